"""The background thread between capture and outputs.

It drains the finished ``ToolCall`` records and executor waits that the hot
path appended (and the loop monitor's finished ``LoopBlock`` records), observes them in the Prometheus metrics, and hands each batch
to the other consumers (the live GPU attribution). A scrape drains first, so
/metrics is exact at the moment it is read.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from agent_otel.records import ToolCall

logger = logging.getLogger("agent_otel")


class Pipeline:
    def __init__(self, recorder, monitor, metrics, interval_s: float = 0.25, loop_monitor=None):
        self._recorder = recorder
        self._monitor = monitor
        self._loop_monitor = loop_monitor
        self._metrics = metrics
        self._interval_s = interval_s
        self.consumers: list[Callable[[list[ToolCall]], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failures_logged: set[str] = set()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agent-otel-pipeline", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.drain()

    def drain(self) -> None:
        """Process everything the hot path has queued so far. Never raises."""
        with self._lock:
            finished = self._recorder.finished
            batch = []
            while finished:
                batch.append(finished.popleft())
            waits = self._monitor.waits if self._monitor is not None else ()
            blocks = self._loop_monitor.finished if self._loop_monitor is not None else ()
            try:
                with self._metrics.lock:
                    for call in batch:
                        self._metrics.observe_call(call)
                    while waits:
                        self._metrics.observe_wait(*waits.popleft())
                    while blocks:
                        self._metrics.observe_block(blocks.popleft())
            except Exception as exc:
                self._log_once("metrics", exc)
            for consumer in self.consumers:
                try:
                    consumer(batch)
                except Exception as exc:
                    self._log_once(getattr(consumer, "__qualname__", repr(consumer)), exc)

    def _log_once(self, where: str, exc: Exception) -> None:
        if where not in self._failures_logged:
            self._failures_logged.add(where)
            logger.warning("agent-otel pipeline step %s failed (%s: %s); telemetry may be incomplete",
                           where, type(exc).__name__, exc)

    def shutdown(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.drain()
