"""The model server's side of each model call: its own spans, joined by trace context.

Usage::

    from agent_otel.report.server_spans import join_server_requests
    joined = join_server_requests(analysis.model_calls, traces.server_requests)
    joined.totals.queue_s          # seconds the model calls waited in the servers' queues

A serving engine that traces its requests (vLLM with
``--otlp-traces-endpoint``) starts one span per request, ``llm_request``,
from the caller's ``traceparent``, and writes on it how long the request
waited in its queue, its prefill and its decode
(``agent_otel.records.ServerRequest``). Each is joined to the agent's model
call it served:

- by its parent: the model call's span itself (``model_span`` and
  ``call.headers()`` send its context), so ``parent_span_id`` is the
  call's span id;
- else, when an HTTP client instrumentation's span sits in between (the
  request's parent is that span, not the model call), to the model call of
  the same trace that overlaps the request most in time (the server's clock
  can be off the agent's: with no overlap the request stays unjoined).

A joined model call's time is split into **client and network** (the
call's duration less the server's time: the HTTP client, the network,
serialisation), **server queue**, **prefill** and **decode** (the
server's latencies), and **server other** (the rest of the server's time:
tokenising, the API server, detokenising). Durations only, never
timestamps across the two hosts: clock skew does not change the split.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from agent_otel.records import ModelCall, ServerRequest

PARTS = ("client_network_s", "server_queue_s", "prefill_s", "decode_s", "server_other_s")


@dataclass(slots=True)
class ModelSplit:
    """One model call and the server requests that served it (a retry makes two)."""

    call: ModelCall
    requests: list[ServerRequest]

    @property
    def server_s(self) -> float:
        return sum(request.seconds for request in self.requests)

    @property
    def server_queue_s(self) -> float:
        return sum(request.queue_s or 0.0 for request in self.requests)

    @property
    def prefill_s(self) -> float:
        return sum(request.prefill_s or 0.0 for request in self.requests)

    @property
    def decode_s(self) -> float:
        return sum(request.decode_s or 0.0 for request in self.requests)

    @property
    def client_network_s(self) -> float:
        return max(0.0, self.call.seconds - self.server_s)

    @property
    def server_other_s(self) -> float:
        return max(0.0, self.server_s - self.server_queue_s - self.prefill_s - self.decode_s)


@dataclass
class SplitTotals:
    """The parts summed over model calls."""

    calls: int = 0
    seconds: float = 0.0  # the calls' own durations
    client_network_s: float = 0.0
    server_queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    server_other_s: float = 0.0

    def add(self, split: ModelSplit) -> None:
        self.calls += 1
        self.seconds += split.call.seconds
        for part in PARTS:
            setattr(self, part, getattr(self, part) + getattr(split, part))


@dataclass
class ServerSpans:
    """What joining gave: every joined call's split, and their totals, overall and per model."""

    requests: int = 0
    joined_by_parent: int = 0
    joined_by_time: int = 0
    unjoined: int = 0
    splits: list[ModelSplit] = field(default_factory=list)
    totals: SplitTotals = field(default_factory=SplitTotals)
    models: dict[str, SplitTotals] = field(default_factory=dict)  # by the model call's model
    _index: Optional[dict[int, list[ModelSplit]]] = field(default=None, repr=False)  # trace id -> its splits

    def of(self, trace_id: int, start_ns: int, end_ns: int) -> SplitTotals:
        """The totals of the joined calls of one trace that start within ``[start_ns, end_ns]`` (a turn)."""
        totals = SplitTotals()
        for split in self._by_trace().get(trace_id, ()):
            if start_ns <= split.call.start_ns <= end_ns:
                totals.add(split)
        return totals

    def _by_trace(self) -> dict[int, list[ModelSplit]]:
        if self._index is None:
            self._index = defaultdict(list)
            for split in self.splits:
                self._index[split.call.trace_id].append(split)
        return self._index


def _overlap(call: ModelCall, request: ServerRequest) -> int:
    return min(call.end_ns, request.end_ns) - max(call.start_ns, request.start_ns)


def join_server_requests(model_calls: Sequence[ModelCall], requests: Iterable[ServerRequest]) -> ServerSpans:
    """Join each server request to the model call it served; see the module docstring."""
    joined = ServerSpans()
    by_span = {call.trace_id << 64 | call.span_id: call for call in model_calls}
    by_trace: dict[int, list[ModelCall]] = defaultdict(list)
    for each in model_calls:
        by_trace[each.trace_id].append(each)
    served: dict[int, ModelSplit] = {}  # id(call) -> its split
    for request in requests:
        joined.requests += 1
        call: Optional[ModelCall] = by_span.get(request.trace_id << 64 | request.parent_span_id)
        if call is not None:
            joined.joined_by_parent += 1
        else:
            candidates = [c for c in by_trace.get(request.trace_id, ()) if _overlap(c, request) > 0]
            if not candidates:
                joined.unjoined += 1
                continue
            call = max(candidates, key=lambda c: (_overlap(c, request), -c.start_ns))
            joined.joined_by_time += 1
        split = served.get(id(call))
        if split is None:
            split = served[id(call)] = ModelSplit(call, [])
            joined.splits.append(split)
        split.requests.append(request)
    for split in joined.splits:
        joined.totals.add(split)
        joined.models.setdefault(split.call.model, SplitTotals()).add(split)
    return joined
