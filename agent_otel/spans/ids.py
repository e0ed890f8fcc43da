"""Span ids in bulk, in numpy: what the reader's ``finish`` joins spans by.

numpy is imported where it is first used, not here: the blame service's
start-up (``agent-otel gpu-exporter``) does not load it.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import numpy as np

_SPAN_ID_MASK = (1 << 64) - 1


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: a sort, then each run of equal values kept
    once. Not ``np.unique``: from numpy 2.3 it hashes, a cache miss a value at
    600k random ids (0.46 s against 0.009 for the sort), and its first call
    imports ``numpy.ma`` (about 18 ms, a tenth of a report of 10k spans)."""
    import numpy as np

    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def grouped(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows grouped by their values in ``columns`` (integer arrays of
    one length, each value below 2**64): an order of the rows that puts
    each group's rows together, in row order (the groups themselves in no
    particular order), and where each group starts in it.

    One stable sort on a 64-bit mix of the columns: a lexsort of a trace
    id's two halves and a tool took 0.3 s at 840k rows, this 0.09. Where
    two groups share a mix (never seen with random ids; ids made by hand
    may), a lexsort of the columns themselves."""
    import numpy as np

    count = len(columns[0])
    mixed = np.zeros(count, np.uint64)
    assert len(columns) <= len(_MIXERS), "grouped: at most as many columns as mixers"
    for column, factor in zip(columns, _MIXERS):
        mixed ^= column.astype(np.uint64, copy=False) * np.uint64(factor)
    order = np.argsort(mixed, kind="stable")
    mixed = mixed[order]

    def ends(order: np.ndarray) -> np.ndarray:
        """Where a group ends: a row whose next row, in this order, differs."""
        found = np.zeros(max(count - 1, 0), dtype=bool)
        for column in columns:
            column = column[order]
            found |= column[1:] != column[:-1]
        return found

    last = ends(order)
    if (last & (mixed[1:] == mixed[:-1])).any():  # two groups mixed to one value
        order = np.lexsort(columns[::-1])
        last = ends(order)
    return order, np.flatnonzero(np.concatenate(([True], last))) if count else np.zeros(0, np.intp)


# Odd 64-bit constants (golden-ratio and xxHash primes): each column times its own.
_MIXERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5)


def rows_among(column: array, *ids: Iterable[int]) -> list[int]:
    """The rows of an id column (an array of unsigned 64-bit ints) whose id
    is one of ``ids`` (columns or lists of span ids; 0, no parent, is no id).

    In numpy, without sorting them all: the ids marked in a bitmap by a hash
    (about 4 slots an id, 8 MB at most), the rows whose hash is marked
    checked exactly against the ids that share a slot with one of them (a
    sort of those, a binary search each). With 840k ids against 420k rows,
    as the reader's ``finish`` has at a million spans, a sort of every id
    took 50-80 ms a join."""
    import numpy as np

    if not len(column):
        return []
    wanted = np.concatenate([np.asarray(part, dtype=np.uint64) for part in ids]) if ids else np.zeros(0, np.uint64)
    wanted = wanted[wanted != 0]
    if not len(wanted):
        return []
    values = np.frombuffer(column, dtype=np.uint64)
    bits = min(max((4 * len(wanted)).bit_length(), 10), 23)
    shift = np.uint64(64 - bits)

    def slot(of: np.ndarray) -> np.ndarray:
        return (of * np.uint64(_MIXERS[0])) >> shift  # (the product wraps: the top bits mix every bit)

    marked = np.zeros(1 << bits, dtype=bool)
    marked[slot(wanted)] = True
    maybe = np.flatnonzero(marked[slot(values)])
    if not len(maybe):
        return []
    candidates = values[maybe]
    marked[:] = False
    marked[slot(candidates)] = True
    near = distinct(wanted[marked[slot(wanted)]])
    found = np.searchsorted(near, candidates)
    np.minimum(found, len(near) - 1, out=found)
    return maybe[near[found] == candidates].tolist()
