"""`agent-otel demo` started as a command, the way a new user starts it."""

from __future__ import annotations

import os
import subprocess
import sys


def agent_otel(*args: str, **popen) -> subprocess.Popen:
    """``agent-otel ARGS`` in a subprocess, its output (stdout and stderr) a text pipe.

    The subprocess sets up its own instrument(), which this test session's
    shared tracer provider would otherwise catch; it exports no spans and
    serves /metrics only where the arguments ask for it.
    """
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1"}
    env.pop("AGENT_OTEL_PROMETHEUS_PORT", None)
    return subprocess.Popen(
        [sys.executable, "-m", "agent_otel.commands.cli", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **popen,
    )
