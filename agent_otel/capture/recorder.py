"""The hot path: begin and end one tool call.

``instrument()`` installs one ``Recorder``; the tool wrappers, ``tool_span``
and the executor hook call into it. Per call it reads the clock twice,
starts and ends one span, and appends the finished ``ToolCall`` to a deque.
With ``deferred_spans`` the span is a ``DeferredSpan`` (``deferred.py``),
appended at the end to ``spans`` for the pipeline thread to build.
Metrics, attribution and serialization happen later, on a background thread
that drains that deque (see ``pipeline.py``).
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from contextvars import Token
from operator import itemgetter
from typing import Callable, Iterable, Mapping, Optional, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode, get_current_span
from opentelemetry.util.types import AttributeValue

from agent_otel.support import forks
from agent_otel.capture import payloads
from agent_otel.support.text import NAME_LIMIT, valid_text
from agent_otel.support import clock
from agent_otel.support.clock import perf_counter_ns
from agent_otel.config import DEFAULTS
from agent_otel.capture import sdk_span
from agent_otel.capture.deferred import Builder, DeferredSpan, bounds, new_span
from agent_otel.capture.otel_context import SPAN_KEY, get_current, reset, with_span
from agent_otel.capture.otel_context import attach as attach_context
from agent_otel.capture.otel_context import detach
from agent_otel.capture.meta import CPU_SAMPLE, CPU_SHORT_NS, START_ATTRIBUTES, ToolMeta
from agent_otel.capture.current import worker_local
from agent_otel.capture.outcomes import error_type_of, outcome_of
from agent_otel.records import ToolCall
from agent_otel.semconv import (
    AGENT_EXECUTOR_MAX_WORKERS,
    AGENT_TOOL_EXEC_CPU_TIME,
    AGENT_TOOL_EXEC_DURATION,
    AGENT_TOOL_EXECUTOR,
    AGENT_TOOL_OUTCOME,
    AGENT_TOOL_QUEUE_DURATION,
    AGENT_TOOL_UNFINISHED,
    ERROR_TYPE,
    EVENT_EXEC_START,
    EVENT_EXCEPTION,
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
    EXECUTOR_DIRECT,
    GEN_AI_TOOL_CALL_ID,
    OUTCOME_CANCELLED,
    SCOPE_NAME,
)

logger = logging.getLogger("agent_otel")


class LiveCall(ToolCall):
    """A call this recorder made: the record, and while it runs its span and
    its tool's ``ToolMeta`` (set by ``begin``; for ``Recorder.close``)."""

    __slots__ = ("span", "meta")
    span: trace_api.Span
    meta: ToolMeta


class ActiveCall(tuple):
    """A call in progress: ``(call, span, token, meta, attributes)``, the
    record, its span, the context token (None when not attached), the tool's
    ``ToolMeta`` and the tool's fixed attributes the span gets at its end
    (``meta.end_attributes``, or ``meta.attributes`` when it started without
    its start attributes: see ``sdk_span.StartAttributes``).

    ``call`` is None for a nested begin of the tool whose span is already
    current (see ``Recorder.begin``): that call is already being recorded.
    A tuple, made in C on the hot path: ``ActiveCall((call, span, token, meta, attributes))``.
    """

    __slots__ = ()
    call: Optional[ToolCall] = property(itemgetter(0))  # type: ignore[assignment]
    span: trace_api.Span = property(itemgetter(1))  # type: ignore[assignment]
    token: Optional[Token[Context]] = property(itemgetter(2))  # type: ignore[assignment]
    meta: ToolMeta = property(itemgetter(3))  # type: ignore[assignment]


def _scope_name(span) -> Optional[str]:
    return getattr(getattr(span, "instrumentation_scope", None), "name", None)


class RemedyCounts(Protocol):
    """The remedies' counters (``agent_otel.exporters.prometheus.RemedyMetrics``)."""

    def fallback(self, tool: str) -> None: ...
    def retry(self, tool: str) -> None: ...
    def rejection(self, tool: str, executor: str) -> None: ...
    def cache_hit(self, tool: str) -> None: ...
    def cache_miss(self, tool: str) -> None: ...
    def cache_evictions(self, tool: str, count: int) -> None: ...
    def batch(self, tool: str, size: int, waits: Iterable[float]) -> None: ...
    def abandoned(self, executor: str, change: int) -> None: ...


class Recorder:
    """Begins and ends tool calls; owns the in-flight table and the finished queue."""

    def __init__(
        self,
        tracer: trace_api.Tracer,
        *,
        record_arguments: bool = False,
        record_results: bool = False,
        max_attribute_length: int = DEFAULTS.max_attribute_length,
        redact: Optional[Callable[[str, str], str]] = None,
        record_exception_messages: bool = DEFAULTS.record_exception_messages,
        deferred_spans: bool = DEFAULTS.deferred_spans,
        remedy_metrics: Optional[RemedyCounts] = None,
    ):
        self.tracer = tracer
        # What a tool span starts with (None where nothing reads it then).
        self.start_attributes = sdk_span.StartAttributes(tracer, START_ATTRIBUTES)
        # Deferred spans (capture/deferred.py): taken where start_attributes.get()
        # is None (an SDK tracer, a sampler blind to attributes, processors whose
        # on_start does nothing) and the tracer is enabled.
        self._sampler = getattr(tracer, "sampler", None)
        self._ids = getattr(tracer, "id_generator", None)
        self._decide = bounds(self._sampler)
        self.deferred = deferred_spans and self._sampler is not None and self._ids is not None
        self._enabled: Callable[[], bool] = getattr(tracer, "_is_enabled", None) or _always
        # The deferred calls ended and not yet built (by the pipeline thread).
        self.spans: deque[DeferredSpan] = deque()
        self.builder = Builder(tracer)
        self.record_arguments = record_arguments
        self.record_results = record_results
        self.max_attribute_length = max_attribute_length
        self.redact = redact
        self.record_exception_messages = record_exception_messages
        # The remedies' counters (instrument()'s metrics); None when nothing serves them.
        self.remedy_metrics = remedy_metrics
        # id(call) -> call, for every call requested and not yet finished.
        self.inflight: dict[int, ToolCall] = {}
        # Finished calls waiting for the pipeline thread. deque.append and
        # popleft are atomic, so the hot path takes no lock.
        self.finished: deque[ToolCall] = deque()
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the calls in flight and finished are the parent's to count."""
        self.inflight.clear()
        self.finished.clear()
        self.spans.clear()

    def running(self, meta: ToolMeta):
        """The current span when it is this tool's own span, else None.

        A tool decorated with ``@tool`` and also run by a hooked framework
        begins twice, once per layer; the inner begin finds the outer span
        current and records nothing, so the call has one span.
        """
        span = trace_api.get_current_span()
        if getattr(span, "name", None) == meta.span_name and _scope_name(span) == SCOPE_NAME:
            return span
        return None

    def begin(self, meta: ToolMeta, call_id: Optional[str] = None, attach: bool = True) -> ActiveCall:
        now = perf_counter_ns() + clock.OFFSET_NS
        context = get_current()
        # self.running(meta), inlined: the hot path
        current = context.get(SPAN_KEY) if SPAN_KEY is not None else get_current_span(context)
        if (
            current is not None
            and getattr(current, "name", None) == meta.span_name
            and _scope_name(current) == SCOPE_NAME
        ):
            return ActiveCall((None, current, None, meta, None))
        call = worker_local.pending
        if call is not None and call.tool == meta.name:
            # This call was submitted to an executor: its span starts at
            # submission, and it is already in the in-flight table.
            worker_local.pending = None
            if now < call.submit_ns:  # the timeline followed the wall clock back since (clock.py)
                now = call.submit_ns
            call.start_ns = now
        else:
            call = LiveCall(meta.name, EXECUTOR_DIRECT, now, now)
            self.inflight[id(call)] = call
        if call_id is not None:
            # valid_text's own test, inlined (the hot path): an ASCII str within the limit is valid as it is.
            call.call_id = (
                call_id
                if type(call_id) is str and call_id.isascii() and len(call_id) <= NAME_LIMIT
                else valid_text(call_id, NAME_LIMIT)
            )
        start = self.start_attributes.get()
        if self.deferred and start is None and self._enabled():
            span = new_span(self._sampler, self._decide, self._ids, meta, call, context, current)
        else:
            span = self.tracer.start_span(meta.span_name, context, attributes=start, start_time=call.submit_ns)
        # SpanContext is a tuple (trace_id, span_id, ...): read by index, not
        # through two Python properties.
        span_context = span.get_span_context()
        call.trace_id = span_context[0]
        call.span_id = span_context[1]
        call.span = span
        call.meta = meta
        if now != call.submit_ns:
            # Execution began after the request: mark when. (For a direct
            # call it began with the span, and the event would say nothing.)
            span.add_event(EVENT_EXEC_START, timestamp=now)
        token = None
        if attach:
            if SPAN_KEY is not None:  # with_span(span, context), inlined
                values = context.copy()
                values[SPAN_KEY] = span
                token = attach_context(Context(values))
            else:
                token = attach_context(with_span(span, context))
        return ActiveCall((call, span, token, meta, meta.end_attributes if start is not None else meta.attributes))

    def request(self, meta: ToolMeta, call_id: Optional[str] = None) -> ActiveCall:
        """Begin a call that a framework is about to hand to a thread pool.

        The span starts now and is current in this context, so the context
        copy the framework makes for the worker carries it; the call stays in
        its queue phase until ``started``. Used where the framework hides the
        submitted callable from the executor hook (a closure of its own).
        """
        context = get_current()
        # self.running(meta), inlined as in begin()
        current = context.get(SPAN_KEY) if SPAN_KEY is not None else get_current_span(context)
        if (
            current is not None
            and getattr(current, "name", None) == meta.span_name
            and _scope_name(current) == SCOPE_NAME
        ):
            return ActiveCall((None, current, None, meta, None))
        now = perf_counter_ns() + clock.OFFSET_NS
        call = LiveCall(meta.name, EXECUTOR_DIRECT, now, 0)
        self.inflight[id(call)] = call
        if call_id is not None:
            call.call_id = valid_text(call_id, NAME_LIMIT)
        start = self.start_attributes.get()
        if self.deferred and start is None and self._enabled():
            span = new_span(self._sampler, self._decide, self._ids, meta, call, context, current)
        else:
            span = self.tracer.start_span(meta.span_name, context, attributes=start, start_time=now)
        # SpanContext is a tuple (trace_id, span_id, ...): read by index, not
        # through two Python properties.
        span_context = span.get_span_context()
        call.trace_id = span_context[0]
        call.span_id = span_context[1]
        call.span = span
        call.meta = meta
        token = attach_context(with_span(span, context))
        return ActiveCall((call, span, token, meta, meta.end_attributes if start is not None else meta.attributes))

    def started(
        self, active: ActiveCall, executor: str, at_ns: Optional[int] = None, max_workers: Optional[int] = None
    ) -> None:
        """A requested call began executing (on a worker of ``executor``, or at ``at_ns``)."""
        call = active.call
        if call is None or call.start_ns:
            return
        call.executor = executor
        call.executor_workers = max_workers
        now = at_ns if at_ns is not None else perf_counter_ns() + clock.OFFSET_NS
        call.start_ns = now if now > call.submit_ns else call.submit_ns  # (clock.py: never before the request)
        if call.start_ns != call.submit_ns:  # as in begin(): only when execution began later
            active.span.add_event(EVENT_EXEC_START, timestamp=call.start_ns)

    def end(self, active: ActiveCall, exc: Optional[BaseException] = None, cpu_ns: Optional[int] = None) -> None:
        """End a call: with ``exc`` as its error, and ``cpu_ns``, the CPU time
        its thread spent running it, where the caller measured that (see
        ``meta.cpu_clock``: ``None`` on the calls it skips).

        The contract's ``agent.*`` attributes are all known by now and go on
        the span in one pass with the tool's GenAI attributes
        (``sdk_span.add``: values made or validated here, not validated
        again); ``gen_ai.operation.name`` went on at its start, or goes on
        with them where nothing could read it at the start
        (``sdk_span.StartAttributes``).
        """
        now = perf_counter_ns() + clock.OFFSET_NS
        call, span, token, meta, fixed = active
        if call is None:
            return
        floor = call.start_ns or call.submit_ns
        if now < floor:  # the timeline followed the wall clock back during the call (clock.py)
            now = floor
        call.end_ns = now
        call.span = None  # (for close() only: the span lives no longer than it did)
        if exc is not None:
            call.outcome = outcome_of(exc)
            if call.outcome != OUTCOME_CANCELLED:
                call.error_type = error_type_of(exc)
                span.set_attribute(ERROR_TYPE, call.error_type)
                self.record_error(span, exc, now)
        exec_ns = now - call.start_ns
        if cpu_ns is not None:
            call.cpu_ns = cpu_ns
            if exec_ns < CPU_SHORT_NS:
                meta.cpu_skip = CPU_SAMPLE - 1  # a short call: measure one in CPU_SAMPLE of the next ones
        elif exec_ns >= CPU_SHORT_NS and meta.cpu_skip:
            meta.cpu_skip = 0  # a long call went unmeasured: measure the next one
        if type(span) is DeferredSpan:
            # Built on the pipeline thread (build_span), with what the call recorded.
            span.ended = True
            self.spans.append(span)
        else:
            sdk_span.add(span, end_attributes(call, fixed), meta.text_bound)
            span.end(end_time=now)
        if token is not None:
            try:
                reset(token)
            except Exception:  # (another context's token): the API's detach logs it
                detach(token)
        # Appended before it leaves the in-flight table, so a reader of both
        # (the live GPU timeline) never misses it.
        self.finished.append(call)
        self.inflight.pop(id(call), None)

    def close(self) -> int:
        """At shutdown, before the span processors shut down: record nothing
        more, and end the span of every call still running as it stands now
        (``agent.tool.outcome`` ``cancelled``, ``agent.tool.unfinished``
        true), so that a stall still going on when the agent stops is in the
        traces with the GPU idle time it held. The number of spans ended.

        The calls' own ends, when they come, only restore their context
        (``end`` is replaced on this instance: nothing on the hot path checks
        for it). A call still queued for a worker has no span yet, and gets
        none.
        """
        self.end = self._end_closed  # type: ignore[method-assign]
        now = perf_counter_ns() + clock.OFFSET_NS
        ended = 0
        replay = None
        for call in list(self.inflight.values()):
            span = getattr(call, "span", None)
            meta = getattr(call, "meta", None)
            if span is None or meta is None or call.end_ns:
                continue
            self.inflight.pop(id(call), None)
            call.start_ns = call.start_ns or now
            call.end_ns = max(now, call.start_ns)
            call.outcome = OUTCOME_CANCELLED
            attributes = end_attributes(call, meta.attributes)
            attributes[AGENT_TOOL_UNFINISHED] = True
            try:
                if type(span) is DeferredSpan:
                    if span.ended:
                        continue
                    span.ended = True
                    replay = replay or self.builder.replay_tracer()
                    self.builder.build(replay, span, attributes, meta.text_bound)
                else:
                    span.set_attributes(attributes)
                    span.end(end_time=call.end_ns)
                ended += 1
            except Exception as exc:  # telemetry, never the agent's shutdown
                logger.debug("agent-otel: could not end the span of %s at shutdown: %s", call.tool, exc)
        return ended

    def _end_closed(
        self, active: ActiveCall, exc: Optional[BaseException] = None, cpu_ns: Optional[int] = None
    ) -> None:
        """``end`` after ``close``: the call's span is ended already, or nobody exports it."""
        token = active[2]
        if token is not None:
            try:
                reset(token)
            except Exception:
                detach(token)
        if active[0] is not None:
            self.inflight.pop(id(active[0]), None)

    def build_span(self, replay, deferred: DeferredSpan) -> None:
        """Build, start and end the SDK span of the ended deferred call (the
        pipeline thread; ``replay`` is ``builder.replay_tracer()``)."""
        meta = deferred.meta
        self.builder.build(replay, deferred, end_attributes(deferred.call, meta.attributes), meta.text_bound)

    # ------------------------------------------------------------ text that leaves the process (payloads.py)

    def text(self, attribute: str, text: str) -> str:
        """``text`` for ``attribute`` through ``redact``, valid and cut to ``max_attribute_length``."""
        return payloads.redacted(self.redact, attribute, text, self.max_attribute_length)

    def payload_text(self, attribute: str, value: object) -> str:
        """A tool's arguments or result as recorded: ``repr()`` (a string as is), through ``redact``."""
        try:
            text = value if isinstance(value, str) else repr(value)
        except Exception:  # a user's __repr__ must not break the tool
            return payloads.UNREPRESENTABLE
        return self.text(attribute, text)

    def record_payload(self, span, attribute: str, value: object) -> None:
        """Record a tool's arguments or result (callers check that the user opted in)."""
        span.set_attribute(attribute, self.payload_text(attribute, value))

    def record_error(self, span, exc: BaseException, timestamp: Optional[int] = None) -> None:
        """The ``exception`` event and ERROR status of a failed call, as the SDK's
        ``record_exception`` writes them, every text through ``redact``; the
        messages only with ``record_exception_messages``."""
        name = type(exc).__name__
        attributes = {EXCEPTION_TYPE: name}
        message = payloads.message_of(exc) if self.record_exception_messages else None
        if message is not None:
            attributes[EXCEPTION_MESSAGE] = self.text(EXCEPTION_MESSAGE, message)
        stack = payloads.exception_text(exc, self.record_exception_messages)
        stack = payloads.redacted(self.redact, EXCEPTION_STACKTRACE, stack, sys.maxsize)
        attributes[EXCEPTION_STACKTRACE] = payloads.keep_end(stack, payloads.STACKTRACE_LIMIT)
        attributes[EXCEPTION_ESCAPED] = "True"
        span.add_event(EVENT_EXCEPTION, attributes, timestamp=timestamp)
        self.set_error_status(span, f"{name}: {message}" if message is not None else name)

    def set_error_status(self, span, description: str) -> None:
        """ERROR status with ``description`` (text from the call) through ``redact``."""
        span.set_status(Status(StatusCode.ERROR, self.text(payloads.STATUS_DESCRIPTION, description)))

    def queued(self, tool: str, executor: str, submit_ns: int, max_workers: Optional[int] = None) -> LiveCall:
        """A tool call submitted to an executor (of ``max_workers``) and not yet started."""
        call = LiveCall(tool, executor, submit_ns, 0, executor_workers=max_workers)
        self.inflight[id(call)] = call
        return call

    def abandon(self, call: ToolCall, now: int, parent_context) -> None:
        """A submitted call that never started (its future was cancelled)."""
        call.start_ns = call.end_ns = now
        call.outcome = OUTCOME_CANCELLED
        meta = ToolMeta(call.tool)
        span = self.tracer.start_span(
            meta.span_name, context=parent_context, attributes=meta.start_attributes, start_time=call.submit_ns
        )
        span_context = span.get_span_context()
        call.trace_id, call.span_id = span_context.trace_id, span_context.span_id
        span.set_attributes(
            {
                **meta.end_attributes,
                AGENT_TOOL_QUEUE_DURATION: (now - call.submit_ns) / 1e9,
                AGENT_TOOL_EXEC_DURATION: 0.0,
                AGENT_TOOL_EXECUTOR: call.executor,
                AGENT_TOOL_OUTCOME: OUTCOME_CANCELLED,
            }
        )
        span.end(end_time=now)
        self.finished.append(call)
        self.inflight.pop(id(call), None)


def _always() -> bool:
    return True


def end_attributes(call: ToolCall, fixed: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The attributes a tool span gets at its end: ``fixed`` (the tool's), and the
    contract's ``agent.*`` and ``gen_ai.tool.call.id`` of the ended ``call``."""
    attributes: dict[str, AttributeValue] = {
        **fixed,
        AGENT_TOOL_QUEUE_DURATION: (call.start_ns - call.submit_ns) / 1e9,
        AGENT_TOOL_EXEC_DURATION: (call.end_ns - call.start_ns) / 1e9,
        AGENT_TOOL_EXECUTOR: call.executor,
        AGENT_TOOL_OUTCOME: call.outcome,
    }
    if call.cpu_ns is not None:
        attributes[AGENT_TOOL_EXEC_CPU_TIME] = call.cpu_ns / 1e9
    if call.executor_workers:
        attributes[AGENT_EXECUTOR_MAX_WORKERS] = call.executor_workers
    if call.call_id is not None:
        attributes[GEN_AI_TOOL_CALL_ID] = call.call_id
    return attributes


# The one recorder while instrumented; None otherwise (the wrappers then
# call straight through).
current: Optional[Recorder] = None
