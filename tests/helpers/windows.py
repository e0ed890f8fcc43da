"""The plain filter the report's "in some idle window" fast paths are checked against."""

from __future__ import annotations

from bisect import bisect_right
from typing import Sequence, TypeVar

from agent_otel.records import IdleWindow

Record = TypeVar("Record")


def in_windows_by_bisect(records: Sequence[Record], windows: Sequence[IdleWindow], begin: str) -> list[Record]:
    """The records (tool or model calls) that meet some window, a bisect per
    record over the windows' merged edges: ``begin`` names the record's
    first instant (``submit_ns``, ``start_ns``); an end of 0 is still running."""
    edges: list[int] = []
    for window in sorted(windows, key=lambda w: w.start_ns):
        if edges and window.start_ns <= edges[-1]:
            edges[-1] = max(edges[-1], window.end_ns)
        else:
            edges += (window.start_ns, window.end_ns)
    kept = []
    for record in records:
        i = bisect_right(edges, getattr(record, begin))
        end = record.end_ns
        if i % 2 or (i < len(edges) and (not end or end > edges[i])):
            kept.append(record)
    return kept
