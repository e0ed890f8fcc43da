"""A batching span processor that counts what it loses.

The SDK's ``BatchSpanProcessor`` drops spans when its queue is full and
when an export fails, and says so only in a log line. This one does the same
work (a bounded queue, one export thread, batches on a timer or when full)
and reports every lost span to a callback, which ``instrument()`` connects to
``agent_otel_spans_dropped_total``. ``on_end`` runs on the caller's thread:
it appends to a deque and nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable, Optional

from opentelemetry import context as context_api
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agent_otel.config import DEFAULTS
from agent_otel.semconv import METRIC_SPANS_DROPPED

logger = logging.getLogger("agent_otel.export")


class BatchSpanProcessor(SpanProcessor):
    def __init__(self, exporter: SpanExporter, *, max_queue_size: int = DEFAULTS.max_queue_size,
                 batch_size: int = DEFAULTS.export_batch_size, interval_s: float = DEFAULTS.export_interval, on_drop: Optional[Callable[[int], None]] = None,
                 name: str = "agent-otel-span-export"):
        self.exporter = exporter
        self._max_queue_size = max_queue_size
        self._batch_size = min(batch_size, max_queue_size)
        self._interval_s = interval_s
        self._on_drop = on_drop or (lambda count: None)
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_requests = 0
        self._flushes_done = 0
        self._stopping = False
        self._export_failures_logged = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def on_start(self, span, parent_context=None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopping:
            # Shut down: its metrics are no longer served (OpenTelemetry keeps
            # a stopped processor on the provider; it must stay cheap).
            return
        if len(self._queue) >= self._max_queue_size:
            self._on_drop(1)
            return
        self._queue.append(span)
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    def _work(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            with self._flushed:
                requested = self._flush_requests
            self._export_all()
            with self._flushed:
                self._flushes_done = requested
                self._flushed.notify_all()
            if self._stopping:
                return

    def _export_all(self) -> None:
        while self._queue:
            batch = []
            while self._queue and len(batch) < self._batch_size:
                batch.append(self._queue.popleft())
            token = context_api.attach(context_api.set_value(context_api._SUPPRESS_INSTRUMENTATION_KEY, True))
            try:
                result = self.exporter.export(batch)
            except Exception:  # an exporter's bug must not end the export thread
                logger.exception("span export raised; %d spans dropped", len(batch))
                result = SpanExportResult.FAILURE
            finally:
                context_api.detach(token)
            if result is not SpanExportResult.SUCCESS:
                self._on_drop(len(batch))
                if not self._export_failures_logged:
                    self._export_failures_logged = True
                    logger.warning("span export to %s failed; counting dropped spans in %s",
                                   type(self.exporter).__name__, METRIC_SPANS_DROPPED)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self._stopping or not self._thread.is_alive():
            return False
        with self._flushed:
            self._flush_requests += 1
            ticket = self._flush_requests
            self._wake.set()
            return self._flushed.wait_for(lambda: self._flushes_done >= ticket, timeout_millis / 1000)

    def shutdown(self, timeout_s: float = DEFAULTS.shutdown_timeout) -> None:
        """Export what is queued and stop; waits at most ``timeout_s`` for the export thread."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        self.exporter.shutdown()
