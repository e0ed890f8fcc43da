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


def distinct_ids(*columns: Iterable[int]) -> np.ndarray:
    """Span ids (64-bit), distinct and sorted, 0 (no parent) left out."""
    import numpy as np

    found = distinct(np.concatenate([np.asarray(column, dtype=np.uint64) for column in columns]))
    return found[1:] if len(found) and found[0] == 0 else found


def rows_in(column: array, ids: np.ndarray) -> list[int]:
    """The rows of an id column (an ``array("Q")``) whose id is one of
    ``ids`` (sorted, distinct): a binary search each, in numpy."""
    import numpy as np

    if not len(column) or not len(ids):
        return []
    values = np.frombuffer(column, dtype=np.uint64)
    found = np.searchsorted(ids, values)
    np.minimum(found, len(ids) - 1, out=found)
    return np.flatnonzero(ids[found] == values).tolist()
