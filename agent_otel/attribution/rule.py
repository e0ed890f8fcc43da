"""Who left the GPU idle: idle windows x tool calls -> blame per tool and phase.

This module is the only implementation of the contract's attribution rule,
used by the live path and by the offline report alike:

    At each instant of an idle window, the idle time is split equally among
    the tool calls in flight at that instant, and within one call goes to
    the phase it is in (queue or exec). Idle time with no tool call in
    flight is unattributed.

The GPU's unused capacity, ``(1 - utilization) x time`` over every stretch
a sample covers (``UtilizationSegment``), is blamed by the same rule: a
segment is attributed like a window, and each share is weighted by the
segment's unused ratio (``UnderuseTotals``). Utilization is constant
within a segment, so that is the rule applied instant by instant.

A call is in flight from ``submit_ns`` to ``end_ns`` (``end_ns == 0``: still
in flight, open-ended); it is queued during ``[submit_ns, start_ns)`` and
executing during ``[start_ns, end_ns)``. A call can only block the GPUs of
its own pool (``ToolCall.pool`` equals ``IdleWindow.pool``; "" is the pool
of processes that declared none), and within a pool every GPU's idle time
is attributed to the same calls: a tool call blocks every GPU of its pool.

How it stays fast (the report runs it on a million spans): the number of
calls in flight, n(t), changes only at call boundaries, so one sweep over
the sorted boundaries builds the running integral H(t) = integral of 1/n
over the time some call is in flight. A call's share of an idle window is
then H(b) - H(a) over the part [a, b) of its life inside the window, split
at ``start_ns`` into queue and exec, and the window's unattributed time is
the integral of "no call in flight" over the window, built the same way.
Pairing windows with the calls they overlap is a sweep too (one pass over
the sorted calls per GPU), so the whole thing costs O((W + C) log(W + C))
plus one step per (window, call) overlap, which is the size of the answer.

The model server comes first (``models``, ``ModelCall`` records):

    At each instant at which a model call of the window's pool is in
    flight, the idle time is split equally among the model calls in
    flight, and within one call goes to its phase (``queued`` before its
    first token, ``decode`` after); the tool calls in flight then get
    nothing. The rule above applies to the other instants.

It is applied to the input as the loop blocks are: the tool calls are cut
out of every instant a model call of their pool is in flight
(``_cut_at_models``), the rule runs on the pieces, and the model calls are
attributed by the same integrals, as calls whose ``queue`` phase is
``queued`` and whose ``exec`` phase is ``decode``. Without model calls
nothing is cut and nothing costs more.

Blocked event loops (``LoopBlock`` records, the ``asyncio.loop.blocked``
spans) refine who is in flight, by the same rule:

    While an event loop is blocked, the tool calls that are only waiting
    for that loop are not in flight, and the call that blocks it is, in
    its exec phase, for the whole block.

It is applied to the input (``_cut_at_blocks``): the waiting calls are cut
out of the blocks, the blocker gets a piece covering its blocks, the rule
above runs on the pieces, and each call's pieces are merged back into one
share per window. Without blocks nothing is cut and nothing costs more.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
import dataclasses
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from operator import and_, attrgetter, ge, le, lshift, mul, not_, or_, rshift, sub, truediv
from typing import Iterable, Iterator, Optional, Protocol, Sequence

from agent_otel.records import NS_PER_S, IdleWindow, LoopBlock, ModelCall, ToolCall, UtilizationSegment
from agent_otel.semconv import MODEL_PHASE_DECODE, MODEL_PHASE_QUEUED, PHASE_EXEC, PHASE_MIXED, PHASE_QUEUE

# end_ns of a call still in flight: later than any real timestamp.
_OPEN_END = 1 << 63
_INF = float("inf")
_SUBMIT, _START, _END = attrgetter("submit_ns"), attrgetter("start_ns"), attrgetter("end_ns")
_TOOL, _POOL = attrgetter("tool"), attrgetter("pool")
# Above this many tools in one window, its sums by tool are made in one loop
# over its calls rather than one pass over them per tool.
_TOOLS_BY_PASSES = 8


class Interval(Protocol):
    """What ``attribute`` needs of a window: one GPU's stretch of time.
    ``IdleWindow`` and ``UtilizationSegment`` are both intervals."""

    @property
    def gpu(self) -> str: ...

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    @property
    def pool(self) -> str:
        """The GPU pool ("" for none): only calls of this pool are blamed."""
        ...


@dataclass(slots=True)
class CallShare:
    """One tool call's share of one idle window.

    ``start_ns``/``end_ns`` are the overlap of the call's life with the
    window (what the per-tool ``gpu.idle`` child span covers).
    """

    call: ToolCall
    start_ns: int
    end_ns: int
    queue_s: float
    exec_s: float

    @property
    def blocked_s(self) -> float:
        return self.queue_s + self.exec_s

    @property
    def phase(self) -> str:
        """``agent.tool.phase``: ``queue`` or ``exec`` when the overlap lies
        in one phase, ``mixed`` when the call started executing inside it."""
        call = self.call
        exec_start = call.start_ns or call.end_ns or self.end_ns  # not started yet: queued
        if exec_start <= self.start_ns:
            return PHASE_EXEC
        if exec_start >= self.end_ns:
            return PHASE_QUEUE
        return PHASE_MIXED


@dataclass(slots=True)
class ModelShare:
    """One model call's share of one idle window: the model server's
    blame (``queued_s`` before its first token, ``decode_s`` after).
    ``start_ns``/``end_ns``: the overlap of the call with the window."""

    call: ModelCall
    start_ns: int
    end_ns: int
    queued_s: float
    decode_s: float

    @property
    def blocked_s(self) -> float:
        return self.queued_s + self.decode_s


def model_by_phase(shares: Iterable[ModelShare]) -> dict[tuple[str, str], float]:
    """The model shares' seconds summed by (model, phase), ``queued`` and ``decode``."""
    sums: dict[tuple[str, str], float] = {}
    for share in shares:
        for phase, seconds in ((MODEL_PHASE_QUEUED, share.queued_s), (MODEL_PHASE_DECODE, share.decode_s)):
            if seconds > 0.0:
                key = (share.call.model, phase)
                sums[key] = sums.get(key, 0.0) + seconds
    return sums


@dataclass(slots=True)
class WindowAttribution:
    """The blame for one idle window (or any ``Interval``): every
    overlapping call's share (in the order the calls were submitted) and
    the time no call was in flight.

    ``models`` are the model calls' shares (the model server's blame, in
    the order the calls started). The tool shares, the model shares and
    ``unattributed_s`` add up to the window's seconds.

    ``blocked``, when set (``attribute(..., shares_from=...)``), is every
    call's share summed by (tool, phase), as ``blocked_by_tool_phase``
    sums them, and ``shares`` holds only the calls long enough to reach
    ``shares_from``; None: ``shares`` holds every call.
    """

    window: IdleWindow  # or whichever Interval attribute() was given
    shares: list[CallShare]
    unattributed_s: float
    blocked: Optional[dict[tuple[str, str], float]] = None
    models: list[ModelShare] = field(default_factory=list)

    @property
    def model_s(self) -> float:
        """The model server's share: the seconds blamed on model calls."""
        return sum(share.blocked_s for share in self.models)

    @property
    def blocked_by(self) -> Optional[str]:
        """``gpu.idle.blocked_by``: the tool whose calls hold the largest
        summed share; on a tie (to the nanosecond) the first name in sort
        order. None when no call overlaps the window."""
        totals: dict[str, float] = {}
        if self.blocked is not None:
            for (tool, _), seconds in self.blocked.items():
                totals[tool] = totals.get(tool, 0.0) + seconds
            return largest_share(totals)
        for share in self.shares:
            totals[share.call.tool] = totals.get(share.call.tool, 0.0) + share.blocked_s
        return largest_share(totals)

    def blocked_by_tool_phase(self) -> dict[tuple[str, str], float]:
        """Every call's share summed by (tool, phase) (``blocked`` where set)."""
        return self.blocked if self.blocked is not None else blocked_by_tool_phase(self.shares)


def blocked_by_tool_phase(shares: Iterable[CallShare]) -> dict[tuple[str, str], float]:
    """The shares' seconds summed by (tool, phase), ``queue`` and ``exec`` (a mixed share in both)."""
    sums: dict[tuple[str, str], float] = {}
    for share in shares:
        if share.queue_s > 0.0:
            key = (share.call.tool, PHASE_QUEUE)
            sums[key] = sums.get(key, 0.0) + share.queue_s
        if share.exec_s > 0.0:
            key = (share.call.tool, PHASE_EXEC)
            sums[key] = sums.get(key, 0.0) + share.exec_s
    return sums


def largest_share(seconds_by_tool: dict[str, float]) -> Optional[str]:
    """The tool with the most seconds (``gpu.idle.blocked_by``); on a tie, to
    the nanosecond, the first name in sort order; None for none."""
    if not seconds_by_tool:
        return None
    return min(seconds_by_tool, key=lambda tool: (-round(seconds_by_tool[tool], 9), tool))


@dataclass
class BlameTotals:
    """Sums over many windows: what the metrics and the report show.

    ``blocked_s`` is keyed by ``(gpu, tool, phase)`` with phase ``queue`` or
    ``exec`` (a mixed share contributes to both); ``gpu`` is ``gpu_key``
    of the window, so GPU 0 of two pools stays two GPUs.
    """

    idle_s: dict[str, float] = field(default_factory=dict)
    blocked_s: dict[tuple[str, str, str], float] = field(default_factory=dict)
    unattributed_s: dict[str, float] = field(default_factory=dict)
    # the model server's share, by (gpu, model, phase): queued or decode
    model_s: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def add(self, attribution: WindowAttribution) -> None:
        gpu = gpu_key(attribution.window)
        self.idle_s[gpu] = self.idle_s.get(gpu, 0.0) + attribution.window.seconds
        self.unattributed_s[gpu] = self.unattributed_s.get(gpu, 0.0) + attribution.unattributed_s
        for share in attribution.shares:
            for phase, seconds in ((PHASE_QUEUE, share.queue_s), (PHASE_EXEC, share.exec_s)):
                if seconds > 0.0:
                    key = (gpu, share.call.tool, phase)
                    self.blocked_s[key] = self.blocked_s.get(key, 0.0) + seconds
        if attribution.models:
            _add_by_gpu(self.model_s, gpu, model_by_phase(attribution.models))


def _add_by_gpu(
    totals: dict[tuple[str, str, str], float], gpu: str, seconds_by: dict[tuple[str, str], float], weight: float = 1.0
) -> None:
    """Add seconds by (name, phase) to ``totals`` by (gpu, name, phase)."""
    for (name, phase), seconds in seconds_by.items():
        key = (gpu, name, phase)
        totals[key] = totals.get(key, 0.0) + weight * seconds


@dataclass
class UnderuseTotals:
    """The GPUs' unused capacity, ``(1 - utilization) x time``, blamed by
    the rule: what the ``agent_gpu_underused_*`` metrics and the report's
    ``gpu_underused_*`` fields show, in GPU-seconds.

    ``underused_s`` per GPU equals the sum of its ``blocked_s`` and
    ``model_s`` entries and its ``unattributed_s``. Keys as in ``BlameTotals``.
    """

    underused_s: dict[str, float] = field(default_factory=dict)
    blocked_s: dict[tuple[str, str, str], float] = field(default_factory=dict)
    unattributed_s: dict[str, float] = field(default_factory=dict)
    model_s: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def add(self, attribution: WindowAttribution, blocked: Optional[dict[tuple[str, str], float]] = None) -> None:
        """Add one attributed ``UtilizationSegment``, weighted by its unused ratio
        (``blocked``: its shares' ``blocked_by_tool_phase``, when already summed)."""
        segment = attribution.window
        seconds = (segment.end_ns - segment.start_ns) / NS_PER_S
        if seconds <= 0.0:
            return
        unused = segment.unused_s / seconds  # type: ignore[attr-defined]  # a UtilizationSegment
        if not unused >= 0.0:  # NaN: the utilization is unknown (missing data), not unused
            return
        gpu = gpu_key(segment)
        self.underused_s[gpu] = self.underused_s.get(gpu, 0.0) + unused * seconds
        self.unattributed_s[gpu] = self.unattributed_s.get(gpu, 0.0) + unused * attribution.unattributed_s
        if not unused > 0.0:
            return
        if attribution.models:
            _add_by_gpu(self.model_s, gpu, model_by_phase(attribution.models), unused)
        if blocked is None:
            blocked = attribution.blocked_by_tool_phase()
        blocked_s = self.blocked_s
        for (tool, phase), seconds in blocked.items():
            key = (gpu, tool, phase)
            blocked_s[key] = blocked_s.get(key, 0.0) + unused * seconds


def attribute_underuse(
    segments: Sequence[UtilizationSegment],
    calls: Iterable[ToolCall],
    blocks: Iterable[LoopBlock] = (),
    models: Iterable[ModelCall] = (),
) -> UnderuseTotals:
    """Blame the unused capacity of ``segments`` on ``calls`` by the rule
    (refined by the event loops' ``blocks`` and the ``models`` in flight,
    as for idle windows).

    Segments whose utilization is unknown (NaN: missing data) count
    nowhere: they are neither used nor unused.
    """
    totals = UnderuseTotals()
    for attribution in attribute(segments, calls, blocks, models=models):
        totals.add(attribution)
    return totals


def gpu_key(window: Interval) -> str:
    """A GPU's name across pools: its index, prefixed by its pool if any
    (``"0"``, ``"vllm-a/0"``)."""
    return f"{window.pool}/{window.gpu}" if window.pool else window.gpu


class _Calls:
    """The calls sorted by submit time, as parallel lists, with the running
    integrals of the in-flight count.

    Timestamps are made safe to compare: the end of a call in flight is far
    in the future, a call in flight that has not started executing
    (``start_ns == 0``) is queued until its end, and a start lies in
    [submit, end] even when the input's clocks disagree.

    ``h`` is H(t), the integral of 1/n(t) while n(t) > 0 calls are in
    flight, and ``z`` is Z(t), the time with no call in flight (an exact
    integer), both in nanoseconds at each boundary in ``times``; both are
    linear in between, so any other instant is one binary search away
    (``integrals_at``). Everything is built with C-level helpers (sort,
    map, accumulate): the report runs this on millions of calls.
    """

    def __init__(self, calls: Iterable[ToolCall]):
        # By submit, then start: two stable sorts on plain ints (no key tuples).
        self.calls = calls = sorted(calls, key=_START)
        calls.sort(key=_SUBMIT)
        self.submits = submits = list(map(_SUBMIT, calls))
        # max(end, submit), a call in flight (end 0) ending far in the future
        self.ends = ends = [
            (end if end >= submit else submit) if end else _OPEN_END for end, submit in zip(map(_END, calls), submits)
        ]
        # min(max(start, submit), end), a call not started queued until its end
        self.starts = starts = [
            end if not start or start >= end else start if start > submit else submit
            for start, submit, end in zip(map(_START, calls), submits, ends)
        ]
        # Every boundary once per call, its change of n in the low two bits
        # (0: an end, -1; 1: a start, 0; 2: a submit, +1), so one sort of
        # plain ints orders them. Submits are sorted already and starts and
        # ends nearly so, which the sort exploits. Equal times may repeat:
        # the gap between them is 0, so H and Z come out the same. A start
        # changes nothing in flight: it is a boundary only where a share is
        # split at it (strictly inside the call's life; not a direct call's).
        two = repeat(2)
        keys = list(map(or_, map(lshift, submits, two), two))
        inside = [start for start, submit, end in zip(starts, submits, ends) if submit < start < end]
        keys += map(or_, map(lshift, inside, two), repeat(1))
        keys += map(lshift, [end for end in ends if end != _OPEN_END], two)
        keys.sort()
        self.times = times = list(map(rshift, keys, two))
        # n on [times[i], times[i + 1])
        self.in_flight = in_flight = list(accumulate(map(sub, map(and_, keys, repeat(3)), repeat(1))))
        gaps = list(map(sub, times[1:], times))
        # gap / inf == 0.0: no call in flight adds nothing to H.
        self.h = list(accumulate(map(truediv, gaps, [n or _INF for n in in_flight]), initial=0.0))
        self.z = list(accumulate(map(mul, gaps, map(not_, in_flight)), initial=0))
        self.h_at = dict(zip(times, self.h))

    def integrals_at(self, time: int) -> tuple[float, int]:
        """(H, Z) at any instant."""
        i = bisect_right(self.times, time) - 1
        if i < 0:  # before the first call: nothing in flight
            return 0.0, time - self.times[0] if self.times else time
        elapsed = time - self.times[i]
        n = self.in_flight[i]
        if n:
            return self.h[i] + elapsed / n, self.z[i]
        return self.h[i], self.z[i] + elapsed


def attribute(
    windows: Iterable[Interval],
    calls: Iterable[ToolCall],
    blocks: Iterable[LoopBlock] = (),
    *,
    shares_from: float = 0.0,
    models: Iterable[ModelCall] = (),
) -> list[WindowAttribution]:
    """Blame each idle window (or any ``Interval``) on the model calls, else the tool calls, in flight during it.

    Returns one ``WindowAttribution`` per window, in the order given. A
    window only needs the calls that overlap it (and the loop blocks that
    overlap it): calls outside it do not change who was in flight inside it.
    A window is blamed only on the calls of its own pool.

    ``shares_from`` (seconds, > 0; the live path's ``gpu_idle_share_min``):
    a call whose life is shorter cannot have a share that long in any
    window, so the results keep no ``CallShare`` for it; every call's share
    is in each result's ``blocked`` sums. Where no two of the calls are
    ever in flight at once (a sequential agent) the sums are then made per
    window, not per call (``_Sequential``). Ignored where event-loop blocks
    or model calls cut calls into pieces.

    ``models``: the model calls (``ModelCall``, ``end_ns`` 0 while in
    flight); while one of a window's pool is in flight, the window's time
    is theirs (``WindowAttribution.models``), not the tool calls'.
    """
    windows = list(windows)
    calls = list(calls)
    blocks = list(blocks)
    stand_ins: list[ToolCall] = [
        _stand_in(model) for model in models if not model.end_ns or model.end_ns > model.start_ns
    ]
    pieces_of: dict[int, ToolCall] = {}
    if blocks:
        calls, pieces_of = _cut_at_blocks(calls, blocks)
    if stand_ins:
        calls, pieces_of = _cut_at_models(calls, stand_ins, pieces_of)
    if blocks or pieces_of:
        shares_from = 0.0  # a piece's share merges into its call's: every piece keeps one
    results = _attribute_calls(windows, calls, pieces_of, shares_from)
    if stand_ins:
        return _with_models(results, _attribute_calls(windows, stand_ins, {}, 0.0))
    return results


def _attribute_calls(
    windows: list[Interval], calls: list[ToolCall], pieces_of: dict[int, ToolCall], shares_from: float
) -> list[WindowAttribution]:
    """The rule over tool calls alone (the pieces merged back into their calls)."""
    if shares_from > 0.0 and not pieces_of:
        sequential = _Sequential.of(calls, windows)
        if sequential is not None:
            return [sequential.attribute(window, shares_from) for window in windows]
    results: list[Optional[WindowAttribution]] = [None] * len(windows)
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for index, window in enumerate(windows):
        by_gpu.setdefault((window.pool, window.gpu), []).append(index)
    by_pool = _by_pool(calls, {pool for pool, _gpu in by_gpu})
    for (pool, _gpu), indexes in by_gpu.items():
        sorted_calls = by_pool[pool]
        indexes.sort(key=lambda i: (windows[i].start_ns, windows[i].end_ns))
        for index, overlapping in _pair_with_calls(windows, indexes, sorted_calls):
            results[index] = _attribute_window(windows[index], overlapping, sorted_calls)
    if pieces_of:
        results = [_merge_pieces(result, pieces_of) for result in results]  # type: ignore[arg-type]
    elif shares_from > 0.0:
        shortest = shares_from * NS_PER_S
        for result in results:
            assert result is not None
            result.blocked = blocked_by_tool_phase(result.shares)
            result.shares = [share for share in result.shares if _life_ns(share.call) >= shortest]
    return results  # type: ignore[return-value]  # every slot was filled


def _life_ns(call: ToolCall) -> float:
    """How long a call is in flight (a call still in flight: for ever)."""
    return call.end_ns - call.submit_ns if call.end_ns else _INF


def _by_pool(calls: list[ToolCall], pools: set[str]) -> dict[str, "_Calls"]:
    """The calls of each of ``pools``, sorted and integrated. One pass over
    the calls only when some call or window declares a pool."""
    if pools <= {""} and not any(map(attrgetter("pool"), calls)):
        return {"": _Calls(calls)}
    grouped: dict[str, list[ToolCall]] = {pool: [] for pool in pools}
    for call in calls:
        group = grouped.get(call.pool)
        if group is not None:
            group.append(call)
    return {pool: _Calls(group) for pool, group in grouped.items()}


def _pair_with_calls(windows: list[Interval], indexes: list[int], calls: _Calls) -> Iterator[tuple[int, list[int]]]:
    """Yield (window index, positions of the calls overlapping it in submit
    order) for one GPU's windows, ``indexes`` sorted by window start.

    The active list holds the calls submitted before the current window's
    end that had not ended at its start: a call joins it once, and leaves
    at the first window that starts after its end, so each call costs a
    constant plus one step per window it overlaps.
    """
    submits, ends = calls.submits, calls.ends
    active: list[int] = []  # positions, in submit order
    next_call = 0
    for index in indexes:
        start, end = windows[index].start_ns, windows[index].end_ns
        active = [position for position in active if ends[position] > start]
        # The calls submitted before the window's end join; one that ended
        # before this window can overlap no later one.
        joining = bisect_left(submits, end, next_call)
        active += [
            position
            for position in range(next_call, joining)
            if ends[position] > start and ends[position] > submits[position]
        ]
        next_call = joining
        # The submit check matters only if one GPU's windows overlap.
        yield index, [position for position in active if submits[position] < end]


def _attribute_window(window: Interval, positions: list[int], calls: _Calls) -> WindowAttribution:
    start, end = window.start_ns, window.end_ns
    if end <= start:
        return WindowAttribution(window, [], 0.0)  # type: ignore[arg-type]  # any Interval
    h_start, z_start = calls.integrals_at(start)
    h_end, z_end = calls.integrals_at(end)
    h_at, submits, starts, ends, records = calls.h_at, calls.submits, calls.starts, calls.ends, calls.calls
    shares: list[CallShare] = []
    append = shares.append
    for position in positions:
        a = submits[position]
        if a > start:
            h_a = h_at[a]
        else:
            a, h_a = start, h_start
        b = ends[position]
        if b < end:
            h_b = h_at[b]
        else:
            b, h_b = end, h_end
        exec_start = starts[position]
        if exec_start <= a:
            append(CallShare(records[position], a, b, 0.0, (h_b - h_a) / NS_PER_S))
        elif exec_start >= b:
            append(CallShare(records[position], a, b, (h_b - h_a) / NS_PER_S, 0.0))
        else:
            h_m = h_at[exec_start]
            append(CallShare(records[position], a, b, (h_m - h_a) / NS_PER_S, (h_b - h_m) / NS_PER_S))
    return WindowAttribution(window, shares, (z_end - z_start) / NS_PER_S)  # type: ignore[arg-type]


class _Sequential:
    """Calls of which no two are ever in flight at once, sorted by submit,
    as parallel lists (timestamps made safe as ``_Calls`` makes them).

    While at most one call is in flight, the rule gives each call, in each
    window, the part of its life inside the window (its queue part and its
    exec part), and the window's rest is unattributed. Every call between
    the first and the last a window overlaps lies wholly inside it, so a
    window's sums by tool and phase are sums over a slice of these lists (C
    level, no object per call): O(1) Python steps a window, where ``_Calls``
    takes several a call. The same numbers as the rule's integrals, in
    integer nanoseconds until the division (the integrals' floating-point
    sums agree with them to about 1e-16 of the window's length).
    """

    __slots__ = ("calls", "submits", "starts", "ends", "tools")

    def __init__(self, calls: list[ToolCall], submits: list[int], starts: list[int], ends: list[int]):
        self.calls, self.submits, self.starts, self.ends = calls, submits, starts, ends
        self.tools = list(map(_TOOL, calls))

    @classmethod
    def of(cls, calls: list[ToolCall], windows: list[Interval]) -> Optional["_Sequential"]:
        """The calls in this form, or None where it does not apply: two calls
        in flight at once, a timestamp out of order, a call still in flight
        other than the last, or more than one pool among the calls and windows."""
        if len(set(map(_POOL, calls)) | set(map(_POOL, windows))) > 1:
            return None
        calls = sorted(calls, key=_SUBMIT)
        submits = list(map(_SUBMIT, calls))
        starts = list(map(_START, calls))
        ends = list(map(_END, calls))
        if calls and not ends[-1]:  # the last call still in flight: open-ended
            ends[-1] = _OPEN_END
            if not starts[-1]:
                starts[-1] = _OPEN_END  # not started: queued until its end
        # submit <= start <= end for each call, and each ends before (or as) the next is submitted
        if not (all(map(le, submits, starts)) and all(map(le, starts, ends)) and all(map(le, ends, submits[1:]))):
            return None
        return cls(calls, submits, starts, ends)

    def attribute(self, window: Interval, shares_from: float) -> WindowAttribution:
        start, end = window.start_ns, window.end_ns
        if end <= start:
            return WindowAttribution(window, [], 0.0, {})  # type: ignore[arg-type]  # any Interval
        submits, starts, ends, tools = self.submits, self.starts, self.ends, self.tools
        first = bisect_right(ends, start)  # the calls ending after the window starts...
        last = bisect_left(submits, end, first)  # ...and submitted before it ends: [first, last)
        queued: dict[str, int] = {}
        executing: dict[str, int] = {}
        inner_from, inner_to = first, last  # the calls wholly inside the window
        for position in {first, last - 1} if first < last else ():
            if submits[position] < start or ends[position] > end:  # partly inside: clipped
                a, b = max(submits[position], start), min(ends[position], end)
                m = min(max(starts[position], a), b)
                tool = tools[position]
                queued[tool] = queued.get(tool, 0) + m - a
                executing[tool] = executing.get(tool, 0) + b - m
                if position == first:
                    inner_from = first + 1
                else:
                    inner_to = last - 1
        if inner_from < inner_to:
            names = dict.fromkeys(tools[inner_from:inner_to])
            if len(names) == 1:
                (tool,) = names
                s, m, e = (
                    sum(submits[inner_from:inner_to]),
                    sum(starts[inner_from:inner_to]),
                    sum(ends[inner_from:inner_to]),
                )
                queued[tool] = queued.get(tool, 0) + m - s
                executing[tool] = executing.get(tool, 0) + e - m
            elif len(names) <= _TOOLS_BY_PASSES:
                inner = slice(inner_from, inner_to)
                for tool in names:
                    mask = list(map(tool.__eq__, tools[inner]))
                    s = sum(compress(submits[inner], mask))
                    m = sum(compress(starts[inner], mask))
                    e = sum(compress(ends[inner], mask))
                    queued[tool] = queued.get(tool, 0) + m - s
                    executing[tool] = executing.get(tool, 0) + e - m
            else:
                for position in range(inner_from, inner_to):
                    tool = tools[position]
                    queued[tool] = queued.get(tool, 0) + starts[position] - submits[position]
                    executing[tool] = executing.get(tool, 0) + ends[position] - starts[position]
        blocked: dict[tuple[str, str], float] = {}
        in_flight = 0
        for tool, ns in queued.items():
            in_flight += ns + executing[tool]
            if ns > 0:
                blocked[(tool, PHASE_QUEUE)] = ns / NS_PER_S
            if executing[tool] > 0:
                blocked[(tool, PHASE_EXEC)] = executing[tool] / NS_PER_S
        shortest = shares_from * NS_PER_S
        shares = []
        for position in compress(
            range(first, last), map(ge, map(sub, ends[first:last], submits[first:last]), repeat(shortest))
        ):
            a, b = max(submits[position], start), min(ends[position], end)
            m = min(max(starts[position], a), b)
            shares.append(CallShare(self.calls[position], a, b, (m - a) / NS_PER_S, (b - m) / NS_PER_S))
        return WindowAttribution(window, shares, (end - start - in_flight) / NS_PER_S, blocked)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the model server


class _ModelStandIn(ToolCall):
    """A model call as the rule's integrals see a call: in flight from its
    start to its end, ``queue`` (``queued``) until its first token and
    ``exec`` (``decode``) after; ``model`` is the record it stands for."""

    __slots__ = ("model",)
    model: ModelCall


def _stand_in(model: ModelCall) -> _ModelStandIn:
    first = model.first_token_ns
    end = model.end_ns
    if first and end:
        first = min(max(first, model.start_ns), end)
    stand_in = _ModelStandIn(
        model.model,
        "model",
        model.start_ns,
        first,  # 0: no first token known, queued until its end
        end,
        trace_id=model.trace_id,
        span_id=model.span_id,
        pool=model.pool,
    )
    stand_in.model = model
    return stand_in


def _cut_at_models(
    calls: list[ToolCall], models: list[ToolCall], pieces_of: dict[int, ToolCall]
) -> tuple[list[ToolCall], dict[int, ToolCall]]:
    """The tool calls as the rule sees them beside the model calls: each is
    out of flight wherever a model call of its pool is in flight (its life
    cut into the pieces outside them, as ``_cut_at_blocks`` cuts). Returns
    the calls and pieces, and for each piece (by id) the original call,
    following ``pieces_of`` (pieces of pieces cut at loop blocks)."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for model in models:
        spans.setdefault(model.pool, []).append((model.submit_ns, model.end_ns or _OPEN_END))
    unions: dict[str, tuple[list[int], list[int]]] = {}
    for pool, intervals in spans.items():
        intervals.sort()
        starts: list[int] = []
        ends: list[int] = []
        for start, end in intervals:
            if ends and start <= ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)
        unions[pool] = (starts, ends)
    result: list[ToolCall] = []
    cut_pieces = dict(pieces_of)
    for call in calls:
        union = unions.get(call.pool)
        if union is None:
            result.append(call)
            continue
        starts, ends = union
        submit, end = call.submit_ns, call.end_ns or _OPEN_END
        first = bisect_right(ends, submit)  # the model stretches ending after the call is submitted...
        last = bisect_left(starts, end, first)  # ...and starting before it ends
        if first >= last:
            result.append(call)
            continue
        original = pieces_of.get(id(call), call)
        for piece in _pieces(call, list(zip(starts[first:last], ends[first:last]))):
            cut_pieces[id(piece)] = original
            result.append(piece)
    return result, cut_pieces


def _with_models(results: list[WindowAttribution], by_models: list[WindowAttribution]) -> list[WindowAttribution]:
    """Each window's tool blame with its model calls' shares beside it; the
    unattributed time is what neither explains."""
    for result, model_result in zip(results, by_models):
        if not model_result.shares:
            continue
        result.models = [
            ModelShare(share.call.model, share.start_ns, share.end_ns, share.queue_s, share.exec_s)  # type: ignore[attr-defined]
            for share in model_result.shares
        ]
        seconds = (result.window.end_ns - result.window.start_ns) / NS_PER_S
        covered = seconds - model_result.unattributed_s  # some model call in flight
        result.unattributed_s = max(0.0, result.unattributed_s - covered)
    return results


# ---------------------------------------------------------------- blocked event loops


def _cut_at_blocks(calls: list[ToolCall], blocks: Sequence[LoopBlock]) -> tuple[list[ToolCall], dict[int, ToolCall]]:
    """The calls as the rule sees them while event loops are blocked.

    A call that waits for a blocked loop, or blocks it, is out of flight
    during that block: its life is cut into the pieces outside its blocks.
    Each blocker gets a piece covering its block, executing throughout (a
    stand-in call with the block's tool name when the blocker is not among
    ``calls``). Returns the calls and pieces, and for each piece (by id) the
    call it is part of; calls no block names are passed on unchanged.
    """
    cut: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for block in blocks:
        interval = (block.start_ns, block.end_ns or _OPEN_END)
        for key in (*block.waiting, *((block.blocker,) if block.blocker else ())):
            cut.setdefault(key, []).append(interval)
    result: list[ToolCall] = []
    pieces_of: dict[int, ToolCall] = {}
    by_key: dict[tuple[int, int], ToolCall] = {}
    for call in calls:
        key = (call.trace_id, call.span_id)
        intervals = cut.get(key) if call.span_id else None
        if intervals is None:
            result.append(call)
            continue
        by_key[key] = call
        for piece in _pieces(call, intervals):
            pieces_of[id(piece)] = call
            result.append(piece)
    for block in blocks:
        if block.blocker is None or block.end_ns and block.end_ns <= block.start_ns:
            continue
        blocker = by_key.get(block.blocker)
        tool = blocker.tool if blocker is not None else (block.tool or "unknown")
        piece = ToolCall(
            tool,
            "direct",
            block.start_ns,
            block.start_ns,
            block.end_ns,
            trace_id=block.blocker[0],
            span_id=block.blocker[1],
            pool=blocker.pool if blocker is not None else block.pool,
        )
        if blocker is not None:
            pieces_of[id(piece)] = blocker
        result.append(piece)
    return result, pieces_of


def _pieces(call: ToolCall, intervals: list[tuple[int, int]]) -> list[ToolCall]:
    """The parts of ``call``'s life outside ``intervals``, each with its own
    queue and exec phases (a part before the call started executing is queued)."""
    submit, start, end = call.submit_ns, call.start_ns, call.end_ns or _OPEN_END
    pieces = []
    at = submit
    for cut_start, cut_end in sorted(intervals) + [(end, end)]:
        if cut_start > at:
            piece_end = min(cut_start, end)
            if start == 0:
                piece_start = 0  # still queued
            else:
                piece_start = min(max(start, at), piece_end)
            pieces.append(
                dataclasses.replace(
                    call, submit_ns=at, start_ns=piece_start, end_ns=0 if piece_end == _OPEN_END else piece_end
                )
            )
        at = max(at, cut_end)
        if at >= end:
            break
    return pieces


def _merge_pieces(result: WindowAttribution, pieces_of: dict[int, ToolCall]) -> WindowAttribution:
    """One share per call: the sum of its pieces' shares, over their overlap."""
    merged: dict[int, CallShare] = {}
    for share in result.shares:
        call = pieces_of.get(id(share.call), share.call)
        existing = merged.get(id(call))
        if existing is None:
            merged[id(call)] = CallShare(call, share.start_ns, share.end_ns, share.queue_s, share.exec_s)
        else:
            existing.start_ns = min(existing.start_ns, share.start_ns)
            existing.end_ns = max(existing.end_ns, share.end_ns)
            existing.queue_s += share.queue_s
            existing.exec_s += share.exec_s
    shares = sorted(merged.values(), key=lambda share: (share.call.submit_ns, share.call.start_ns))
    return WindowAttribution(result.window, shares, result.unattributed_s)
