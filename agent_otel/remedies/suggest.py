"""The code a recommendation suggests, from the numbers that justify it.

Usage (the report, for each recommendation)::

    from agent_otel.remedies.suggest import DOCS, snippet_for

    code = snippet_for(rec.kind, rec.evidence)   # None when no block applies
    link = DOCS[rec.kind]                        # "docs/remedies.md#timeouts"

Pure functions of plain numbers, so the report, the docs and the tests agree
on one rounding and one spelling of each remedy. The evidence keys are those
``agent_otel.report.recommendations`` writes.
"""

from __future__ import annotations

import math
from typing import Optional

from agent_otel.semconv import EXECUTOR_ASYNCIO_DEFAULT, EXECUTOR_UNNAMED

# Where docs/remedies.md explains each recommendation's remedy.
DOCS = {
    "raise_pool_workers": "docs/remedies.md#pools",
    "isolate_tool": "docs/remedies.md#pools",
    "set_timeout": "docs/remedies.md#timeouts",
    "batch_calls": "docs/remedies.md#batching",
    "idle_not_tools": "docs/remedies.md#when-no-remedy-applies",
    "offload_from_loop": "docs/remedies.md#calling-from-async-code",
    "use_process_pool": "docs/remedies.md#pools",
    "use_async_io": "docs/remedies.md#calling-from-async-code",
    "overlap_tool_with_gpu": "docs/remedies.md#when-the-gpu-waits-on-a-tool",
}

TIMEOUT_P99S = 2.0  # a timeout of 2x p99 lets nearly every healthy call finish
DEFAULT_IO_POOL = "io"  # the name suggested for a pool that has none of its own


def suggested_timeout(p99_s: float) -> float:
    """2x p99, to two significant digits (1.4 s -> 2.8 s): what a reader acts on."""
    if not p99_s > 0:
        raise ValueError(f"p99 must be a positive number of seconds, not {p99_s!r}")
    return float(f"{TIMEOUT_P99S * p99_s:.2g}")


def suggest_timeout(p99_s: float, retries: int = 1) -> str:
    """``@agent_otel.tool(timeout=2.8, retries=1, fallback=...)`` for p99 1.4 s."""
    return f"@agent_otel.tool(timeout={suggested_timeout(p99_s):g}, retries={retries}, fallback=...)"


def suggest_pool_workers(executor: str, workers: int) -> str:
    """Size a pool: an agent-otel pool of that name, or asyncio's default executor."""
    workers = max(1, int(workers))
    if executor == EXECUTOR_ASYNCIO_DEFAULT:
        return (
            "loop.set_default_executor(concurrent.futures.ThreadPoolExecutor("
            f'max_workers={workers}, thread_name_prefix="asyncio"))'
        )
    name = DEFAULT_IO_POOL if executor.startswith(EXECUTOR_UNNAMED) else executor
    return f'agent_otel.pool("{name}", workers={workers})\n@agent_otel.tool(pool="{name}")'


def suggest_isolation(tool: str, workers: int) -> str:
    """A pool of the tool's own, so its slow calls stop queueing the others."""
    workers = max(1, int(workers))
    return f'agent_otel.pool("{tool}", workers={workers})\n@agent_otel.tool(pool="{tool}")'


def suggest_batch(largest_burst: int, burst_gap_s: float) -> str:
    """Batches as large as the largest burst, open as long as the gap that made calls one burst."""
    max_size = max(2, int(largest_burst))
    window_ms = max(1, math.ceil(burst_gap_s * 1000))
    return f"@agent_otel.batch(max_size={max_size}, window_ms={window_ms})"


def suggest_process_pool(tool: str) -> str:
    """A process pool of the tool's own: CPU-bound Python runs in parallel only in processes."""
    return f'agent_otel.pool("{tool}", kind="cpu", processes=True)\n@agent_otel.tool(pool="{tool}")'


def suggest_offload(tool: str, cpu_bound: bool) -> str:
    """Off the event loop: a pool of the tool's own (processes when it is
    CPU-bound), awaited with ``.aio()`` from async code."""
    pool = suggest_process_pool(tool) if cpu_bound else f'agent_otel.pool("{tool}")\n@agent_otel.tool(pool="{tool}")'
    return f"{pool}\n# in async code: result = await {tool}.aio(...)   (or: await asyncio.to_thread({tool}, ...))"


def suggest_async_io(tool: str) -> str:
    """An I/O-bound tool: overlap its waits (a pool of threads, awaited from async code)."""
    return (
        f'agent_otel.pool("{tool}")\n@agent_otel.tool(pool="{tool}")\n'
        f"# in async code: result = await {tool}.aio(...)   (or an async client)"
    )


def snippet_for(kind: str, evidence: dict) -> Optional[str]:
    """The remedy code for one recommendation of the report, or None when no block applies."""
    if kind == "set_timeout":
        return suggest_timeout(evidence["duration_p99_s"])
    if kind == "raise_pool_workers":
        return suggest_pool_workers(evidence["executor"], evidence["suggested_workers"])
    if kind == "isolate_tool":
        return suggest_isolation(evidence["tool"], evidence["suggested_workers"])
    if kind == "batch_calls":
        return suggest_batch(evidence["largest_burst"], evidence["burst_gap_s"])
    if kind == "offload_from_loop" and evidence.get("tool"):
        return suggest_offload(evidence["tool"], evidence.get("wait_kind") in ("cpu", "gil"))
    if kind == "use_process_pool":
        return suggest_process_pool(evidence["tool"])
    if kind == "use_async_io":
        return suggest_async_io(evidence["tool"])
    return None
