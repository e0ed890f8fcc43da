"""The tool calls' times and names as numpy columns, from the reader's table (``spans.calls``).

The per-tool and per-executor statistics and the idle windows' filter
(``report.analysis``) read these: the times are views of the table's
columns, the names codes in order of first appearance; then sorts,
groupings and searches inside numpy.

Times are ``uint64`` (the reader keeps every time in [0, 2**64)); a
call's phases never go backwards (submit <= start <= end), so the
differences taken here never wrap.
"""

from __future__ import annotations

from array import array
from itertools import count, repeat
from operator import truediv
from typing import Iterable, Iterator

import numpy as np

from agent_otel.records import NS_PER_S
from agent_otel.spans.calls import CallTable
from agent_otel.spans.ids import distinct

# Up to this many names, a column's groups are found a pass per name (a
# comparison and a search over the codes, linear), not by a sort of them.
_PASSES = 32
# Below this many nanoseconds a double holds every int exactly (see seconds_sorted).
_EXACT_NS = 1 << 53


class Names:
    """A column of names (tools, executors, outcomes): a code per row, 0, 1,
    ... in order of the names' first appearance (so codes in ascending
    order are the names in that order), in the smallest unsigned dtype that
    holds them (a byte a row for up to 256 names)."""

    __slots__ = ("codes", "name_of")

    def __init__(self, names: Iterable[str], rows: int) -> None:
        first: dict[str, int] = {}
        positions = np.fromiter(map(first.setdefault, names, count()), np.int64, rows)  # each name's first row
        firsts = np.fromiter(first.values(), np.int64, len(first))  # ascending: rows in the order met
        dtype = np.uint8 if len(first) <= 1 << 8 else np.uint16 if len(first) <= 1 << 16 else np.uint32
        rank = np.zeros(rows, dtype)  # each first row -> its name's code (a gather, not a search per row)
        rank[firsts] = np.arange(len(first), dtype=dtype)
        self.codes = rank[positions]
        self.name_of = dict(enumerate(first))

    def groups(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, its rows in ascending order), in order of first appearance."""
        codes = self.codes
        if not len(codes):
            return
        if len(self.name_of) <= _PASSES:  # a pass per name: no sort
            for code, name in self.name_of.items():
                yield name, np.flatnonzero(codes == code)
            return
        order = np.argsort(codes, kind="stable")
        cuts = np.flatnonzero(np.diff(codes[order])) + 1
        for rows in np.split(order, cuts):
            yield self.name_of[int(codes[rows[0]])], rows

    def names(self, rows: np.ndarray) -> list[str]:
        """The distinct names of these rows, sorted."""
        return sorted(self.name_of[code] for code in distinct(self.codes[rows]).tolist())


class CallColumns:
    """``submit``, ``start`` and ``end`` (ns, ``uint64``), the tool,
    executor and outcome, and the executor's workers (the records' ints or
    None, in an object column) of each call, row i being ``calls[i]``."""

    __slots__ = ("calls", "submit", "start", "end", "tool", "executor", "outcome", "workers")

    def __init__(self, calls: CallTable) -> None:
        rows = len(calls)
        self.calls = calls
        # (views of the table's own columns, not copies)
        self.submit = np.frombuffer(calls.submit_ns, np.uint64)
        self.start = np.frombuffer(calls.start_ns, np.uint64)
        self.end = np.frombuffer(calls.end_ns, np.uint64)
        self.tool = Names(calls.tool, rows)
        self.executor = Names(calls.executor, rows)
        self.outcome = Names(calls.column("outcome"), rows)
        self.workers = np.array(calls.executor_workers or [None] * rows, object)

    def count_of(self, names: Names, wanted: Iterable[str], rows: np.ndarray) -> int:
        """How many of these rows have one of the wanted names."""
        codes = [code for code, name in names.name_of.items() if name in wanted]
        return int(np.isin(names.codes[rows], codes).sum()) if codes else 0


def seconds_sorted(nanoseconds: np.ndarray) -> array:
    """Sorted seconds as an array of doubles (8 bytes a call): each the
    same double as ``ns / NS_PER_S`` on Python ints (below 2**53 both
    operands are exact doubles, and Python divides them as doubles)."""
    ordered = np.sort(nanoseconds)
    seconds = array("d")
    if len(ordered) and int(ordered[-1]) >= _EXACT_NS:
        seconds.extend(map(truediv, ordered.tolist(), repeat(NS_PER_S, len(ordered))))
    else:
        seconds.frombytes((ordered.astype(np.float64) / NS_PER_S).tobytes())
    return seconds


def total(nanoseconds: np.ndarray) -> int:
    """The exact sum, as a Python int (a uint64 sum could wrap)."""
    if not len(nanoseconds) or int(nanoseconds.max()) < (1 << 63) // len(nanoseconds):
        return int(nanoseconds.sum())
    return sum(nanoseconds.tolist())
