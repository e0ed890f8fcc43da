"""Deferred tool spans (the ``deferred_spans`` setting, off by default).

In this mode a tool call's hot path builds no SDK span. ``Recorder.begin``
takes the span's ids the way the SDK's ``Tracer.start_span`` does (the
trace id from the parent context or the provider's id generator, a new span
id from it), takes the sampler's decision (for the SDK's samplers, from the
trace id and the parent's flags as they decide: ``bounds``; for any other
sampler that ignores attributes, its ``should_sample`` with the arguments
``start_span`` gives it), and makes a ``DeferredSpan``
current for the call: a span object that carries the span context the SDK
span will have (so child spans, of HTTP clients or models, parent on it and
inherit its sampled flag) and keeps every call made on it (attributes,
events, status, exceptions, links, a new name) in a list.
``Recorder.end`` appends it to ``Recorder.spans``. The pipeline thread
(``pipeline.py``) then builds the real span in ``build``: through the
tracer's own ``start_span`` (on a copy of the tracer whose id generator and
sampler give back the ids and the decision taken on the hot path), with the
call's start time and parent context, replays the calls made on it, adds
the attributes of its end and ends it at the call's end. So the span
processors see ``on_start`` and then ``on_end`` (and ``_on_ending``) on the
pipeline thread, after the call ended, up to ``interval_s`` (0.25 s) later;
``Instrumentation.force_flush`` and ``shutdown`` build them first, on their
caller's thread (``Pipeline.drain(spans=True)``).

Only where nothing can tell the difference: the tracer is the SDK's, its
sampler one of the SDK's samplers that decide without the span's
attributes, and every span processor's ``on_start`` does nothing (exactly
the tracers for which ``sdk_span.StartAttributes.get()`` is None, checked
again whenever the processors change); and the tracer is enabled. Any
other call takes the default path. What a user sees of the span inside
the call is in docs/telemetry.md ("Deferred spans").

What it relies on beyond the public API: ``Tracer.sampler`` and
``Tracer.id_generator``, the attributes the SDK's ``Tracer`` sets in its
constructor and reads in ``start_span``, are replaced on a shallow copy of
the tracer (never on the tracer itself); ``Tracer._is_enabled`` (the SDK's
tracer configurator) is read where it exists; and ``bounds`` reads the
SDK samplers' settings (``StaticSampler._decision``, ``ParentBased``'s
delegates, ``TraceIdRatioBased.bound``). ``tests/test_deferred_spans.py``
checks that both modes export the same spans, and the bounds' decisions
against ``should_sample``.
"""

from __future__ import annotations

import copy
from time import time_ns
from typing import Any, Optional

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, TraceFlags

from agent_otel.capture import sdk_span
from agent_otel.semconv import SCOPE_NAME
from agent_otel.version import __version__

# The trace flags of a span context, by (sampled, random trace id): made once.
FLAGS = {
    (sampled, random): TraceFlags(
        (TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT) | (TraceFlags.RANDOM_TRACE_ID if random else 0)
    )
    for sampled in (False, True)
    for random in (False, True)
}
INTERNAL = SpanKind.INTERNAL
RECORDING = (Decision.RECORD_ONLY, Decision.RECORD_AND_SAMPLE)


def _kept(value: Any) -> Any:
    # The SDK copies a sequence value when it is set (as a tuple): a list the
    # caller changes later must not change what is exported.
    return tuple(value) if isinstance(value, list) else value


def _kept_all(attributes) -> Optional[dict]:
    return None if attributes is None else {key: _kept(value) for key, value in attributes.items()}


class DeferredSpan(trace_api.Span):
    """The current span of a tool call in deferred mode; see the module docstring.

    Its span context is the one the exported span has; ``is_recording()`` is
    True until the call ends. Every call made on it is kept (in ``ops``, in
    order, with the time of an event or exception that was given none) and
    made on the SDK span when the pipeline builds it; ``end()`` does
    nothing: the call's end ends the span.
    """

    __slots__ = ("name", "context", "parent", "meta", "call", "ops", "ended")
    # Read by Recorder.begin to tell the tool's own span (a nested begin).
    instrumentation_scope = InstrumentationScope(SCOPE_NAME, __version__)

    def __init__(self, name, context, parent, meta, call):
        self.name = name
        self.context = context
        self.parent = parent  # the Context the call began in
        self.meta = meta
        self.call = call
        self.ops: Optional[list] = None
        self.ended = False

    def _keep(self, *op) -> None:
        if self.ended:  # as an ended SDK span: nothing more goes on it
            return
        ops = self.ops
        if ops is None:
            ops = self.ops = []
        ops.append(op)

    def get_span_context(self):
        return self.context

    def is_recording(self) -> bool:
        return not self.ended

    def set_attribute(self, key, value) -> None:
        self._keep("set_attribute", key, _kept(value))

    def set_attributes(self, attributes) -> None:
        self._keep("set_attributes", _kept_all(attributes))

    def add_event(self, name, attributes=None, timestamp=None) -> None:
        self._keep("add_event", name, _kept_all(attributes), time_ns() if timestamp is None else timestamp)

    def add_link(self, context, attributes=None) -> None:
        self._keep("add_link", context, _kept_all(attributes))

    def update_name(self, name) -> None:
        if not self.ended:
            self.name = name
        self._keep("update_name", name)

    def set_status(self, status, description=None) -> None:
        self._keep("set_status", status, description)

    def record_exception(self, exception, attributes=None, timestamp=None, escaped=False) -> None:
        # The SDK span's own record_exception, run now on this span: it
        # formats the exception (its stack as it is now: it may grow as the
        # exception goes on up) and calls add_event, which keeps the event.
        SdkSpan.record_exception(self, exception, attributes, timestamp, escaped)  # type: ignore[arg-type]

    def end(self, end_time=None) -> None:
        pass

    def __repr__(self) -> str:
        return f'DeferredSpan(name="{self.name}", context={self.context})'


# ------------------------------------------------------------------ the sampling decision

_ALWAYS = (1 << 64) + 1  # a bound above every trace id's low 64 bits: sampled
_LOW_64 = TraceIdRatioBased.TRACE_ID_LIMIT


def _bound(sampler) -> Optional[int]:
    """The bound of a sampler of the SDK that samples a trace id exactly when
    its low 64 bits are below it (``TraceIdRatioBased``'s rule; ``ALWAYS_ON``
    and ``ALWAYS_OFF`` as bounds above and at zero); None for any other."""
    kind = type(sampler)
    if kind is StaticSampler:
        decision = sampler._decision
        if decision is Decision.RECORD_AND_SAMPLE:
            return _ALWAYS
        return 0 if decision is Decision.DROP else None
    if kind is TraceIdRatioBased:
        return sampler.bound
    return None


def bounds(sampler) -> Optional[tuple[int, int, int, int, int]]:
    """The SDK sampler ``sampler`` as bounds (see ``_bound``) by parent: (no valid
    parent, remote sampled, remote not sampled, local sampled, local not
    sampled); None where it is not one of those made of them (then
    ``new_span`` asks ``should_sample``).

    Every such sampler decides DROP or RECORD_AND_SAMPLE, keeps the parent's
    trace state (none without a valid parent) and reads nothing else of the
    call (``ParentBased.should_sample``, ``StaticSampler``,
    ``TraceIdRatioBased``, ``_get_parent_trace_state`` in the SDK);
    ``tests/test_deferred_spans.py`` checks the decisions against
    ``should_sample`` for the installed SDK.
    """
    kind = type(sampler)
    if kind is ParentBased or kind is ParentBasedTraceIdRatio:
        found = tuple(_bound(getattr(sampler, name, None)) for name in sdk_span.PARENT_BASED_DELEGATES)
    else:
        found = (_bound(sampler),) * 5
    if any(bound is None for bound in found):
        return None
    return found  # type: ignore[return-value]


def new_span(sampler, decide, ids, meta, call, context, parent_span) -> trace_api.Span:
    """The span of a call beginning now in ``context`` (whose current span is
    ``parent_span``, or None): a ``DeferredSpan``, or where the sampler drops
    it a ``NonRecordingSpan``, as ``tracer.start_span`` would make it.
    ``decide`` is ``bounds(sampler)``, or None."""
    parent = parent_span.get_span_context() if parent_span is not None else None
    if parent is None or not parent.is_valid:
        parent = None
        trace_id = ids.generate_trace_id()
        random = ids.is_trace_id_random()
    else:
        trace_id = parent.trace_id
        flags = parent.trace_flags
        random = flags.random_trace_id
    name = meta.span_name
    if decide is not None:
        if parent is None:
            bound = decide[0]
            trace_state = None
        else:
            # (remote sampled, remote not, local sampled, local not), as ParentBased picks its delegate
            bound = decide[(1 if parent.is_remote else 3) + (0 if flags.sampled else 1)]
            trace_state = parent.trace_state
        sampled = trace_id & _LOW_64 < bound
        recording = sampled
    else:
        result = sampler.should_sample(context, trace_id, name, INTERNAL, None, ())
        decision = result.decision
        trace_state = result.trace_state
        sampled = decision is Decision.RECORD_AND_SAMPLE
        recording = decision in RECORDING
    span_context = trace_api.SpanContext(trace_id, ids.generate_span_id(), False, FLAGS[sampled, random], trace_state)
    if recording:
        return DeferredSpan(name, span_context, context, meta, call)
    return trace_api.NonRecordingSpan(span_context)


class _Ids(IdGenerator):
    """Gives back the ids taken on the hot path (one span at a time)."""

    def __init__(self, real: IdGenerator):
        self.real = real
        self.trace_id = self.span_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id

    def is_trace_id_random(self) -> bool:
        return self.real.is_trace_id_random()


class _Decided(Sampler):
    """Gives back the decision taken on the hot path (one span at a time)."""

    def __init__(self, real: Sampler):
        self.real = real
        self.decision = Decision.RECORD_AND_SAMPLE
        self.trace_state: Optional[trace_api.TraceState] = None

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return SamplingResult(self.decision, attributes, self.trace_state)

    def get_description(self) -> str:
        return self.real.get_description()


class Builder:
    """Builds the SDK spans of deferred calls, on the pipeline thread (one at a time)."""

    def __init__(self, tracer):
        self.tracer = tracer

    def replay_tracer(self):
        """A copy of the tracer whose ids and sampling decision are the hot path's."""
        replay = copy.copy(self.tracer)
        replay.id_generator = _Ids(self.tracer.id_generator)
        replay.sampler = _Decided(self.tracer.sampler)
        return replay

    def build(self, replay, deferred: DeferredSpan, end_attributes, text_bound: int) -> trace_api.Span:
        """The SDK span of the ended call ``deferred``, given to the span processors (started and ended)."""
        context = deferred.context
        ids, decided = replay.id_generator, replay.sampler
        ids.trace_id, ids.span_id = context.trace_id, context.span_id
        decided.decision = Decision.RECORD_AND_SAMPLE if context.trace_flags.sampled else Decision.RECORD_ONLY
        decided.trace_state = context.trace_state
        call = deferred.call
        span = replay.start_span(deferred.meta.span_name, deferred.parent, start_time=call.submit_ns)
        for op in deferred.ops or ():
            getattr(span, op[0])(*op[1:])
        sdk_span.add(span, end_attributes, text_bound)
        span.end(end_time=call.end_ns)
        return span
