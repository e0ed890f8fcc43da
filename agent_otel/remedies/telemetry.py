"""Spans and metrics for calls that a remedy runs.

A remedy call is requested on the caller's thread, executes on a pool worker
or a batch's flusher, and ends when the caller has its answer (a result, a
timeout, a fallback). ``CallTelemetry`` carries the call across: the caller
opens a queued ``ToolCall``; the thread that runs the first attempt begins
the span through ``Recorder.begin``, so its ``exec.start`` event and the
queue time are real; the caller ends it with ``Recorder.end``. The span and
the contract's metrics are therefore exactly those of a plain ``@tool``
call, plus the remedy's own attributes, events and counters.

Without ``instrument()`` every method is a no-op and the remedies behave
the same.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

from agent_otel.support.text import NAME_LIMIT, valid_text
from agent_otel.capture.current import current_recorder, worker_local
from agent_otel.support.clock import now_ns
from agent_otel.capture.meta import ToolMeta
from agent_otel.capture.outcomes import error_type_of, outcome_of
from agent_otel.semconv import (
    AGENT_TOOL_ATTEMPT,
    AGENT_TOOL_OUTCOME,
    ERROR_TYPE,
    EVENT_TOOL_ATTEMPT,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_RESULT,
    OUTCOME_OK,
)

if TYPE_CHECKING:  # (the recorder loads OpenTelemetry's SDK: a library's remedies load without it)
    from agent_otel.capture.recorder import ActiveCall, Recorder


def metrics():
    """The remedy metrics of the running instrumentation, or None."""
    rec = current_recorder()
    return rec.remedy_metrics if rec is not None else None


def count_rejection(tool: str, pool: str) -> None:
    found = metrics()
    if found is not None:
        found.rejection(tool, pool)


class _Notes:
    """What a remedy did during one call, written onto the call's span when it ends."""

    __slots__ = ("attributes", "_events", "metrics")

    def __init__(self):
        self.attributes: dict = {}
        self._events: list[tuple[str, dict, int]] = []
        self.metrics = metrics()

    def attempt(self, number: int, exc: Optional[BaseException]) -> None:
        """Note how one attempt ended (an event on the span when it ends)."""
        attributes = {AGENT_TOOL_ATTEMPT: number, AGENT_TOOL_OUTCOME: OUTCOME_OK if exc is None else outcome_of(exc)}
        if exc is not None:
            attributes[ERROR_TYPE] = error_type_of(exc)
        self._events.append((EVENT_TOOL_ATTEMPT, attributes, now_ns()))

    def event(self, name: str, attributes: dict) -> None:
        self._events.append((name, attributes, now_ns()))

    def arguments(self, args: tuple, kwargs: dict) -> None:
        """The call's arguments, when recorded (see ``CallTelemetry``)."""

    def result(self, value) -> None:
        """The call's answer, when recorded (see ``CallTelemetry``)."""

    def _write(self, span) -> None:
        for name, attributes, timestamp in self._events:
            span.add_event(name, attributes, timestamp=timestamp)
        if self.attributes:
            span.set_attributes(self.attributes)


class CallTelemetry(_Notes):
    """One remedy call's span, from request to answer, whichever threads it crosses."""

    __slots__ = ("_recorder", "_meta", "_call", "_active", "_lock")

    def __init__(self, rec: Recorder, meta: ToolMeta, executor: str):
        super().__init__()
        executor = valid_text(executor, NAME_LIMIT)  # a pool's name, as the user wrote it
        pending = worker_local.pending
        if pending is not None and pending.tool == meta.name:
            # The user submitted this tool to an executor of their own: the
            # call was requested there, and runs on through the remedy.
            worker_local.pending = None
            pending.executor = executor
            call = pending
        else:
            call = rec.queued(meta.name, executor, now_ns())
        self._recorder = rec
        self._meta = meta
        self._call = call
        self._active: Optional[ActiveCall] = None
        self._lock = threading.Lock()

    def started(self):
        """On the thread that runs an attempt, as it starts: the span to make current."""
        with self._lock:
            active = self._active if self._active is not None else self._begin()
            return active.span

    def arguments(self, args: tuple, kwargs: dict) -> None:
        """Record the arguments as ``@tool`` does, with ``record_arguments`` (through ``redact``)."""
        rec = self._recorder
        if rec.record_arguments:
            self.attributes[GEN_AI_TOOL_CALL_ARGUMENTS] = rec.payload_text(
                GEN_AI_TOOL_CALL_ARGUMENTS, {"args": args, "kwargs": kwargs}
            )

    def result(self, value) -> None:
        """Record what the caller got (a result, a cached one, a fallback's), with ``record_results``."""
        rec = self._recorder
        if rec.record_results:
            self.attributes[GEN_AI_TOOL_CALL_RESULT] = rec.payload_text(GEN_AI_TOOL_CALL_RESULT, value)

    def _begin(self) -> ActiveCall:
        worker_local.pending = self._call  # Recorder.begin claims it: the span starts at request
        active = self._active = self._recorder.begin(self._meta, attach=False)
        return active

    def finish(self, exc: Optional[BaseException] = None, outcome: Optional[str] = None) -> None:
        """End the span: with ``exc`` as the call's error, or with ``outcome`` (e.g. ``fallback``)."""
        with self._lock:
            # No attempt ever started: all of it was queue time.
            active = self._active if self._active is not None else self._begin()
        self._write(active.span)
        if outcome is not None and active.call is not None:
            active.call.outcome = outcome
        self._recorder.end(active, exc)


class FrameworkSpanTelemetry(_Notes):
    """A framework hook already records this call (its span is current): the
    remedy adds its notes to that span and leaves beginning and ending it to
    the hook, so the call still has one span."""

    __slots__ = ("_span",)

    def __init__(self, span):
        super().__init__()
        self._span = span

    def started(self):
        return self._span

    def finish(self, exc: Optional[BaseException] = None, outcome: Optional[str] = None) -> None:
        self._write(self._span)


class NoTelemetry:
    """What a remedy call records when ``instrument()`` is off: nothing."""

    __slots__ = ("attributes",)
    metrics = None

    def __init__(self):
        self.attributes: dict = {}

    def started(self):
        return None

    def attempt(self, number, exc) -> None:
        pass

    def event(self, name, attributes) -> None:
        pass

    def arguments(self, args, kwargs) -> None:
        pass

    def result(self, value) -> None:
        pass

    def finish(self, exc=None, outcome=None) -> None:
        pass


def open_call(meta: ToolMeta, executor: str):
    """Start recording one remedy call (its request time is now)."""
    rec = current_recorder()
    if rec is None:
        return NoTelemetry()
    outer = rec.running(meta)
    return CallTelemetry(rec, meta, executor) if outer is None else FrameworkSpanTelemetry(outer)
