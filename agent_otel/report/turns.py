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
from itertools import accumulate
from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np

from agent_otel.records import NS_PER_S, AgentRun, LoopBlock, ModelCall
from agent_otel.spans.calls import CallTable

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
    no_models: list[ModelCall] = []
    submit, end = calls.submit_ns, calls.end_ns
    for trace_id, rows in _traces(calls, models_of):
        trace_models = models_of.get(trace_id, no_models)
        found = runs_of.get(trace_id)
        if found is not None:
            runs = _outermost(found) if isinstance(found, list) else [found]
            if _all_covered(calls, rows, trace_models, runs):
                if len(runs) == 1:
                    turn = Turn(runs[0].name, trace_id, runs[0].start_ns, runs[0].end_ns, FROM_AGENT)
                    turns.add(_breakdown(turn, calls, rows, trace_models, in_flight, True, blocks_of.get(trace_id)))
                    continue
                # many turns in one trace (a session's): each gets the calls
                # that may overlap it, not the whole trace's to filter
                overlapping = _overlapping(calls, rows, trace_models)
                for run in runs:
                    turn = Turn(run.name, trace_id, run.start_ns, run.end_ns, FROM_AGENT)
                    mine, models = overlapping(run.start_ns, run.end_ns)
                    turns.add(_breakdown(turn, calls, mine, models, in_flight, False, blocks_of.get(trace_id)))
                continue
        root = roots.get(trace_id)
        if root is None:
            continue  # no agent run around the calls
        root_span, span = root.span_id, calls.span_id
        if any(span[row] == root_span for row in rows) or any(m.span_id == root_span for m in trace_models):
            continue  # the root is itself a call
        # (no list of every call's times: one trace may hold a million, 64 MB of them)
        first = min(root.start_ns, min(map(submit.__getitem__, rows), default=root.start_ns))
        first = min(first, min((m.start_ns for m in trace_models), default=first))
        last = max(root.end_ns, max(map(end.__getitem__, rows), default=root.end_ns))
        last = max(last, max((m.end_ns for m in trace_models), default=last))
        turn = Turn(root.name, trace_id, first, last, FROM_TRACE)
        turns.add(_breakdown(turn, calls, rows, trace_models, in_flight, True, blocks_of.get(trace_id)))
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


def _traces(calls: CallTable, models_of: dict[int, list[ModelCall]]) -> Iterator[tuple[int, list[int]]]:
    """(trace, the rows of its calls, by submit time) for each trace with
    calls, in the order of their last calls, then the traces with model
    calls only.

    Grouped in numpy (the trace ids' two 64-bit halves sorted): no dict of
    every trace (with a trace per call, a million of them took 100 MB at
    the report's peak), and only one trace's list of rows at a time."""
    trace_ids = calls.trace_id
    count = len(trace_ids)
    if count:
        high = np.fromiter((trace >> 64 for trace in trace_ids), np.uint64, count)
        low = np.fromiter((trace & _LOW_64 for trace in trace_ids), np.uint64, count)
        order = np.lexsort((low, high))  # stable: each trace's rows stay in row order
        del low
        high_sorted = high[order]
        del high
        low_sorted = np.fromiter((trace_ids[i] & _LOW_64 for i in order.tolist()), np.uint64, count)
        changes = np.flatnonzero((high_sorted[1:] != high_sorted[:-1]) | (low_sorted[1:] != low_sorted[:-1])) + 1
        del high_sorted, low_sorted
        firsts = np.concatenate(([0], changes))
        lasts = np.concatenate((changes, [count]))
    pending = dict.fromkeys(models_of)  # the traces with model calls not yet given
    if count:
        # each trace at its last call, as the calls come
        for group in np.argsort(order[lasts - 1], kind="stable").tolist():
            rows = order[firsts[group] : lasts[group]].tolist()
            trace_id = trace_ids[rows[0]]
            pending.pop(trace_id, None)
            yield trace_id, rows
    for trace_id in pending:
        yield trace_id, []


# The slowest turns the totals keep (the JSON's ``turns.slowest``).
SLOWEST = 10
_LOW_64 = (1 << 64) - 1


class _Turns:
    """The turns as they are found: each one's start, trace and the
    seconds of its parts (40 bytes a turn where a ``Turn`` takes about
    200), the slowest ``SLOWEST`` of them, and every ``Turn`` when kept."""

    def __init__(self, keep: bool) -> None:
        self.kept: Optional[list[Turn]] = [] if keep else None
        self.starts = array("Q")
        self.traces: list[int] = []
        self.parts = array("d")  # per turn: seconds, client CPU, model, tool queue, tool exec, other
        self.from_agent = 0
        # the slowest so far, as (seconds, -start, -trace, -order, turn): the root is the least slow
        self.slowest: list[tuple[float, int, int, int, Turn]] = []

    def add(self, turn: Turn) -> None:
        if self.kept is not None:
            self.kept.append(turn)
        seconds = turn.seconds
        self.starts.append(turn.start_ns)
        self.traces.append(turn.trace_id)
        self.parts.extend((seconds, turn.client_cpu_s, turn.model_s, turn.tool_queue_s, turn.tool_exec_s, turn.other_s))
        self.from_agent += turn.source == FROM_AGENT
        # (slowest first; of equal seconds, the first by start and trace, as the turns are ordered)
        slowest = self.slowest
        if len(slowest) < SLOWEST:
            heapq.heappush(slowest, (seconds, -turn.start_ns, -turn.trace_id, -len(self.starts), turn))
        elif seconds >= slowest[0][0]:
            entry = (seconds, -turn.start_ns, -turn.trace_id, -len(self.starts), turn)
            if entry[:4] > slowest[0][:4]:
                heapq.heapreplace(slowest, entry)

    def finish(self, in_flight_ns: dict[str, int]) -> tuple[list[Turn], "TurnTotals"]:
        """The kept turns in order (by start, then trace), and the totals."""
        # by (start, trace), ties in the order found: a stable sort in numpy on
        # the start and the trace id's two 64-bit halves (in Python, 0.4 s at
        # 250k turns: the key functions, and the ints scattered in memory)
        traces = self.traces
        high = np.fromiter((trace >> 64 for trace in traces), np.uint64, len(traces))
        low = np.fromiter((trace & _LOW_64 for trace in traces), np.uint64, len(traces))
        order = np.lexsort((low, high, np.frombuffer(self.starts, np.uint64))).tolist()
        parts = self.parts
        result = TurnTotals(count=len(order), from_agent_spans=self.from_agent)
        # summed in that order, one part at a time
        for i in order:
            i *= 6
            result.end_to_end_s += parts[i]
            result.client_cpu_s += parts[i + 1]
            result.model_s += parts[i + 2]
            result.tool_queue_s += parts[i + 3]
            result.tool_exec_s += parts[i + 4]
            result.other_s += parts[i + 5]
        result.tool_in_flight_s = {tool: ns / NS_PER_S for tool, ns in in_flight_ns.items()}
        result.durations_s = array("d", np.sort(np.frombuffer(parts, np.float64)[::6]).tobytes())
        result.slowest = [entry[-1] for entry in sorted(self.slowest, reverse=True)]
        kept = self.kept
        return ([] if kept is None else [kept[i] for i in order]), result


def _all_covered(calls: CallTable, rows: list[int], model_calls: list[ModelCall], runs: list[AgentRun]) -> bool:
    """Whether every call (of these rows) lies within one of the runs."""
    submit, end = calls.submit_ns, calls.end_ns
    if len(runs) == 1:
        low, high = runs[0].start_ns - SLACK_NS, runs[0].end_ns + SLACK_NS
        for row in rows:
            if submit[row] < low or end[row] > high:
                return False
        for model_call in model_calls:
            if model_call.start_ns < low or model_call.end_ns > high:
                return False
        return True
    # The outermost runs, by start, end later one after the other: of the
    # runs begun by a span's start, the last one reaches furthest.
    begins = [r.start_ns - SLACK_NS for r in runs]
    reach = [r.end_ns + SLACK_NS for r in runs]
    for row in rows:  # (no list of every call's span: one trace may hold a million)
        i = bisect_right(begins, submit[row]) - 1
        if i < 0 or end[row] > reach[i]:
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


def _breakdown(
    turn: Turn,
    calls: CallTable,
    rows: list[int],
    model_calls: list[ModelCall],
    in_flight: dict[str, int],
    whole_trace: bool,
    blocks: Optional[list[tuple[int, int]]] = None,
) -> Turn:
    """Split the turn's time between the calls of these rows (by submit
    time) and the model calls; add each tool's in-flight time to ``in_flight``.

    ``whole_trace``: every call given lies within the turn (no filtering).
    ``blocks``: the (start, end) of the client CPU blocks of the trace.
    """
    a, b = turn.start_ns, turn.end_ns
    submits, starts, ends, tools = calls.submit_ns, calls.start_ns, calls.end_ns, calls.tool
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
        queue = execution = 0
        for row in rows:  # each within [a, b]: sequential calls start at or after a
            submit, start, end = submits[row], starts[row], ends[row]
            if end > b:
                end = b
                start = start if start < b else b
            queue += start - submit
            execution += end - start
            in_flight[tools[row]] += end - submit
        turn.tool_queue_s, turn.tool_exec_s = queue / NS_PER_S, execution / NS_PER_S
    else:
        turn.client_cpu_s, turn.model_s, turn.tool_queue_s, turn.tool_exec_s = _split(
            a, b, model_calls, calls, rows, blocks or []
        )
        if len(rows) > SWEEP_MAX:
            _in_flight_columns(a, b, calls, rows, in_flight)
        else:
            by_tool: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for row in rows:
                by_tool[tools[row]].append((submits[row], ends[row]))
            for tool, spans in by_tool.items():
                in_flight[tool] += _union_ns(a, b, spans)
    turn.other_s = max(0.0, turn.seconds - turn.client_cpu_s - turn.model_s - turn.tool_queue_s - turn.tool_exec_s)
    return turn


# Past this many calls in one turn, its time is split in numpy (``_split_columns``).
SWEEP_MAX = 64


def _split(
    a: int, b: int, model_calls: list[ModelCall], calls: CallTable, rows: list[int], blocks: list[tuple[int, int]]
) -> tuple[float, float, float, float]:
    """(client CPU, model, tool queue, tool exec) seconds of [a, b) (the tool
    calls: these rows, by submit time; ``blocks``: client CPU blocks, by
    start): see the module's docstring."""
    if len(rows) > SWEEP_MAX:
        return _split_columns(a, b, model_calls, calls, rows, blocks)
    submits, starts, ends = calls.submit_ns, calls.start_ns, calls.end_ns
    bounds = {a, b}
    for start, end in blocks:
        bounds.update((start, end))
    for m in model_calls:
        bounds.update((m.start_ns, m.end_ns))
    for row in rows:
        bounds.update((submits[row], starts[row], ends[row]))
    points = sorted(t for t in bounds if a <= t <= b)
    models = sorted((max(m.start_ns, a), min(m.end_ns, b)) for m in model_calls if m.start_ns < b and m.end_ns > a)
    client_s = model_s = queue_s = exec_s = 0
    next_block = 0
    in_flight: list[tuple[int, int, int]] = []  # heap of (-end, submit order, start) of the calls requested so far
    next_call = next_model = 0
    model_ends: list[int] = []  # heap of the ends of the model calls begun so far
    for t0, t1 in zip(points, points[1:]):
        while next_block < len(blocks) and blocks[next_block][1] <= t0:
            next_block += 1
        if blocks and _in_any(blocks, next_block, t0):
            client_s += t1 - t0
            continue
        while next_model < len(models) and models[next_model][0] <= t0:
            heapq.heappush(model_ends, models[next_model][1])
            next_model += 1
        while model_ends and model_ends[0] <= t0:
            heapq.heappop(model_ends)
        if model_ends:
            model_s += t1 - t0
            continue
        while next_call < len(rows) and submits[rows[next_call]] <= t0:
            row = rows[next_call]
            heapq.heappush(in_flight, (-ends[row], next_call, starts[row]))
            next_call += 1
        while in_flight and -in_flight[0][0] <= t0:
            heapq.heappop(in_flight)
        if in_flight:
            if t0 < in_flight[0][2]:
                queue_s += t1 - t0
            else:
                exec_s += t1 - t0
    return client_s / NS_PER_S, model_s / NS_PER_S, queue_s / NS_PER_S, exec_s / NS_PER_S


def _split_columns(
    a: int, b: int, model_calls: list[ModelCall], calls: CallTable, rows: list[int], blocks: list[tuple[int, int]]
) -> tuple[float, float, float, float]:
    """``_split`` in numpy, the same sums: each piece of [a, b) between two
    bounds is the client's where a block covers its start, else the model's
    where a model call does, else the tool calls' where one is in flight:
    of those requested by then, the one that ends last (the first of them
    by request), queued before its start, executing after. The pieces are
    classed ``_PIECES`` at a time (a trace of a million calls has 3 million)."""
    u64 = np.uint64
    taken = np.asarray(rows, np.intp)
    submits = np.frombuffer(calls.submit_ns, u64)[taken]
    starts = np.frombuffer(calls.start_ns, u64)[taken]
    ends = np.frombuffer(calls.end_ns, u64)[taken]
    del taken
    model_bounds = np.array([(m.start_ns, m.end_ns) for m in model_calls], u64).reshape(-1, 2)
    block_bounds = np.array(blocks, u64).reshape(-1, 2)
    points = np.concatenate((np.array([a, b], u64), block_bounds.ravel(), model_bounds.ravel(), submits, starts, ends))
    points = points[(points >= u64(a)) & (points <= u64(b))]
    points.sort()  # (then the distinct ones: np.unique took 15x as long, hashing)
    points = points[np.concatenate(([True], points[1:] != points[:-1]))]
    model_bounds = model_bounds[np.argsort(model_bounds[:, 0], kind="stable")]
    blocks_at, blocks_reach = block_bounds[:, 0], np.maximum.accumulate(block_bounds[:, 1])
    models_at, models_reach = model_bounds[:, 0], np.maximum.accumulate(model_bounds[:, 1])
    # the call in flight that ends last, among those requested up to an instant (first by request of equals)
    reach = np.maximum.accumulate(ends)
    later = np.empty(len(ends), bool)
    later[:1] = True
    np.greater(ends[1:], reach[:-1], out=later[1:])
    del ends
    last_start = starts[np.maximum.accumulate(np.where(later, np.arange(len(later)), 0))]
    del starts, later
    client = model = queue = execution = 0
    pieces = len(points) - 1
    for first in range(0, pieces, _PIECES):
        t0 = points[first : min(first + _PIECES, pieces)]
        width = points[first + 1 : first + 1 + len(t0)] - t0
        free = ~_covered(blocks_at, blocks_reach, t0)
        client += int(width[~free].sum())
        modelled = free & _covered(models_at, models_reach, t0)
        model += int(width[modelled].sum())
        free &= ~modelled
        requested = np.searchsorted(submits, t0, "right") - 1
        free &= requested >= 0
        np.maximum(requested, 0, out=requested)
        busy = free & (reach[requested] > t0)
        queued = busy & (t0 < last_start[requested])
        queue += int(width[queued].sum())
        execution += int(width[busy & ~queued].sum())
    return client / NS_PER_S, model / NS_PER_S, queue / NS_PER_S, execution / NS_PER_S


# Pieces of a turn classed at once by ``_split_columns``.
_PIECES = 1 << 16


def _covered(begins: np.ndarray, reach: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Whether an interval of these covers each point of ``at`` (``begins``:
    their begins, sorted; ``reach``: the running maximum of their ends)."""
    if not len(begins):
        return np.zeros(len(at), bool)
    begun = np.searchsorted(begins, at, "right") - 1
    return (begun >= 0) & (reach[np.maximum(begun, 0)] > at)


def _in_any(blocks: list[tuple[int, int]], first: int, t: int) -> bool:
    """Whether an interval of ``blocks`` (by start) from ``first`` on covers ``t``."""
    for start, end in blocks[first:]:
        if start > t:
            return False
        if end > t:
            return True
    return False


def _union_ns(a: int, b: int, spans: list[tuple[int, int]]) -> int:
    """Nanoseconds of [a, b) that the spans (sorted by start) cover."""
    total, reach = 0, a
    for start, end in spans:
        start, end = max(start, reach), min(end, b)
        if start < end:
            total += end - start
            reach = end
    return total


def _in_flight_columns(a: int, b: int, calls: CallTable, rows: list[int], in_flight: dict[str, int]) -> None:
    """``_union_ns`` of each tool's calls among these rows (by submit time),
    added to ``in_flight``, in numpy: no pair per call (at a million calls
    in one turn, 100 MB of them)."""
    u64 = np.uint64
    tools = calls.tool
    code_of: dict[str, int] = {}  # tool -> its number, in the order of first calls
    codes = np.fromiter((code_of.setdefault(tools[row], len(code_of)) for row in rows), np.intp, len(rows))
    taken = np.asarray(rows, np.intp)
    submits = np.frombuffer(calls.submit_ns, u64)[taken]
    ends = np.minimum(np.frombuffer(calls.end_ns, u64)[taken], u64(b))
    del taken
    for tool, code in code_of.items():
        mine = codes == code
        starts, finishes = submits[mine], ends[mine]
        reach = np.empty(len(finishes), u64)  # the latest end of the calls before (a at first)
        reach[0] = a
        np.maximum(np.maximum.accumulate(finishes[:-1]), u64(a), out=reach[1:])
        np.maximum(starts, reach, out=starts)
        covered = finishes > starts
        in_flight[tool] += int((finishes[covered] - starts[covered]).sum())


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
