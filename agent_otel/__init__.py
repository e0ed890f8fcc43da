"""agent-otel: which tool call left the GPU idle.

Usage::

    import agent_otel
    agent_otel.instrument(service_name="support-agent")

    @agent_otel.tool
    def search(query: str) -> list[str]: ...

Every call of ``search`` (direct, awaited, or submitted to a thread pool)
becomes an ``execute_tool search`` span with its queue time and exec time,
and the Prometheus metrics of docs/telemetry.md move.

The public names below are loaded on first use, so importing a light
module of the package (``agent_otel.semconv``, ``agent_otel.config``,
``agent_otel.errors``) does not load OpenTelemetry's SDK or the Prometheus
client.
"""

from __future__ import annotations

import importlib

from agent_otel.version import __version__

# typing.TYPE_CHECKING without importing typing (a few milliseconds):
# `import agent_otel` loads this module and agent_otel.version, nothing else.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from agent_otel.errors import AgentOtelError, ConfigError, InputError
    from agent_otel.wiring.instrumentation import Instrumentation, instrument, uninstrument
    from agent_otel.capture.models import agent_span, model_span
    from agent_otel.remedies import PoolFullError, ResultCache, batch, pool, pools
    from agent_otel.tools import tool, tool_span

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "AgentOtelError": "agent_otel.errors",
    "ConfigError": "agent_otel.errors",
    "InputError": "agent_otel.errors",
    "Instrumentation": "agent_otel.wiring.instrumentation",
    "instrument": "agent_otel.wiring.instrumentation",
    "uninstrument": "agent_otel.wiring.instrumentation",
    "PoolFullError": "agent_otel.remedies",
    "ResultCache": "agent_otel.remedies",
    "batch": "agent_otel.remedies",
    "pool": "agent_otel.remedies",
    "pools": "agent_otel.remedies",
    "agent_span": "agent_otel.capture.models",
    "model_span": "agent_otel.capture.models",
    "tool": "agent_otel.tools",
    "tool_span": "agent_otel.tools",
}

__all__ = [
    "AgentOtelError",
    "ConfigError",
    "InputError",
    "Instrumentation",
    "PoolFullError",
    "ResultCache",
    "__version__",
    "agent_span",
    "batch",
    "instrument",
    "model_span",
    "pool",
    "pools",
    "tool",
    "tool_span",
    "uninstrument",
]  # _PUBLIC's names and __version__ (tests/test_package.py holds them equal)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_otel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
