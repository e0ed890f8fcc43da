"""The GPUs' unused capacity in the report: ``(1 - utilization) x time``,
blamed on the tool calls by the contract's rule.

Usage (``analysis`` does this for a GPU log)::

    from agent_otel.report.underuse import read_underuse
    windows, underuse = read_underuse(log.steps(threshold, min_idle_s), calls, start_ns, end_ns)

It walks the stretches the idle detector reads from the samples
(``GpuLog.steps``, one chunk at a time, so no list of every stretch is
built), cuts them to the traces' window, and blames each chunk's unused
capacity with ``agent_otel.attribution`` against the calls that overlap it:
the numbers the live ``agent_gpu_underused_*`` counters give for the same
samples and calls. Stretches whose data is missing count apart
(``missing_s``), neither used nor unused.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Iterable, Sequence

from agent_otel.attribution import UnderuseTotals, attribute, gpu_key
from agent_otel.gpu.timeline import TimelineStep, is_missing
from agent_otel.records import IdleWindow, LoopBlock, ModelCall, ToolCall, UtilizationSegment

_OPEN_END = 1 << 63


@dataclass
class UtilizationShare:
    """Utilization integrated over some time: ``used_ns`` (utilization x ns) over ``ns``."""

    used_ns: float = 0.0
    ns: int = 0

    @property
    def mean(self) -> float:
        return self.used_ns / self.ns if self.ns else 0.0


@dataclass
class Underuse:
    """What the report shows of unused capacity, by ``gpu_key``.

    ``totals``: the blame (``UnderuseTotals``). ``missing_s``: seconds of
    missing data. ``observed``: utilization over every known stretch;
    ``during[(gpu, tool)]``: over the part of it when a call of ``tool`` was
    in flight. ``blocked_curve[gpu]``: per stretch, its start and end
    (epoch ns) and the share of the GPU's capacity that was unused while
    some tool call was in flight (0..1), for the HTML timeline.
    """

    totals: UnderuseTotals = field(default_factory=UnderuseTotals)
    missing_s: dict[str, float] = field(default_factory=dict)
    observed: dict[str, UtilizationShare] = field(default_factory=dict)
    during: dict[tuple[str, str], UtilizationShare] = field(default_factory=dict)
    blocked_curve: dict[str, tuple[array, array, array]] = field(default_factory=dict)


class _CallIndex:
    """The calls sorted by submit, with a running maximum of their ends,
    so the calls overlapping any stretch are a binary search away."""

    def __init__(self, calls: Sequence[ToolCall]):
        self.calls = sorted(calls, key=lambda call: call.submit_ns)
        self.submits = [call.submit_ns for call in self.calls]
        self.max_end = list(accumulate((call.end_ns or _OPEN_END for call in self.calls), max))

    def overlapping(self, start_ns: int, end_ns: int) -> list[ToolCall]:
        first = bisect_right(self.max_end, start_ns)  # every call before it ended by start_ns
        last = bisect_left(self.submits, end_ns)
        return [call for call in self.calls[first:last] if (call.end_ns or _OPEN_END) > start_ns]


def read_underuse(
    steps: Iterable[TimelineStep],
    calls: Sequence[ToolCall],
    start_ns: int,
    end_ns: int,
    blocks: Iterable[LoopBlock] = (),
    models: Sequence[ModelCall] = (),
) -> tuple[list[IdleWindow], Underuse]:
    """The idle windows of ``steps`` (all of them, unclipped) and the unused
    capacity of their stretches inside ``[start_ns, end_ns]``, blamed on
    ``calls`` (and on the ``models`` in flight, the model server, first)."""
    index = _CallIndex(calls)
    models = sorted(models, key=lambda model: model.start_ns)
    model_starts = [model.start_ns for model in models]
    longest = max((model.end_ns - model.start_ns for model in models), default=0)  # bounds the search back
    blocks = list(blocks)
    underuse = Underuse()
    curves: dict[str, tuple[array, array, array]] = {}
    windows: list[IdleWindow] = []
    for step in steps:
        windows += step.windows
        known = []
        for segment in step.segments:
            a, b = max(segment.start_ns, start_ns), min(segment.end_ns, end_ns)
            if a >= b:
                continue
            if (a, b) != (segment.start_ns, segment.end_ns):
                segment = segment._replace(start_ns=a, end_ns=b)
            if is_missing(segment.utilization):
                key = gpu_key(segment)
                underuse.missing_s[key] = underuse.missing_s.get(key, 0.0) + segment.seconds
            else:
                known.append(segment)
        if not known:
            continue
        first, last = min(s.start_ns for s in known), max(s.end_ns for s in known)
        overlapping = index.overlapping(first, last)
        near = [block for block in blocks if block.start_ns < last and (block.end_ns or _OPEN_END) > first]
        near_models = models[bisect_left(model_starts, first - longest) : bisect_left(model_starts, last)]
        serving = [m for m in near_models if m.end_ns > first]
        for result in attribute(known, overlapping, near, models=serving):
            segment: UtilizationSegment = result.window  # type: ignore[no-redef]
            underuse.totals.add(result)
            _observe(underuse, segment, result.shares, curves)
    underuse.blocked_curve = curves
    return windows, underuse


def _observe(underuse: Underuse, segment: UtilizationSegment, shares, curves) -> None:
    key = gpu_key(segment)
    ns = segment.end_ns - segment.start_ns
    utilization = min(max(segment.utilization, 0.0), 1.0)
    observed = underuse.observed.setdefault(key, UtilizationShare())
    observed.used_ns += utilization * ns
    observed.ns += ns
    in_flight_ns = 0
    by_tool: dict[str, list[tuple[int, int]]] = {}
    for share in shares:
        by_tool.setdefault(share.call.tool, []).append((share.start_ns, share.end_ns))
    everyone: list[tuple[int, int]] = []
    for tool, spans in by_tool.items():
        covered = _union_ns(spans)
        during = underuse.during.setdefault((key, tool), UtilizationShare())
        during.used_ns += utilization * covered
        during.ns += covered
        everyone += spans
    if everyone:
        in_flight_ns = _union_ns(everyone)
    starts, ends, ratios = curves.setdefault(key, (array("q"), array("q"), array("d")))
    starts.append(segment.start_ns)
    ends.append(segment.end_ns)
    ratios.append(round((1.0 - utilization) * in_flight_ns / ns, 4) if ns else 0.0)


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total
