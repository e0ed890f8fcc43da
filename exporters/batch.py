"""A batching span processor that counts what it loses, and never floods.

The SDK's ``BatchSpanProcessor`` drops spans when its queue is full and
when an export fails, and says so only in a log line. This one does the same
work (a bounded queue, one export thread, batches on a timer or when full)
and more:

- **Counts every lost span** in a ``SpanLosses`` shared by all of
  ``instrument()``'s sinks, which counts a span as dropped once every sink
  lost it (``agent_otel_spans_dropped_total{kind}``).
- **Tool spans first**: derived spans (the per-call ``gpu.idle`` children
  the live GPU timeline makes) may fill three quarters of the queue; past
  that they are dropped, and a tool span (or any span that is not derived)
  arriving at a full queue takes the place of a derived span still in it.
  The check costs nothing until the queue is three quarters full.
- **Backs off**: after a failed export it waits 1 s, then 2, 4, ... up to a
  minute before trying again (spans wait in the queue meanwhile), instead of
  re-posting every few spans to an endpoint that is down.
- **One line, not a flood**: each distinct failure is logged once, then at
  most once a minute with a count (``agent_otel.support.problems``). The log lines
  the OpenTelemetry exporters write while exporting for it (a retry warning
  per attempt) are folded into that one line.
- **Survives fork()**: the child empties its copy of the queue (the parent
  exports those spans), takes fresh locks and starts its own export thread.
- **Tells the truth at shutdown**: ``shutdown()`` returns True only when the
  export thread finished and flushed within the time given.

``on_end`` runs on the caller's thread: it appends to a deque and nothing
else, unless the queue is full.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from itertools import islice
from typing import Callable, Iterator, Optional, Sequence

from opentelemetry import context as context_api

# The key the SDK's own batch processors set while they export; the API has no
# public name for it. (opentelemetry-instrumentation's suppress_instrumentation()
# sets it too, but its module loads wrapt and asyncio: tens of milliseconds of
# instrument(), or an import on the export thread, which a fork can catch
# halfway.) tests/test_imports.py allows this one private name.
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status

from agent_otel.support import forks
from agent_otel.config import DEFAULTS
from agent_otel.support.problems import Problems
from agent_otel.semconv import (
    GEN_AI_OPERATION_EXECUTE_TOOL,
    GEN_AI_OPERATION_NAME,
    METRIC_SPANS_DROPPED,
    SPAN_GPU_IDLE,
    SPAN_KIND_DERIVED,
    SPAN_KIND_OTHER,
    SPAN_KIND_TOOL,
    SPAN_KINDS,
)
from agent_otel.support.text import valid_text

logger = logging.getLogger("agent_otel.export")

FIRST_RETRY_DELAY_S = 1.0
MAX_RETRY_DELAY_S = 60.0
# The longest text of a repaired span attribute (see _valid_span).
_ATTRIBUTE_LIMIT = 64 * 1024


def kind_of(span: ReadableSpan) -> str:
    """The ``kind`` label of a lost span: ``tool``, ``derived`` or ``other`` (``semconv.SPAN_KINDS``)."""
    attributes = span.attributes or {}
    if attributes.get(GEN_AI_OPERATION_NAME) == GEN_AI_OPERATION_EXECUTE_TOOL:
        return SPAN_KIND_TOOL
    if span.name == SPAN_GPU_IDLE and span.parent is not None:
        return SPAN_KIND_DERIVED
    return SPAN_KIND_OTHER


class SpanLosses:
    """Counts a span as dropped when every sink it was given to lost it.

    With one sink, every loss counts at once. With several (OTLP and a
    traces file), a span one sink lost and another delivered is not lost:
    a loss is held until every sink has lost that span, and forgotten when
    the oldest of them can no longer be waiting in any sink's queue.
    """

    def __init__(self, on_drop: Callable[[str, int], None]):
        self._on_drop = on_drop  # (kind, count)
        self.sinks = 0
        self._room = 0  # spans all sinks can hold at once (queues and batches in flight)
        self._pending: "OrderedDict[int, int]" = OrderedDict()  # span id -> sinks that lost it
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def add_sink(self, room: int) -> None:
        self.sinks += 1
        self._room += room

    def lost(self, spans: Sequence[ReadableSpan]) -> None:
        if not spans:
            return
        counts = dict.fromkeys(SPAN_KINDS, 0)
        if self.sinks <= 1:
            for span in spans:
                counts[kind_of(span)] += 1
        else:
            with self._lock:
                pending = self._pending
                for span in spans:
                    key = span.context.span_id
                    losses = pending.pop(key, 0) + 1
                    if losses >= self.sinks:
                        counts[kind_of(span)] += 1
                    else:
                        pending[key] = losses
                while len(pending) > 2 * self._room:
                    pending.popitem(last=False)
        for kind, count in counts.items():
            if count:
                self._on_drop(kind, count)

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pending = OrderedDict()


class _ExporterLog(logging.Filter):
    """Holds back what an exporter logs while this processor's thread exports.

    OpenTelemetry's OTLP exporters log a warning per retry and an error per
    failed batch. On the export thread those records are kept and turned
    into the processor's one line; anywhere else they pass unchanged.
    """

    local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        held = getattr(self.local, "held", None)
        if held is None:
            return True
        if len(held) < 16:
            held.append(record)
        return False


_EXPORTER_LOG = _ExporterLog()
# Where OpenTelemetry's exporters log from besides their own class's module.
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.common._internal",)


def hold_exporter_logs(exporter: SpanExporter) -> None:
    names = {cls.__module__ for cls in type(exporter).__mro__ if cls.__module__ not in ("builtins", "abc")}
    for name in sorted(names | set(_EXPORTER_LOGGERS)):
        target = logging.getLogger(name)
        if _EXPORTER_LOG not in target.filters:
            target.addFilter(_EXPORTER_LOG)


class BatchSpanProcessor(SpanProcessor):
    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = DEFAULTS.max_queue_size,
        batch_size: int = DEFAULTS.export_batch_size,
        interval_s: float = DEFAULTS.export_interval,
        losses: Optional[SpanLosses] = None,
        sink: Optional[str] = None,
        name: str = "agent-otel-span-export",
        advice: Optional[Callable[[str], str]] = None,
    ):
        self.exporter = exporter
        self.sink = sink or type(exporter).__name__
        # What to add to the failure line, given its text (how to fix it), if anything.
        self._advice = advice
        self._max_queue_size = max_queue_size
        # Past three quarters of the queue, derived spans are dropped: the
        # rest is kept for tool spans (see _crowded).
        self._crowded_at = max(1, max_queue_size * 3 // 4)
        self._batch_size = min(batch_size, max_queue_size)
        self._interval_s = interval_s
        self._losses = losses if losses is not None else SpanLosses(lambda kind, count: None)
        self._losses.add_sink(max_queue_size + self._batch_size)
        self._name = name
        self._problems = Problems(logger)
        self._stopping = False
        hold_exporter_logs(exporter)
        self._reset()
        forks.after_fork_in_child(self.reinit_after_fork)

    def _reset(self) -> None:
        """The state of a fresh processor: empty queue, fresh locks, a new export thread."""
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()  # a batch is ready (set by on_end)
        self._urgent = threading.Event()  # a flush or shutdown: export now, even while backing off
        self._flushed = threading.Condition()
        self._room_lock = threading.Lock()
        self._flush_requests = 0
        self._flushes_done = 0
        self._last_pass_ok = True
        self._abandoned = False  # shutdown gave up waiting: export nothing more
        self._may_hold_derived = True  # whether a derived span may be in the queue (see _crowded)
        self._retry_delay_s = 0.0
        self._retry_at = 0.0
        self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
        if not self._stopping:
            self._thread.start()

    def reinit_after_fork(self) -> None:
        """In a forked child: the parent exports what was queued; start afresh."""
        self._reset()

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopping:
            # Shut down: its metrics are no longer served (OpenTelemetry keeps
            # a stopped processor on the provider; it must stay cheap).
            return
        queue = self._queue
        if len(queue) >= self._crowded_at:
            self._crowded(span)
            return
        queue.append(span)
        if len(queue) >= self._batch_size and not self._wake.is_set():
            self._wake.set()

    def _crowded(self, span: ReadableSpan) -> None:
        """The queue is three quarters full: derived spans wait no more; the others
        may fill it, and when it is full take a derived span's place."""
        if kind_of(span) == SPAN_KIND_DERIVED:
            self._losses.lost((span,))
            return
        if len(self._queue) >= self._max_queue_size and self._may_hold_derived:
            with self._room_lock:
                if self._may_hold_derived:
                    self._losses.lost(self._evict_derived())
                    # Derived spans enter only below three quarters: if the
                    # purge left the queue above that, none can be back until
                    # the export thread takes spans out (it sets the flag
                    # then). Each purge is paid for by a quarter of a queue of
                    # arrivals, so the cost per span stays constant.
                    self._may_hold_derived = len(self._queue) < self._crowded_at
        if len(self._queue) < self._max_queue_size:
            self._queue.append(span)
            if not self._wake.is_set():
                self._wake.set()
            return
        self._losses.lost((span,))

    def _evict_derived(self) -> list[ReadableSpan]:
        """Take every derived span out of the queue; the others keep their order."""
        queue = self._queue
        kept: list[ReadableSpan] = []
        evicted: list[ReadableSpan] = []
        for _ in range(len(queue)):
            try:
                span = queue.popleft()
            except IndexError:  # the export thread took the rest
                break
            (evicted if kind_of(span) == SPAN_KIND_DERIVED else kept).append(span)
        queue.extendleft(reversed(kept))
        return evicted

    # ------------------------------------------------------------ the export thread

    def _work(self) -> None:
        while True:
            backing_off = self._retry_at - time.monotonic()
            if backing_off > 0:
                # on_end's wake-ups wait for the back-off; a flush or shutdown does not.
                self._urgent.wait(backing_off)
            else:
                self._wake.wait(self._interval_s)
                self._wake.clear()
            self._urgent.clear()
            with self._flushed:
                requested = self._flush_requests
            exported = self._export_all(must=self._stopping or requested > self._flushes_done)
            with self._flushed:
                self._last_pass_ok = exported
                self._flushes_done = requested
                self._flushed.notify_all()
            if self._stopping:
                return

    def _export_all(self, must: bool) -> bool:
        """Export the queue; True if every batch went.

        ``must`` (a flush, the shutdown) tries now even while backing off.
        A failed batch ends the pass either way: the sink is failing, and
        posting every queued batch to it would be the flood back-off avoids.
        At shutdown the spans left are counted as lost then, since nothing
        will export them later.
        """
        if not must and time.monotonic() < self._retry_at:
            return False
        queue = self._queue
        while queue and not self._abandoned:
            batch: list[ReadableSpan] = []
            try:
                # The oldest spans, a batch at most, taken in C (no bytecode per span).
                # Should another thread empty the queue meanwhile (_take_all when
                # shutdown gives up, _evict_derived for a moment), the spans taken
                # before the IndexError stay in the batch (list.extend keeps them).
                batch.extend(islice(iter(queue.popleft, None), min(len(queue), self._batch_size)))
            except IndexError:
                pass
            self._may_hold_derived = True
            if not self._export(batch):
                if self._stopping:
                    self._losses.lost(self._take_all())
                return False
        return True

    def _take_all(self) -> list[ReadableSpan]:
        taken = []
        while True:
            try:
                taken.append(self._queue.popleft())
            except IndexError:
                return taken

    def _export(self, batch: list[ReadableSpan]) -> bool:
        """Export one batch; count it lost if it failed, and schedule the next try."""
        held: list[logging.LogRecord] = []
        _ExporterLog.local.held = held
        failure: Optional[str] = None
        try:
            with _instrumentation_suppressed():  # the exporter's own requests are not traced
                try:
                    result = self.exporter.export(batch)
                except UnicodeError:
                    # A lone surrogate somewhere in another library's span: repair
                    # the batch and try once more, rather than lose all of it.
                    result = self.exporter.export([_valid_span(span) for span in batch])
        except Exception as exc:  # an exporter's bug must not end the export thread
            result = SpanExportResult.FAILURE
            failure = f"{type(exc).__name__}: {_one_line(str(exc))}"
        finally:
            _ExporterLog.local.held = None
        if result is SpanExportResult.SUCCESS:
            if self._retry_delay_s:
                logger.info("agent-otel: exporting spans to %s works again", self.sink)
            self._retry_delay_s = 0.0
            self._retry_at = 0.0
            return True
        self._losses.lost(batch)
        self._retry_delay_s = min(max(self._retry_delay_s * 2, FIRST_RETRY_DELAY_S), MAX_RETRY_DELAY_S)
        self._retry_at = time.monotonic() + self._retry_delay_s
        if failure is None:
            failure = _what_failed(held)
        if self._advice is not None:
            failure += self._advice(failure)
        # Once shutdown has begun nothing tries again (an abandoned thread's last export included).
        then = "not trying again (shut down)" if self._stopping else "trying again with back-off"
        self._problems.report(
            (self.sink, _shape(failure)),
            "agent-otel: exporting spans to %s failed (%s); %s, spans no sink could take are counted in %s",
            self.sink,
            failure,
            then,
            METRIC_SPANS_DROPPED,
        )
        return False

    # ------------------------------------------------------------ flush and shutdown

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now (even while backing off); True if done in time."""
        if self._stopping or not self._thread.is_alive():
            return False
        with self._flushed:
            self._flush_requests += 1
            ticket = self._flush_requests
            self._urgent.set()
            self._wake.set()
            if not self._flushed.wait_for(lambda: self._flushes_done >= ticket, timeout_millis / 1000):
                return False
            return self._last_pass_ok

    # The SDK's SpanProcessor.shutdown() returns None; this one says whether it finished (Background).
    def shutdown(self, timeout_s: float = DEFAULTS.shutdown_timeout) -> bool:  # type: ignore[override]
        """Export what is queued and stop, within ``timeout_s``.

        True when the export thread finished with everything exported or
        counted; False when it was still exporting at the deadline: it is
        left behind (a daemon thread), told to export nothing more, and the
        spans still queued are counted as lost.
        """
        if self._stopping:
            return not self._thread.is_alive()
        self._stopping = True
        self._urgent.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abandoned = True
            self._losses.lost(self._take_all())
            # Unblocks an OTLP exporter waiting between its own retries.
            threading.Thread(target=self._shutdown_exporter, name=self._name + "-close", daemon=True).start()
            return False
        self._shutdown_exporter()
        return True

    def _shutdown_exporter(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as exc:
            logger.warning(
                "agent-otel: closing the span exporter to %s failed (%s: %s)",
                self.sink,
                type(exc).__name__,
                _one_line(str(exc)),
            )

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Spans waiting in the queue."""
        return len(self._queue)


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _what_failed(held: list[logging.LogRecord]) -> str:
    """What the exporter said while failing, as one line: its error, else its
    first warning (the cause; later ones are retries, or "shutdown in progress")."""
    for level in (logging.ERROR, logging.WARNING):
        for record in held:
            if record.levelno >= level:
                try:
                    return _one_line(record.getMessage())
                except Exception:
                    return _one_line(str(record.msg))
    return "the exporter reported a failure"


_NUMBERS = re.compile(r"\d+(\.\d+)?")


def _shape(failure: str) -> str:
    """What makes two failures the same kind: the text without its numbers (delays, counts)."""
    return _NUMBERS.sub("#", failure)


# ------------------------------------------------------------------ repairing a span


def _valid(value):
    if isinstance(value, str):
        return valid_text(value, _ATTRIBUTE_LIMIT)
    if isinstance(value, (tuple, list)):
        return type(value)(_valid(item) for item in value)
    return value


def _valid_attributes(attributes) -> dict:
    return {valid_text(key, 256): _valid(value) for key, value in (attributes or {}).items()}


# The plain key opentelemetry-instrumentation's suppress_instrumentation() sets as
# well, for instrumentations that read that one.
_SUPPRESS_INSTRUMENTATION_KEY_PLAIN = "suppress_instrumentation"


@contextmanager
def _instrumentation_suppressed() -> Iterator[None]:
    """What opentelemetry-instrumentation's ``suppress_instrumentation()`` does:
    both keys set in the current context while the block runs."""
    ctx = context_api.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True)
    token = context_api.attach(context_api.set_value(_SUPPRESS_INSTRUMENTATION_KEY_PLAIN, True, ctx))
    try:
        yield
    finally:
        context_api.detach(token)


def _valid_span(span: ReadableSpan) -> ReadableSpan:
    """A copy of ``span`` whose every text UTF-8 can encode."""
    status = span.status
    return ReadableSpan(
        name=valid_text(span.name, 1024),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_valid_attributes(span.attributes),
        events=[
            Event(valid_text(event.name, 256), _valid_attributes(event.attributes), event.timestamp)
            for event in span.events
        ],
        links=[Link(link.context, _valid_attributes(link.attributes)) for link in span.links],
        kind=span.kind,
        status=Status(status.status_code, _valid(status.description)) if status.description else status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
