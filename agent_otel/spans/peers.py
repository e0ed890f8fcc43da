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

A peer's tool span that carries nothing but its tool, times and ids (no
attribute of agent-otel's, no call id, no event: OpenInference's ``TOOL``
span as it is written) is read into ``Aside``, a few columns, not into a
call's row: most are merged away, and a span set aside skips the reads of
what such a span lacks. Those left after the merge become rows,
each where it would have been (``Aside.order``), so the records are the
same as if every span had been a row from the start. Where one of them
may be in a chain of one call's spans (a span under a tool span, or one
others hang under), they all become rows first.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate, chain
from typing import Callable, Iterable, Sequence

from agent_otel.records import NS_PER_S, ModelCall
from agent_otel.semconv import OPENINFERENCE_SPAN_KIND, TRACELOOP_SPAN_KIND
from agent_otel.spans.calls import U64, TraceIds
from agent_otel.spans.ids import grouped

# How far (ns) a span may reach beyond the span of the call it is merged into.
SLACK_NS = 5_000_000
# Past this many agent-otel calls of one tool in one trace, a span's candidates are bisected.
SCAN_MAX = 16
# Times past this (ns, year 2116) take the one-by-one merge: in numpy they are int64s, with room to add.
_PAIR_NS_END = 1 << 62

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


def merge_tool_groups(
    keep: bytearray,
    ours: bytearray,
    families: bytearray,
    ids: array,
    submits: array,
    ends: array,
    trace_ids: tuple[TraceIds, TraceIds],
    tools: tuple[Sequence[str], Sequence[str]],
    aside: Aside,
    count: int,
) -> int:
    """Merge the tool spans of each tool in each trace, the rows ``keep``
    (rows as in ``Aside.place``: the table's ``count``, then the spans set
    aside), setting ``keep[row]`` to 0 for each span merged away; returns
    how many were. The columns are as in ``merge_tool_spans``, ``ids`` an
    ``array("q")``, ``submits`` and ``ends`` ``array(U64)``; ``trace_ids``
    (``TraceIds``) and ``tools`` in two parts, the table's and the spans set
    aside's (not joined: a list of a million rows is 8 MB). The small
    groups are merged in numpy, many at once (``_merge_small_groups``), the
    others one by one."""
    import numpy as np  # (as in Aside.order)

    rows = np.flatnonzero(np.frombuffer(keep, dtype=np.uint8))
    total, n = len(keep), len(rows)
    if n < 2:
        return 0
    # the kept rows grouped by (trace, tool): the trace ids' halves and a code per tool, sorted
    high = np.concatenate([np.frombuffer(part.high, np.uint64) for part in trace_ids])
    low = np.concatenate([np.frombuffer(part.low, np.uint64) for part in trace_ids])
    # (a code per tool, looked up in C: a generator's step per row took 0.5 µs)
    codes = {name: code for code, name in enumerate(set(chain(*tools)))}
    tool = np.fromiter(map(codes.__getitem__, chain(*tools)), np.int32, total)
    if n < total:  # (the rows a chain of one call's spans left out)
        high, low, tool = high[rows], low[rows], tool[rows]
    order, starts = grouped(high, low, tool)
    del high, low, tool
    rows = rows[order]
    del order
    sizes = np.diff(np.append(starts, n))
    theirs = np.frombuffer(ours, dtype=np.uint8)[rows] == 0
    peers = np.add.reduceat(theirs.astype(np.int64), starts)
    rest = (sizes > 1) & (peers > 0)
    small = rest & (sizes <= SMALL_GROUP)
    starts_ns, ends_ns = np.frombuffer(submits, dtype=np.uint64), np.frombuffer(ends, dtype=np.uint64)
    dropped = 0
    if small.any() and int(ends_ns.max()) < _PAIR_NS_END:
        settled, merged = _merge_small_groups(
            starts[small],
            sizes[small],
            rows,
            theirs,
            starts_ns,
            ends_ns,
            np.frombuffer(ids, dtype=np.int64),
            np.frombuffer(families, dtype=np.uint8),
            aside.places(count),
        )
        np.frombuffer(keep, dtype=np.uint8)[merged] = 0
        dropped += len(merged)
        rest[np.flatnonzero(small)[settled]] = False

    def drop(row: int) -> None:
        keep[row] = 0

    for first, size in zip(starts[rest].tolist(), sizes[rest].tolist()):
        group = rows[first : first + size].tolist()
        aside.by_request(group, submits, count)
        dropped += merge_tool_spans(group, ours, families, ids, submits, ends, drop)
    return dropped


# Groups of at most this many spans may be decided in numpy (each of its
# peers' spans is checked against each of its agent-otel spans).
SMALL_GROUP = 16
# Pairs checked at once there (a few MB of temporaries).
_PAIRS_AT_ONCE = 1 << 16


def _merge_small_groups(firsts, sizes, rows, theirs, submits, ends, ids, families, places):
    """``merge_tool_spans`` on many small groups at once (of
    ``merge_tool_groups``: ``rows[first : first + size]``, a span of a
    peer's where ``theirs``). Returns (whether each group was decided here,
    the rows merged away). Times are below ``_PAIR_NS_END``: in int64 they
    have room to add.

    - The usual group: each peer's span lies within exactly one agent-otel
      span of its group (with call ids that agree) that no other peer's
      span of the group lies within, but at most one peer's span within
      none. Each is merged into that one, in any order.
    - Otherwise (calls of one tool that overlap) the one-by-one rule, a rank
      at a time: the spans of each group ranked by request time (ties by
      ``places``, the order read), the k-th span of every group is taken
      at once and, where it is a peer's, merged into the agent-otel span of
      its group that holds it (within, call ids that agree, no span of its
      family absorbed yet) and ends first (of equal ends, the first
      requested).

    A group where two or more peers' spans find no agent-otel span is not
    decided here (the rule then merges them with each other)."""
    import numpy as np

    settled = np.zeros(len(firsts), dtype=bool)
    merged = []
    pairs = np.cumsum(sizes.astype(np.int64) ** 2)
    cuts = [0]  # chunks of groups with at most _PAIRS_AT_ONCE (span, span) pairs
    while cuts[-1] < len(firsts):
        done = int(pairs[cuts[-1] - 1]) if cuts[-1] else 0
        cuts.append(max(cuts[-1] + 1, int(np.searchsorted(pairs, done + _PAIRS_AT_ONCE, side="right"))))
    for lo, hi in zip(cuts, cuts[1:]):
        k = sizes[lo:hi].astype(np.int64)
        groups = len(k)
        # the spans of the chunk's groups, each with its group
        element_starts = np.cumsum(k) - k
        group_of = np.repeat(np.arange(groups), k)
        count = len(group_of)
        position = firsts[lo:hi].astype(np.int64)[group_of] + np.arange(count) - element_starts[group_of]
        row_of, peer = rows[position], theirs[position]
        del position
        # every (peer's span, agent-otel span) of a group where the one holds the other
        per = k[group_of]
        left = np.repeat(np.arange(count), per)
        right = element_starts[group_of[left]] + np.arange(len(left)) - np.repeat(np.cumsum(per) - per, per)
        candidate = peer[left] & ~peer[right]
        left, right = left[candidate], right[candidate]
        row, host = row_of[left], row_of[right]
        start, end, host_end = submits[row].astype(np.int64), ends[row].astype(np.int64), ends[host].astype(np.int64)
        overlap = np.minimum(host_end + SLACK_NS, end) - np.maximum(submits[host].astype(np.int64) - SLACK_NS, start)
        call_id, host_id = ids[row], ids[host]
        holds = (overlap >= 0) & (overlap * 2 >= end - start) & ((call_id == 0) | (host_id == 0) | (call_id == host_id))
        left, right, host_end = left[holds], right[holds], host_end[holds]
        # the usual groups
        hosts = np.bincount(left, minlength=count)  # per peer's span: the agent-otel spans holding it
        held = np.bincount(right, minlength=count)  # per agent-otel span: the peers' spans it holds
        unclear = (peer & (hosts > 1)) | (~peer & (held > 1))
        usual = np.bincount(group_of, weights=unclear, minlength=groups) == 0
        taken = peer & (hosts == 1) & usual[group_of]
        if not usual.all():
            _merge_in_order(~usual, group_of, row_of, submits, families, places, left, right, host_end, taken)
        alone = peer & ~taken
        decided = np.bincount(group_of, weights=alone, minlength=groups) <= 1
        settled[lo:hi] = decided
        merged.append(row_of[taken & decided[group_of]])
    return settled, np.concatenate(merged)


def _merge_in_order(chosen, group_of, row_of, submits, families, places, left, right, host_end, taken) -> None:
    """The one-by-one rule, a rank at a time, for the ``chosen`` groups of
    ``_merge_small_groups`` (its spans, and the pairs ``left`` (a peer's
    span) and ``right`` (an agent-otel span holding it)): marks in
    ``taken`` the peers' spans it merges."""
    import numpy as np

    spans = np.flatnonzero(chosen[group_of])
    by_request = spans[np.lexsort((places(row_of[spans]), submits[row_of[spans]], group_of[spans]))]
    groups = group_of[by_request]
    rank = np.zeros(len(group_of), dtype=np.int64)
    rank[by_request] = np.arange(len(spans)) - np.searchsorted(groups, groups)
    these = chosen[group_of[left]]
    left, right, host_end = left[these], right[these], host_end[these]
    # by the peer's rank, then the peer, then the host's end and rank: each
    # peer's first pair whose host is still free for its family is the rule's pick
    order = np.lexsort((rank[right], host_end, left, rank[left]))
    left, right = left[order], right[order]
    ranks = int(rank.max()) + 1
    bounds = np.searchsorted(rank[left], np.arange(ranks + 1))
    family = families[row_of].astype(np.uint8)
    absorbed = np.zeros(len(group_of), dtype=np.uint8)  # per agent-otel span: a bit per family it took
    for r in range(ranks):
        peers, hosts = left[bounds[r] : bounds[r + 1]], right[bounds[r] : bounds[r + 1]]
        free = ((absorbed[hosts] >> family[peers]) & 1) == 0
        peers, hosts = peers[free], hosts[free]
        if not len(peers):
            continue
        first = np.concatenate(([True], peers[1:] != peers[:-1]))
        peers, hosts = peers[first], hosts[first]
        absorbed[hosts] |= np.left_shift(1, family[peers]).astype(np.uint8)
        taken[peers] = True


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


class Aside:
    """Peers' tool spans set aside while reading (see the module's
    docstring): per span, what its call's row would hold that is not the
    same for all of them (the executor is unknown, the request is the
    start, no call id, error type, thread, workers or CPU time), what the
    merge reads, and ``before``: how many rows the table had when it was
    read (it goes before that row, after the spans set aside before it)."""

    __slots__ = ("tool", "start_ns", "end_ns", "trace_id", "span_id", "parent", "pool", "family", "failed", "before")

    def __init__(self) -> None:
        self.tool: list[str] = []
        self.start_ns = array(U64)
        self.end_ns = array(U64)
        self.trace_id = TraceIds()
        self.span_id = array(U64)
        self.parent = array(U64)  # 0: none
        self.pool: list[str] = []
        self.family = bytearray()
        self.failed = bytearray()  # 1: its status is an error
        self.before = array(U64)

    def __len__(self) -> int:
        return len(self.tool)

    def add(
        self,
        tool: str,
        start_ns: int,
        end_ns: int,
        trace_id: int,
        span_id: int,
        parent: int,
        pool: str,
        family: int,
        failed: bool,
        before: int,
    ) -> None:
        self.tool.append(tool)
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        self.trace_id.append(trace_id)
        self.span_id.append(span_id)
        self.parent.append(parent)
        self.pool.append(pool)
        self.family.append(family)
        self.failed.append(failed)
        self.before.append(before)

    def place(self, row: int, rows: int) -> int:
        """Where a row of the table and the spans set aside (``rows`` in the
        table: row ``rows + j`` is span ``j`` set aside) would have been, had
        every span been a row as read."""
        before = self.before
        if row < rows:
            return row + bisect_right(before, row)
        return before[row - rows] + row - rows

    def places(self, count: int) -> Callable:
        """``place`` in numpy: a function of an array of rows (``count`` in the table)."""
        import numpy as np

        before = np.frombuffer(self.before, dtype=np.uint64).astype(np.int64)

        def places(row):
            row = row.astype(np.int64)
            if not len(before):
                return row
            table = row < count
            aside = np.where(table, 0, row - count)
            return np.where(table, row + np.searchsorted(before, row, side="right"), before[aside] + aside)

        return places

    def by_request(self, group: list[int], submits: Sequence[int], rows: int) -> None:
        """Sort ``group`` (rows as in ``place``) by request time, ties in the
        order the spans were read (as a stable sort of rows as read)."""
        if len(group) == 2:  # (the usual group: agent-otel's span and one peer's)
            a, b = group
            if submits[a] > submits[b] or (submits[a] == submits[b] and self.place(a, rows) > self.place(b, rows)):
                group[0], group[1] = b, a
            return
        group.sort(key=submits.__getitem__)
        if any(submits[a] == submits[b] for a, b in zip(group, group[1:])):
            group.sort(key=lambda row: (submits[row], self.place(row, rows)))

    def order(self, rows: Iterable[int], aside: Iterable[int], count: int) -> list[int]:
        """The table's rows once the spans ``aside`` (increasing) are appended
        to it (``count`` rows before), in the order they were read: ``rows``
        (increasing) and then the new rows, interleaved."""
        import numpy as np  # (here: the blame service's start-up does not load numpy)

        ours = np.asarray(rows, dtype=np.int64)
        theirs = np.asarray(aside, dtype=np.int64)
        places = self.places(count)(np.concatenate([ours, count + theirs]))
        table_rows = np.concatenate([ours, np.arange(count, count + len(theirs), dtype=np.int64)])
        return table_rows[np.argsort(places, kind="stable")].tolist()


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
