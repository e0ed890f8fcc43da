"""One call, one record: the spans several instrumentations made of one call, merged.

agent-otel, OpenInference, OpenLLMetry and the OpenTelemetry GenAI
instrumentations can all run in one process, each making its own span of
the same tool call or model call: nested (one makes its span current, the
next one's is its child) or side by side (OpenInference never makes its
spans current). ``TraceReader`` drops a span under a span of the same call
(the same tool; a model span under a model span); what is left is merged
here, by *family* (which instrumentation made the span, told by its
attributes: ``family_of``):

- spans of one family are never merged: two calls side by side from one
  instrumentation are two calls;
- a span lies within another (to within ``SLACK_NS``, at least half of it)
  in the same trace, of another family, for the same tool (or a model of
  the same name, where both name one): it is the same call, and the wider
  span keeps it; each kept span absorbs at most one span of each other
  family. Where both carry a tool call id, the ids must match;
- of a tool call, agent-otel's span is kept (it has the queue and exec
  split), else the widest; of a model call, the widest, with the token
  counts, the time to first token and the model's name taken from the
  others where it has none.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Callable, Sequence

from agent_otel.records import NS_PER_S, ModelCall
from agent_otel.semconv import OPENINFERENCE_SPAN_KIND, TRACELOOP_SPAN_KIND

# How far (ns) a span may reach beyond the span of the call it is merged into.
SLACK_NS = 5_000_000
# Past this many agent-otel calls of one tool in one trace, a span's candidates are bisected.
SCAN_MAX = 16

# Which instrumentation made a span.
FAMILY_GENAI = 0  # the GenAI conventions alone: agent-otel's, the OpenTelemetry GenAI instrumentations'
FAMILY_OPENINFERENCE = 1  # openinference.span.kind
FAMILY_OPENLLMETRY = 2  # traceloop.* attributes
_TRACELOOP_PREFIX = "traceloop."


def family_of(found: dict) -> int:
    """The family of a span, from its attributes (by key)."""
    if OPENINFERENCE_SPAN_KIND in found:
        return FAMILY_OPENINFERENCE
    if TRACELOOP_SPAN_KIND in found:
        return FAMILY_OPENLLMETRY
    for key in found:
        if type(key) is str and key.startswith(_TRACELOOP_PREFIX):
            return FAMILY_OPENLLMETRY
    return FAMILY_GENAI


def within(start: int, end: int, host_start: int, host_end: int) -> bool:
    """Whether [start, end] lies within [host_start, host_end] (to within SLACK_NS, at least half of it)."""
    overlap = min(host_end + SLACK_NS, end) - max(host_start - SLACK_NS, start)
    return overlap >= 0 and overlap * 2 >= end - start


def merge_tool_spans(
    rows: Sequence[int],
    ours: Sequence[int],
    families: Sequence[int],
    ids: Sequence[int],
    submits: Sequence[int],
    ends: Sequence[int],
    drop: Callable[[int], None],
) -> int:
    """Merge the tool spans of one tool in one trace (``rows``, by submit
    time): ``drop(row)`` for each span another one keeps; returns how many
    were dropped. ``ours[row]``: agent-otel's span (it keeps the call where
    there is one); ``ids[row]``: a hash of its call id, 0 for none."""
    if len(rows) == 2 and ours[rows[0]] != ours[rows[1]]:
        # agent-otel's span and one other (the usual pair): what the rest does for it, inline
        host, row = (rows[0], rows[1]) if ours[rows[0]] else (rows[1], rows[0])
        call_id, host_id = ids[row], ids[host]
        if (call_id and host_id and call_id != host_id) or not within(
            submits[row], ends[row], submits[host], ends[host]
        ):
            return 0
        drop(row)
        return 1
    hosts = [row for row in rows if ours[row]]
    absorbed: dict[int, set[int]] = {row: set() for row in hosts}
    left = []
    dropped = 0
    # Many calls of one tool in one trace (a session's): a span is checked
    # only against those that can hold it, bisected by request time and the
    # latest end so far; the order (by request) and so the choice are the same.
    near = len(hosts) > SCAN_MAX
    if near:
        lows = [submits[host] - SLACK_NS for host in hosts]
        reach = list(accumulate((ends[host] + SLACK_NS for host in hosts), max))
    for row in rows:
        if ours[row]:
            continue
        candidates = hosts[bisect_left(reach, submits[row]) : bisect_right(lows, ends[row])] if near else hosts
        host = _host(row, candidates, absorbed, families, ids, submits, ends)
        if host is None:
            left.append(row)
        else:
            absorbed[host].add(families[row])
            drop(row)
            dropped += 1
    # The peers' spans no agent-otel span took: the widest keeps the call.
    left.sort(key=lambda row: (submits[row] - ends[row], submits[row]))
    kept: list[int] = []
    for row in left:
        host = _host(row, kept, absorbed, families, ids, submits, ends)
        if host is None:
            kept.append(row)
            absorbed[row] = {families[row]}
        else:
            absorbed[host].add(families[row])
            drop(row)
            dropped += 1
    return dropped


def _host(
    row: int,
    hosts: list[int],
    absorbed: dict[int, set[int]],
    families: Sequence[int],
    ids: Sequence[int],
    submits: Sequence[int],
    ends: Sequence[int],
):
    """The span among ``hosts`` that ``row`` is the same call as (of several, the first to end), or None."""
    family, call_id = families[row], ids[row]
    start, end = submits[row], ends[row]
    best = None
    for host in hosts:
        if family in absorbed[host] or (call_id and ids[host] and call_id != ids[host]):
            continue
        if within(start, end, submits[host], ends[host]) and (best is None or ends[host] < ends[best]):
            best = host
    return best


def merge_model_calls(calls: list[ModelCall], families: list[int], named: list[bool]) -> list[ModelCall]:
    """The model calls with each call seen by several families once (see the
    module's docstring); ``families`` and ``named`` (whether the model's name
    came from an attribute) line up with ``calls``. A merged call's name is one
    an attribute gave, else the span name of the family first in
    ``FAMILY_*`` order (OpenInference's is the model's class name), so one
    model's calls all have one name."""
    by_trace: dict[int, list[int]] = {}
    for i, call in enumerate(calls):
        by_trace.setdefault(call.trace_id, []).append(i)
    keep = [True] * len(calls)
    for rows in by_trace.values():
        if len(rows) < 2 or len({families[i] for i in rows}) < 2:
            continue
        # the widest first: it keeps the call; of equal width, the GenAI conventions' span
        rows.sort(key=lambda i: (calls[i].start_ns - calls[i].end_ns, families[i], calls[i].start_ns))
        hosts: list[int] = []
        absorbed: dict[int, set[int]] = {}
        name_rank: dict[int, tuple[bool, int]] = {}  # host -> how good its name is (less is better)
        for i in rows:
            call = calls[i]
            host = None
            for h in hosts:
                if families[i] in absorbed[h] or not _same_model(calls[h], named[h], call, named[i]):
                    continue
                if within(call.start_ns, call.end_ns, calls[h].start_ns, calls[h].end_ns):
                    host = h
                    break
            if host is None:
                hosts.append(i)
                absorbed[i] = {families[i]}
                name_rank[i] = (not named[i], families[i])
                continue
            absorbed[host].add(families[i])
            keep[i] = False
            rank = (not named[i], families[i])
            _absorb(calls[host], call, rank < name_rank[host])
            if rank < name_rank[host]:
                name_rank[host] = rank
                named[host] = named[i]
    return [call for call, kept in zip(calls, keep) if kept]


def _same_model(a: ModelCall, a_named: bool, b: ModelCall, b_named: bool) -> bool:
    """Whether two spans can be of one model: names agree where both name one
    (one may name a dated snapshot of the other: ``gpt-4o`` and ``gpt-4o-2024-08-06``)."""
    if not (a_named and b_named):
        return True
    return a.model.startswith(b.model) or b.model.startswith(a.model)


def _absorb(host: ModelCall, other: ModelCall, take_name: bool) -> None:
    """What ``other``, the same call, knows and ``host`` does not."""
    if host.input_tokens is None:
        host.input_tokens = other.input_tokens
    if host.output_tokens is None:
        host.output_tokens = other.output_tokens
    if host.first_chunk_s is None and other.first_chunk_s is not None:
        first_ns = other.start_ns + round(other.first_chunk_s * NS_PER_S)
        host.first_chunk_s = max(0, first_ns - host.start_ns) / NS_PER_S
    if take_name:
        host.model = other.model
    host.failed = host.failed or other.failed
