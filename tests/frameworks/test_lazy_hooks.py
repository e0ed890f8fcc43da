"""instrument() hooks a framework the agent imports later, and never imports one itself.

The framework is imported only in the agent's process, not in this one (see
``require_installed``): under xdist this module runs on a worker of its own,
beside the modules that import the frameworks here."""

import os
import subprocess
import sys
import textwrap

from frameworks.framework_support import require_installed


def run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_framework_imported_after_instrument_is_hooked_then():
    require_installed("langchain", "langchain_core")
    result = run("""
        import sys
        import agent_otel
        from agent_otel.capture import frameworks
        handle = agent_otel.instrument(traces_exporters="console", gpu="off")
        assert "langchain_core" not in sys.modules, "instrument() imported a framework"
        assert "langchain" in frameworks.pending() and "langchain" not in frameworks.hooked()
        from langchain_core.tools import tool
        assert "langchain" in frameworks.hooked() and "langchain" not in frameworks.pending()

        @tool
        def add(a: int, b: int) -> int:
            "Add two numbers."
            return a + b

        assert add.invoke({"a": 1, "b": 2}) == 3
        handle.shutdown()
    """)
    assert result.returncode == 0, result.stderr
    assert '"name": "execute_tool add"' in result.stdout


def test_a_pending_hook_does_nothing_after_uninstrument():
    require_installed("langchain", "langchain_core")
    result = run("""
        import agent_otel
        from agent_otel.capture import frameworks
        handle = agent_otel.instrument(traces_exporters="none", gpu="off")
        handle.shutdown()
        from langchain_core.tools import BaseTool
        original = BaseTool.__dict__["run"]
        assert frameworks.hooked() == [] and frameworks.pending() == []
        assert not hasattr(original, "__wrapped__"), "hooked after uninstrument"
    """)
    assert result.returncode == 0, result.stderr
