"""`agent-otel demo --serve`, run as a command: /metrics while it runs, then a clean stop.

The recorded runs of `agent-otel demo` are tested in test_demo.py.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.request

import pytest
from helpers.demo import agent_otel


def metrics_url(process: subprocess.Popen) -> str:
    seen = []
    for line in process.stdout:
        seen.append(line)
        found = re.match(r"metrics: (http://\S+)", line)
        if found:
            return found.group(1)
    pytest.fail("the demo never printed its /metrics address:\n" + "".join(seen))


def test_serve_mode_exposes_metrics_and_stops_after_its_duration():
    started = time.monotonic()
    process = agent_otel(
        "demo",
        "--serve",
        "--duration",
        "2",
        "--seconds",
        "1",
        "--scenario",
        "alternate",
        "--prometheus-port",
        "0",
        "--gpu",
        "simulated",
    )
    try:
        url = metrics_url(process)
        text = ""
        while "agent_tool_calls_total{" not in text and time.monotonic() - started < 20:
            time.sleep(0.3)
            text = urllib.request.urlopen(url, timeout=5).read().decode()
        assert re.search(
            r'^agent_tool_calls_total\{outcome="ok",tool="(search_docs|fetch_quote|calculator)"\} ', text, re.M
        ), text
        rest, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, rest
    assert "stopped" in rest
    assert time.monotonic() - started < 30


def test_serve_mode_stops_cleanly_on_sigterm():
    process = agent_otel("demo", "--serve", "--prometheus-port", "0", "--gpu", "simulated")
    try:
        metrics_url(process)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, rest
    assert "agent-otel demo --serve: stopped" in rest


def test_options_of_serve_mode_alone_are_refused():
    process = agent_otel("demo", "--duration", "3")
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 2
    assert "--duration" in output and "--serve" in output
