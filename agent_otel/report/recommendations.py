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
  at once on it (then none would have waited), capped: 4 x the agent's
  cores for I/O, the core count for CPU-bound calls (in processes), 200
  when the core count is unknown. Past the cap it says to split the pool
  (the tool that waited longest gets its own) rather than grow one giant
  pool.
- ``set_timeout``: a tool whose timeout (span attribute
  ``agent.tool.timeout``) is at least 4x its healthy calls' p99 duration,
  or that has none and a long tail (p99 at least 3x p50). Suggests 2x the
  p99 of its healthy calls (not timed out or cancelled, not cut by its
  timeout, not hung at 20x p50) to two significant digits, and says how
  many calls it would have cut; 1.5x p99 for a middle tier, a tool called
  from inside another tool's call, so that its timeout fires before its
  caller's.
- ``bound_queue``: a pool of known size whose queue held more than twice
  its workers (bursts: no rule above sizes it). Suggests the bounded queue,
  about twice the workers, then caller-runs.
- ``fewer_workers``: a pool whose size the traces show rising while its
  wait p95 rose 1.5x or more: more concurrency made queueing worse.
  Suggests the smaller size, with the bounded queue.
- ``isolate_tool``: a slow tool (exec p50 at least 10x the others') holding
  most of a shared pool's worker time while the other tools wait in its
  queue longer than they run. Suggests a pool of its own (of processes when
  it is CPU-bound), capped as above.
- ``batch_calls``: a tool called in bursts of concurrent calls (each call
  within 50 ms of the previous and in flight while an earlier one of the
  burst was, or from another trace; 3 or more calls) for at least 30% of
  its calls, 3 bursts or more. Suggests one batched call per burst, the
  window from the p50 (a tenth of the tool's duration p50). A
  sequential loop is no burst: batching joins concurrent callers only.
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
- ``offload_or_bound``: a tool only ever called directly (in its caller's
  thread) that held the GPU idle 1 s or more while executing, and that no
  rule above already tells how to offload. Suggests a pool of its own
  awaited with ``.aio()``, or a timeout (the one ``set_timeout`` computes).
- ``hidden_retries``: a tool with no retries of the toolkit's whose calls
  went on after failures inside them (``exception`` events on its span,
  failed child spans, failed nested tool calls retried under it), 2 calls or more and 1 s of exec time or more until
  their last failure; says when the waits between attempts grew (a
  back-off). Suggests the toolkit's retries: a per-attempt timeout, one
  retry at a fixed interval (a back-off stretches the stall the GPU waits
  through).
- ``overlap_tool_with_gpu``: from utilization samples (a GPU log), a tool
  blamed for at least 1 GPU-second and 10% of a GPU's unused capacity,
  during whose calls that GPU ran at least 20 points below its utilization
  the rest of the time (95% -> 30% while it runs). The GPU waits on the
  tool: keep it fed while the tool runs, or make the tool shorter.

No two recommendations contradict each other: where two rules fire on the
same tool or pool and one's advice covers the other's, ``SUPERSEDES`` drops
the other (the slow tool's own pool, not a bigger shared one), and the
rules that suggest a timeout for a tool suggest the same one.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import numpy as np

from agent_otel.records import NS_PER_S
from agent_otel.remedies.suggest import (
    MIDDLE_TIER_P99S,
    QUEUE_PER_WORKER,
    TIMEOUT_P99S,
    snippet_for,
    suggested_timeout,
)
from agent_otel.report.columns import Names
from agent_otel.spans.decode import UNKNOWN_EXECUTOR
from agent_otel.report.stats import max_overlap, peak_depth, percentile
from agent_otel.report.waits import KIND_CPU, KIND_GIL, KIND_IO
from agent_otel.semconv import EXECUTOR_DIRECT

if TYPE_CHECKING:
    from agent_otel.records import ToolCall
    from agent_otel.spans.calls import CallTable
    from agent_otel.report.analysis import Analysis, ToolStats
    from agent_otel.report.reader import InnerFailures

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
    "offload_or_bound",
    "hidden_retries",
    "bound_queue",
    "fewer_workers",
)

# Executors that are not pools: nothing to size.
NOT_POOLS = (EXECUTOR_DIRECT, UNKNOWN_EXECUTOR)

MIN_CALLS = 20  # a p99 needs at least this many calls
MIN_POOL_CALLS = 5  # a pool's queueing, this many
QUEUE_SHARE = 0.5  # raise_pool_workers: share of call time spent queued
MIN_WAIT_P95_S = 0.010  # ... and a p95 wait worth acting on
TIMEOUT_FACTOR = 4.0  # set_timeout: timeout at least this many p99s
TAIL_FACTOR = 3.0  # set_timeout, no timeout known: p99 at least this many p50s (a long tail)
HUNG_P50S = 20.0  # a call that ran this many times its tool's p50 or longer hung (a long tail is 3-10x)
CUT_BY_TIMEOUT = 0.95  # ... and one that ran this share of its declared timeout or more was cut by it
UNHEALTHY_OUTCOMES = ("timeout", "cancelled")  # timed out; still running at shutdown, or cancelled
SLOW_FACTOR = 10.0  # isolate_tool: exec p50 at least this many times the others'
MIN_SLOW_CALLS = 5
SLOW_WORKER_SHARE = 0.5  # ... and at least this share of the pool's worker time
BURST_GAP_S = 0.050  # batch_calls: a call this soon after the previous joins its burst
MIN_BURST = 3
MIN_BURSTS = 3
BURST_SHARE = 0.3
BATCH_WINDOW_P50_SHARE = 0.1  # batch_calls: the window, this share of the tool's p50 (a lone call waits that long)
MIN_BATCH_WINDOW_S = 0.001  # ... whole milliseconds, 1 at least
QUEUE_RISE = 1.5  # fewer_workers: wait p95 at least this many times what it was with fewer workers
IO_WORKERS_PER_CORE = 4  # worker cap: 2-4 x cores for I/O pools (the top of it) ...
CPU_WORKERS_PER_CORE = 1  # ... about the core count for CPU-bound ones
THREAD_CEILING = 200  # ... and, cores unknown, past about 200 threads p99 gets worse
MIN_HIDDEN_RETRY_CALLS = 2  # hidden_retries: calls that went on after a failure inside them
MIN_HIDDEN_RETRY_S = 1.0  # ... and the exec seconds until their last such failure, in all
BACKOFF_GROWTH = 1.5  # each wait between failed attempts at least this many times the previous: back-off
SUGGESTED_RETRY_INTERVAL_S = 0.1  # the fixed interval hidden_retries suggests
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


def recommend(analysis: Analysis, names: Optional[dict[str, Names]] = None) -> list[Recommendation]:
    """Every recommendation the data supports, grouped by kind, none that
    another one supersedes (``SUPERSEDES``). ``names``: columns of the call
    table's names already made (``Names`` by column: ``tool``, ...)."""
    return resolve(candidates(analysis, names))


def candidates(analysis: Analysis, names: Optional[dict[str, Names]] = None) -> list[Recommendation]:
    """What each rule finds on its own, before ``resolve``."""
    facts = _Facts(analysis, names)
    return [
        *_raise_pool_workers(analysis, facts),
        *_bound_queue(analysis, facts),
        *_fewer_workers(analysis, facts),
        *_set_timeout(analysis, facts),
        *_isolate_tool(analysis, facts),
        *_batch_calls(analysis, facts),
        *_idle_not_tools(analysis),
        *_waits(analysis, facts),
        *_hidden_retries(analysis, facts),
        *_overlap_tool_with_gpu(analysis),
    ]


# (winner, loser, where they meet: the same "tool" or the same "pool"): where
# both fire, the loser is dropped; the winner's advice covers it, and the two
# together would read as two different fixes.
SUPERSEDES = (
    # more workers made the queue worse: not more of them, nor a queue bound at the larger count
    ("fewer_workers", "raise_pool_workers", "pool"),
    ("fewer_workers", "bound_queue", "pool"),
    # with workers for every call in flight (or the slow tool's own pool) the queue no longer grows
    ("raise_pool_workers", "bound_queue", "pool"),
    ("isolate_tool", "bound_queue", "pool"),
    # the slow tool's own pool is the fix, not a bigger shared one
    ("isolate_tool", "raise_pool_workers", "pool"),
    # its own pool already follows its kind (threads for I/O, processes for CPU)
    ("isolate_tool", "use_process_pool", "tool"),
    ("isolate_tool", "use_async_io", "tool"),
    # off the loop, with a pool that follows its kind
    ("offload_from_loop", "use_process_pool", "tool"),
    ("offload_from_loop", "use_async_io", "tool"),
    ("offload_from_loop", "offload_or_bound", "tool"),
    # a direct call's offload, said for its kind
    ("use_process_pool", "offload_or_bound", "tool"),
    ("use_async_io", "offload_or_bound", "tool"),
    # the same timeout, with the pool or the retries that go with it
    ("offload_or_bound", "set_timeout", "tool"),
    ("hidden_retries", "set_timeout", "tool"),
)


def resolve(found: list[Recommendation]) -> list[Recommendation]:
    """``found`` less the recommendations another one in it supersedes, the
    pairs taken in ``SUPERSEDES`` order: a dropped one supersedes nothing."""

    def where(rec: Recommendation, scope: str) -> Optional[str]:
        return rec.evidence.get("executor" if scope == "pool" else "tool")

    kept = list(found)
    for winner, loser, scope in SUPERSEDES:
        places = {where(rec, scope) for rec in kept if rec.kind == winner} - {None}
        if places:
            kept = [rec for rec in kept if not (rec.kind == loser and where(rec, scope) in places)]
    return kept


@dataclass
class TimeoutAdvice:
    """The one timeout the rules suggest for a tool (set_timeout,
    offload_or_bound, hidden_retries agree on it)."""

    timeout_s: float
    p99_s: float
    p50_s: float
    factor: float  # of p99: 2, or 1.5 for a middle tier
    middle_tier: bool  # the tool is called from inside another tool's call
    calls: int  # the calls the percentiles are over: the healthy ones
    clean_only: bool  # over the calls with no failure inside (the tool retries inside its code)
    unhealthy: int  # the tool's calls left out: timed out, cancelled, cut by its timeout, hung
    cut: int  # the tool's calls that took longer than the timeout: it would have cut them


class _Facts:
    """What several rules read: each tool's timeout advice and kind of wait,
    the worker cap, the calls with failures inside them, the table's
    columns of names as codes and their groups of rows (made once)."""

    def __init__(self, analysis: Analysis, names: Optional[dict[str, Names]] = None):
        self.analysis = analysis
        self.inner = analysis.inner_failures
        self._timeouts: dict[str, Optional[TimeoutAdvice]] = {}
        self._healthy: Optional[dict[str, Sequence[float]]] = None
        # (those given, where they are of this table: as many rows)
        self._names = {column: made for column, made in (names or {}).items() if len(made.codes) == len(analysis.calls)}
        self._groups: dict[str, dict[str, np.ndarray]] = {}
        self._unhealthy: dict[str, int] = {}
        self._kinds = {tool.tool: (tool.cpu.kind if tool.cpu is not None else None) for tool in analysis.tools}
        # The tools that retry inside their code: the durations of their calls with no failure inside.
        self._clean: dict[str, list[float]] = {}
        if self.inner:
            keys = [call.trace_id << 64 | call.span_id for call in analysis.calls]
            retried = {call.tool for call, key in zip(analysis.calls, keys) if key in self.inner}
            self._clean = {tool: [] for tool in retried}
            for call, key in zip(analysis.calls, keys):
                if call.tool in retried and key not in self.inner:
                    self._clean[call.tool].append((call.end_ns - call.submit_ns) / NS_PER_S)

    def names(self, column: str) -> Names:
        """A column of names of the call table (``tool``, ``executor``, ``outcome``) as codes."""
        names = self._names.get(column)
        if names is None:
            calls = self.analysis.calls
            names = self._names[column] = Names(calls.column(column), len(calls))
        return names

    def groups(self, column: str) -> dict[str, np.ndarray]:
        """Each name of the column -> its rows, ascending (by submit time), in order of first appearance."""
        groups = self._groups.get(column)
        if groups is None:
            groups = self._groups[column] = dict(self.names(column).groups())
        return groups

    def timeout(self, tool: ToolStats) -> Optional[TimeoutAdvice]:
        if tool.tool not in self._timeouts:
            self._timeouts[tool.tool] = self._timeout(tool)
        return self._timeouts[tool.tool]

    def _timeout(self, tool: ToolStats) -> Optional[TimeoutAdvice]:
        clean_only = tool.tool in self._clean
        durations = self.healthy(tool, self._clean[tool.tool] if clean_only else None)
        if len(durations) < MIN_CALLS:
            return None
        p99 = percentile(durations, 99)
        if p99 <= 0:
            return None
        middle = tool.tool in self.analysis.nested_tools
        factor = MIDDLE_TIER_P99S if middle else TIMEOUT_P99S
        timeout_s = suggested_timeout(p99, factor)
        return TimeoutAdvice(
            timeout_s=timeout_s,
            p99_s=p99,
            p50_s=percentile(durations, 50),
            factor=factor,
            middle_tier=middle,
            calls=len(durations),
            clean_only=clean_only,
            unhealthy=self._unhealthy.get(tool.tool, 0),
            cut=tool.calls - bisect_right(tool.duration_s, timeout_s),
        )

    def healthy(self, tool: ToolStats, clean: Optional[list[float]]) -> Sequence[float]:
        """The sorted durations of the tool's healthy calls (of those with no
        failure inside, when ``clean`` gives them): not timed out or cancelled
        (nor still running at shutdown), not cut by a declared timeout (at
        ``CUT_BY_TIMEOUT`` of it or more), and not hung (``HUNG_P50S`` x the
        p50 of the rest or more)."""
        if self._healthy is None:
            self._healthy = self._healthy_durations()
        durations: Sequence[float] = sorted(clean) if clean is not None else self._healthy.get(tool.tool, [])
        if tool.timeout_s is not None:
            durations = durations[: bisect_left(durations, CUT_BY_TIMEOUT * tool.timeout_s)]
        if durations:
            durations = durations[: bisect_left(durations, HUNG_P50S * percentile(durations, 50))]
        self._unhealthy[tool.tool] = tool.calls - len(durations) if clean is None else 0
        return durations

    def _healthy_durations(self) -> dict[str, Sequence[float]]:
        """Each tool's sorted call durations (``array("d")``: 8 bytes each, no
        float objects), timed-out and cancelled calls left out."""
        calls = self.analysis.calls
        outcomes = self.names("outcome")
        bad = [code for code, name in outcomes.name_of.items() if name in UNHEALTHY_OUTCOMES]
        kept = ~np.isin(outcomes.codes, bad) if bad else np.ones(len(calls), bool)
        seconds = (np.frombuffer(calls.end_ns, np.uint64) - np.frombuffer(calls.submit_ns, np.uint64)) / NS_PER_S
        # A tool with every call kept: its statistics' sorted durations, the
        # same doubles where exact (below 2**53 ns), not sorted again.
        sorted_already = {
            tool.tool: tool.duration_s
            for tool in self.analysis.tools
            if not len(tool.duration_s) or tool.duration_s[-1] < _EXACT_NS / NS_PER_S / 2
        }
        healthy = {}
        for tool, rows in self.groups("tool").items():
            mine = rows[kept[rows]]
            durations = sorted_already.get(tool)
            if durations is None or len(durations) != len(rows) or len(mine) != len(rows):
                durations = _doubles(np.sort(seconds[mine]))
            healthy[tool] = durations
        return healthy

    def kind(self, tool: str) -> Optional[str]:
        return self._kinds.get(tool)

    def worker_cap(self, tools: Iterable[str]) -> tuple[int, bool, str]:
        """(the most workers to suggest, whether the calls are CPU-bound, why that many)."""
        cpu_bound = any(self.kind(tool) in (KIND_CPU, KIND_GIL) for tool in tools)
        cores = self.analysis.cpu_count
        if cores is None:
            return THREAD_CEILING, cpu_bound, f"the agent's core count is unknown: past about {THREAD_CEILING} threads"
        if cpu_bound:
            cap = max(1, CPU_WORKERS_PER_CORE * cores)
            return cap, True, f"about the core count ({cores}) for CPU-bound calls"
        cap = max(1, IO_WORKERS_PER_CORE * cores)
        return cap, False, f"{IO_WORKERS_PER_CORE} x {cores} cores for I/O"


def _s(seconds: float) -> float:
    return round(seconds, 6)


def _g(seconds: float) -> str:
    """Seconds for a message: two significant digits is what a reader acts on
    (whole seconds from 100 on, never 1e+02)."""
    return f"{seconds:.0f}" if abs(seconds) >= 100 else f"{seconds:.2g}"


def _raise_pool_workers(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
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
        in_flight: dict[str, list[tuple[int, int]]] = {}
        for call in analysis.calls:
            if call.executor == pool.executor:
                waits[call.tool] = waits.get(call.tool, 0.0) + call.queue_seconds
                in_flight.setdefault(call.tool, []).append((call.submit_ns, call.end_ns))
        most_waiting = max(waits, key=lambda tool: (waits[tool], tool))
        needed = pool.peak_in_flight
        cap, cpu_bound, why = facts.worker_cap(pool.tools)
        workers = min(needed, cap)
        split = needed > cap
        split_tool = most_waiting if split and len(pool.tools) > 1 else None
        split_workers = min(max_overlap(in_flight[most_waiting]), cap) if split_tool else None
        waited = (
            f"its calls spent {pool.queue_total_s / total:.0%} of their time waiting in its queue "
            f"(wait p95 {_g(pool.wait_p95_s)} s, up to {pool.max_queue_depth} queued) while at most "
            f"{pool.max_concurrent_exec} ran at once"
        )
        if not split:
            message = (
                f'pool="{pool.executor}" with {workers} workers: {waited}; {needed} calls were in flight at '
                f'the peak. Or give tool="{most_waiting}", which waited longest, a pool of its own.'
            )
        else:
            rest = (
                f'split the pool: give tool="{split_tool}", which waited longest, a pool of its own '
                f"({split_workers} workers)"
                if split_tool
                else "overlap the rest of its waits with async code (.aio() or an async client) or spread "
                "the calls over processes"
            )
            message = (
                f'pool="{pool.executor}" with {workers} workers, not {needed}: {waited}, and {needed} calls were '
                f"in flight at the peak, but past {cap} workers ({why}) more threads make p99 worse, not "
                f"better. Rather than one giant pool, {rest}."
            )
        found.append(
            Recommendation(
                kind="raise_pool_workers",
                subject=pool.executor,
                message=message,
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
                    "cores": analysis.cpu_count,
                    "cpu_bound": cpu_bound,
                    "worker_cap": cap,
                    "suggested_workers": workers,
                    "split_tool": split_tool,
                    "split_tool_workers": split_workers,
                },
            )
        )
    return found


def _pool_rows(facts: _Facts) -> dict[str, np.ndarray]:
    """Each pool's rows of the call table (not ``direct`` nor ``unknown``)."""
    return {
        executor: rows
        for executor, rows in facts.groups("executor").items()
        if executor not in NOT_POOLS and len(rows) >= MIN_POOL_CALLS
    }


def _bound_queue(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    """A pool of known size whose queue held more than about twice its
    workers: bound it there, and have the caller run what does not fit."""
    found = []
    calls = analysis.calls
    submit, end = np.frombuffer(calls.submit_ns, np.uint64), np.frombuffer(calls.end_ns, np.uint64)
    by_pool = {pool.executor: pool for pool in analysis.executors}
    for executor, rows in sorted(_pool_rows(facts).items()):
        pool = by_pool.get(executor)
        workers = pool.max_workers if pool is not None else None
        if not workers or pool is None:
            continue
        limit = QUEUE_PER_WORKER * workers
        if pool.max_queue_depth <= limit:
            continue
        # outstanding (requested, not finished) in the pool when each call was requested
        submits, ends = np.sort(submit[rows], kind="stable"), np.sort(end[rows], kind="stable")  # (nearly sorted)
        outstanding = np.searchsorted(submits, submit[rows], "left") - np.searchsorted(ends, submit[rows], "right")
        caller_runs = int((outstanding >= workers + limit).sum())
        found.append(
            Recommendation(
                kind="bound_queue",
                subject=executor,
                message=(
                    f'bound the queue of pool="{executor}" at about twice its {workers} workers, then caller-runs: '
                    f"up to {pool.max_queue_depth} calls waited in it at once ({pool.max_queue_depth / workers:.1f}x "
                    f"its workers; wait p95 {_g(pool.wait_p95_s)} s). With queue_limit={limit} the {caller_runs} of "
                    f"its {len(rows)} calls that found {workers + limit} or more outstanding would have run in their "
                    "caller's thread (back-pressure: the caller slows down instead of queueing without bound)."
                ),
                evidence={
                    "executor": executor,
                    "workers": workers,
                    "submissions": len(rows),
                    "max_queue_depth": pool.max_queue_depth,
                    "queued_calls": pool.queued_calls,
                    "wait_p95_s": _s(pool.wait_p95_s),
                    "suggested_queue_limit": limit,
                    "queue_limit_per_worker": QUEUE_PER_WORKER,
                    "calls_caller_runs": caller_runs,
                },
            )
        )
    return found


def _fewer_workers(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    """A pool whose size the traces show rising (``agent.executor.max_workers``)
    while its calls waited longer: more concurrency made queueing worse (a
    backend, a lock or the GIL is the limit, not the workers)."""
    found: list[Recommendation] = []
    calls = analysis.calls
    workers_of = calls.executor_workers
    if workers_of is None:
        return found
    submit = np.frombuffer(calls.submit_ns, np.uint64)
    start = np.frombuffer(calls.start_ns, np.uint64)
    end = np.frombuffer(calls.end_ns, np.uint64)
    size_of = np.fromiter((size or 0 for size in workers_of), np.int64, len(calls))
    for executor, rows in sorted(_pool_rows(facts).items()):
        sized = size_of[rows]
        by_size = {int(size): rows[sized == size] for size in np.unique(sized) if size > 0}
        # each size by when it was first seen, with enough calls to tell a queue
        sizes = sorted((int(submit[mine].min()), size) for size, mine in by_size.items() if len(mine) >= MIN_POOL_CALLS)
        if len(sizes) < 2:
            continue
        stats = {}
        for _, size in sizes:
            mine = by_size[size]
            stats[size] = (
                len(mine),
                percentile(np.sort((start[mine] - submit[mine]) / NS_PER_S).tolist(), 95),
                percentile(np.sort((end[mine] - start[mine]) / NS_PER_S).tolist(), 50),
            )
        # the first rise (in time) after which calls waited longer
        rise = next(
            (
                (a, b)
                for (_, a), (_, b) in zip(sizes, sizes[1:])
                if b > a and stats[b][1] >= MIN_WAIT_P95_S and stats[b][1] >= QUEUE_RISE * stats[a][1]
            ),
            None,
        )
        if rise is None:
            continue
        before, after = rise
        (calls_before, wait_before, exec_before), (calls_after, wait_after, exec_after) = stats[before], stats[after]
        slower = (
            f", and each call ran longer (exec p50 {_g(exec_before)} s -> {_g(exec_after)} s): what the calls wait "
            "on is saturated"
            if exec_after > exec_before
            else ""
        )
        found.append(
            Recommendation(
                kind="fewer_workers",
                subject=executor,
                message=(
                    f'pool="{executor}" went from {before} to {after} workers and its calls queued longer, not '
                    f"shorter: wait p95 {_g(wait_before)} s over {calls_before} calls -> {_g(wait_after)} s over "
                    f"{calls_after}{slower}. Raising concurrency made queueing worse: go back to {before} workers "
                    f"and bound the queue at about twice them (queue_limit={QUEUE_PER_WORKER * before}), the caller "
                    "running what does not fit."
                ),
                evidence={
                    "executor": executor,
                    "workers_before": before,
                    "workers_after": after,
                    "calls_before": calls_before,
                    "calls_after": calls_after,
                    "wait_p95_before_s": _s(wait_before),
                    "wait_p95_after_s": _s(wait_after),
                    "exec_p50_before_s": _s(exec_before),
                    "exec_p50_after_s": _s(exec_after),
                    "suggested_workers": before,
                    "suggested_queue_limit": QUEUE_PER_WORKER * before,
                },
            )
        )
    return found


def _set_timeout(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    """A declared timeout far above p99, or none at all on a tool with a long
    tail; the timeout from the p99 of the healthy calls (``_Facts.healthy``)."""
    found = []
    for tool in analysis.tools:
        advice = facts.timeout(tool)
        if advice is None:
            continue
        p99, suggested = advice.p99_s, advice.timeout_s
        healthy = f"{advice.calls} healthy calls"
        if tool.timeout_s is not None:
            if tool.timeout_s < TIMEOUT_FACTOR * p99:
                continue
            why = (
                f"its timeout of {_g(tool.timeout_s)} s is {tool.timeout_s / p99:.0f}x the p99 of its {healthy}, "
                "so a hung call holds its worker that long"
            )
        else:
            all_p50, all_p99 = percentile(tool.duration_s, 50), percentile(tool.duration_s, 99)
            if all_p99 < TAIL_FACTOR * all_p50:
                continue
            why = (
                f"it has no timeout and a long tail (p99 {all_p99 / all_p50:.1f}x its p50 of "
                f"{_g(all_p50)} s over {tool.calls} calls), so a hung call holds the agent, and the "
                "GPU waiting on it, as long as it hangs"
            )
        left_out = (
            f" ({advice.unhealthy} left out: timed out, cancelled, cut by its timeout, or hung at "
            f"{HUNG_P50S:g}x the p50 or longer)"
            if advice.unhealthy
            else ""
        )
        tier = (
            f" ({advice.factor:g}x p99: it is called from inside another tool's call, so its timeout must "
            "fire before its caller's)"
            if advice.middle_tier
            else ""
        )
        found.append(
            Recommendation(
                kind="set_timeout",
                subject=tool.tool,
                message=(
                    f'tool="{tool.tool}" timeout={_g(suggested)} s from p99 {_g(p99)} s of its {healthy}'
                    f"{left_out}{tier}: {why}; it would have cut {advice.cut} of its {tool.calls} calls."
                ),
                evidence={
                    "tool": tool.tool,
                    "calls": tool.calls,
                    "timeout_s": tool.timeout_s,
                    "healthy_calls": advice.calls,
                    "unhealthy_calls": advice.unhealthy,
                    "duration_p50_s": _s(advice.p50_s),
                    "duration_p99_s": _s(p99),
                    "timeout_factor": advice.factor,
                    "middle_tier": advice.middle_tier,
                    "suggested_timeout_s": suggested,
                    "calls_over_suggested": advice.cut,
                },
            )
        )
    return found


def _isolate_tool(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    calls = analysis.calls
    submits, starts, ends = (
        np.frombuffer(column, np.uint64) for column in (calls.submit_ns, calls.start_ns, calls.end_ns)
    )
    tools = facts.names("tool")
    by_pool: dict[str, dict[str, np.ndarray]] = {}  # pool -> tool -> its calls' rows (ascending)
    for executor, rows in facts.groups("executor").items():
        if executor not in NOT_POOLS:
            codes = tools.codes[rows]
            order = np.argsort(codes, kind="stable")  # (a radix sort of the byte codes)
            ordered = codes[order]
            runs = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if len(rows) else order
            first = order[runs]  # each tool's first row in the pool
            by_pool[executor] = {
                tools.name_of[code]: rows[codes == code]
                for code in ordered[runs][np.argsort(first, kind="stable")].tolist()
            }
    found = []
    # (the seconds in numpy, 8 bytes each, not lists of floats, 32: at a
    # million spans three such lists were the report's peak; summed by
    # Python's sum, in the calls' order, as the floats were summed before)
    for pool, by_tool in sorted(by_pool.items()):
        exec_of = {tool: _seconds(ends[rows], starts[rows]) for tool, rows in by_tool.items()}
        pool_exec = sum(chain.from_iterable(tool_exec.tolist() for tool_exec in exec_of.values()))
        if len(by_tool) < 2 or not pool_exec:
            continue
        for tool, mine in sorted(by_tool.items()):
            share = sum(exec_of[tool].tolist()) / pool_exec
            if len(mine) < MIN_SLOW_CALLS or share < SLOW_WORKER_SHARE:
                continue
            others = np.concatenate([rows for name, rows in by_tool.items() if name != tool])
            slow_p50 = percentile(_doubles(np.sort(exec_of[tool])), 50)
            other_exec = _doubles(np.sort(_seconds(ends[others], starts[others])))
            fast_p50, fast_exec_p95 = percentile(other_exec, 50), percentile(other_exec, 95)
            del other_exec
            fast_wait_p95 = percentile(_doubles(np.sort(_seconds(starts[others], submits[others]))), 95)
            if not (
                slow_p50 >= SLOW_FACTOR * fast_p50 and fast_wait_p95 >= MIN_WAIT_P95_S and fast_wait_p95 > fast_exec_p95
            ):
                continue
            concurrent = peak_depth(starts[mine], ends[mine])
            cap, cpu_bound, why = facts.worker_cap([tool])
            workers = min(concurrent, cap)
            ratio = f"{slow_p50 / fast_p50:.0f}x" if fast_p50 else "far above"
            kind = "a process pool" if cpu_bound else "its own pool"
            capped = f" (not {concurrent}: {why})" if workers < concurrent else ""
            found.append(
                Recommendation(
                    kind="isolate_tool",
                    subject=tool,
                    message=(
                        f'give tool="{tool}" {kind} with {workers} workers{capped}: it held {share:.0%} of '
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
                        "max_concurrent_exec": concurrent,
                        "wait_kind": facts.kind(tool),
                        "processes": cpu_bound,
                        "worker_cap": cap,
                        "suggested_workers": workers,
                    },
                )
            )
    return found


# Below 2**63 a time is an int64; below 2**53 ns a double holds every int exactly.
_INT64, _EXACT_NS = 1 << 63, 1 << 53


def _seconds(later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """``(later - earlier) / NS_PER_S`` of two columns of ns (``uint64``), each
    the same double as on Python ints (exact operands below 2**53: see
    ``columns.seconds_sorted``), negative where ``later`` is earlier."""
    if not len(later):
        return np.zeros(0)
    if int(max(later.max(), earlier.max())) < _INT64:
        ns = later.astype(np.int64) - earlier.astype(np.int64)
        if int(np.abs(ns).max()) < _EXACT_NS:
            return ns / NS_PER_S
    return np.array([(b - a) / NS_PER_S for b, a in zip(later.tolist(), earlier.tolist())], np.float64)


def _doubles(values: np.ndarray) -> array:
    """Doubles as an ``array("d")``: a sequence of Python floats, 8 bytes each."""
    found = array("d")
    found.frombytes(np.ascontiguousarray(values, np.float64).tobytes())
    return found


def _batch_calls(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    by_tool = facts.groups("tool")  # tool -> its calls' rows, by submit time
    gap_ns = round(BURST_GAP_S * NS_PER_S)
    durations = {tool.tool: tool.duration_s for tool in analysis.tools}
    submits = analysis.calls.submit_ns
    found = []
    for tool in sorted(by_tool):
        calls = by_tool[tool]
        runs = [run for run in _bursts(analysis.calls, calls, gap_ns) if len(run) >= MIN_BURST]
        bursts = [len(run) for run in runs]
        in_bursts = sum(bursts)
        if len(bursts) < MIN_BURSTS or in_bursts < BURST_SHARE * len(calls):
            continue
        saved = in_bursts - len(bursts)
        # The window from the p50: a tenth of a typical call, so that the wait
        # for a batch (a lone call waits the whole window) stays small beside it.
        p50 = percentile(durations[tool], 50) if tool in durations else 0.0
        window = min(BURST_GAP_S, max(MIN_BATCH_WINDOW_S, round(BATCH_WINDOW_P50_SHARE * p50, 3)))
        window_ns = round(window * NS_PER_S)
        joined = sum(1 for run in runs for row in run if submits[row] - submits[run[0]] <= window_ns)
        found.append(
            Recommendation(
                kind="batch_calls",
                subject=tool,
                message=(
                    f'batch tool="{tool}": {in_bursts} of {len(calls)} calls came in {len(bursts)} bursts of '
                    f"concurrent calls (each call within {BURST_GAP_S * 1000:.0f} ms of the previous, while "
                    f"another was in flight or from another trace; up to {max(bursts)} per burst); one batched "
                    f"call per burst would make {saved} fewer calls. A window of {window * 1000:g} ms, "
                    f"{BATCH_WINDOW_P50_SHARE:.0%} of its p50 of {_g(p50)} s (a lone call waits that long), "
                    f"joins {joined} of the {in_bursts} calls of the bursts."
                ),
                evidence={
                    "tool": tool,
                    "calls": len(calls),
                    "bursts": len(bursts),
                    "calls_in_bursts": in_bursts,
                    "largest_burst": max(bursts),
                    "median_burst": percentile(sorted(bursts), 50),
                    "burst_gap_s": BURST_GAP_S,
                    "calls_saved": saved,
                    "duration_p50_s": _s(p50),
                    "window_p50_share": BATCH_WINDOW_P50_SHARE,
                    "suggested_window_s": window,
                    "calls_joined_by_window": joined,
                },
            )
        )
    return found


def _bursts(table: CallTable, rows: np.ndarray, gap_ns: int) -> list[list[int]]:
    """The runs (their rows) of two calls or more (of these rows of the table,
    by submit time) that a batch window of ``gap_ns`` would join: each
    requested within ``gap_ns`` of the previous and concurrent with it, in
    flight while an earlier call of the run was, or from another trace
    (another turn or session; a direct call on the same thread is the same
    caller). A sequential loop, each call after the previous answered, waits
    for each result: a batch window would only delay it. (Read from the
    columns: no record is made.)

    A call requested more than ``gap_ns`` after the previous one starts a
    run whatever else holds: those are found in numpy, and only the
    stretches of calls between them are walked in Python."""
    if not len(rows):
        return []
    submitted = np.frombuffer(table.submit_ns, np.uint64)[rows]
    # pair k (calls k and k + 1) may join unless the second came later than the gap
    apart = (submitted[1:] >= submitted[:-1]) & (submitted[1:] - submitted[:-1] > gap_ns)
    may_join = np.flatnonzero(~apart)
    runs: list[list[int]] = []
    if not len(may_join):
        return runs
    for stretch in np.split(may_join, np.flatnonzero(np.diff(may_join) != 1) + 1):
        runs.extend(_runs(table, rows[int(stretch[0]) : int(stretch[-1]) + 2].tolist(), gap_ns))
    return runs


def _runs(table: CallTable, rows: list[int], gap_ns: int) -> list[list[int]]:
    """``_bursts`` over these rows, one call at a time."""
    submits, ends, executors = table.submit_ns, table.end_ns, table.executor
    highs, lows = table.trace_id.high, table.trace_id.low
    threads = table.thread  # None while no call names its thread
    runs: list[list[int]] = []
    run: list[int] = []
    previous = -1
    reach = 0  # the latest end in the run so far
    for i in rows:
        if (
            previous >= 0
            and submits[i] - submits[previous] <= gap_ns
            and (
                submits[i] < reach
                or (
                    (lows[previous] != lows[i] or highs[previous] != highs[i])
                    and not (
                        executors[previous] == executors[i] == EXECUTOR_DIRECT
                        and threads is not None
                        and threads[previous] is not None
                        and threads[previous] == threads[i]
                    )
                )
            )
        ):
            run.append(i)
        else:
            if len(run) > 1:
                runs.append(run)
            run = [i]
            reach = 0
        reach = max(reach, ends[i])
        previous = i
    if len(run) > 1:
        runs.append(run)
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


def _waits(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    """offload_from_loop, use_process_pool and use_async_io, offload_or_bound."""
    found = []
    for tool in analysis.tools:
        loop = tool.loop
        if loop is None or loop.blocked_s < MIN_LOOP_BLOCKED_S:
            continue
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
        if cpu is None or tool.blocked_exec_s < MIN_EXEC_IDLE_S:
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
    found.extend(_offload_or_bound(analysis, facts))
    return found


def _offload_or_bound(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    """A tool called directly (in its caller's thread) that held the GPU idle while executing."""
    found = []
    for tool in analysis.tools:
        if tool.executors != [EXECUTOR_DIRECT] or tool.blocked_exec_s < MIN_EXEC_IDLE_S:
            continue
        advice = facts.timeout(tool)
        kind = facts.kind(tool.tool)
        cpu_bound = kind in (KIND_CPU, KIND_GIL)
        offload = (
            "a process pool of its own (it is CPU-bound)" if cpu_bound else "a pool of its own, awaited with .aio()"
        )
        bound = (
            f"timeout={_g(advice.timeout_s)} s ({advice.factor:g}x its p99 of {_g(advice.p99_s)} s), one retry "
            "and a fallback, so a slow call stops holding the GPU"
            if advice is not None
            else f"a timeout near 2x its p99 (its {tool.calls} calls are too few to tell a p99)"
        )
        found.append(
            Recommendation(
                kind="offload_or_bound",
                subject=tool.tool,
                message=(
                    f'offload tool="{tool.tool}" or bound it: all {tool.calls} of its calls ran in their caller\'s '
                    f"thread (executor direct), and the GPU was held idle {_g(tool.blocked_exec_s)} GPU-s while "
                    f"they executed, with nothing else of the agent running meanwhile. Offload it to {offload}, "
                    f"so the agent does other work while it runs, or bound it: {bound}."
                ),
                evidence={
                    "tool": tool.tool,
                    "calls": tool.calls,
                    "executor": EXECUTOR_DIRECT,
                    "gpu_idle_blocked_exec_s": _s(tool.blocked_exec_s),
                    "wait_kind": kind,
                    "duration_p99_s": None if advice is None else _s(advice.p99_s),
                    "timeout_factor": None if advice is None else advice.factor,
                    "suggested_timeout_s": None if advice is None else advice.timeout_s,
                },
            )
        )
    return found


def _hidden_retries(analysis: Analysis, facts: _Facts) -> list[Recommendation]:
    """Failures inside a plain tool's calls that the call went on after: retries in its own code."""
    if not analysis.inner_failures:
        return []
    by_tool: dict[str, list[tuple[ToolCall, InnerFailures]]] = {}
    for call in analysis.calls:
        inner = analysis.inner_failures.get(call.trace_id << 64 | call.span_id)
        if inner is not None:
            by_tool.setdefault(call.tool, []).append((call, inner))
    found = []
    for tool in analysis.tools:
        affected = by_tool.get(tool.tool, [])
        if len(affected) < MIN_HIDDEN_RETRY_CALLS:
            continue
        failures = events = children = 0
        seconds = 0.0
        names: dict[str, int] = {}
        backoff: list[list[float]] = []
        for call, inner in affected:
            ends = [*inner.exceptions, *(end for _name, _start, end in inner.children)]
            failures += len(ends)
            events += len(inner.exceptions)
            children += len(inner.children)
            seconds += max(0, max(ends) - call.start_ns) / NS_PER_S
            for name, _start, _end in inner.children:
                names[name] = names.get(name, 0) + 1
            waits = _retry_waits(inner)
            if _grows(waits):
                backoff.append(waits)
        if seconds < MIN_HIDDEN_RETRY_S:
            continue
        exec_total = sum(tool.exec_s)
        advice = facts.timeout(tool)
        source = " and ".join(
            part
            for part in (
                f"{events} exception events on its spans" if events else "",
                f"{children} failed child spans ({', '.join(sorted(names, key=lambda n: (-names[n], n))[:3])})"
                if children
                else "",
            )
            if part
        )
        seen_backoff = (
            f"; the waits between failed attempts grew ({', '.join(_g(w) for w in backoff[0])} s): a back-off, "
            "which stretches exactly the stall the GPU waits through"
            if backoff
            else ""
        )
        timeout = (
            f"timeout={_g(advice.timeout_s)} s per attempt ({advice.factor:g}x the p99 of the calls with no "
            f"failure inside, {_g(advice.p99_s)} s)"
            if advice is not None
            else "a timeout per attempt near 2x the p99 of a call with no failure inside"
        )
        found.append(
            Recommendation(
                kind="hidden_retries",
                subject=tool.tool,
                message=(
                    f'tool="{tool.tool}" retries inside its own code: {len(affected)} of its {tool.calls} calls '
                    f"went on after {failures} failures inside them ({source}), {_g(seconds)} s of their exec "
                    f"time until the last of them{seen_backoff}. The report counts those attempts and waits as "
                    f"exec time, and the GPU waits through them. Retry with the toolkit instead: {timeout}, "
                    f"retries=1 at a fixed interval of {SUGGESTED_RETRY_INTERVAL_S:g} s and a fallback; a fixed "
                    "interval, because the GPU is waiting for this answer and a back-off would stretch the stall."
                ),
                evidence={
                    "tool": tool.tool,
                    "calls": tool.calls,
                    "calls_with_failures": len(affected),
                    "failures": failures,
                    "exception_events": events,
                    "failed_child_spans": children,
                    "failed_child_names": sorted(names),
                    "failed_attempts_s": _s(seconds),
                    "exec_share": round(seconds / exec_total, 4) if exec_total else None,
                    "backoff_calls": len(backoff),
                    "backoff_waits_s": [_s(w) for w in backoff[0]] if backoff else None,
                    "duration_p99_s": None if advice is None else _s(advice.p99_s),
                    "timeout_factor": None if advice is None else advice.factor,
                    "suggested_timeout_s": None if advice is None else advice.timeout_s,
                    "suggested_retries": 1,
                    "retry_interval_s": SUGGESTED_RETRY_INTERVAL_S,
                },
            )
        )
    return found


def _retry_waits(inner: InnerFailures) -> list[float]:
    """Seconds between one failure inside a call and the next attempt: from
    a failed nested tool call to its retry; else from a failed child span's
    end to the next one's start, or between exception events."""
    if inner.retry_waits:
        return inner.retry_waits
    if len(inner.children) >= 2:
        spans = sorted(inner.children, key=lambda child: child[1])
        return [max(0, b[1] - a[2]) / NS_PER_S for a, b in zip(spans, spans[1:])]
    times = sorted(inner.exceptions)
    return [(b - a) / NS_PER_S for a, b in zip(times, times[1:])]


def _grows(waits: list[float]) -> bool:
    """Two waits or more, each at least ``BACKOFF_GROWTH`` times the one before: a back-off."""
    return len(waits) >= 2 and waits[0] > 0 and all(b >= BACKOFF_GROWTH * a for a, b in zip(waits, waits[1:]))


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
