"""agent-otel: which tool call left the GPU idle.

Usage::

    import agent_otel
    agent_otel.instrument(service_name="support-agent")

    @agent_otel.tool
    def search(query: str) -> list[str]: ...

Every call of ``search`` (direct, awaited, or submitted to a thread pool)
becomes an ``execute_tool search`` span with its queue time and exec time,
and the Prometheus metrics of docs/telemetry.md move.
"""

from agent_otel.errors import AgentOtelError, ConfigError, InputError
from agent_otel.instrumentation import Instrumentation, instrument, uninstrument
from agent_otel.tools import tool, tool_span
from agent_otel.remedies import PoolFullError, ResultCache, batch, pool, pools

__version__ = "0.1.0"

__all__ = [
    "AgentOtelError",
    "ConfigError",
    "InputError",
    "Instrumentation",
    "PoolFullError",
    "ResultCache",
    "batch",
    "instrument",
    "pool",
    "pools",
    "tool",
    "tool_span",
    "uninstrument",
]
