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
stretches by ``IdleDetector.step``; every stretch's unused capacity is
blamed at once (``attribute``, weighted), and so is every part of an idle
window the new samples cover, as soon as the window has lasted the minimum
idle time, although it has not closed. So the counters are behind the
GPU by no more than the newest sample, and a ten-minute stall shows on
them during its ten minutes. When the window closes, its blame is the sum
of the parts it accrued (the same numbers the counters received), merged
per call, so its ``gpu.idle`` spans agree with the counters.

Memory is bounded by the horizon, not by how long a window lasts: the
parts of an open window already blamed are kept as per-call sums, and
the horizon is told to keep the finished calls the part not yet blamed
may still need (``CallHorizon.keep_from``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
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
)
from agent_otel.config import DEFAULTS
from agent_otel.gpu.timeline import IdleDetector, is_missing
from agent_otel.records import NS_PER_S, GpuSample, IdleWindow, LoopBlock, ToolCall
from agent_otel.semconv import PHASE_EXEC, PHASE_QUEUE

# Finished calls kept for attribution: enough for a busy agent, small
# enough to bound memory (~330 bytes a call: ~17 MB).
MAX_HORIZON_CALLS = 50_000


class ClosedWindow(NamedTuple):
    """An idle window that closed: its blame, merged over the parts it
    accrued, and ``idle_s``, the sum of the idle seconds the counters
    received for it (the window's length, summed as the counters summed it)."""

    attribution: WindowAttribution
    idle_s: float


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


class _Piece:
    """The part of an idle window one batch covers: an ``Interval``."""

    __slots__ = ("gpu", "start_ns", "end_ns", "pool")

    def __init__(self, gpu: str, start_ns: int, end_ns: int, pool: str):
        self.gpu, self.start_ns, self.end_ns, self.pool = gpu, start_ns, end_ns, pool


class _OpenWindow:
    """An idle window being blamed part by part."""

    __slots__ = ("start_ns", "accrued_to", "shares", "originals", "unattributed_s", "idle_s")

    def __init__(self, start_ns: int):
        self.start_ns = start_ns
        self.accrued_to = start_ns
        self.idle_s = 0.0
        self.shares: dict[int, CallShare] = {}  # id(original call) -> its share so far
        self.originals: dict[int, ToolCall] = {}  # holds each original, so its id stays its own
        self.unattributed_s = 0.0

    def add(self, result: WindowAttribution, originals: dict[int, ToolCall]) -> None:
        self.unattributed_s += result.unattributed_s
        shares, kept = self.shares, self.originals
        for share in result.shares:
            call = share.call
            original = originals.get(id(call), call) if originals else call
            key = id(original)
            merged = shares.get(key)
            if merged is None:
                kept[key] = original
                # The share is this piece's own (attribute() made it): kept as the call's merged share.
                shares[key] = share
                continue
            merged.start_ns = min(merged.start_ns, share.start_ns)
            merged.end_ns = max(merged.end_ns, share.end_ns)
            merged.queue_s += share.queue_s
            merged.exec_s += share.exec_s
            if share.call.finished or not merged.call.finished:
                merged.call = share.call  # the newest record of the call: its phases as they turned out

    def close(self, window: IdleWindow) -> ClosedWindow:
        shares = sorted(self.shares.values(), key=lambda s: (s.call.submit_ns, s.call.start_ns))
        return ClosedWindow(WindowAttribution(window, shares, self.unattributed_s), self.idle_s)


class BlameEngine:
    """Samples + calls -> counter increments + closed windows; see the module docstring.

    ``max_gap_s`` is the detector's (None when the source vouches for the
    gaps between its samples, as the NVML source does). ``pool`` is the GPU
    pool the samples come from: only calls of that pool are blamed
    (``ToolCall.pool``; "" for a process that declared none), and the GPU
    keys of the update are ``gpu_key``'s (``"pool/0"``).
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
    ):
        self.pool = pool
        self.detector = IdleDetector(idle_threshold, min_idle_s, max_gap_s=max_gap_s, uuids=uuids, pool=pool)
        self.horizon = CallHorizon(horizon_s, max_calls)
        self._open: dict[str, _OpenWindow] = {}
        self._newest_ns = 0
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the blame accrued so far in an open window is the
        parent's (its calls, its counters); the child blames from where it got to."""
        for gpu, current in list(self._open.items()):
            fresh = self._open[gpu] = _OpenWindow(current.start_ns)
            fresh.accrued_to = current.accrued_to

    def add_finished(self, calls: Iterable[ToolCall]) -> None:
        """Finished calls, as they finish (any thread)."""
        self.horizon.add_many(calls)

    def feed(
        self, samples: Sequence[GpuSample], in_flight: Iterable[ToolCall] = (), blocks: Iterable[LoopBlock] = ()
    ) -> BlameUpdate:
        """Add a batch of samples; ``in_flight`` are the calls not finished now
        (read before the finished calls were last added, so none falls between);
        ``blocks`` the event-loop blocks that may overlap the new stretches
        (``attribute`` refines the rule with them)."""
        return self._update(self.detector.step(samples), in_flight, blocks, flushing=False)

    def flush(self, in_flight: Iterable[ToolCall] = (), blocks: Iterable[LoopBlock] = ()) -> BlameUpdate:
        """Close the windows still open (at shutdown): each ends at its last idle sample."""
        return self._update(self.detector.step(()), in_flight, blocks, flushing=True)

    def open_windows(self) -> dict[str, tuple[int, int]]:
        """The idle windows still open, by GPU: (start_ns, blamed up to ns)."""
        return {gpu: (window.start_ns, window.accrued_to) for gpu, window in self._open.items()}

    # -- the work --------------------------------------------------------

    def _update(
        self, step, in_flight: Iterable[ToolCall], blocks: Iterable[LoopBlock], *, flushing: bool
    ) -> BlameUpdate:
        update = BlameUpdate()
        closed = list(step.windows)
        if flushing:
            closed += self.detector.flush()
        # The intervals to blame: each window's part not yet blamed (closed
        # windows first, so a GPU's next window starts afresh), then every
        # stretch's unused capacity.
        pieces: list[tuple[_Piece, int, Optional[IdleWindow]]] = []
        for window in closed:
            pieces.append((self._piece(window.gpu, window.start_ns, window.end_ns), window.start_ns, window))
        for gpu in self.detector.gpus():
            extent = self.detector.open_window(gpu)
            if extent is not None:
                pieces.append((self._piece(gpu, *extent), extent[0], None))
        segments = []
        for segment in step.segments:
            self._newest_ns = max(self._newest_ns, segment.end_ns)
            if is_missing(segment.utilization):
                key = gpu_key(segment)
                update.missing_s[key] = update.missing_s.get(key, 0.0) + segment.seconds
            elif segment.utilization >= 1.0:
                # No capacity unused: nothing to blame, and no call to look at.
                update.underused.add(WindowAttribution(segment, [], 0.0))  # type: ignore[arg-type]
            elif segment.end_ns > segment.start_ns:
                segments.append(segment)
        intervals: list = [piece for piece, _, _ in pieces] + segments
        calls, originals = self._calls(intervals, in_flight) if intervals else ([], {})
        results = attribute(intervals, calls, blocks) if intervals else []
        for (piece, start, window), result in zip(pieces, results):
            self._accrue(piece, start, window, result, originals, update)
        for result in results[len(pieces) :]:
            update.underused.add(result)
        self.horizon.keep_from(self._needed_from())
        return update

    def _piece(self, gpu: str, start_ns: int, end_ns: int) -> _Piece:
        """The part of the window starting at ``start_ns`` not blamed yet."""
        current = self._open.get(gpu)
        if current is not None and current.start_ns == start_ns:
            start_ns = current.accrued_to
        return _Piece(gpu, start_ns, max(start_ns, end_ns), self.pool)

    def _accrue(
        self,
        piece: _Piece,
        start: int,
        window: Optional[IdleWindow],
        result: WindowAttribution,
        originals: dict[int, ToolCall],
        update: BlameUpdate,
    ) -> None:
        gpu, label = piece.gpu, gpu_key(piece)
        current = self._open.get(gpu)
        if current is None or current.start_ns != start:
            current = self._open[gpu] = _OpenWindow(start)
        if piece.end_ns > piece.start_ns:
            seconds = (piece.end_ns - piece.start_ns) / NS_PER_S
            update.idle.idle_s[label] = update.idle.idle_s.get(label, 0.0) + seconds
            update.idle.unattributed_s[label] = update.idle.unattributed_s.get(label, 0.0) + result.unattributed_s
            blocked_s = update.idle.blocked_s
            for share in result.shares:
                if share.queue_s > 0.0:
                    key = (label, share.call.tool, PHASE_QUEUE)
                    blocked_s[key] = blocked_s.get(key, 0.0) + share.queue_s
                if share.exec_s > 0.0:
                    key = (label, share.call.tool, PHASE_EXEC)
                    blocked_s[key] = blocked_s.get(key, 0.0) + share.exec_s
            current.add(result, originals)
            current.idle_s += seconds
            current.accrued_to = piece.end_ns
        if window is not None:
            update.closed.append(current.close(window))
            del self._open[gpu]

    def _calls(self, intervals: list, in_flight: Iterable[ToolCall]) -> tuple[list[ToolCall], dict[int, ToolCall]]:
        """The calls that may overlap ``intervals``: finished ones from the
        horizon, and a copy of each call in flight (the hot path changes the
        original meanwhile); and, by ``id`` of each copy, its original, so a
        call's parts merge whether it was in flight or finished."""
        running = list(in_flight)  # before the horizon: a call that finishes meanwhile is in one or both
        start = min(interval.start_ns for interval in intervals)
        end = max(interval.end_ns for interval in intervals)
        calls = {id(call): call for call in self.horizon.overlapping(start, end)}
        originals: dict[int, ToolCall] = {}
        for call in running:
            if id(call) in calls or call.submit_ns >= end:
                continue
            snapshot = dataclasses.replace(call)
            originals[id(snapshot)] = call
            calls[id(call)] = snapshot
        return list(calls.values()), originals

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
