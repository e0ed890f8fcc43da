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
    "offload_or_bound": "docs/remedies.md#calling-from-async-code",
    "hidden_retries": "docs/remedies.md#timeouts",
    "bound_queue": "docs/remedies.md#pools",
    "fewer_workers": "docs/remedies.md#pools",
}

TIMEOUT_P99S = 2.0  # a timeout of 2x p99 lets nearly every healthy call finish
MIDDLE_TIER_P99S = 1.5  # a tool called from inside another tool's call: its timeout fires before its caller's
DEFAULT_IO_POOL = "io"  # the name suggested for a pool that has none of its own
QUEUE_PER_WORKER = 2  # a bounded queue: about twice the workers, then caller-runs


def suggested_timeout(p99_s: float, factor: float = TIMEOUT_P99S) -> float:
    """``factor`` x p99 (2x; 1.5x for a middle tier), to two significant
    digits (1.4 s -> 2.8 s): what a reader acts on."""
    if not p99_s > 0:
        raise ValueError(f"p99 must be a positive number of seconds, not {p99_s!r}")
    return float(f"{factor * p99_s:.2g}")


def suggest_timeout(p99_s: float, retries: int = 1, factor: float = TIMEOUT_P99S) -> str:
    """``@agent_otel.tool(timeout=2.8, retries=1, fallback=...)`` for p99 1.4 s."""
    return f"@agent_otel.tool(timeout={suggested_timeout(p99_s, factor):g}, retries={retries}, fallback=...)"


def suggest_pool_workers(executor: str, workers: int, processes: bool = False) -> str:
    """Size a pool: an agent-otel pool of that name (of processes for
    CPU-bound calls), or asyncio's default executor."""
    workers = max(1, int(workers))
    if executor == EXECUTOR_ASYNCIO_DEFAULT and not processes:
        return (
            "loop.set_default_executor(concurrent.futures.ThreadPoolExecutor("
            f'max_workers={workers}, thread_name_prefix="asyncio"))'
        )
    name = _pool_name(executor)
    kind = ', kind="cpu", processes=True' if processes else ""
    return f'agent_otel.pool("{name}", workers={workers}{kind})\n@agent_otel.tool(pool="{name}")'


def _pool_name(executor: str) -> str:
    """The agent-otel pool to declare for an executor: its own name, or ``io`` for an unnamed one."""
    return (
        DEFAULT_IO_POOL if executor.startswith(EXECUTOR_UNNAMED) or executor == EXECUTOR_ASYNCIO_DEFAULT else executor
    )


def suggest_bounded_queue(executor: str, workers: int) -> str:
    """A pool of ``workers`` whose queue holds about twice the workers; past
    it the caller runs the call itself (back-pressure, nothing dropped)."""
    workers = max(1, int(workers))
    name = _pool_name(executor)
    return (
        f'agent_otel.pool("{name}", workers={workers}, queue_limit={QUEUE_PER_WORKER * workers}, '
        f'rejection="caller_runs")\n@agent_otel.tool(pool="{name}")'
    )


def suggest_isolation(tool: str, workers: int, processes: bool = False) -> str:
    """A pool of the tool's own (of processes when it is CPU-bound), so its slow calls stop queueing the others."""
    workers = max(1, int(workers))
    kind = ', kind="cpu", processes=True' if processes else ""
    return f'agent_otel.pool("{tool}", workers={workers}{kind})\n@agent_otel.tool(pool="{tool}")'


def suggest_offload_or_bound(tool: str, timeout_s: Optional[float], cpu_bound: bool) -> str:
    """A direct call, off the caller's thread (a pool of its own, awaited with
    ``.aio()``) and bounded (a timeout, one retry, a fallback)."""
    kind = ', kind="cpu", processes=True' if cpu_bound else ""
    bound = f", timeout={timeout_s:g}, retries=1, fallback=..." if timeout_s else ""
    return (
        f'agent_otel.pool("{tool}"{kind})\n@agent_otel.tool(pool="{tool}"{bound})\n'
        f"# in async code: result = await {tool}.aio(...)"
        + ("" if timeout_s else "\n# and a timeout near 2x its p99 once 20 calls tell it")
    )


def suggest_retries(timeout_s: Optional[float], retries: int, interval_s: float) -> str:
    """Retries moved out of a tool's code into the toolkit's: a per-attempt
    timeout and a fixed interval (no back-off: the GPU waits for the answer)."""
    timeout = f"{timeout_s:g}" if timeout_s else "..."
    return f"@agent_otel.tool(timeout={timeout}, retries={max(1, int(retries))}, retry_interval={interval_s:g}, fallback=...)"


def suggest_batch(largest_burst: int, window_s: float) -> str:
    """Batches as large as the largest burst, open ``window_s`` (whole milliseconds, 1 at least)."""
    max_size = max(2, int(largest_burst))
    window_ms = max(1, math.ceil(round(window_s * 1000, 6)))
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
        return suggest_timeout(evidence["duration_p99_s"], factor=evidence.get("timeout_factor", TIMEOUT_P99S))
    if kind == "raise_pool_workers":
        code = suggest_pool_workers(
            evidence["executor"], evidence["suggested_workers"], bool(evidence.get("cpu_bound"))
        )
        split = evidence.get("split_tool")
        if split:
            code += "\n" + suggest_isolation(split, evidence["split_tool_workers"], bool(evidence.get("cpu_bound")))
        return code
    if kind == "isolate_tool":
        return suggest_isolation(evidence["tool"], evidence["suggested_workers"], bool(evidence.get("processes")))
    if kind == "offload_or_bound":
        return suggest_offload_or_bound(
            evidence["tool"], evidence.get("suggested_timeout_s"), evidence.get("wait_kind") in ("cpu", "gil")
        )
    if kind == "hidden_retries":
        return suggest_retries(
            evidence.get("suggested_timeout_s"), evidence["suggested_retries"], evidence["retry_interval_s"]
        )
    if kind == "batch_calls":
        return suggest_batch(evidence["largest_burst"], evidence.get("suggested_window_s", evidence["burst_gap_s"]))
    if kind == "bound_queue":
        return suggest_bounded_queue(evidence["executor"], evidence["workers"])
    if kind == "fewer_workers":
        return suggest_bounded_queue(evidence["executor"], evidence["workers_before"])
    if kind == "offload_from_loop" and evidence.get("tool"):
        return suggest_offload(evidence["tool"], evidence.get("wait_kind") in ("cpu", "gil"))
    if kind == "use_process_pool":
        return suggest_process_pool(evidence["tool"])
    if kind == "use_async_io":
        return suggest_async_io(evidence["tool"])
    return None
