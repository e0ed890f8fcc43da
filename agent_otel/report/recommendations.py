"""What to change, from measured data only.

Each rule looks for one pattern in the analysed traces and, when the data
shows it, says what to change with the parameters the data suggests, the
numbers that justify it (``evidence``) and, where agent-otel has one, the
code that applies it (``remedy``, from ``agent_otel.remedies.suggest``). A rule that lacks its input
(no GPU data, no known timeout, too few calls for a p99) stays silent.

Kinds:

- ``raise_pool_workers``: a pool whose calls spend at least half of their
  time waiting in its queue, with more calls in flight at its peak than
  ever ran at once. Suggests as many workers as calls were ever in flight
  at once on it (then none would have waited).
- ``set_timeout``: a tool whose timeout (span attribute
  ``agent.tool.timeout``) is at least 4x its p99 duration. Suggests 2x p99
  to two significant digits.
- ``isolate_tool``: a slow tool (exec p50 at least 10x the others') holding
  most of a shared pool's worker time while the other tools wait in its
  queue longer than they run. Suggests a pool of its own.
- ``batch_calls``: a tool called in bursts (each call within 50 ms of the
  previous, 3 or more calls) for at least 30% of its calls, 3 bursts or
  more. Suggests one batched call per burst.
- ``idle_not_tools``: a GPU idle for at least 1 s and 10% of the time it
  was observed, more than half of it with no tool call in flight: the
  stall is elsewhere, and tuning tools will not recover it.
- ``offload_from_loop``: a tool whose calls blocked an asyncio event loop
  for 0.5 s or more in all (``asyncio.loop.blocked`` spans). Suggests
  calling it off the loop: a pool of its own (of processes when it is
  CPU-bound) awaited with ``.aio()``, or ``asyncio.to_thread``. With subject
  ``unknown`` when code that is no tool blocked the loop that long: no
  remedy, the evidence names the top of its stack.
- ``use_process_pool``: a CPU-bound or GIL-bound tool (``waits.py``: its
  exec is at least 60% CPU, or that share collapses when other calls run in
  parallel) that held the GPU idle 1 s or more while executing. Suggests
  a process pool.
- ``use_async_io``: an I/O-bound tool (its exec is at most 25% CPU) that
  held the GPU idle 1 s or more while executing. Suggests overlapping its
  waits: async, or a pool of threads (a process pool would not help).
  Neither of these two fires for a tool ``offload_from_loop`` names: its
  remedy already follows the kind.
- ``overlap_tool_with_gpu``: from utilization samples (a GPU log), a tool
  blamed for at least 1 GPU-second and 10% of a GPU's unused capacity,
  during whose calls that GPU ran at least 20 points below its utilization
  the rest of the time (95% -> 30% while it runs). The GPU waits on the
  tool: keep it fed while the tool runs, or make the tool shorter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from agent_otel.records import NS_PER_S
from agent_otel.remedies.suggest import DOCS, snippet_for, suggested_timeout
from agent_otel.report.reader import UNKNOWN_EXECUTOR
from agent_otel.report.stats import max_overlap, percentile
from agent_otel.report.waits import KIND_CPU, KIND_GIL, KIND_IO

if TYPE_CHECKING:
    from agent_otel.report.analysis import Analysis

KINDS = (
    "raise_pool_workers",
    "set_timeout",
    "isolate_tool",
    "batch_calls",
    "idle_not_tools",
    "offload_from_loop",
    "use_process_pool",
    "use_async_io",
    "overlap_tool_with_gpu",
)

# Executors that are not pools: nothing to size.
NOT_POOLS = ("direct", UNKNOWN_EXECUTOR)

MIN_CALLS = 20  # a p99 needs at least this many calls
MIN_POOL_CALLS = 5  # a pool's queueing, this many
QUEUE_SHARE = 0.5  # raise_pool_workers: share of call time spent queued
MIN_WAIT_P95_S = 0.010  # ... and a p95 wait worth acting on
TIMEOUT_FACTOR = 4.0  # set_timeout: timeout at least this many p99s
SLOW_FACTOR = 10.0  # isolate_tool: exec p50 at least this many times the others'
MIN_SLOW_CALLS = 5
SLOW_WORKER_SHARE = 0.5  # ... and at least this share of the pool's worker time
BURST_GAP_S = 0.050  # batch_calls: a call this soon after the previous joins its burst
MIN_BURST = 3
MIN_BURSTS = 3
BURST_SHARE = 0.3
MIN_IDLE_S = 1.0  # idle_not_tools
MIN_IDLE_SHARE = 0.10
UNATTRIBUTED_SHARE = 0.5
MIN_LOOP_BLOCKED_S = 0.5  # offload_from_loop: blocked loop seconds, in all
MIN_EXEC_IDLE_S = 1.0  # use_process_pool, use_async_io: GPU idle blamed on the tool's exec
MIN_UNDERUSED_S = 1.0  # overlap_tool_with_gpu: GPU-seconds of unused capacity blamed on the tool
MIN_UNDERUSED_SHARE = 0.10  # ... and this share of the GPU's unused capacity
MIN_DIP = 0.20  # ... with utilization this much lower while its calls were in flight


@dataclass
class Recommendation:
    kind: str
    subject: str
    message: str
    evidence: dict

    @property
    def remedy(self) -> Optional[str]:
        """The agent-otel code that applies it (docs/remedies.md), if any."""
        return snippet_for(self.kind, self.evidence)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "message": self.message,
            "evidence": self.evidence,
            "remedy": self.remedy,
            "docs": DOCS[self.kind],
        }


def recommend(analysis: Analysis) -> list[Recommendation]:
    """Every recommendation the data supports, grouped by kind."""
    return [
        *_raise_pool_workers(analysis),
        *_set_timeout(analysis),
        *_isolate_tool(analysis),
        *_batch_calls(analysis),
        *_idle_not_tools(analysis),
        *_waits(analysis),
        *_overlap_tool_with_gpu(analysis),
    ]


def _s(seconds: float) -> float:
    return round(seconds, 6)


def _g(seconds: float) -> str:
    """Seconds for a message: two significant digits is what a reader acts on
    (whole seconds from 100 on, never 1e+02)."""
    return f"{seconds:.0f}" if abs(seconds) >= 100 else f"{seconds:.2g}"


def _raise_pool_workers(analysis: Analysis) -> list[Recommendation]:
    found = []
    for pool in analysis.executors:
        if pool.executor in NOT_POOLS or pool.submissions < MIN_POOL_CALLS:
            continue
        total = pool.queue_total_s + pool.exec_total_s
        if not total or pool.queue_total_s < QUEUE_SHARE * total or pool.wait_p95_s < MIN_WAIT_P95_S:
            continue
        if pool.peak_in_flight <= pool.max_concurrent_exec:
            # Calls waited though no more of them were in flight than ever ran
            # at once: the workers were busy with work the traces do not show.
            continue
        waits: dict[str, float] = {}
        for call in analysis.calls:
            if call.executor == pool.executor:
                waits[call.tool] = waits.get(call.tool, 0.0) + call.queue_seconds
        most_waiting = max(waits, key=lambda tool: (waits[tool], tool))
        workers = pool.peak_in_flight
        found.append(
            Recommendation(
                kind="raise_pool_workers",
                subject=pool.executor,
                message=(
                    f'pool="{pool.executor}" with {workers} workers: its calls spent '
                    f"{pool.queue_total_s / total:.0%} of their time waiting in its queue "
                    f"(wait p95 {_g(pool.wait_p95_s)} s, up to {pool.max_queue_depth} queued) while at most "
                    f"{pool.max_concurrent_exec} ran at once; {workers} calls were in flight at the peak. "
                    f'Or give tool="{most_waiting}", which waited longest, a pool of its own.'
                ),
                evidence={
                    "executor": pool.executor,
                    "submissions": pool.submissions,
                    "queue_share": round(pool.queue_total_s / total, 4),
                    "wait_p95_s": _s(pool.wait_p95_s),
                    "max_queue_depth": pool.max_queue_depth,
                    "max_concurrent_exec": pool.max_concurrent_exec,
                    "peak_in_flight": pool.peak_in_flight,
                    "most_waiting_tool": most_waiting,
                    "most_waiting_tool_queue_s": _s(waits[most_waiting]),
                    "suggested_workers": workers,
                },
            )
        )
    return found


def _set_timeout(analysis: Analysis) -> list[Recommendation]:
    found = []
    for tool in analysis.tools:
        if tool.timeout_s is None or tool.calls < MIN_CALLS:
            continue
        p99 = percentile(tool.duration_s, 99)
        if p99 <= 0 or tool.timeout_s < TIMEOUT_FACTOR * p99:
            continue
        suggested = suggested_timeout(p99)
        over = sum(1 for seconds in tool.duration_s if seconds > suggested)
        found.append(
            Recommendation(
                kind="set_timeout",
                subject=tool.tool,
                message=(
                    f'tool="{tool.tool}" timeout={_g(suggested)} s from p99 {_g(p99)} s: its timeout of '
                    f"{_g(tool.timeout_s)} s is {tool.timeout_s / p99:.0f}x its p99 over {tool.calls} calls, "
                    f"so a hung call holds its worker that long; {over} of {tool.calls} calls took longer "
                    "than the suggested timeout."
                ),
                evidence={
                    "tool": tool.tool,
                    "calls": tool.calls,
                    "timeout_s": tool.timeout_s,
                    "duration_p99_s": _s(p99),
                    "suggested_timeout_s": suggested,
                    "calls_over_suggested": over,
                },
            )
        )
    return found


def _isolate_tool(analysis: Analysis) -> list[Recommendation]:
    by_pool: dict[str, dict[str, list]] = {}
    for call in analysis.calls:
        if call.executor not in NOT_POOLS:
            by_pool.setdefault(call.executor, {}).setdefault(call.tool, []).append(call)
    found = []
    for pool, by_tool in sorted(by_pool.items()):
        pool_exec = sum(call.exec_seconds for calls in by_tool.values() for call in calls)
        if len(by_tool) < 2 or not pool_exec:
            continue
        for tool, mine in sorted(by_tool.items()):
            share = sum(call.exec_seconds for call in mine) / pool_exec
            if len(mine) < MIN_SLOW_CALLS or share < SLOW_WORKER_SHARE:
                continue
            others = [call for name, calls in by_tool.items() if name != tool for call in calls]
            slow_p50 = percentile(sorted(call.exec_seconds for call in mine), 50)
            other_exec = sorted(call.exec_seconds for call in others)
            fast_p50, fast_exec_p95 = percentile(other_exec, 50), percentile(other_exec, 95)
            fast_wait_p95 = percentile(sorted(call.queue_seconds for call in others), 95)
            if not (
                slow_p50 >= SLOW_FACTOR * fast_p50 and fast_wait_p95 >= MIN_WAIT_P95_S and fast_wait_p95 > fast_exec_p95
            ):
                continue
            workers = max_overlap([(call.start_ns, call.end_ns) for call in mine])
            ratio = f"{slow_p50 / fast_p50:.0f}x" if fast_p50 else "far above"
            found.append(
                Recommendation(
                    kind="isolate_tool",
                    subject=tool,
                    message=(
                        f'give tool="{tool}" its own pool with {workers} workers: it held {share:.0%} of '
                        f'pool="{pool}" worker time with exec p50 {_g(slow_p50)} s ({ratio} the other '
                        f"tools' {_g(fast_p50)} s), and the other tools waited p95 {_g(fast_wait_p95)} s in the "
                        f"queue for calls that ran p95 {_g(fast_exec_p95)} s."
                    ),
                    evidence={
                        "tool": tool,
                        "executor": pool,
                        "worker_time_share": round(share, 4),
                        "exec_p50_s": _s(slow_p50),
                        "other_tools_exec_p50_s": _s(fast_p50),
                        "other_tools_exec_p95_s": _s(fast_exec_p95),
                        "other_tools_wait_p95_s": _s(fast_wait_p95),
                        "max_concurrent_exec": workers,
                        "suggested_workers": workers,
                    },
                )
            )
    return found


def _batch_calls(analysis: Analysis) -> list[Recommendation]:
    submits: dict[str, list[int]] = {}
    for call in analysis.calls:
        submits.setdefault(call.tool, []).append(call.submit_ns)
    gap_ns = round(BURST_GAP_S * NS_PER_S)
    found = []
    for tool in sorted(submits):
        times = sorted(submits[tool])
        bursts = [size for size in _run_lengths(times, gap_ns) if size >= MIN_BURST]
        in_bursts = sum(bursts)
        if len(bursts) < MIN_BURSTS or in_bursts < BURST_SHARE * len(times):
            continue
        saved = in_bursts - len(bursts)
        found.append(
            Recommendation(
                kind="batch_calls",
                subject=tool,
                message=(
                    f'batch tool="{tool}": {in_bursts} of {len(times)} calls came in {len(bursts)} bursts '
                    f"(each call within {BURST_GAP_S * 1000:.0f} ms of the previous, up to {max(bursts)} "
                    f"per burst); one batched call per burst would make {saved} fewer calls."
                ),
                evidence={
                    "tool": tool,
                    "calls": len(times),
                    "bursts": len(bursts),
                    "calls_in_bursts": in_bursts,
                    "largest_burst": max(bursts),
                    "median_burst": percentile(sorted(bursts), 50),
                    "burst_gap_s": BURST_GAP_S,
                    "calls_saved": saved,
                },
            )
        )
    return found


def _run_lengths(times: list[int], gap_ns: int) -> list[int]:
    """Sizes of the runs of sorted times whose neighbours are <= gap_ns apart."""
    runs = []
    size = 0
    previous = None
    for time in times:
        if previous is not None and time - previous <= gap_ns:
            size += 1
        else:
            if size:
                runs.append(size)
            size = 1
        previous = time
    if size:
        runs.append(size)
    return runs


def _idle_not_tools(analysis: Analysis) -> list[Recommendation]:
    found = []
    for gpu in analysis.gpus:
        if gpu.idle_s < MIN_IDLE_S or not gpu.observed_s or gpu.idle_s < MIN_IDLE_SHARE * gpu.observed_s:
            continue
        share = gpu.idle_unattributed_s / gpu.idle_s
        if share <= UNATTRIBUTED_SHARE:
            continue
        found.append(
            Recommendation(
                kind="idle_not_tools",
                subject=gpu.gpu,
                message=(
                    f'gpu="{gpu.gpu}": {_g(gpu.idle_unattributed_s)} s of its {_g(gpu.idle_s)} s idle '
                    f"({share:.0%}) had no tool call in flight: the stall is elsewhere (input pipeline, "
                    "model server, the agent's own code), and tuning tools will not recover it."
                ),
                evidence={
                    "gpu": gpu.gpu,
                    "observed_s": _s(gpu.observed_s),
                    "idle_s": _s(gpu.idle_s),
                    "idle_unattributed_s": _s(gpu.idle_unattributed_s),
                    "unattributed_share": round(share, 4),
                },
            )
        )
    return found


def _share(value) -> str:
    return "?" if value is None else f"{value:.0%}"


def _waits(analysis: Analysis) -> list[Recommendation]:
    """offload_from_loop, then use_process_pool and use_async_io for the other tools."""
    found = []
    offloaded = set()
    for tool in analysis.tools:
        loop = tool.loop
        if loop is None or loop.blocked_s < MIN_LOOP_BLOCKED_S:
            continue
        offloaded.add(tool.tool)
        cpu = tool.cpu
        kind = cpu.kind if cpu is not None else None
        threads = sorted(loop.threads)
        how = (
            "a process pool awaited with .aio() (it is CPU-bound: a thread would still hold the GIL)"
            if kind in (KIND_CPU, KIND_GIL)
            else "await it with .aio() on a pool of its own, or asyncio.to_thread"
        )
        found.append(
            Recommendation(
                kind="offload_from_loop",
                subject=tool.tool,
                message=(
                    f'call tool="{tool.tool}" off the event loop: its calls blocked the loop of '
                    f"{', '.join(threads)} {loop.blocks} time{'s' if loop.blocks != 1 else ''} for "
                    f"{_g(loop.blocked_s)} s in all (longest {_g(loop.longest_s)} s)"
                    + (
                        f", while up to {loop.most_waiting} other tool call{'s' if loop.most_waiting != 1 else ''} "
                        "waited for the loop"
                        if loop.most_waiting
                        else ""
                    )
                    + f"; {_g(tool.loop_idle_blocked_s)} GPU-s of GPU idle time meanwhile are blamed on it. A sync "
                    f"function called from a coroutine holds the loop's thread, and no other coroutine runs: {how}."
                ),
                evidence={
                    "tool": tool.tool,
                    "blocks": loop.blocks,
                    "loop_blocked_s": _s(loop.blocked_s),
                    "longest_block_s": _s(loop.longest_s),
                    "threads": threads,
                    "most_waiting_calls": loop.most_waiting,
                    "gpu_idle_blocked_loop_s": _s(tool.loop_idle_blocked_s),
                    "wait_kind": kind,
                    "exec_cpu_share": None if cpu is None or cpu.share is None else round(cpu.share, 4),
                },
            )
        )
    unknown = analysis.loop_unknown
    if unknown is not None and unknown.blocked_s >= MIN_LOOP_BLOCKED_S:
        top = _innermost_frame(unknown.stack)
        found.append(
            Recommendation(
                kind="offload_from_loop",
                subject="unknown",
                message=(
                    f"code that is not a tool blocked the event loop of {', '.join(sorted(unknown.threads))} "
                    f"{unknown.blocks} time{'s' if unknown.blocks != 1 else ''} for {_g(unknown.blocked_s)} s in all "
                    f"(longest {_g(unknown.longest_s)} s)"
                    + (f", in the longest at {top}" if top else "")
                    + "; the asyncio.loop.blocked spans carry the loop thread's stack (code.stacktrace). "
                    "Move that work off the loop (asyncio.to_thread, or a pool), or make it a tool to have it traced."
                ),
                evidence={
                    "tool": None,
                    "blocks": unknown.blocks,
                    "loop_blocked_s": _s(unknown.blocked_s),
                    "longest_block_s": _s(unknown.longest_s),
                    "threads": sorted(unknown.threads),
                    "most_waiting_calls": unknown.most_waiting,
                    "innermost_frame": top,
                },
            )
        )
    for tool in analysis.tools:
        cpu = tool.cpu
        if tool.tool in offloaded or cpu is None or tool.blocked_exec_s < MIN_EXEC_IDLE_S:
            continue
        kind = cpu.kind
        evidence = {
            "tool": tool.tool,
            "measured_calls": cpu.all.calls,
            "exec_cpu_share": None if cpu.share is None else round(cpu.share, 4),
            "exec_cpu_share_alone": None if cpu.alone_share is None else round(cpu.alone_share, 4),
            "exec_cpu_share_parallel": None if cpu.parallel_share is None else round(cpu.parallel_share, 4),
            "wait_kind": kind,
            "gpu_idle_blocked_exec_s": _s(tool.blocked_exec_s),
        }
        held = f"it held the GPU idle {_g(tool.blocked_exec_s)} GPU-s executing"
        if kind == KIND_GIL:
            message = (
                f'tool="{tool.tool}" is GIL-bound: alone {_share(cpu.alone_share)} of its exec time was on the CPU, '
                f"with other calls running in parallel only {_share(cpu.parallel_share)}: its threads take turns on "
                f"the interpreter lock, so more threads make each call slower; {held}. Give it a process pool "
                "(or, if the host was short of cores, check its load: that lowers the share too)."
            )
        elif kind == KIND_CPU:
            message = (
                f'tool="{tool.tool}" is CPU-bound: {_share(cpu.alone_share or cpu.share)} of its exec time was on '
                f"the CPU over {cpu.all.calls} calls; {held}. Threads cannot run Python in parallel: "
                "give it a process pool."
            )
        elif kind == KIND_IO:
            message = (
                f'tool="{tool.tool}" waits: only {_share(cpu.share)} of its exec time was on the CPU over '
                f"{cpu.all.calls} calls (I/O, a lock or a remote service); {held}. Overlap its waits with the "
                "agent's other work: call it async (an async client, or .aio() on a pool of its own); a process "
                "pool would not help."
            )
        else:
            continue
        found.append(
            Recommendation(
                kind="use_async_io" if kind == KIND_IO else "use_process_pool",
                subject=tool.tool,
                message=message,
                evidence=evidence,
            )
        )
    return found


def _innermost_frame(stack) -> Optional[str]:
    """'file:line in function' of the last frame of a Python traceback text."""
    if not stack:
        return None
    frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    if not frames:
        return None
    parts = frames[-1].split(", ")
    if len(parts) == 3 and parts[1].startswith("line ") and parts[2].startswith("in "):
        return f"{parts[0][5:].strip(chr(34))}:{parts[1][5:]} in {parts[2][3:]}"
    return frames[-1]


def _overlap_tool_with_gpu(analysis: Analysis) -> list[Recommendation]:
    underuse = analysis.underuse
    if underuse is None:
        return []  # no utilization samples: only idle windows are known
    by_tool_gpu: dict[tuple[str, str], float] = {}
    for (gpu, name, _phase), seconds in underuse.totals.blocked_s.items():
        by_tool_gpu[(name, gpu)] = by_tool_gpu.get((name, gpu), 0.0) + seconds
    found = []
    for tool in analysis.tools:  # in rank order
        best = None
        for gpu, total in sorted(underuse.totals.underused_s.items()):
            blamed = by_tool_gpu.get((tool.tool, gpu), 0.0)
            during = underuse.during.get((gpu, tool.tool))
            observed = underuse.observed.get(gpu)
            if not during or not observed or during.ns >= observed.ns:
                continue
            otherwise = (observed.used_ns - during.used_ns) / (observed.ns - during.ns)
            dip = otherwise - during.mean
            if blamed < MIN_UNDERUSED_S or not total or blamed < MIN_UNDERUSED_SHARE * total or dip < MIN_DIP:
                continue
            if best is None or blamed > best[1]:
                best = (gpu, blamed, total, during.mean, otherwise, during.ns / NS_PER_S)
        if best is None:
            continue
        gpu, blamed, total, while_running, otherwise, seconds = best
        found.append(
            Recommendation(
                kind="overlap_tool_with_gpu",
                subject=tool.tool,
                message=(
                    f'tool="{tool.tool}" leaves gpu="{gpu}" waiting: the GPU ran at {while_running:.0%} while its '
                    f"calls were in flight ({_g(seconds)} s) and {otherwise:.0%} the rest of the time; "
                    f"{_g(blamed)} GPU-s of capacity ({blamed / total:.0%} of what the GPU left unused) went unused "
                    "on its account. Keep the GPU fed while it runs (other requests or agent sessions on the "
                    "model meanwhile, start the call earlier, cache repeated calls) or make it shorter."
                ),
                evidence={
                    "tool": tool.tool,
                    "gpu": gpu,
                    "calls": tool.calls,
                    "underused_blocked_s": _s(blamed),
                    "underused_share": round(blamed / total, 4),
                    "utilization_during": round(while_running, 4),
                    "utilization_otherwise": round(otherwise, 4),
                    "in_flight_s": _s(seconds),
                },
            )
        )
    return found
