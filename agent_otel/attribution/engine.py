"""The live blame engine: GPU samples and tool calls in; counter increments
and closed idle windows out.

Usage::

    from agent_otel.attribution.engine import BlameEngine
    engine = BlameEngine(horizon_s=120.0)
    engine.add_finished(finished_calls)             # as calls finish
    update = engine.feed(samples, in_flight_calls)  # as samples arrive
    update.idle, update.underused, update.missing_s # add these to the counters
    update.closed                                   # one ClosedWindow per window that closed

It has no outputs of its own: ``agent_otel.attribution.live`` turns updates
into Prometheus counters and ``gpu.idle`` spans in the agent's process, and
a service that gathers calls and samples from elsewhere can do the same
with its own. Not thread-safe: one thread feeds it (``add_finished`` may
come from another; the horizon has its own lock).

Blame accrues while a stall lasts. Each batch of samples is cut into
stretches by ``IdleDetector.step``, and each stretch is attributed once
(``attribute``): its shares, weighted by its unused capacity, are the
under-use blame; unweighted, the shares of an idle stretch are the blame
of the idle window it is part of (a window is its idle stretches, end to
end). An idle stretch's blame is kept with its window as it comes, held
until the window has lasted the minimum idle time and counted from then
on, although the window has not closed. So the counters are behind the
GPU by no more than the newest sample, and a ten-minute stall shows on
them during its ten minutes; and each call is attributed once per batch
it overlaps, however long the window it is in. When the window closes,
its blame is the sum of the stretches it accrued (the same numbers the
counters received), merged per call, so its ``gpu.idle`` spans agree with
the counters.

Memory is bounded by the horizon, not by how long a window lasts: the
stretches of an open window already blamed are kept as per-call sums, and
the horizon is told to keep the finished calls the part not yet blamed
may still need (``CallHorizon.keep_from``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Iterable, NamedTuple, Optional, Sequence

from agent_otel import forks
from agent_otel.attribution.horizon import CallHorizon
from agent_otel.attribution.rule import (
    BlameTotals,
    CallShare,
    UnderuseTotals,
    WindowAttribution,
    attribute,
    gpu_key,
    model_by_phase,
)
from agent_otel.config import DEFAULTS
from agent_otel.gpu.timeline import IdleDetector, is_missing
from agent_otel.records import NS_PER_S, GpuSample, IdleWindow, LoopBlock, ModelCall, ToolCall, UtilizationSegment

# Finished calls kept for attribution: enough for a busy agent, small
# enough to bound memory (~330 bytes a call: ~17 MB).
MAX_HORIZON_CALLS = 50_000


class ClosedWindow(NamedTuple):
    """An idle window that closed: its blame, merged over the parts it
    accrued; ``idle_s``, the sum of the idle seconds the counters received
    for it (the window's length, summed as the counters summed it); and
    ``blocked``, what the blocked counter received for it by (tool, phase)."""

    attribution: WindowAttribution
    idle_s: float
    blocked: dict[tuple[str, str], float]
    models: dict[tuple[str, str], float] = {}  # the model server's share, by (model, phase), as counted


@dataclass
class BlameUpdate:
    """What one batch of samples adds.

    ``idle`` and ``underused`` are increments for the ``agent_gpu_idle_*``
    and ``agent_gpu_underused_*`` counters; ``missing_s`` the seconds of
    missing data per GPU; ``closed`` the idle windows that closed, each
    with the blame it accrued (the sums of the increments it contributed).
    """

    idle: BlameTotals = field(default_factory=BlameTotals)
    underused: UnderuseTotals = field(default_factory=UnderuseTotals)
    missing_s: dict[str, float] = field(default_factory=dict)
    closed: list[ClosedWindow] = field(default_factory=list)
    # per GPU: seconds some model call was in flight, and of those the GPU read idle
    model_in_flight_s: dict[str, float] = field(default_factory=dict)
    model_idle_s: dict[str, float] = field(default_factory=dict)


_CALL_SUBMIT, _CALL_START = attrgetter("call.submit_ns"), attrgetter("call.start_ns")


class _OpenWindow:
    """An idle stretch being blamed stretch by stretch: a window once it has
    lasted the minimum idle time (``counted``: from then on its blame goes
    to the counters as it comes; what it accrued before goes at once)."""

    __slots__ = (
        "start_ns",
        "accrued_to",
        "shares",
        "originals",
        "unattributed_s",
        "idle_s",
        "blocked",
        "counted",
        "label",
        "models",
    )

    def __init__(self, start_ns: int, label: str):
        self.start_ns = start_ns
        self.accrued_to = start_ns
        self.idle_s = 0.0
        self.shares: dict[int, CallShare] = {}  # id(original call) -> its share so far
        self.originals: dict[int, ToolCall] = {}  # holds each original, so its id stays its own
        self.unattributed_s = 0.0
        self.blocked: dict[tuple[str, str], float] = {}  # (tool, phase) -> seconds so far
        self.counted = False
        self.label = label  # gpu_key of its GPU: the counters' gpu label
        self.models: dict[tuple[str, str], float] = {}  # (model, phase) -> seconds so far

    def add(
        self, result: WindowAttribution, blocked: dict[tuple[str, str], float], originals: dict[int, ToolCall]
    ) -> None:
        """A stretch's blame (``blocked``: its shares summed by tool and phase)."""
        self.unattributed_s += result.unattributed_s
        totals = self.blocked
        for tool_phase, seconds in blocked.items():
            totals[tool_phase] = totals.get(tool_phase, 0.0) + seconds
        if result.models:
            models = self.models
            for model_phase, seconds in model_by_phase(result.models).items():
                models[model_phase] = models.get(model_phase, 0.0) + seconds
        shares, kept = self.shares, self.originals
        for share in result.shares:
            call = share.call
            original = originals.get(id(call), call) if originals else call
            key = id(original)
            merged = shares.get(key)
            if merged is None:
                kept[key] = original
                shares[key] = share  # the stretch's result is done with (counted first): kept, and merged into
                continue
            merged.start_ns = min(merged.start_ns, share.start_ns)
            merged.end_ns = max(merged.end_ns, share.end_ns)
            merged.queue_s += share.queue_s
            merged.exec_s += share.exec_s
            if call.finished or not merged.call.finished:
                merged.call = call  # the newest record of the call: its phases as they turned out

    def count(self, totals: BlameTotals) -> None:
        """It became a window: everything it accrued so far goes to ``totals``."""
        self.counted = True
        label = self.label
        totals.idle_s[label] = totals.idle_s.get(label, 0.0) + self.idle_s
        totals.unattributed_s[label] = totals.unattributed_s.get(label, 0.0) + self.unattributed_s
        _add_blocked(totals.blocked_s, label, self.blocked)
        _add_blocked(totals.model_s, label, self.models)

    def close(self, window: IdleWindow) -> ClosedWindow:
        shares = sorted(self.shares.values(), key=_CALL_START)
        shares.sort(key=_CALL_SUBMIT)  # by submit, then start
        return ClosedWindow(
            WindowAttribution(window, shares, self.unattributed_s), self.idle_s, self.blocked, self.models
        )


def _add_blocked(
    blocked_s: dict[tuple[str, str, str], float], label: str, blocked: dict[tuple[str, str], float]
) -> None:
    """Add seconds by (tool, phase) to ``blocked_s`` by (gpu, tool, phase)."""
    for (tool, phase), seconds in blocked.items():
        key = (label, tool, phase)
        blocked_s[key] = blocked_s.get(key, 0.0) + seconds


class BlameEngine:
    """Samples + calls -> counter increments + closed windows; see the module docstring.

    ``max_gap_s`` is the detector's (None when the source vouches for the
    gaps between its samples, as the NVML source does). ``pool`` is the GPU
    pool the samples come from: only calls of that pool are blamed
    (``ToolCall.pool``; "" for a process that declared none), and the GPU
    keys of the update are ``gpu_key``'s (``"pool/0"``). ``share_min_s``:
    a closed window's shares are those of the calls whose life lasts that
    long (none shorter can have a share that long); every call's share is
    in the counters' increments and the window's ``blocked`` totals
    (``attribute``'s ``shares_from``; 0: every call's share).
    """

    def __init__(
        self,
        *,
        idle_threshold: float = DEFAULTS.gpu_idle_threshold,
        min_idle_s: float = DEFAULTS.gpu_min_idle,
        max_gap_s: Optional[float] = None,
        uuids: Optional[dict[str, str]] = None,
        horizon_s: float = DEFAULTS.attribution_horizon,
        max_calls: int = MAX_HORIZON_CALLS,
        pool: str = "",
        share_min_s: float = 0.0,
    ):
        self.pool = pool
        self.share_min_s = share_min_s
        self.detector = IdleDetector(idle_threshold, min_idle_s, max_gap_s=max_gap_s, uuids=uuids, pool=pool)
        self.horizon = CallHorizon(horizon_s, max_calls)
        self._open: dict[str, _OpenWindow] = {}
        self._newest_ns = 0
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the blame accrued so far in an open window is the
        parent's (its calls, its counters); the child blames from where it got to."""
        for gpu, current in list(self._open.items()):
            fresh = self._open[gpu] = _OpenWindow(current.start_ns, current.label)
            fresh.accrued_to = current.accrued_to
            fresh.counted = current.counted

    def add_finished(self, calls: Iterable[ToolCall]) -> None:
        """Finished calls, as they finish (any thread)."""
        self.horizon.add_many(calls)

    def feed(
        self,
        samples: Sequence[GpuSample],
        in_flight: Iterable[ToolCall] = (),
        blocks: Iterable[LoopBlock] = (),
        models: Sequence[ModelCall] = (),
    ) -> BlameUpdate:
        """Add a batch of samples; ``in_flight`` are the calls not finished now
        (read before the finished calls were last added, so none falls between);
        ``blocks`` the event-loop blocks that may overlap the new stretches
        (``attribute`` refines the rule with them); ``models`` the model calls
        that may overlap them (in flight: ``end_ns`` 0), the model server's share."""
        return self._update(self.detector.step(samples), in_flight, blocks, models, flushing=False)

    def flush(
        self, in_flight: Iterable[ToolCall] = (), blocks: Iterable[LoopBlock] = (), models: Sequence[ModelCall] = ()
    ) -> BlameUpdate:
        """Close the windows still open (at shutdown): each ends at its last idle sample."""
        return self._update(self.detector.step(()), in_flight, blocks, models, flushing=True)

    def open_windows(self) -> dict[str, tuple[int, int]]:
        """The idle windows still open, by GPU: (start_ns, blamed up to ns)."""
        return {gpu: (window.start_ns, window.accrued_to) for gpu, window in self._open.items() if window.counted}

    # -- the work --------------------------------------------------------

    def _update(
        self,
        step,
        in_flight: Iterable[ToolCall],
        blocks: Iterable[LoopBlock],
        models: Sequence[ModelCall] = (),
        *,
        flushing: bool,
    ) -> BlameUpdate:
        update = BlameUpdate()
        closed = list(step.windows)
        if flushing:
            closed += self.detector.flush()
        threshold = self.detector.threshold
        segments = []
        for segment in step.segments:
            self._newest_ns = max(self._newest_ns, segment.end_ns)
            if is_missing(segment.utilization):
                key = gpu_key(segment)
                update.missing_s[key] = update.missing_s.get(key, 0.0) + segment.seconds
            elif segment.utilization >= 1.0 and segment.utilization > threshold and not models:
                # No capacity unused: nothing to blame, and no call to look at.
                update.underused.add(WindowAttribution(segment, [], 0.0))
            elif segment.end_ns > segment.start_ns:
                segments.append(segment)
        # Every stretch is blamed once, for its unused capacity; an idle
        # stretch's same shares, unweighted, are its idle window's blame.
        calls, originals = self._calls(segments, in_flight) if segments else ([], {})
        results = (
            attribute(segments, calls, blocks, shares_from=self.share_min_s, models=self._models(segments, models))
            if segments
            else []
        )
        ended: dict[tuple[str, int], _OpenWindow] = {}  # stretches that ended in this batch
        for segment, result in zip(segments, results):
            blocked = result.blocked_by_tool_phase()
            update.underused.add(result, blocked)
            if result.models:
                key, serving = gpu_key(segment), result.model_s
                update.model_in_flight_s[key] = update.model_in_flight_s.get(key, 0.0) + serving
                if segment.utilization <= threshold:
                    update.model_idle_s[key] = update.model_idle_s.get(key, 0.0) + serving
            if segment.utilization <= threshold:
                self._accrue(segment, result, blocked, originals, update, ended)
        for window in closed:
            current = self._open.get(window.gpu)
            if current is not None and current.start_ns == window.start_ns:
                del self._open[window.gpu]
            else:
                current = ended.pop((window.gpu, window.start_ns), None)
                if current is None:  # no stretch of it was seen (not expected): a window blamed on nobody
                    current = _OpenWindow(window.start_ns, gpu_key(window))
            if not current.counted:
                current.count(update.idle)
            update.closed.append(current.close(window))
        for gpu, current in list(self._open.items()):
            if self.detector.open_since(gpu) != current.start_ns:
                del self._open[gpu]  # the stretch ended too short to be a window
            elif not current.counted and self.detector.open_window(gpu) is not None:
                current.count(update.idle)  # it has lasted the minimum idle time
        self.horizon.keep_from(self._needed_from())
        return update

    def _accrue(
        self,
        segment: UtilizationSegment,
        result: WindowAttribution,
        blocked: dict[tuple[str, str], float],
        originals: dict[int, ToolCall],
        update: BlameUpdate,
        ended: dict[tuple[str, int], _OpenWindow],
    ) -> None:
        """Add an idle stretch's blame to the idle stretch of its GPU it continues, or start one."""
        gpu = segment.gpu
        current = self._open.get(gpu)
        if current is None or current.accrued_to != segment.start_ns:
            if current is not None:
                ended[(gpu, current.start_ns)] = current
            current = self._open[gpu] = _OpenWindow(segment.start_ns, gpu_key(segment))
        seconds = (segment.end_ns - segment.start_ns) / NS_PER_S
        if current.counted:  # before add(), which merges later shares into these
            idle, label = update.idle, current.label
            idle.idle_s[label] = idle.idle_s.get(label, 0.0) + seconds
            idle.unattributed_s[label] = idle.unattributed_s.get(label, 0.0) + result.unattributed_s
            _add_blocked(idle.blocked_s, label, blocked)
            if result.models:
                _add_blocked(idle.model_s, label, model_by_phase(result.models))
        current.add(result, blocked, originals)
        current.idle_s += seconds
        current.accrued_to = segment.end_ns

    def _models(self, intervals: list, models: Sequence[ModelCall]) -> list[ModelCall]:
        """The model calls of this engine's pool that overlap ``intervals``."""
        if not models:
            return []
        start = min(interval.start_ns for interval in intervals)
        end = max(interval.end_ns for interval in intervals)
        pool = self.pool
        return [m for m in models if m.start_ns < end and (not m.end_ns or m.end_ns > start) and m.pool == pool]

    def _calls(self, intervals: list, in_flight: Iterable[ToolCall]) -> tuple[list[ToolCall], dict[int, ToolCall]]:
        """The calls that may overlap ``intervals``: finished ones from the
        horizon, and a copy of each call in flight (the hot path changes the
        original meanwhile); and, by ``id`` of each copy, its original, so a
        call's parts merge whether it was in flight or finished."""
        running = list(in_flight)  # before the horizon: a call that finishes meanwhile is in one or both
        start = min(interval.start_ns for interval in intervals)
        end = max(interval.end_ns for interval in intervals)
        calls = self.horizon.overlapping(start, end)
        originals: dict[int, ToolCall] = {}
        if running:
            finished = set(map(id, calls))
            for call in running:
                if id(call) in finished or call.submit_ns >= end:
                    continue
                snapshot = dataclasses.replace(call)
                originals[id(snapshot)] = call
                calls.append(snapshot)
        return calls, originals

    def _needed_from(self) -> int:
        """The earliest instant a later batch may still blame: an open
        window's part not yet blamed, or (within the horizon) the stretch
        the next sample of a GPU will cover."""
        needed = self._newest_ns
        for gpu in self.detector.gpus():
            current = self._open.get(gpu)
            if current is not None:
                needed = min(needed, current.accrued_to)
                continue
            since = self.detector.open_since(gpu)
            if since is None:
                since = self.detector.covered_to(gpu)
            if since is not None:
                needed = min(needed, max(since, self._newest_ns - self.horizon.horizon_ns))
        return needed
