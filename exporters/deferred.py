"""A span exporter made where it is first used: on the export thread.

The OTLP exporters import a lot (gRPC's alone takes about 58 ms, more than
the rest of ``instrument()`` together). ``instrument()`` hands the batch
processor a ``DeferredExporter`` that knows how to make the real one; the
processor's export thread makes it on its first export, so the agent's
thread never waits for that import. A failure to make it (the package not
installed, a bad setting) is an export failure like any other: logged in
one line, retried with back-off, the spans counted as lost.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agent_otel.support import forks
from agent_otel.exporters.batch import hold_exporter_logs


class DeferredExporter(SpanExporter):
    """Exports through the exporter ``make()`` returns, made on the first export."""

    def __init__(self, make: Callable[[], SpanExporter]):
        self._make = make
        self._exporter: Optional[SpanExporter] = None
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        # A fork while the parent's export thread was making the exporter (inside the
        # lock) would leave the child's export thread waiting on it for good.
        self._lock = threading.Lock()

    @property
    def made(self) -> Optional[SpanExporter]:
        """The real exporter, once made."""
        return self._exporter

    def _made(self) -> SpanExporter:
        with self._lock:
            if self._exporter is None:
                with forks.background_import():  # a fork waits for the exporter's imports
                    exporter = self._make()
                hold_exporter_logs(exporter)
                self._exporter = exporter
            return self._exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._made().export(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        exporter = self._exporter
        return True if exporter is None else exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        exporter = self._exporter
        if exporter is not None:
            exporter.shutdown()
