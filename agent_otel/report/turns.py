"""The turn broken down: where each agent run's end-to-end time went.

A turn is an agent run: an ``invoke_agent`` span (or OpenInference's
``AGENT`` / OpenLLMetry's ``agent`` and ``workflow`` spans), the outermost
ones of a trace; where a trace has none, or has tool or model calls outside
them, the trace itself is one turn: its root span (a web framework's
request span, say), widened to cover its calls. A trace whose root is
itself a tool or model call, or whose root is not in the input, has no turn
to break down. Each turn's end-to-end time is split into five parts that
add up to it:

- **client CPU**: the agent process's event loop was blocked by its own
  code (an ``asyncio.loop.blocked`` span that no tool call held) while a
  model or tool call of the turn waited for it: the client spending CPU on
  itself (a first call's schema building and imports, parsing, a sync call
  in async code), which would otherwise read as model time (the answer
  cannot be read while the loop is held) or tool time;
- else **model**: a model call of the turn was in flight;
- else **tool queue** or **tool exec**: a tool call of the turn was in
  flight; the instant goes to the phase of the one that finishes last, the
  call the turn is waiting on (of two calls side by side, one executing and
  one still queued behind it that finishes later, the turn waits on the
  queued one: tool queue);
- else **other**: the agent's own code, the framework, waits the traces do
  not show.

Per tool, ``latency_share`` is the part of all turns' end-to-end time in
which a call of that tool was in flight (queued or executing): tools running
side by side each count that time, so the shares can add up to more than 1.
With the GPU idle time blamed on the tool per call, it gives the sentence
"search idles the GPU 2.1 s per call, 57 % of end-to-end latency".
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import accumulate, chain
from operator import attrgetter
from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np

from agent_otel.records import NS_PER_S, AgentRun, LoopBlock, ModelCall
from agent_otel.spans.calls import U64, CallTable, TraceIds
from agent_otel.spans.ids import grouped

FROM_AGENT = "agent"
FROM_TRACE = "trace"
# How far (ns) a call may reach beyond an agent span and still be inside it.
SLACK_NS = 1_000_000
PARTS = ("client_cpu", "model", "tool_queue", "tool_exec", "other")


@dataclass(slots=True)
class Turn:
    name: str
    trace_id: int
    start_ns: int
    end_ns: int
    source: str  # FROM_AGENT or FROM_TRACE
    client_cpu_s: float = 0.0
    model_s: float = 0.0
    tool_queue_s: float = 0.0
    tool_exec_s: float = 0.0
    other_s: float = 0.0
    tool_calls: int = 0
    model_calls: int = 0

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S


def find_turns(
    calls: CallTable,
    model_calls: Sequence[ModelCall],
    agent_runs: Sequence[AgentRun],
    roots: dict[int, AgentRun],
    keep: bool = True,
    loop_blocks: Sequence[LoopBlock] = (),
) -> tuple[list[Turn], "TurnTotals"]:
    """Every turn of the traces that holds a tool or model call, in start order, and their totals.

    ``loop_blocks``: the event-loop blocks read from the traces; one that no
    tool call held is client CPU time of the traces of the calls it links as
    waiting for the loop.

    ``calls`` come by submit time (``analysis.calls``); their columns are
    read by row, no record made per call. ``keep``: return
    every turn (the HTML and Perfetto outputs draw them); without it the
    list is empty and only the totals are kept (with the turns' durations
    and the slowest turns): 250k turns take about 50 MB.
    """
    models_of: dict[int, list[ModelCall]] = defaultdict(list)
    for model_call in model_calls:
        models_of[model_call.trace_id].append(model_call)
    # trace -> its run, or its runs where it has several (no list per trace: a run is a turn, and there are many)
    runs_of: dict[int, Union[AgentRun, list[AgentRun]]] = {}
    for run in agent_runs:
        known = runs_of.setdefault(run.trace_id, run)
        if known is not run:
            if isinstance(known, list):
                known.append(run)
            else:
                runs_of[run.trace_id] = [known, run]
    blocks_of = _client_blocks(loop_blocks)
    turns = _Turns(keep)
    in_flight: dict[str, int] = defaultdict(int)  # tool -> ns of turns with a call of it in flight
    batch = _Batch(calls, turns, in_flight)
    no_models: list[ModelCall] = []
    for trace_id, rows, times in _traces(calls, models_of):
        trace_models = models_of.get(trace_id, no_models)
        found = runs_of.get(trace_id)
        if found is not None:
            runs = _outermost(found) if isinstance(found, list) else [found]
            if _all_covered(calls, rows, times, trace_models, runs):
                if len(runs) == 1:
                    turn = Turn(runs[0].name, trace_id, runs[0].start_ns, runs[0].end_ns, FROM_AGENT)
                    batch.add(turn, rows, trace_models, True, blocks_of.get(trace_id))
                    continue
                # many turns in one trace (a session's): each gets the calls
                # that may overlap it, not the whole trace's to filter
                overlapping = _overlapping(calls, rows, trace_models)
                for run in runs:
                    turn = Turn(run.name, trace_id, run.start_ns, run.end_ns, FROM_AGENT)
                    mine, models = overlapping(run.start_ns, run.end_ns)
                    batch.add(turn, mine, models, False, blocks_of.get(trace_id))
                continue
        root = roots.get(trace_id)
        if root is None:
            continue  # no agent run around the calls
        root_span, span = root.span_id, calls.span_id
        if any(span[row] == root_span for row in rows) or any(m.span_id == root_span for m in trace_models):
            continue  # the root is itself a call
        first = root.start_ns if times is None else min(root.start_ns, times[0])
        first = min(first, min((m.start_ns for m in trace_models), default=first))
        last = root.end_ns if times is None else max(root.end_ns, times[1])
        last = max(last, max((m.end_ns for m in trace_models), default=last))
        turn = Turn(root.name, trace_id, first, last, FROM_TRACE)
        batch.add(turn, rows, trace_models, True, blocks_of.get(trace_id))
    batch.flush()
    return turns.finish(in_flight)


def _client_blocks(loop_blocks: Sequence[LoopBlock]) -> dict[int, list[tuple[int, int]]]:
    """trace -> the (start, end) of the loop blocks no tool call held that
    calls of the trace waited on, by start (a tool call's own block is its exec time)."""
    found: dict[int, list[tuple[int, int]]] = {}
    for block in loop_blocks:
        if block.blocker is not None or block.tool is not None or not block.end_ns:
            continue
        for trace_id in {trace for trace, _span in block.waiting}:
            found.setdefault(trace_id, []).append((block.start_ns, block.end_ns))
    for intervals in found.values():
        intervals.sort()
    return found


def _traces(
    calls: CallTable, models_of: dict[int, list[ModelCall]]
) -> Iterator[tuple[int, list[int], Optional[tuple[int, int]]]]:
    """(trace, the rows of its calls by submit time, (their earliest
    request, latest end)) for each trace with calls, in the order of their
    last calls, then the traces with model calls only (no rows, None).

    Grouped in numpy (the trace ids' two 64-bit halves sorted): no dict of
    every trace (with a trace per call, a million of them took 100 MB at
    the report's peak), and only one trace's list of rows at a time."""
    trace_ids = calls.trace_id
    count = len(trace_ids)
    if count:
        high, low = np.frombuffer(trace_ids.high, np.uint64), np.frombuffer(trace_ids.low, np.uint64)
        order, firsts = grouped(high, low)  # each trace's rows stay in row order
        del high, low
        lasts = np.concatenate((firsts[1:], [count]))
        earliest = np.minimum.reduceat(np.frombuffer(calls.submit_ns, np.uint64)[order], firsts)
        latest = np.maximum.reduceat(np.frombuffer(calls.end_ns, np.uint64)[order], firsts)
    pending = dict.fromkeys(models_of)  # the traces with model calls not yet given
    if count:
        # each trace at its last call, as the calls come (as Python ints a few thousand at a time)
        walk = np.argsort(order[lasts - 1], kind="stable")
        for begin in range(0, len(walk), _GROUPS):
            groups = walk[begin : begin + _GROUPS]
            for first, last, times in zip(
                firsts[groups].tolist(), lasts[groups].tolist(), zip(earliest[groups].tolist(), latest[groups].tolist())
            ):
                rows = order[first:last].tolist()
                trace_id = trace_ids[rows[0]]
                pending.pop(trace_id, None)
                yield trace_id, rows, times
    for trace_id in pending:
        yield trace_id, [], None


_GROUPS = 4096


# The slowest turns the totals keep (the JSON's ``turns.slowest``).
SLOWEST = 10
_LOW_64 = (1 << 64) - 1


class _Turns:
    """The turns as they are found: each one's start, trace and the
    seconds of its parts (40 bytes a turn where a ``Turn`` takes about
    200), the slowest ``SLOWEST`` of them, and every ``Turn`` when kept."""

    def __init__(self, keep: bool) -> None:
        self.kept: Optional[list[Turn]] = [] if keep else None
        self.starts = array(U64)
        self.traces = TraceIds()  # (halves: a trace per call is a trace id int per turn)
        self.parts = array("d")  # per turn: seconds, client CPU, model, tool queue, tool exec, other
        self.from_agent = 0
        # the slowest so far, as (seconds, -start, -trace, -order, turn): the root is the least slow
        self.slowest: list[tuple[float, int, int, int, Turn]] = []

    def add(self, turns: list[Turn]) -> None:
        """These turns, in the order found."""
        if self.kept is not None:
            self.kept.extend(turns)
        count = len(self.starts)
        self.starts.extend([turn.start_ns for turn in turns])
        self.traces.high.extend([turn.trace_id >> 64 for turn in turns])
        self.traces.low.extend([turn.trace_id & _LOW_64 for turn in turns])
        rows = list(map(_row_of, turns))
        self.parts.extend(chain.from_iterable(rows))
        self.from_agent += sum(turn.source == FROM_AGENT for turn in turns)
        # (slowest first; of equal seconds, the first by start and trace, as the turns are ordered)
        slowest = self.slowest
        for order, (turn, (took, *_)) in enumerate(zip(turns, rows), count + 1):
            if len(slowest) < SLOWEST:
                heapq.heappush(slowest, (took, -turn.start_ns, -turn.trace_id, -order, turn))
            elif took >= slowest[0][0]:
                entry = (took, -turn.start_ns, -turn.trace_id, -order, turn)
                if entry[:4] > slowest[0][:4]:
                    heapq.heapreplace(slowest, entry)

    def finish(self, in_flight_ns: dict[str, int]) -> tuple[list[Turn], "TurnTotals"]:
        """The kept turns in order (by start, then trace), and the totals."""
        # by (start, trace), ties in the order found: a stable sort in numpy on
        # the start and the trace id's two 64-bit halves (in Python, 0.4 s at
        # 250k turns: the key functions, and the ints scattered in memory)
        high, low = np.frombuffer(self.traces.high, np.uint64), np.frombuffer(self.traces.low, np.uint64)
        order = np.lexsort((low, high, np.frombuffer(self.starts, np.uint64)))
        del high, low
        parts = np.frombuffer(self.parts, np.float64).reshape(-1, 6)
        result = TurnTotals(count=len(order), from_agent_spans=self.from_agent)
        if len(order):
            # summed in that order, one part at a time (a running sum adds them one by one, as Python does)
            (
                result.end_to_end_s,
                result.client_cpu_s,
                result.model_s,
                result.tool_queue_s,
                result.tool_exec_s,
                result.other_s,
            ) = (float(np.cumsum(parts[order, part])[-1]) for part in range(6))
        result.tool_in_flight_s = {tool: ns / NS_PER_S for tool, ns in in_flight_ns.items()}
        result.durations_s = array("d", np.sort(parts[:, 0]).tobytes())
        result.slowest = [entry[-1] for entry in sorted(self.slowest, reverse=True)]
        kept = self.kept
        return ([] if kept is None else [kept[i] for i in order.tolist()]), result


_row_of = attrgetter("seconds", "client_cpu_s", "model_s", "tool_queue_s", "tool_exec_s", "other_s")


def _all_covered(
    calls: CallTable,
    rows: list[int],
    times: Optional[tuple[int, int]],
    model_calls: list[ModelCall],
    runs: list[AgentRun],
) -> bool:
    """Whether every call (of these rows: requested from ``times[0]``, ended
    by ``times[1]``) lies within one of the runs."""
    if len(runs) == 1:
        low, high = runs[0].start_ns - SLACK_NS, runs[0].end_ns + SLACK_NS
        if times is not None and (times[0] < low or times[1] > high):
            return False
        for model_call in model_calls:
            if model_call.start_ns < low or model_call.end_ns > high:
                return False
        return True
    # The outermost runs, by start, end later one after the other: of the
    # runs begun by a span's start, the last one reaches furthest.
    begins = [r.start_ns - SLACK_NS for r in runs]
    reach = [r.end_ns + SLACK_NS for r in runs]
    if rows:  # the calls' in numpy (one trace may hold a million)
        u64, taken = np.uint64, np.array(rows, np.intp)
        lowest = np.array([max(t, 0) for t in begins], u64)  # (a time is within [0, 2**64))
        highest = np.array([min(t, _LOW_64) for t in reach], u64)
        run = np.searchsorted(lowest, np.frombuffer(calls.submit_ns, u64)[taken], "right") - 1
        if run.min() < 0 or (np.frombuffer(calls.end_ns, u64)[taken] > highest[run]).any():
            return False
    for model_call in model_calls:
        i = bisect_right(begins, model_call.start_ns) - 1
        if i < 0 or model_call.end_ns > reach[i]:
            return False
    return True


def _overlapping(
    calls: CallTable, rows: list[int], model_calls: list[ModelCall]
) -> Callable[[int, int], tuple[list[int], list[ModelCall]]]:
    """For a stretch [a, b): the rows (by submit time) and model calls that
    may overlap it, found by bisection: those requested before b, from the
    first whose end, or an earlier one's, is past a."""
    taken = np.array(rows, np.int64)
    submits = np.frombuffer(calls.submit_ns, np.uint64)[taken]  # (arrays: a trace may hold a million calls)
    reach = np.maximum.accumulate(np.frombuffer(calls.end_ns, np.uint64)[taken])
    del taken
    models = sorted(model_calls, key=lambda m: m.start_ns)
    model_starts = [m.start_ns for m in models]
    model_reach = list(accumulate((m.end_ns for m in models), max))

    def within(a: int, b: int) -> tuple[list[int], list[ModelCall]]:
        first = int(np.searchsorted(reach, np.uint64(a), "right"))
        mine = rows[first : int(np.searchsorted(submits, np.uint64(b), "left"))]
        theirs = models[bisect_right(model_reach, a) : bisect_left(model_starts, b)]
        return mine, theirs

    return within


def _outermost(runs: list[AgentRun]) -> list[AgentRun]:
    """The runs no other run of the trace contains (a sub-agent is part of its parent's turn)."""
    runs = sorted(runs, key=lambda r: (r.start_ns, -r.end_ns))
    outer: list[AgentRun] = []
    for run in runs:
        if outer and run.end_ns <= outer[-1].end_ns:
            continue
        outer.append(run)
    return outer


# Turns split together in numpy (``_Batch``): at most this many turns wait, and
# the calls of the turns waiting are split once they pass this many.
BATCH_TURNS = 4096
BATCH_CALLS = 1 << 14


class _Batch:
    """The turns as they are found, broken down: a turn of calls one after
    another (and no model call or client block) at once, in Python; the
    others a batch at a time in numpy (``_split_turns``, ``_in_flight_turns``).
    The turns reach ``_Turns`` in the order they were found, and each
    tool's time in flight is added to ``in_flight``."""

    def __init__(self, calls: CallTable, turns: _Turns, in_flight: dict[str, int]) -> None:
        self.calls, self.turns, self.in_flight = calls, turns, in_flight
        self.pending: list[Turn] = []  # the turns found, in order, since the last batch
        self.split: list[Turn] = []  # those of them to split in numpy
        self.bounds = array(U64)  # of each turn to split: start, end
        self.rows = array("q")  # their calls' rows, turn after turn
        self.models = array(U64)  # their model calls' (start, end), turn after turn
        self.blocks = array(U64)  # their client CPU blocks' (start, end), turn after turn
        self.counts = array("q")  # of each turn: how many calls, model calls, blocks
        self.code_of: Optional[dict[str, int]] = None  # tool -> its number (made at the first batch)
        self.tools: list[str] = []  # the tools by number

    def add(
        self,
        turn: Turn,
        rows: list[int],
        model_calls: list[ModelCall],
        whole_trace: bool,
        blocks: Optional[list[tuple[int, int]]] = None,
    ) -> None:
        """Break the turn down between the calls of these rows (by submit
        time) and the model calls.

        ``whole_trace``: every call given lies within the turn (no filtering).
        ``blocks``: the (start, end) of the client CPU blocks of the trace.
        """
        calls = self.calls
        a, b = turn.start_ns, turn.end_ns
        submits, ends = calls.submit_ns, calls.end_ns
        if not whole_trace:
            rows = [row for row in rows if submits[row] < b and ends[row] > a]
            model_calls = [m for m in model_calls if m.start_ns < b and m.end_ns > a]
        turn.tool_calls, turn.model_calls = len(rows), len(model_calls)
        if blocks:
            blocks = [(start, end) for start, end in blocks if start < b and end > a]
        sequential = not model_calls and not blocks
        if sequential:
            reach = a
            for row in rows:
                if submits[row] < reach:
                    sequential = False
                    break
                reach = ends[row]
        if sequential:
            # one call after another, no model call: each instant has at most one call in flight
            starts, tools, in_flight = calls.start_ns, calls.tool, self.in_flight
            queue = execution = 0
            for row in rows:  # each from a on (sequential calls start at or after a), up to b
                submit, start, end = submits[row], starts[row], ends[row]
                if end > b:
                    end = b
                    start = start if start < b else b
                    submit = submit if submit < b else b  # (requested past b, within the slack: nothing)
                queue += start - submit
                execution += end - start
                in_flight[tools[row]] += end - submit
            turn.tool_queue_s, turn.tool_exec_s = queue / NS_PER_S, execution / NS_PER_S
            turn.other_s = max(0.0, turn.seconds - turn.tool_queue_s - turn.tool_exec_s)
            self.pending.append(turn)
            if len(self.pending) >= BATCH_TURNS:
                self.flush()
            return
        self.pending.append(turn)
        self.split.append(turn)
        self.bounds.extend((a, b))
        self.rows.extend(rows)
        models = self.models
        for model_call in model_calls:
            models.extend((model_call.start_ns, model_call.end_ns))
        if blocks:
            for block in blocks:
                self.blocks.extend(block)
        self.counts.extend((len(rows), len(model_calls), len(blocks) if blocks else 0))
        if len(self.pending) >= BATCH_TURNS or len(self.rows) >= BATCH_CALLS:
            self.flush()

    def flush(self) -> None:
        """Split the turns waiting, and hand every turn waiting on to ``_Turns``, in order."""
        if self.split:
            self._split()
        self.turns.add(self.pending)
        self.pending.clear()

    def _split(self) -> None:
        calls, split = self.calls, self.split
        u64, count = np.uint64, len(split)
        bounds = np.frombuffer(self.bounds, u64).reshape(count, 2)
        taken = np.frombuffer(self.rows, np.int64)
        counts = np.frombuffer(self.counts, np.int64).reshape(count, 3)
        call_turn, model_turn, block_turn = (np.repeat(np.arange(count), counts[:, kind]) for kind in range(3))
        submits = np.frombuffer(calls.submit_ns, u64)[taken]
        ends = np.frombuffer(calls.end_ns, u64)[taken]
        models = np.frombuffer(self.models, u64).reshape(-1, 2)
        blocks = np.frombuffer(self.blocks, u64).reshape(-1, 2)
        parts = _split_turns(
            bounds,
            call_turn,
            submits,
            np.frombuffer(calls.start_ns, u64)[taken],
            ends,
            model_turn,
            models,
            block_turn,
            blocks,
        )
        for turn, (client, model, queue, execution) in zip(split, parts.tolist()):
            turn.client_cpu_s, turn.model_s = client / NS_PER_S, model / NS_PER_S
            turn.tool_queue_s, turn.tool_exec_s = queue / NS_PER_S, execution / NS_PER_S
            turn.other_s = max(
                0.0, turn.seconds - turn.client_cpu_s - turn.model_s - turn.tool_queue_s - turn.tool_exec_s
            )
        if self.code_of is None:
            self.tools = list(dict.fromkeys(calls.tool))  # in the order of first calls
            self.code_of = {tool: code for code, tool in enumerate(self.tools)}
        codes = np.fromiter(map(self.code_of.__getitem__, map(calls.tool.__getitem__, self.rows)), np.intp, len(taken))
        in_flight, tools = self.in_flight, self.tools
        for code, ns in _in_flight_turns(bounds, call_turn, submits, ends, codes).items():
            in_flight[tools[code]] += ns
        del taken, counts, models, blocks, bounds  # (the views let go of the arrays)
        split.clear()
        for column in (self.bounds, self.rows, self.models, self.blocks, self.counts):
            del column[:]


def _split_turns(
    bounds: np.ndarray,
    call_turn: np.ndarray,
    submits: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    model_turn: np.ndarray,
    models: np.ndarray,
    block_turn: np.ndarray,
    blocks: np.ndarray,
) -> np.ndarray:
    """Nanoseconds of client CPU, model, tool queue and tool exec of each
    turn [a, b) of ``bounds`` (a row each, uint64), as a (turns, 4) uint64
    array; see the module's docstring.

    The turns' tool calls (``call_turn`` numbers each one's turn; the
    turns in order, each one's calls by request time), model calls and
    client CPU blocks (each turn's by start) come as columns. Each piece
    of [a, b) between two bounds is the client's where a block covers its
    start, else the model's where a model call does, else the tool calls'
    where one is in flight: of those requested by then, the one that ends
    last (the first of them by request), queued before its start,
    executing after.

    All turns at once: each time is moved into its turn's segment of one
    axis, the turns' segments end to end (``_segments``), where the
    classing above is one running maximum and a few searches over every
    piece. Each time is first clamped into [a, b] (a request or an end
    only from below): for an instant of [a, b) that changes none of the
    answers, and it keeps each turn's times within its segment. An end
    past b is kept (up to the segment's end): of two calls ending past b,
    the turn waits on the one ending later. The pieces are classed
    ``_PIECES`` at a time (one turn may hold a million calls)."""
    u64 = np.uint64
    a = bounds[:, 0]
    b = np.maximum(bounds[:, 1], a)  # (a turn that ends before it starts has no instant)
    ends = np.maximum(ends, a[call_turn])
    last = b.copy()  # each turn's latest time on the axis: b, or a call's end (or request) past it
    np.maximum.at(last, call_turn, np.maximum(submits, ends))
    parts = np.zeros((len(a), 4), u64)
    for first, stop, offsets in _segments(last - a):
        calls = slice(*np.searchsorted(call_turn, (first, stop)).tolist())
        models_in = slice(*np.searchsorted(model_turn, (first, stop)).tolist())
        blocks_in = slice(*np.searchsorted(block_turn, (first, stop)).tolist())
        shift = offsets - a[first:stop]  # time + shift: the time on the axis (mod 2**64)
        begin, finish = offsets, b[first:stop] + shift
        turn = call_turn[calls] - first
        call_a, call_b, call_shift = a[first:stop][turn], finish[turn], shift[turn]
        requested = np.maximum(submits[calls], call_a) + call_shift  # (within the segment: no wrap)
        start = np.minimum(np.maximum(starts[calls], call_a), b[first:stop][turn]) + call_shift
        end = ends[calls] + call_shift
        model = _clamped(models[models_in], model_turn[models_in] - first, a[first:stop], b[first:stop], shift)
        block = _clamped(blocks[blocks_in], block_turn[blocks_in] - first, a[first:stop], b[first:stop], shift)
        points = np.concatenate(
            (begin, finish, np.minimum(requested, call_b), start, np.minimum(end, call_b), model.ravel(), block.ravel())
        )
        del call_a, call_shift
        points.sort()  # (then the distinct ones: np.unique took 15x as long, hashing)
        points = points[np.concatenate(([True], points[1:] != points[:-1]))]
        model = model[np.argsort(model[:, 0], kind="stable")]
        parts[first:stop] = _classed(points, begin, finish, requested, start, end, model, block)
    return parts


def _clamped(spans: np.ndarray, turn: np.ndarray, a: np.ndarray, b: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """(start, end) rows clamped into their turn's [a, b], then moved onto the axis."""
    return np.minimum(np.maximum(spans, a[turn, None]), b[turn, None]) + shift[turn, None]


def _classed(
    points: np.ndarray,
    begin: np.ndarray,
    finish: np.ndarray,
    requested: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    model: np.ndarray,
    block: np.ndarray,
) -> np.ndarray:
    """``_split_turns`` on the axis: the pieces between the ``points`` (the
    turns' bounds among them) classed, and summed per turn over those from
    its a (``begin``) to its b (``finish``)."""
    u64 = np.uint64
    blocks_at, blocks_reach = block[:, 0], np.maximum.accumulate(block[:, 1])
    models_at, models_reach = model[:, 0], np.maximum.accumulate(model[:, 1])
    # the call in flight that ends last, among those requested up to an instant (first by request of equals)
    if not len(end):
        requested = end = start = np.zeros(1, u64)  # (no call: none in flight, ever)
    reach = np.maximum.accumulate(end)
    later = np.empty(len(end), bool)
    later[:1] = True
    np.greater(end[1:], reach[:-1], out=later[1:])
    last_start = start[np.maximum.accumulate(np.where(later, np.arange(len(later)), 0))]
    del later
    # each turn's pieces: from the one at its a to the one before its b
    first_piece, stop_piece = np.searchsorted(points, begin), np.searchsorted(points, finish)
    parts = np.zeros((len(begin), 4), u64)
    pieces = len(points) - 1
    for first in range(0, pieces, _PIECES):
        t0 = points[first : min(first + _PIECES, pieces)]
        width = points[first + 1 : first + 1 + len(t0)] - t0
        client = _covered(blocks_at, blocks_reach, t0)
        free = ~client
        modelled = free & _covered(models_at, models_reach, t0)
        free &= ~modelled
        called = np.searchsorted(requested, t0, "right") - 1
        free &= called >= 0
        np.maximum(called, 0, out=called)
        busy = free & (reach[called] > t0)
        queued = busy & (t0 < last_start[called])
        busy &= ~queued
        # the turns with pieces here, and theirs: sums of a running total (exact, in integers)
        turns = slice(
            int(np.searchsorted(stop_piece, first, "right")), int(np.searchsorted(first_piece, first + len(t0)))
        )
        low = np.clip(first_piece[turns] - first, 0, len(t0))
        high = np.clip(stop_piece[turns] - first, 0, len(t0))
        running = np.zeros(len(t0) + 1, u64)
        for part, mask in enumerate((client, modelled, queued, busy)):
            np.cumsum(np.where(mask, width, u64(0)), out=running[1:])
            parts[turns, part] += running[high] - running[low]
    return parts


# Pieces of the turns classed at once by ``_classed``.
_PIECES = 1 << 16


def _covered(begins: np.ndarray, reach: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether an interval of these covers each point of ``at`` (``begins``:
    their begins, sorted; ``reach``: the running maximum of their ends)."""
    if not len(begins):
        return np.zeros(len(at), bool)
    begun = np.searchsorted(begins, at, "right") - 1
    return (begun >= 0) & (reach[np.maximum(begun, 0)] > at)


def _segments(lengths: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
    """The segments [0, length] (uint64) laid end to end on one axis of
    2**64 points, as many at a time as fit: (first, stop, each one's start)
    for consecutive runs of them (nearly always one run; a segment longer
    than 2**63 alone)."""
    u64, count = np.uint64, len(lengths)
    if float(lengths.sum(dtype=np.float64)) + count < 2.0**62:
        runs = [(0, count)]
    else:
        runs, first, total = [], 0, 0
        for i, length in enumerate(lengths.tolist()):
            if i > first and total + length + 1 > 1 << 63:
                runs.append((first, i))
                first, total = i, 0
            total += length + 1
        runs.append((first, count))
    for first, stop in runs:
        offsets = np.zeros(stop - first, u64)
        np.cumsum(lengths[first : stop - 1] + u64(1), out=offsets[1:])
        yield first, stop, offsets


def _in_flight_turns(
    bounds: np.ndarray, call_turn: np.ndarray, submits: np.ndarray, ends: np.ndarray, codes: np.ndarray
) -> dict[int, int]:
    """Each tool's (by number, ``codes``: each call's) nanoseconds in flight
    within the turns of ``bounds``: per turn, the time within [a, b) that a
    call of the tool covered, from its request to its end, added up over
    the turns. The calls come as ``_split_turns``'s.

    The calls are grouped by (tool, turn), each group's times clamped into
    its turn's [a, b] and moved into its own segment of one axis, the
    segments end to end (``_segments``): there one running maximum of the
    ends gives each call the part of it no earlier call of its group
    covered."""
    u64 = np.uint64
    if not len(codes):
        return {}
    group_key = codes.astype(np.int64) * len(bounds) + call_turn
    order = np.argsort(group_key, kind="stable")  # by tool, then turn; each group's calls by request
    group_key = group_key[order]
    group_first = np.flatnonzero(np.concatenate(([True], group_key[1:] != group_key[:-1])))
    group_turn = call_turn[order[group_first]]
    a = bounds[group_turn, 0]
    b = np.maximum(bounds[group_turn, 1], a)  # (a turn that ends before it starts has no instant)
    codes, submits, ends = codes[order], submits[order], ends[order]
    del group_key, order
    found: dict[int, int] = {}
    for first, stop, offsets in _segments(b - a):
        lo = int(group_first[first])
        hi = int(group_first[stop]) if stop < len(group_first) else len(codes)
        group = np.repeat(np.arange(stop - first), np.diff(np.append(group_first[first:stop], hi)))
        group_a, group_b = a[first:stop][group], b[first:stop][group]
        shift = (offsets - a[first:stop])[group]  # time + shift: the time on the axis (mod 2**64)
        requested = np.minimum(np.maximum(submits[lo:hi], group_a), group_b) + shift
        end = np.minimum(np.maximum(ends[lo:hi], group_a), group_b) + shift
        del shift, group_a, group_b
        # the latest end of the calls before (an earlier group's ends before this group's a: no matter)
        reach = np.zeros(hi - lo, u64)
        np.maximum.accumulate(end[:-1], out=reach[1:])
        np.maximum(requested, reach, out=requested)
        covered = np.zeros(hi - lo, u64)
        np.subtract(end, requested, out=covered, where=end > requested)
        mine = codes[lo:hi]
        code_first = np.flatnonzero(np.concatenate(([True], mine[1:] != mine[:-1])))
        for code, ns in zip(mine[code_first].tolist(), np.add.reduceat(covered, code_first).tolist()):
            found[code] = found.get(code, 0) + ns
    return found


@dataclass
class TurnTotals:
    """All turns together: the five parts, and each tool's share of the end-to-end time."""

    count: int = 0
    from_agent_spans: int = 0
    end_to_end_s: float = 0.0
    client_cpu_s: float = 0.0
    model_s: float = 0.0
    tool_queue_s: float = 0.0
    tool_exec_s: float = 0.0
    other_s: float = 0.0
    tool_in_flight_s: dict[str, float] = field(default_factory=dict)
    durations_s: Sequence[float] = field(default_factory=list)  # each turn's end-to-end seconds, sorted
    slowest: list[Turn] = field(default_factory=list)  # the slowest turns (SLOWEST), slowest first

    def latency_share(self, tool: str) -> Optional[float]:
        """The part of all turns' end-to-end time with a call of ``tool`` in flight (None: no turns)."""
        if not self.end_to_end_s:
            return None
        return self.tool_in_flight_s.get(tool, 0.0) / self.end_to_end_s


@dataclass
class ModelStats:
    """One model's calls: how long they took, what they used."""

    model: str
    calls: int
    errors: int
    duration_s: list[float]  # sorted
    first_chunk_s: list[float]  # sorted; only the streamed calls that reported it
    input_tokens: Optional[int]  # summed over the calls that reported usage; None when none did
    output_tokens: Optional[int]

    @property
    def seconds(self) -> float:
        return sum(self.duration_s)


def model_stats(model_calls: Sequence[ModelCall]) -> list[ModelStats]:
    """Per model, by total time, longest first."""
    by_model: dict[str, list[ModelCall]] = defaultdict(list)
    for call in model_calls:
        by_model[call.model].append(call)
    stats = []
    for model, calls in by_model.items():
        inputs = [c.input_tokens for c in calls if c.input_tokens is not None]
        outputs = [c.output_tokens for c in calls if c.output_tokens is not None]
        stats.append(
            ModelStats(
                model=model,
                calls=len(calls),
                errors=sum(1 for c in calls if c.failed),
                duration_s=sorted(c.seconds for c in calls),
                first_chunk_s=sorted(c.first_chunk_s for c in calls if c.first_chunk_s is not None),
                input_tokens=sum(inputs) if inputs else None,
                output_tokens=sum(outputs) if outputs else None,
            )
        )
    stats.sort(key=lambda s: (-s.seconds, s.model))
    return stats
