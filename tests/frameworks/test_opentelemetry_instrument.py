"""Loading the hooks with ``opentelemetry-instrument``, no code change.

The frameworks are imported only in the agent's process, not in this one
(see ``require_installed``): under xdist this module runs on a worker of its
own, beside the modules that import the frameworks here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from frameworks.framework_support import require_installed


def test_opentelemetry_instrument_loads_the_hooks_with_no_code_change(tmp_path):
    require_installed("langchain", "langchain_core")
    require_installed("smolagents", "smolagents")
    instrument_command = Path(sys.executable).with_name("opentelemetry-instrument")
    agent = tmp_path / "agent.py"
    agent.write_text(
        textwrap.dedent('''
        from langchain_core.tools import tool as langchain_tool
        from smolagents import tool as smolagents_tool

        @langchain_tool
        def lookup(key: str) -> str:
            """Look a key up."""
            return key.upper()

        @smolagents_tool
        def shout(text: str) -> str:
            """Shout.

            Args:
                text: what to shout
            """
            return text + "!"

        print(lookup.invoke({"key": "a"}), shout(text="b"))
    ''')
    )
    traces = tmp_path / "traces.jsonl"
    environment = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "none",
        "AGENT_OTEL_TRACES_FILE": str(traces),
        "AGENT_OTEL_GPU": "off",
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "agent_otel_smolagents",
    }
    done = subprocess.run(
        [str(instrument_command), sys.executable, str(agent)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["A", "b!"]
    # (OpenInference's and OpenLLMetry's instrumentations, where installed, load too and add their own spans.)
    names = [
        span["name"]
        for line in traces.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        if scope["scope"]["name"] == "agent_otel"
        for span in scope["spans"]
    ]
    assert names == ["execute_tool lookup"]  # smolagents' hook was turned off
