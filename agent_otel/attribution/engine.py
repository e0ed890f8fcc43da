"""The live blame engine: GPU samples and tool calls in; counter increments
and closed idle windows out.

Usage::

    from agent_otel.attribution.engine import BlameEngine
    engine = BlameEngine(GpuOptions.of(settings))
    engine.add_finished(finished_calls)             # as calls finish
    update = engine.feed(samples, in_flight_calls)  # as samples arrive
    update.idle, update.underused, update.missing_s # add these to the counters
    update.settled                                  # the calls' shares that are final
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

Memory is bounded by the horizon, not by how long a window lasts. An open
window keeps its totals by (tool, phase), and a share (a sum over the
stretches it accrued) only for the calls whose share can still grow: those
in flight, or ending after the part already blamed. A call's share is
**settled** once the call has ended and the blame has passed its end (no
later stretch can reach it): it leaves the window in ``update.settled``
(for its ``gpu.idle`` child span) and the window keeps, of the settled
shares, only the ``max_links`` largest its span links, and how many were
eligible for a link. So a window that lasts hours over millions of calls
holds the calls in flight, the calls of the stretch not yet blamed and
``max_links`` shares. The horizon is told, after each batch, from when on
the engine may still ask for calls (``CallHorizon.keep_from``): it keeps
those calls however old they are, and lets the others go.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Iterable, NamedTuple, Optional, Sequence

from agent_otel.support import forks
from agent_otel.attribution.horizon import CallHorizon
from agent_otel.attribution.options import GpuOptions
from agent_otel.attribution.rule import (
    BlameTotals,
    CallShare,
    UnderuseTotals,
    WindowAttribution,
    attribute,
    gpu_key,
    model_by_phase,
)
from agent_otel.gpu.timeline import IdleDetector, is_missing
from agent_otel.records import NS_PER_S, GpuSample, IdleWindow, LoopBlock, ModelCall, ToolCall, UtilizationSegment

# Finished calls kept for attribution: enough for a busy agent, small
# enough to bound memory (~330 bytes a call: ~17 MB).
MAX_HORIZON_CALLS = 50_000
# The shares a window keeps for its span's links: the SDK's default link
# limit per span (OTEL_SPAN_LINK_COUNT_LIMIT).
DEFAULT_MAX_LINKS = 128


class ClosedWindow(NamedTuple):
    """An idle window that closed.

    ``attribution``: the window, its unattributed seconds and, as
    ``shares``, the shares its span links: the ``max_links`` largest of
    the shares that reach ``share_min_s`` and whose call has a span
    (``trace_id``), smallest first. Every call's share was handed out in
    ``BlameUpdate.settled`` once final (the last ones in the update that
    closes the window). ``idle_s``: the sum of the idle seconds the
    counters received for it (the window's length, summed as the counters
    summed it); ``blocked``: what the blocked counter received for it by
    (tool, phase); ``linkable``: how many shares could have had a link
    (``len(attribution.shares)`` of them have one)."""

    attribution: WindowAttribution
    idle_s: float
    blocked: dict[tuple[str, str], float]
    models: dict[tuple[str, str], float] = {}  # the model server's share, by (model, phase), as counted
    linkable: int = 0


class SettledShare(NamedTuple):
    """One call's share of an idle window, final: the window is ``gpu``'s
    (``IdleWindow.gpu``) that started at ``window_start_ns``."""

    gpu: str
    window_start_ns: int
    share: CallShare


@dataclass
class BlameUpdate:
    """What one batch of samples adds.

    ``idle`` and ``underused`` are increments for the ``agent_gpu_idle_*``
    and ``agent_gpu_underused_*`` counters; ``missing_s`` the seconds of
    missing data per GPU; ``closed`` the idle windows that closed, each
    with the blame it accrued (the sums of the increments it contributed);
    ``settled`` the calls' shares of idle windows that became final: each
    share once, merged over the stretches it accrued, only of stretches
    that lasted the minimum idle time (windows).
    """

    idle: BlameTotals = field(default_factory=BlameTotals)
    underused: UnderuseTotals = field(default_factory=UnderuseTotals)
    missing_s: dict[str, float] = field(default_factory=dict)
    closed: list[ClosedWindow] = field(default_factory=list)
    # per GPU: seconds some model call was in flight, and of those the GPU read idle
    model_in_flight_s: dict[str, float] = field(default_factory=dict)
    model_idle_s: dict[str, float] = field(default_factory=dict)
    settled: list[SettledShare] = field(default_factory=list)


class WholeWindows:
    """Each closed window with every call's share, gathered from the updates
    (``add`` returns the windows an update closed). For checks and
    benchmarks: it holds a window's shares until the window closes, which
    the engine does not."""

    def __init__(self) -> None:
        self._settling: dict[tuple[str, int], list[CallShare]] = {}

    def add(self, update: BlameUpdate) -> list[WindowAttribution]:
        for gpu, start_ns, share in update.settled:
            self._settling.setdefault((gpu, start_ns), []).append(share)
        whole = []
        for closed in update.closed:
            window = closed.attribution.window
            shares = self._settling.pop((window.gpu, window.start_ns), [])
            whole.append(WindowAttribution(window, shares, closed.attribution.unattributed_s))
        return whole


_CALL_SUBMIT, _CALL_START = attrgetter("call.submit_ns"), attrgetter("call.start_ns")


class _OpenWindow:
    """An idle stretch being blamed stretch by stretch: a window once it has
    lasted the minimum idle time (``counted``: from then on its blame goes
    to the counters as it comes; what it accrued before goes at once).

    ``shares`` holds the shares that can still grow (see ``settle``);
    ``links`` the largest settled ones that may get a link, as a heap of at
    most ``max_links`` entries."""

    __slots__ = (
        "start_ns",
        "accrued_to",
        "shares",
        "originals",
        "order",
        "added",
        "links",
        "linkable",
        "unattributed_s",
        "idle_s",
        "blocked",
        "counted",
        "label",
        "gpu",
        "models",
    )

    def __init__(self, start_ns: int, label: str, gpu: str):
        self.start_ns = start_ns
        self.accrued_to = start_ns
        self.idle_s = 0.0
        self.shares: dict[int, CallShare] = {}  # id(original call) -> its share so far
        self.originals: dict[int, ToolCall] = {}  # holds each original, so its id stays its own
        self.order: dict[int, int] = {}  # id(original call) -> when its share came (ties between links)
        self.added = 0
        self.links: list[tuple[float, int, int, int, CallShare]] = []  # a min-heap: (blocked_s, submit, start, order)
        self.linkable = 0
        self.unattributed_s = 0.0
        self.blocked: dict[tuple[str, str], float] = {}  # (tool, phase) -> seconds so far
        self.counted = False
        self.label = label  # gpu_key of its GPU: the counters' gpu label
        self.gpu = gpu  # IdleWindow.gpu
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
        shares, kept, order = self.shares, self.originals, self.order
        for share in result.shares:
            call = share.call
            original = originals.get(id(call), call) if originals else call
            key = id(original)
            merged = shares.get(key)
            if merged is None:
                kept[key] = original
                self.added += 1
                order[key] = self.added
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

    def settle(self, settled: list[SettledShare], share_min_s: float, max_links: int) -> None:
        """Hand out the shares that can no longer grow: of calls that have
        ended (the original record, which the hot path finishes) no later
        than the blame has reached. No later stretch can reach such a call
        (the horizon gives only calls ending after a stretch's start; a
        block it caused past its end is blamed on a stand-in for it, as
        before: ``rule._cut_at_blocks``)."""
        to = self.accrued_to
        final = [key for key, original in self.originals.items() if 0 < original.end_ns <= to]
        if final:
            self._hand_out(final, settled, share_min_s, max_links)

    def close(
        self, window: IdleWindow, settled: list[SettledShare], share_min_s: float, max_links: int
    ) -> ClosedWindow:
        """Every share left is final; the window's links are its largest."""
        self._hand_out(list(self.shares), settled, share_min_s, max_links)
        links = [share for *_, share in sorted(self.links)]  # smallest first (by share, submit, start, order)
        return ClosedWindow(
            WindowAttribution(window, links, self.unattributed_s), self.idle_s, self.blocked, self.models, self.linkable
        )

    def _hand_out(self, keys: list[int], settled: list[SettledShare], share_min_s: float, max_links: int) -> None:
        shares, originals, order, links = self.shares, self.originals, self.order, self.links
        out = []
        for key in keys:
            share = shares.pop(key)
            del originals[key]
            out.append(share)
            blocked_s = share.queue_s + share.exec_s
            if blocked_s < share_min_s or not share.call.trace_id:
                del order[key]
                continue
            self.linkable += 1
            call = share.call
            entry = (blocked_s, call.submit_ns, call.start_ns, order.pop(key), share)
            if len(links) < max_links:
                heapq.heappush(links, entry)
            elif max_links and entry[:4] > links[0][:4]:
                heapq.heapreplace(links, entry)
        out.sort(key=_CALL_START)
        out.sort(key=_CALL_SUBMIT)  # by submit, then start
        gpu, start = self.gpu, self.start_ns
        settled.extend(SettledShare(gpu, start, share) for share in out)


def _add_blocked(
    blocked_s: dict[tuple[str, str, str], float], label: str, blocked: dict[tuple[str, str], float]
) -> None:
    """Add seconds by (tool, phase) to ``blocked_s`` by (gpu, tool, phase)."""
    for (tool, phase), seconds in blocked.items():
        key = (label, tool, phase)
        blocked_s[key] = blocked_s.get(key, 0.0) + seconds


class BlameEngine:
    """Samples + calls -> counter increments + closed windows; see the module docstring.

    ``options``: the idle threshold, minimum idle window and attribution
    horizon (``GpuOptions``; the settings' defaults without). ``max_gap_s`` is the detector's (None when the source vouches for the
    gaps between its samples, as the NVML source does). ``pool`` is the GPU
    pool the samples come from: only calls of that pool are blamed
    (``ToolCall.pool``; "" for a process that declared none), and the GPU
    keys of the update are ``gpu_key``'s (``"pool/0"``). ``share_min_s``:
    a closed window's shares are those of the calls whose life lasts that
    long (none shorter can have a share that long); every call's share is
    in the counters' increments and the window's ``blocked`` totals
    (``attribute``'s ``shares_from``; 0: every call's share); ``max_links``
    how many of a window's shares it keeps for the links of its span
    (``ClosedWindow``).
    """

    def __init__(
        self,
        options: Optional[GpuOptions] = None,
        *,
        max_gap_s: Optional[float] = None,
        uuids: Optional[dict[str, str]] = None,
        max_calls: int = MAX_HORIZON_CALLS,
        pool: str = "",
        share_min_s: float = 0.0,
        max_links: int = DEFAULT_MAX_LINKS,
    ):
        self.pool = pool
        self.share_min_s = share_min_s
        self.max_links = max(0, max_links)
        options = options if options is not None else GpuOptions.default()
        self.detector = IdleDetector(
            options.idle_threshold, options.min_idle_s, max_gap_s=max_gap_s, uuids=uuids, pool=pool
        )
        self.horizon = CallHorizon(options.horizon_s, max_calls)
        self._open: dict[str, _OpenWindow] = {}
        self._newest_ns = 0
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the blame accrued so far in an open window is the
        parent's (its calls, its counters); the child blames from where it got to."""
        for gpu, current in list(self._open.items()):
            fresh = self._open[gpu] = _OpenWindow(current.start_ns, current.label, current.gpu)
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
        share_min_s, max_links, settled = self.share_min_s, self.max_links, update.settled
        for window in closed:
            current = self._open.get(window.gpu)
            if current is not None and current.start_ns == window.start_ns:
                del self._open[window.gpu]
            else:
                current = ended.pop((window.gpu, window.start_ns), None)
                if current is None:  # no stretch of it was seen (not expected): a window blamed on nobody
                    current = _OpenWindow(window.start_ns, gpu_key(window), window.gpu)
            if not current.counted:
                current.count(update.idle)
            update.closed.append(current.close(window, settled, share_min_s, max_links))
        for gpu, current in list(self._open.items()):
            if self.detector.open_since(gpu) != current.start_ns:
                del self._open[gpu]  # the stretch ended too short to be a window
                continue
            if not current.counted and self.detector.open_window(gpu) is not None:
                current.count(update.idle)  # it has lasted the minimum idle time
            if current.counted:
                current.settle(settled, share_min_s, max_links)
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
            current = self._open[gpu] = _OpenWindow(segment.start_ns, gpu_key(segment), gpu)
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
