"""Idle windows' edges from the model calls' spans (docs/attribution.md, "Edges from the spans").

A GPU's utilization samples each average a sample period (NVML: 1/6 s;
``nvidia-smi dmon -d 2``: 2 s), so an idle window read from them starts
and ends on that grid: a period in which the model stopped computing
half-way reads 50% busy, and the window starts at its end. The model
calls' spans say to the microsecond when the model computed. The rule:

    Where an idle window's edge lies within one sample period of a model
    call's edge (an end, for the window's start; a start, for its end),
    and no model call of the pool is in flight at that instant, the
    window's edge moves to it: the latest such end for the start, the
    earliest such start for the end.

So an edge moves by less than one sample period, only to a model call's
edge, and a window never grows over an instant a model call of its pool
was in flight, nor shrinks to nothing (then it stays as the samples have it).
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from typing import Iterable, Mapping, Sequence

from agent_otel.records import IdleWindow, ModelCall

_OPEN_END = 1 << 63


class _Calls:
    """One pool's model calls: their starts and ends sorted, and the stretches
    at least one of them is in flight (their union)."""

    def __init__(self, calls: Sequence[ModelCall]):
        spans = sorted((call.start_ns, call.end_ns or _OPEN_END) for call in calls)
        self.starts = [start for start, _ in spans]
        self.ends = sorted(end for _, end in spans if end != _OPEN_END)
        self.union_starts: list[int] = []
        self.union_ends: list[int] = []
        for start, end in spans:
            if self.union_ends and start <= self.union_ends[-1]:
                self.union_ends[-1] = max(self.union_ends[-1], end)
            else:
                self.union_starts.append(start)
                self.union_ends.append(end)

    def in_flight_at(self, t: int) -> bool:
        """Whether some call is in flight at ``t`` (``[start, end)``)."""
        i = bisect_right(self.union_starts, t) - 1
        return i >= 0 and t < self.union_ends[i]

    def in_flight_within(self, a: int, b: int) -> bool:
        """Whether some call is in flight at an instant of ``[a, b)``."""
        i = bisect_right(self.union_starts, a) - 1
        if i >= 0 and a < self.union_ends[i]:
            return True
        j = bisect_left(self.union_starts, a)
        return j < len(self.union_starts) and self.union_starts[j] < b


def sharpen(
    windows: Iterable[IdleWindow], models: Iterable[ModelCall], period_ns: Mapping[tuple[str, str], int]
) -> tuple[list[IdleWindow], int]:
    """The windows with their edges moved to the model calls' edges (the
    module's rule), in the order given; and how many edges moved.

    ``period_ns``: each GPU's sample period, by (pool, gpu); a GPU not in
    it keeps its windows as they are.
    """
    by_pool: dict[str, list[ModelCall]] = {}
    for call in models:
        if not call.end_ns or call.end_ns > call.start_ns:
            by_pool.setdefault(call.pool, []).append(call)
    pools = {pool: _Calls(calls) for pool, calls in by_pool.items()}
    result: list[IdleWindow] = []
    moved = 0
    for window in windows:
        calls = pools.get(window.pool)
        period = period_ns.get((window.pool, window.gpu), 0)
        if calls is None or period <= 0:
            result.append(window)
            continue
        start, end = window.start_ns, window.end_ns
        # the start: the latest call end within a period of it
        ends = calls.ends
        i = bisect_left(ends, start + period) - 1
        new_start = start
        while i >= 0 and ends[i] > start - period:
            if ends[i] < end and not calls.in_flight_at(ends[i]) and not calls.in_flight_within(ends[i], start):
                new_start = ends[i]
                break
            i -= 1
        # the end: the earliest call start within a period of it
        starts = calls.starts
        j = bisect_right(starts, end - period)
        new_end = end
        while j < len(starts) and starts[j] < end + period:
            t = starts[j]
            if t > new_start and not calls.in_flight_within(new_start, t):
                new_end = t
                break
            j += 1
        if new_end <= new_start:
            result.append(window)
            continue
        moved += (new_start != start) + (new_end != end)
        if (new_start, new_end) != (start, end):
            window = dataclasses.replace(window, start_ns=new_start, end_ns=new_end)
        result.append(window)
    return result, moved
