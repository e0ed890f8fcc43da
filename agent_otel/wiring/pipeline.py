"""The background thread between capture and outputs.

It drains the finished ``ToolCall`` records and executor waits that the hot
path appended (and the loop monitor's finished ``LoopBlock`` records),
keeps the timeline on the wall clock (``clock.follow_wall_clock``),
observes them in the Prometheus metrics, and hands each batch to the other
consumers (the live GPU attribution). A scrape drains first, so /metrics is
exact at the moment it is read. Its own drains (and ``force_flush`` and
``shutdown``'s) also build the SDK spans of deferred tool calls
(``capture/deferred.py``); the drains before a scrape or a GPU poll do not.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from agent_otel.support import clock, forks
from agent_otel.capture.executors import ExecutorMonitor
from agent_otel.capture.loop_monitor import LoopMonitor
from agent_otel.capture.recorder import Recorder
from agent_otel.exporters.prometheus import Metrics
from agent_otel.support.problems import Problems
from agent_otel.records import ToolCall

logger = logging.getLogger("agent_otel")


class Pipeline:
    """Drains the hot path's records into the metrics and the consumers; see the module docstring."""

    def __init__(
        self,
        recorder: Recorder,
        monitor: Optional[ExecutorMonitor],
        metrics: Metrics,
        interval_s: float = 0.25,
        loop_monitor: Optional[LoopMonitor] = None,
    ):
        self._recorder = recorder
        self._monitor = monitor
        self._loop_monitor = loop_monitor
        self._metrics = metrics
        self._interval_s = interval_s
        self.consumers: list[Callable[[list[ToolCall]], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._problems = Problems(logger)
        self._thread: Optional[threading.Thread] = None
        forks.after_fork_in_child(self.reinit_after_fork)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agent-otel-pipeline", daemon=True)
        self._thread.start()

    def reinit_after_fork(self) -> None:
        """In a forked child: fresh locks, and the thread started again if it ran."""
        self._lock = threading.Lock()
        running = self._thread is not None and not self._stop.is_set()
        self._stop = threading.Event()
        self._thread = None
        if running:
            self.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._follow_wall_clock()
            self.drain(spans=True)

    def _follow_wall_clock(self) -> None:
        # The timeline stays within a millisecond of the wall clock, which other
        # instrumentations' spans and other processes read (clock.py).
        moved = clock.follow_wall_clock()
        if abs(moved) >= 100_000_000:
            logger.info(
                "agent-otel: the wall clock moved %+.3f s against the monotonic clock; the timeline follows it",
                moved / 1e9,
            )

    def drain(self, spans: bool = False) -> None:
        """Process everything the hot path has queued so far; with ``spans``,
        build the deferred tool spans too (this thread's own drains,
        ``force_flush`` and ``shutdown``: not the drains before a scrape or a
        GPU poll, so span processors see them here). Never raises."""
        with self._lock:
            if spans:
                self._build_spans()
            finished = self._recorder.finished
            # Only this thread takes from the left (under the lock); the hot
            # path appends on the right meanwhile and waits for the next drain.
            take = finished.popleft
            batch = [take() for _ in range(len(finished))]
            blocks = self._loop_monitor.finished if self._loop_monitor is not None else ()
            try:
                with self._metrics.lock:
                    self._metrics.observe_calls(batch)
                    if self._monitor is not None:
                        self._metrics.observe_waits(self._monitor.waits())
                    while blocks:
                        self._metrics.observe_block(blocks.popleft())
            except Exception as exc:
                self._failed("metrics", exc)
            for consumer in self.consumers:
                try:
                    consumer(batch)
                except Exception as exc:
                    self._failed(getattr(consumer, "__qualname__", repr(consumer)), exc)

    def _build_spans(self) -> None:
        # Deferred spans (capture/deferred.py): started and ended here, so the
        # span processors' on_start and on_end run on this thread.
        spans = self._recorder.spans
        if not spans:
            return
        try:
            replay = self._recorder.builder.replay_tracer()
        except Exception as exc:
            spans.clear()
            self._failed("deferred spans", exc)
            return
        build, take = self._recorder.build_span, spans.popleft
        for _ in range(len(spans)):
            try:
                build(replay, take())
            except Exception as exc:
                self._failed("deferred spans", exc)

    def _failed(self, where: str, exc: Exception) -> None:
        self._problems.report(
            (where, type(exc).__name__),
            "agent-otel pipeline step %s failed (%s: %s); telemetry may be incomplete",
            where,
            type(exc).__name__,
            exc,
        )

    def shutdown(self, timeout_s: float) -> bool:
        """Stop the thread and drain what is left; True if both happened within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
        if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            return False
        self._lock.release()
        self.drain(spans=True)
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
