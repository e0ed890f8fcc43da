"""Remedies for tools that hold the GPU up: the building blocks the report recommends.

Usage::

    agent_otel.pool("io", workers=24)                       # a bounded pool (bulkhead)

    @agent_otel.tool(pool="io", timeout=2.8, retries=1, fallback=cached_quote)
    def finance_quote(symbol: str) -> float: ...

    @agent_otel.tool(cache=True)                             # deterministic: cache results
    def exchange_rate(currency: str) -> float: ...

    @agent_otel.batch(max_size=32, window_ms=5)              # merge calls into batches
    def embed(texts: list[str]) -> list[list[float]]: ...

Each block works without ``instrument()``; with it, every call is still one
``execute_tool`` span with real queue and exec time, plus what the remedy
did (retries, timeout, fallback, cache hit, batch size) and its own metrics.
docs/remedies.md has when to use which, and what the dashboards show.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from agent_otel.remedies import pools
    from agent_otel.remedies.batching import BatchedTool, batch
    from agent_otel.remedies.cache import MISS, CacheStore, MemoryStore, ResultCache
    from agent_otel.remedies.pools import PoolFullError, ToolPool, pool

# Loaded on first use, as agent_otel's own names are: the report imports
# agent_otel.remedies.suggest (the snippets it prints), and importing this
# package's blocks (thread pools, executors, the cache) would add about
# 80 ms to every `agent-otel report`.
# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "BatchedTool": "agent_otel.remedies.batching",
    "batch": "agent_otel.remedies.batching",
    "MISS": "agent_otel.remedies.cache",
    "CacheStore": "agent_otel.remedies.cache",
    "MemoryStore": "agent_otel.remedies.cache",
    "ResultCache": "agent_otel.remedies.cache",
    "PoolFullError": "agent_otel.remedies.pools",
    "ToolPool": "agent_otel.remedies.pools",
    "pool": "agent_otel.remedies.pools",
    "pools": "agent_otel.remedies.pools",  # the module itself
}

__all__ = [
    "BatchedTool",
    "CacheStore",
    "MISS",
    "MemoryStore",
    "PoolFullError",
    "ResultCache",
    "ToolPool",
    "batch",
    "pool",
    "pools",
]  # _PUBLIC's names


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_otel.remedies' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if module == f"{__name__}.{name}" else getattr(loaded, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
