"""Executor timing: the ``ThreadPoolExecutor.submit`` hook.

``loop.run_in_executor`` and ``asyncio.to_thread`` both go through
``executor.submit``, so one hook covers thread pools, asyncio's default
executor and ``to_thread``. For every submission the hook stamps the submit
time, carries the OpenTelemetry context to the worker and keeps the pool's
queue depth and busy workers. When the submitted callable is a tool (a
function made by ``@tool`` or a framework hook, possibly inside
``functools.partial`` or ``Context.run``), the tool's span starts at
submission and its queue time is worker start minus submit.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
import threading
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from opentelemetry import context as context_api

from agent_otel import forks
from agent_otel.text import NAME_LIMIT, valid_text
from agent_otel.capture import patching
from agent_otel.capture import recorder as _recorder
from agent_otel.clock import OFFSET_NS, perf_counter_ns
from agent_otel.capture.meta import TOOL_MARK, ToolMeta
from agent_otel.capture.patching import Patch
from agent_otel.capture.recorder import worker_local
from agent_otel.semconv import EXECUTOR_ASYNCIO_DEFAULT, EXECUTOR_UNNAMED

_NUMBERED = re.compile(r"ThreadPoolExecutor-\d+")
_STATS_ATTRIBUTE = "_agent_otel_executor_stats"


def executor_name(executor: ThreadPoolExecutor) -> str:
    """The pool's thread name prefix; asyncio's default pool is ``asyncio-default``.

    Python numbers unnamed pools (``ThreadPoolExecutor-0``, ``-1``, ...) in
    creation order; code that makes a pool per request would make a new
    label value each time, so every unnamed pool is ``ThreadPoolExecutor``.
    """
    prefix = getattr(executor, "_thread_name_prefix", "") or ""
    if prefix == "asyncio":
        return EXECUTOR_ASYNCIO_DEFAULT
    if not prefix or _NUMBERED.fullmatch(prefix):
        return EXECUTOR_UNNAMED
    return valid_text(prefix, NAME_LIMIT)


class ExecutorStats:
    """Live counts for one executor, read by the metrics collector at scrape."""

    __slots__ = ("name", "max_workers", "queued", "active", "submissions", "_lock", "__weakref__")

    def __init__(self, name: str, max_workers: Optional[int]):
        self.name = name
        self.max_workers = max_workers
        self.queued = 0
        self.active = 0
        self.submissions = 0
        self._lock = threading.Lock()

    def submitted(self) -> None:
        with self._lock:
            self.queued += 1
            self.submissions += 1

    def started(self) -> None:
        with self._lock:
            self.queued -= 1
            self.active += 1

    def finished(self) -> None:
        with self._lock:
            self.active -= 1

    def withdrawn(self) -> None:
        """A submission that will never start (rejected or cancelled)."""
        with self._lock:
            self.queued -= 1


# Every executor's stats, for as long as the executor lives. Module-wide, not
# per monitor: the stats stay on the executor across uninstrument() and
# instrument() again, and the submit hook finds them there without asking
# the monitor, so a per-monitor list would miss pools used before.
_all_stats: "weakref.WeakSet[ExecutorStats]" = weakref.WeakSet()
_all_stats_lock = threading.Lock()  # a WeakSet must not grow while a scrape lists it


def _reinit_after_fork() -> None:
    """In a forked child: fresh locks, and no submission queued or running (those were the parent's)."""
    global _all_stats_lock
    _all_stats_lock = threading.Lock()
    for stats in list(_all_stats):
        stats._lock = threading.Lock()
        stats.queued = stats.active = 0
    if _monitor is not None:
        _monitor.waits.clear()


forks.after_fork_in_child(_reinit_after_fork)


class ExecutorMonitor:
    """Every instrumented executor's stats, and the waits not yet observed."""

    def __init__(self):
        # (executor name, seconds waited) for the pipeline thread to observe.
        self.waits: deque[tuple[str, float]] = deque()

    def stats_for(self, executor: ThreadPoolExecutor) -> ExecutorStats:
        stats = executor.__dict__.get(_STATS_ATTRIBUTE)
        if stats is None:
            with _all_stats_lock:
                stats = executor.__dict__.get(_STATS_ATTRIBUTE)
                if stats is None:
                    stats = ExecutorStats(executor_name(executor), getattr(executor, "_max_workers", None))
                    executor.__dict__[_STATS_ATTRIBUTE] = stats
                    _all_stats.add(stats)
        return stats

    def snapshot(self) -> list[ExecutorStats]:
        with _all_stats_lock:
            return list(_all_stats)


def submitted_target(fn: Callable) -> Callable:
    """The callable a submission will really run, through partials and ``Context.run``."""
    for _ in range(8):
        if not isinstance(fn, functools.partial):
            break
        inner = fn.func
        if type(getattr(inner, "__self__", None)) is contextvars.Context and fn.args:
            fn = fn.args[0]  # asyncio.to_thread: partial(ctx.run, partial(func, ...))
        else:
            fn = inner
    return fn


def tool_name_of(target: Callable) -> Optional[str]:
    mark = getattr(target, TOOL_MARK, None)
    if mark is None:
        return None
    if isinstance(mark, ToolMeta):
        return mark.name
    try:
        name = mark(target)  # framework hooks know the name only from the instance
    except Exception:
        return None
    return valid_text(name, NAME_LIMIT) if name is not None else None


def submitted_tool(fn: Callable) -> Optional[str]:
    """The tool a submission runs, if it is one: ``fn`` itself, or the callable a
    wrapper put on top of it closes over (another instrumentor's submit hook,
    installed after ours, hands us its own closure around the user's callable)."""
    target = submitted_target(fn)
    name = tool_name_of(target)
    if name is not None or not inspect.isfunction(target):
        return name
    for cell in target.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(inner) and inner is not target:
            name = tool_name_of(submitted_target(inner))
            if name is not None:
                return name
    return None


_monitor: Optional[ExecutorMonitor] = None
_patch: Optional[Patch] = None


class _Submission:
    """One submitted callable: runs it in the worker, notices a cancellation."""

    __slots__ = ("monitor", "stats", "submit_perf_ns", "parent_context", "call", "started", "fn", "args", "kwargs")

    def __init__(self, monitor, stats, submit_perf_ns, parent_context, call, fn, args, kwargs):
        self.monitor = monitor
        self.stats = stats
        self.submit_perf_ns = submit_perf_ns
        self.parent_context = parent_context
        self.call = call
        self.started = False
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def run(self):
        """Runs in the worker thread: the submission's real start."""
        start = perf_counter_ns()
        self.started = True
        stats, call = self.stats, self.call
        stats.started()
        self.monitor.waits.append((stats.name, (start - self.submit_perf_ns) / 1e9))
        # A worker's context is empty between submissions; carrying an empty
        # one over would change nothing, so only a non-empty one is attached.
        token = context_api.attach(self.parent_context) if self.parent_context else None
        if call is not None:
            worker_local.pending = call
        try:
            return self.fn(*self.args, **self.kwargs)
        finally:
            if call is not None and worker_local.pending is call:
                # The tool never claimed its submission (instrumentation was
                # removed meanwhile): forget it rather than leave it in flight.
                worker_local.pending = None
                rec = _recorder.current
                if rec is not None:
                    rec.inflight.pop(id(call), None)
            if token is not None:
                context_api.detach(token)
            stats.finished()

    def done(self, future) -> None:
        # Only a future cancelled before its worker started needs anything here.
        if not self.started and future.cancelled():
            self.stats.withdrawn()
            rec = _recorder.current
            if self.call is not None and rec is not None:
                rec.abandon(self.call, perf_counter_ns() + OFFSET_NS, self.parent_context)


def _submit_hook(original: Callable) -> Callable:
    """The ``ThreadPoolExecutor.submit`` that times the submission, around ``original``
    (the method as it was when the hook was installed: maybe another instrumentor's)."""

    @functools.wraps(original)
    def submit(self, fn, /, *args, **kwargs):
        monitor = _monitor
        if monitor is None:
            return original(self, fn, *args, **kwargs)
        stats = self.__dict__.get(_STATS_ATTRIBUTE) or monitor.stats_for(self)
        submit_perf_ns = perf_counter_ns()
        rec = _recorder.current
        call = None
        if rec is not None:
            tool = submitted_tool(fn)
            if tool is not None:
                call = rec.queued(tool, stats.name, submit_perf_ns + OFFSET_NS, stats.max_workers)
        submission = _Submission(monitor, stats, submit_perf_ns, context_api.get_current(), call, fn, args, kwargs)
        stats.submitted()
        try:
            future = original(self, submission.run)
        except BaseException:
            stats.withdrawn()
            if call is not None and rec is not None:
                rec.inflight.pop(id(call), None)
            raise
        future.add_done_callback(submission.done)
        return future

    return submit


def install(monitor: ExecutorMonitor) -> None:
    """Time every submission to any ``ThreadPoolExecutor`` (through ``patching``)."""
    global _monitor, _patch
    _monitor = monitor
    if _patch is None:
        _patch = patching.install(ThreadPoolExecutor, "submit", _submit_hook)


def uninstall() -> None:
    """Stop timing; put ``ThreadPoolExecutor.submit`` back as it was (see ``patching.remove``)."""
    global _monitor, _patch
    _monitor = None
    if _patch is not None:
        patching.remove(_patch)
        _patch = None


def hooked() -> bool:
    """Whether submissions are being timed."""
    return _patch is not None and _patch.active
