"""The two small statistics the report is built on.

Percentiles use linear interpolation between the two nearest ranks
(numpy's default, Hyndman and Fan's type 7): for sorted values x[0..n-1]
and p in 0..100, h = (n - 1) * p / 100 and the result is
x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]).
"""

from __future__ import annotations

import heapq
import math
from typing import Iterable, Sequence

import numpy as np


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    h = (len(sorted_values) - 1) * p / 100.0
    low = math.floor(h)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (h - low) * (sorted_values[high] - sorted_values[low])


def max_overlap(intervals: Iterable[tuple[int, int]]) -> int:
    """The most half-open intervals [a, b) that hold one instant: at a tie,
    an interval ending at t is gone before one starting at t counts, and
    empty intervals never count (``peak_depth``)."""
    starts, ends = [], []
    for a, b in intervals:
        starts.append(a)
        ends.append(b)
    return peak_depth(starts, ends)


def peak_depth(starts: Sequence[int] | np.ndarray, ends: Sequence[int] | np.ndarray) -> int:
    """``max_overlap`` of the intervals ``[starts[i], ends[i])``, given as
    two columns (sequences of ints, or numpy arrays): a sweep over the
    sorted ends, where the depth just after the i-th start (in order) is
    i + 1 minus the ends at or before it; sorts and searches in numpy,
    with no object made per interval: the report runs it on a million
    calls."""
    starts, ends = _ints(starts), _ints(ends)
    nonempty = ends > starts
    if not nonempty.all():
        starts, ends = starts[nonempty], ends[nonempty]
    if not len(starts):
        return 0
    # (stable: a merge sort, linear on the nearly sorted times of calls in
    # the order submitted, where the default sort is n log n whatever the order)
    gone = np.searchsorted(np.sort(ends, kind="stable"), np.sort(starts, kind="stable"), side="right")
    return int((np.arange(1, len(starts) + 1) - gone).max())


def _ints(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """Ints as a numpy array: int64, or Python ints where one does not fit."""
    if isinstance(values, np.ndarray):
        return values
    values = list(values)
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def assign_rows(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """A row for each interval so that intervals in one row never overlap
    (touching ends are fine), using as few rows as the peak overlap: the
    greedy interval-partitioning sweep, reusing the lowest free row."""
    rows = [0] * len(intervals)
    busy: list[tuple[int, int]] = []  # heap of (end, row)
    free: list[int] = []  # heap of rows
    used = 0
    for index in sorted(range(len(intervals)), key=lambda i: intervals[i]):
        start, end = intervals[index]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            row = heapq.heappop(free)
        else:
            row, used = used, used + 1
        rows[index] = row
        heapq.heappush(busy, (max(end, start), row))
    return rows
