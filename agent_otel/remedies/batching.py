"""Micro-batching: calls of one tool that arrive within a few milliseconds
become one call of a function that takes them all.

Usage::

    @agent_otel.batch(max_size=32, window_ms=5)
    def embed(texts: list[str]) -> list[list[float]]:
        return client.embeddings(texts)          # one request for the batch

    vector = embed("hello")                      # each caller passes one item
    vector = await embed.aio("hello")            # from async code

You write the batch function (a list of items in, a list of results out,
same length and order); callers call it with one item and get their own
result. An item's result that is an exception is raised to that caller
only; an exception from the batch function reaches every caller of the
batch. A batch closes when ``max_size`` calls joined it or ``window_ms``
after its first call, whichever comes first, and runs on a pool
(``"<name>-batch"`` unless ``pool=`` names one), so its executor metrics show
batches waiting and running.

Each caller's call is an ``execute_tool <name>`` span whose queue time is the
wait for its batch to start; the batch itself is a ``batch <name>`` span,
child of the first caller's span, with a link to every caller's span and
``agent.tool.batch.size``.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Link

from agent_otel.support import forks
from agent_otel.capture.current import current_recorder
from agent_otel.errors import ConfigError
from agent_otel.capture.meta import TOOL_MARK, ToolMeta, first_doc_line, name_of
from agent_otel.capture.outcomes import error_type_of
from agent_otel.remedies import pools
from agent_otel.remedies.telemetry import metrics, open_call
from agent_otel.semconv import AGENT_TOOL_BATCH_SIZE, AGENT_TOOL_EXECUTOR, ERROR_TYPE, GEN_AI_TOOL_NAME, batch_span_name


class _Slot:
    """One caller's item, its answer to come, and its call's telemetry."""

    __slots__ = ("item", "future", "telemetry", "requested")

    def __init__(self, item, telemetry):
        self.item = item
        self.future: Future = Future()
        self.telemetry = telemetry
        self.requested = time.perf_counter()


class _Batch:
    __slots__ = ("slots", "full", "deadline")

    def __init__(self, window_s: float):
        self.slots: list[_Slot] = []
        self.full = threading.Event()
        self.deadline = time.monotonic() + window_s


class BatchedTool:
    """A batch function that callers call with one item each (see the module docs)."""

    def __init__(self, fn: Callable[[list], list], *, name: str, max_size: int, window_ms: float, pool: Optional[str]):
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ConfigError(f"@batch {name!r} max_size", max_size, "a whole number >= 1")
        if isinstance(window_ms, bool) or not isinstance(window_ms, (int, float)) or window_ms < 0:
            raise ConfigError(f"@batch {name!r} window_ms", window_ms, "a number of milliseconds >= 0")
        if pool is not None and (not isinstance(pool, str) or not pool.strip()):
            raise ConfigError(f"@batch {name!r} pool", pool, "a pool name (str)")
        self.fn = fn
        self.meta = ToolMeta(name, first_doc_line(fn))
        self.max_size = max_size
        self.window_s = window_ms / 1000.0
        self.pool = pool or f"{name}-batch"
        self._open: Optional[_Batch] = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)
        setattr(self, TOOL_MARK, self.meta)
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the open batch is the parent's (its flusher runs there)."""
        self._lock = threading.Lock()
        self._open = None

    def __call__(self, item):
        """One item in, its result out; blocks until its batch has run."""
        return self.submit(item).result()

    async def aio(self, item):
        """``__call__`` for async code: awaits the batch without blocking the loop."""
        return await asyncio.wrap_future(self.submit(item))

    def submit(self, item) -> Future:
        """Add ``item`` to the open batch (opening one if needed); the future holds its result."""
        pool = pools.use(self.pool)
        slot = _Slot(item, open_call(self.meta, pool.name))
        slot.telemetry.arguments((item,), {})
        with self._lock:
            open_batch = self._open
            opener = open_batch is None
            batch = self._open = _Batch(self.window_s) if open_batch is None else open_batch
            batch.slots.append(slot)
            if len(batch.slots) >= self.max_size:
                self._open = None
                batch.full.set()
        if opener:
            try:
                pool.dispatch(self.meta.name, self._run_batch, (batch,), {})
            except BaseException as exc:  # the pool rejected the batch: every caller in it learns why
                for each in self._close(batch):
                    _answer(each, exc, failed=True)
                if not isinstance(exc, Exception):
                    raise
        return slot.future

    def _close(self, batch: _Batch) -> list[_Slot]:
        """Stop ``batch`` taking calls; returns its callers that still want an answer."""
        with self._lock:
            if self._open is batch:
                self._open = None
        waiting = []
        for slot in batch.slots:
            if slot.future.set_running_or_notify_cancel():
                waiting.append(slot)
            else:  # its caller cancelled (an awaiting task was cancelled)
                slot.telemetry.finish(asyncio.CancelledError())
        return waiting

    def _run_batch(self, batch: _Batch) -> None:
        """On a pool thread: wait out the window (or until full), then run the batch function."""
        remaining = batch.deadline - time.monotonic()
        if remaining > 0:
            batch.full.wait(remaining)
        slots = self._close(batch)
        if not slots:
            return
        try:
            self._execute(slots)
        except BaseException as exc:  # never leave a caller waiting, whatever went wrong
            for slot in slots:
                if not slot.future.done():
                    _answer(slot, exc, failed=True)
            raise

    def _execute(self, slots: list[_Slot]) -> None:
        size = len(slots)
        spans = [slot.telemetry.started() for slot in slots]
        found = metrics()
        if found is not None:
            started = time.perf_counter()
            found.batch(self.meta.name, size, [started - slot.requested for slot in slots])
        for slot in slots:
            slot.telemetry.attributes[AGENT_TOOL_BATCH_SIZE] = size
        batch_span = self._batch_span(spans, size)
        token = context_api.attach(trace_api.set_span_in_context(batch_span)) if batch_span else None
        try:
            results = list(self.fn([slot.item for slot in slots]))
            if len(results) != size:
                raise ValueError(
                    f"batch function {self.meta.name!r} returned {len(results)} results "
                    f"for {size} calls: it must return one result per item, in order"
                )
        except Exception as exc:
            _end_batch_span(batch_span, exc)
            for slot in slots:
                _answer(slot, exc, failed=True)
            return
        finally:
            if token is not None:
                context_api.detach(token)
        _end_batch_span(batch_span, None)
        for slot, result in zip(slots, results):
            _answer(slot, result, failed=isinstance(result, BaseException))

    def _batch_span(self, spans: list, size: int):
        rec = current_recorder()
        spans = [span for span in spans if span is not None]
        if rec is None or not spans:
            return None
        return rec.tracer.start_span(
            batch_span_name(self.meta.name),
            context=trace_api.set_span_in_context(spans[0]),
            links=[Link(span.get_span_context()) for span in spans],
            attributes={GEN_AI_TOOL_NAME: self.meta.name, AGENT_TOOL_BATCH_SIZE: size, AGENT_TOOL_EXECUTOR: self.pool},
        )


def _answer(slot: _Slot, value, *, failed: bool) -> None:
    """End the caller's span, then hand it its result or exception (in that order, so a
    caller that has its answer also finds its span ended)."""
    if failed:
        slot.telemetry.finish(value)
        slot.future.set_exception(value)
    else:
        slot.telemetry.result(value)
        slot.telemetry.finish()
        slot.future.set_result(value)


def _end_batch_span(span, exc: Optional[BaseException]) -> None:
    if span is None:
        return
    rec = current_recorder()
    if exc is not None:
        span.set_attribute(ERROR_TYPE, error_type_of(exc))
        if rec is not None:
            rec.record_error(span, exc)  # the same texts, through redact, as the callers' spans
    span.end()


def batch(
    fn: Optional[Callable] = None,
    *,
    max_size: int = 32,
    window_ms: float = 5.0,
    pool: Optional[str] = None,
    name: Optional[str] = None,
):
    """Make ``fn`` (items -> results) callable one item at a time, merging calls into batches.

    ``max_size``: most calls in one batch. ``window_ms``: longest a batch
    stays open after its first call. ``pool``: where batches run (default a
    pool of its own, ``"<name>-batch"``). ``name``: the tool name in spans
    and metrics (default the function's name).
    """
    if fn is None:
        return lambda f: batch(f, max_size=max_size, window_ms=window_ms, pool=pool, name=name)
    return BatchedTool(fn, name=name or name_of(fn), max_size=max_size, window_ms=window_ms, pool=pool)
