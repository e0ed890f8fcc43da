"""What each tool waits on, and which tools blocked an event loop.

**CPU share.** A sync call's span carries the CPU time its thread spent
during exec (``agent.tool.exec.cpu_time``). A tool's CPU share is its
calls' CPU time over their exec time, over the calls that carry one:
near 1 the tool computes (it wants a process pool: threads take turns on
the GIL), near 0 it waits (I/O, a lock, a remote service: async or more
threads overlap those waits).

**Alone and in parallel.** Each measured call's *contention* is how many
other threads were busy on the CPU, on average, while it executed: the
sum, over the other measured calls executing at each instant, of their
own CPU share, integrated over the call's exec and divided by its length.
A call is *alone* below 0.1 and *in parallel* from 0.5. A CPU-bound tool
whose share in parallel falls to at most 0.6 of its share alone is
**GIL-bound**: its threads take turns on the interpreter lock, so more
threads make each call slower and only processes run it at once. (An
oversubscribed host lowers the share too: the thread waits for a core;
the evidence names both numbers.)

**Kinds** (``wait_kind``): ``gil`` as above; ``cpu`` at a share of 0.6 or
more (alone, when at least 3 calls ran alone; else over all calls);
``io`` at 0.25 or less; ``mixed`` in between; None with fewer than 3
measured calls.

**Event loops.** ``asyncio.loop.blocked`` spans (``LoopBlock`` records),
summed per tool (None: no tool call held the loop) and per loop thread.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Optional, Sequence

from agent_otel.records import NS_PER_S, LoopBlock, ToolCall
from agent_otel.spans.calls import CallTable

CPU_BOUND_SHARE = 0.6
IO_BOUND_SHARE = 0.25
GIL_COLLAPSE = 0.6  # in parallel, a GIL-bound tool keeps at most this fraction of its share alone
ALONE_BELOW = 0.1  # contention (other busy threads, on average) under which a call ran alone
PARALLEL_FROM = 0.5  # ... and from which it ran in parallel
MIN_KIND_CALLS = 3

KIND_CPU = "cpu"
KIND_GIL = "gil"
KIND_IO = "io"
KIND_MIXED = "mixed"


@dataclass
class _Sums:
    calls: int = 0
    exec_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, exec_s: float, cpu_s: float) -> None:
        self.calls += 1
        self.exec_s += exec_s
        self.cpu_s += cpu_s

    @property
    def share(self) -> Optional[float]:
        return min(1.0, self.cpu_s / self.exec_s) if self.calls and self.exec_s > 0 else None


@dataclass
class CpuStats:
    """One tool's CPU time over its measured calls: all, alone, in parallel."""

    all: _Sums = field(default_factory=_Sums)
    alone: _Sums = field(default_factory=_Sums)
    parallel: _Sums = field(default_factory=_Sums)

    @property
    def share(self) -> Optional[float]:
        return self.all.share

    @property
    def alone_share(self) -> Optional[float]:
        return self.alone.share if self.alone.calls >= MIN_KIND_CALLS else None

    @property
    def parallel_share(self) -> Optional[float]:
        return self.parallel.share if self.parallel.calls >= MIN_KIND_CALLS else None

    @property
    def kind(self) -> Optional[str]:
        if self.all.calls < MIN_KIND_CALLS or self.share is None:
            return None
        alone, parallel = self.alone_share, self.parallel_share
        if alone is not None and parallel is not None and alone >= CPU_BOUND_SHARE and parallel <= GIL_COLLAPSE * alone:
            return KIND_GIL
        share = alone if alone is not None else self.share
        if share >= CPU_BOUND_SHARE:
            return KIND_CPU
        if share <= IO_BOUND_SHARE:
            return KIND_IO
        return KIND_MIXED


def cpu_stats(calls: CallTable) -> dict[str, CpuStats]:
    """Per tool, the CPU time of its calls that carry one, split by contention."""
    starts, ends, cpu_ns = calls.start_ns, calls.end_ns, calls.cpu_ns  # cpu_ns: None while no call has one
    measured = [calls[i] for i, cpu in enumerate(cpu_ns or ()) if cpu is not None and ends[i] > starts[i]]
    stats: dict[str, CpuStats] = {}
    if not measured:
        return stats
    contention = _contention(measured)
    for call, others in zip(measured, contention):
        tool = stats.setdefault(call.tool, CpuStats())
        exec_s, cpu_s = call.exec_seconds, call.cpu_ns / NS_PER_S  # type: ignore[operator]
        tool.all.add(exec_s, cpu_s)
        if others < ALONE_BELOW:
            tool.alone.add(exec_s, cpu_s)
        elif others >= PARALLEL_FROM:
            tool.parallel.add(exec_s, cpu_s)
    return stats


def _contention(calls: list[ToolCall]) -> list[float]:
    """For each call, the other calls' CPU busyness while it executed, on
    average: ∫ (W(t) - its own rate) dt / its exec, where W(t) is the sum
    of the CPU rates (cpu / exec) of the calls executing at t.

    One sort of the exec boundaries; W is constant between them, so its
    integral at any instant is one binary search away.
    """
    rates = [min(1.0, call.cpu_ns / (call.end_ns - call.start_ns)) for call in calls]  # type: ignore[operator]
    events = sorted(
        [(call.start_ns, rate) for call, rate in zip(calls, rates)]
        + [(call.end_ns, -rate) for call, rate in zip(calls, rates)]
    )
    times = [time for time, _ in events]
    level = list(accumulate(change for _, change in events))  # W on [times[i], times[i + 1])
    integral = list(accumulate((level[i] * (times[i + 1] - times[i]) for i in range(len(times) - 1)), initial=0.0))

    def at(time: int) -> float:
        i = bisect_right(times, time) - 1
        return integral[i] + level[i] * (time - times[i]) if i >= 0 else 0.0

    result = []
    for call, rate in zip(calls, rates):
        length = call.end_ns - call.start_ns
        busy = at(call.end_ns) - at(call.start_ns) - rate * length
        result.append(max(0.0, busy / length))
    return result


@dataclass
class LoopBlockStats:
    """The blocks one tool (or no tool: ``tool`` None) caused."""

    tool: Optional[str]
    blocks: int = 0
    blocked_s: float = 0.0
    longest_s: float = 0.0
    threads: set[str] = field(default_factory=set)
    most_waiting: int = 0  # the most tool calls one block kept waiting
    stack: Optional[str] = None  # no tool: the loop thread's stack in the longest block

    def add(self, block: LoopBlock) -> None:
        self.blocks += 1
        self.blocked_s += block.seconds
        if block.seconds >= self.longest_s:
            self.longest_s = block.seconds
            if block.stack is not None:
                self.stack = block.stack
        self.threads.add(block.thread)
        self.most_waiting = max(self.most_waiting, len(block.waiting))


@dataclass
class LoopStats:
    """One event loop (by its thread's name): its blocks, by tool."""

    thread: str
    blocks: int = 0
    blocked_s: float = 0.0
    longest_s: float = 0.0
    by_tool: dict[Optional[str], float] = field(default_factory=dict)


def loop_block_stats(blocks: Sequence[LoopBlock]) -> tuple[dict[Optional[str], LoopBlockStats], list[LoopStats]]:
    """The blocks per blocking tool (None: no tool), and per loop thread
    (most blocked first)."""
    by_tool: dict[Optional[str], LoopBlockStats] = {}
    by_thread: dict[str, LoopStats] = {}
    for block in blocks:
        if not block.end_ns:
            continue
        by_tool.setdefault(block.tool, LoopBlockStats(block.tool)).add(block)
        loop = by_thread.setdefault(block.thread, LoopStats(block.thread))
        loop.blocks += 1
        loop.blocked_s += block.seconds
        loop.longest_s = max(loop.longest_s, block.seconds)
        loop.by_tool[block.tool] = loop.by_tool.get(block.tool, 0.0) + block.seconds
    loops = sorted(by_thread.values(), key=lambda loop: (-loop.blocked_s, loop.thread))
    return by_tool, loops
