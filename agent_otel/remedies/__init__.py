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

from agent_otel.remedies import pools
from agent_otel.remedies.batching import BatchedTool, batch
from agent_otel.remedies.cache import MISS, CacheStore, MemoryStore, ResultCache
from agent_otel.remedies.pools import PoolFullError, ToolPool, pool

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
]
