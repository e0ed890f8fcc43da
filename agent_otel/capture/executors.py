"""Executor timing: the ``ThreadPoolExecutor.submit`` hook.

``loop.run_in_executor`` and ``asyncio.to_thread`` both go through
``executor.submit``, so one hook covers thread pools, asyncio's default
executor and ``to_thread``. For every submission the hook stamps the submit
time, carries the OpenTelemetry context to the worker and keeps the pool's
queue depth, busy workers and waits for a worker. When the submitted
callable is a tool (a function made by ``@tool`` or a framework hook,
possibly inside ``functools.partial`` or ``Context.run``), the tool's span
starts at submission and its queue time is worker start minus submit.

Every submission pays for this on the agent's threads, so a plain one (not
a tool) costs a few C calls beyond the two Python calls (the hook, and
``_run`` in the worker): the counts are ``itertools.count``s, the wait goes
on a deque that the pipeline thread observes in C, the submission travels
as ``_run``'s arguments (no object made per submission), and a
cancellation is noticed by a ``Future.cancel`` hook through a mark on the
future (no done-callback). See docs/performance.md, "Thread pools".
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import re
import threading
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED
from types import FunctionType
from typing import Callable, Optional

from agent_otel.support import forks
from agent_otel.support.text import NAME_LIMIT, valid_text
from agent_otel.capture import patching
from agent_otel.capture.current import current_recorder
from agent_otel.support import clock
from agent_otel.support.clock import perf_counter_ns
from agent_otel.capture.meta import TOOL_MARK, ToolMeta
from agent_otel.capture.otel_context import attach, detach, get_current, reset
from agent_otel.capture.patching import Patch
from agent_otel.capture.current import worker_local
from agent_otel.records import ToolCall
from agent_otel.semconv import EXECUTOR_ASYNCIO_DEFAULT, EXECUTOR_UNNAMED

_NUMBERED = re.compile(r"ThreadPoolExecutor-\d+")
_STATS_ATTRIBUTE = "_agent_otel_executor_stats"
# On a submitted future until it starts or is cancelled: what a cancellation withdraws.
_QUEUED_ATTRIBUTE = "_agent_otel_queued"
_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)  # a Future's states once cancelled


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
    """Live counts for one executor, read by the metrics collector at scrape.

    Each count is an ``itertools.count`` that the hot path advances with
    ``next()``: one C call, atomic under the GIL, no lock. A submission is
    counted submitted, then started or withdrawn (cancelled before it
    started, or refused); a started one, finished.
    """

    __slots__ = ("name", "max_workers", "submitted", "started", "finished", "withdrawn", "waits", "__weakref__")

    def __init__(self, name: str, max_workers: Optional[int]):
        self.name = name
        self.max_workers = max_workers
        self.restart(0)

    def restart(self, submissions: int) -> None:
        """Counts with ``submissions`` made and none queued or running, and no wait to observe."""
        self.submitted = itertools.count(submissions)
        self.started = itertools.count(submissions)
        self.finished = itertools.count(submissions)
        self.withdrawn = itertools.count()
        # Each started submission's wait for a worker, in nanoseconds, until
        # the pipeline thread observes it (appended on the right, taken off the left).
        self.waits: deque[int] = deque()

    @property
    def submissions(self) -> int:
        return _count(self.submitted)

    @property
    def queued(self) -> int:
        # The later stages are read first: every submission they count is
        # then counted submitted too, so a scrape never sees fewer than none.
        left = _count(self.withdrawn) + _count(self.started)
        return _count(self.submitted) - left

    @property
    def active(self) -> int:
        finished = _count(self.finished)
        return _count(self.started) - finished

    def withdraw(self, now_ns: int) -> None:
        """A submission that will never start: its future was cancelled first."""
        next(self.withdrawn)


def _count(counter: itertools.count) -> int:
    """How far ``counter`` has counted, without advancing it: its repr is ``count(N)``."""
    return int(repr(counter)[6:-1])


# Every executor's stats, for as long as the executor lives. Module-wide, not
# per monitor: the stats stay on the executor across uninstrument() and
# instrument() again, and the submit hook finds them there without asking
# the monitor, so a per-monitor list would miss pools used before.
_all_stats: "weakref.WeakSet[ExecutorStats]" = weakref.WeakSet()
_all_stats_lock = threading.Lock()  # a WeakSet must not grow while a scrape lists it
# The stats of executors collected with waits not yet observed (a pool made
# per request): the pipeline thread takes them once.
_retired: deque[ExecutorStats] = deque()


def _retire(stats: ExecutorStats) -> None:
    """``stats``' executor is gone: keep its last waits for the pipeline thread."""
    if stats.waits:
        _retired.append(stats)


def _reinit_after_fork() -> None:
    """In a forked child: fresh locks, and no submission queued or running (those were the parent's)."""
    global _all_stats_lock
    _all_stats_lock = threading.Lock()
    for stats in list(_all_stats):
        stats.restart(stats.submissions)
    _retired.clear()


forks.after_fork_in_child(_reinit_after_fork)


class ExecutorMonitor:
    """Every instrumented executor's stats, and the waits not yet observed."""

    def stats_for(self, executor: ThreadPoolExecutor) -> ExecutorStats:
        stats = getattr(executor, _STATS_ATTRIBUTE, None)
        if stats is None:
            with _all_stats_lock:
                stats = getattr(executor, _STATS_ATTRIBUTE, None)
                if stats is None:
                    stats = ExecutorStats(executor_name(executor), getattr(executor, "_max_workers", None))
                    setattr(executor, _STATS_ATTRIBUTE, stats)
                    _all_stats.add(stats)
                    weakref.finalize(executor, _retire, stats).atexit = False
        return stats

    def snapshot(self) -> list[ExecutorStats]:
        with _all_stats_lock:
            return list(_all_stats)

    def waits(self) -> list[tuple[str, deque[int]]]:
        """(executor name, its waits in nanoseconds) for each executor with a wait not yet observed."""
        found = self.snapshot()
        while _retired:
            found.append(_retired.popleft())
        return [(stats.name, stats.waits) for stats in found if stats.waits]


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
_cancel_patch: Optional[Patch] = None


class _QueuedTool:
    """A tool call submitted and not yet started: what a cancellation of its future ends."""

    __slots__ = ("stats", "call", "parent_context")

    def __init__(self, stats: ExecutorStats, call: ToolCall, parent_context):
        self.stats = stats
        self.call = call
        self.parent_context = parent_context

    def withdraw(self, now_ns: int) -> None:
        self.stats.withdraw(now_ns)
        rec = current_recorder()
        if rec is not None:
            rec.abandon(self.call, max(now_ns + clock.OFFSET_NS, self.call.submit_ns), self.parent_context)


def _run(stats, submit_perf_ns, parent_context, call, fn, args, kwargs):
    """Runs in the worker thread: the submission's real start, then ``fn``."""
    start = perf_counter_ns()
    next(stats.started)
    stats.waits.append(start - submit_perf_ns)
    # A worker's context is empty between submissions; carrying an empty
    # one over would change nothing, so only a non-empty one is attached.
    token = attach(parent_context) if parent_context else None
    if call is not None:
        worker_local.pending = call
    try:
        return fn(*args, **kwargs)
    finally:
        if call is not None and worker_local.pending is call:
            # The tool never claimed its submission (instrumentation was
            # removed meanwhile): forget it rather than leave it in flight.
            worker_local.pending = None
            rec = current_recorder()
            if rec is not None:
                rec.inflight.pop(id(call), None)
        if token is not None:
            try:
                reset(token)
            except Exception:  # (another context's token): the API's detach logs it
                detach(token)
        next(stats.finished)


def _withdraw(future) -> None:
    """``future`` was cancelled: withdraw its submission, once (whoever pops the mark first)."""
    try:
        queued = vars(future).pop(_QUEUED_ATTRIBUTE, None)
        if queued is not None:
            queued.withdraw(perf_counter_ns())
    except Exception:  # telemetry only: the cancellation itself stands
        pass


def _submit_hook(original: Callable) -> Callable:
    """The ``ThreadPoolExecutor.submit`` that times the submission, around ``original``
    (the method as it was when the hook was installed: maybe another instrumentor's).

    What every submission costs is kept to a few C calls: the counts are
    ``itertools.count``s, the worker runs the module's ``_run`` with the
    submission as its arguments (no object per submission), and a
    cancellation is noticed by the ``Future.cancel`` hook through a mark on
    the future (no done-callback). Only a submitted tool makes more: its
    queued ``ToolCall``.
    """

    # Self-switching (no switch in front): it calls straight through while
    # _monitor is None, which uninstall() sets whenever the patch goes inactive.
    @patching.self_switching
    @functools.wraps(original)
    def submit(self, fn, /, *args, **kwargs):
        monitor = _monitor
        if monitor is None:
            return original(self, fn, *args, **kwargs)
        stats = getattr(self, _STATS_ATTRIBUTE, None) or monitor.stats_for(self)
        submit_perf_ns = perf_counter_ns()
        parent_context = get_current()
        rec = current_recorder()
        call = tool = None
        # A plain function that closes over nothing and carries no tool mark
        # is no tool: decided here without a call (the common case).
        if rec is not None and (
            type(fn) is not FunctionType or fn.__closure__ is not None or getattr(fn, TOOL_MARK, None) is not None
        ):
            tool = submitted_tool(fn)
            if tool is not None:
                call = rec.queued(tool, stats.name, submit_perf_ns + clock.OFFSET_NS, stats.max_workers)
        next(stats.submitted)
        try:
            future = original(self, _run, stats, submit_perf_ns, parent_context, call, fn, args, kwargs)
        except BaseException:
            next(stats.withdrawn)
            if call is not None and rec is not None:
                rec.inflight.pop(id(call), None)
            raise
        try:
            future._agent_otel_queued = stats if call is None else _QueuedTool(stats, call, parent_context)
            if future._state in _CANCELLED:  # by a shutdown(cancel_futures=True) before it was marked
                _withdraw(future)
        except Exception:  # a future of another kind: its cancellation goes unnoticed
            pass
        return future

    return submit


def _cancel_hook(original: Callable) -> Callable:
    """``Future.cancel``, which withdraws a queued submission when it cancels one."""

    @functools.wraps(original)
    def cancel(self):
        cancelled = original(self)
        if cancelled:
            _withdraw(self)
        return cancelled

    return cancel


def install(monitor: ExecutorMonitor) -> None:
    """Time every submission to any ``ThreadPoolExecutor`` (through ``patching``)."""
    global _monitor, _patch, _cancel_patch
    _monitor = monitor
    if _cancel_patch is None:
        _cancel_patch = patching.install(Future, "cancel", _cancel_hook)
    if _patch is None:
        _patch = patching.install(ThreadPoolExecutor, "submit", _submit_hook)


def uninstall() -> None:
    """Stop timing; put ``ThreadPoolExecutor.submit`` back as it was (see ``patching.remove``)."""
    global _monitor, _patch, _cancel_patch
    _monitor = None
    if _patch is not None:
        patching.remove(_patch)
        _patch = None
    if _cancel_patch is not None:
        patching.remove(_cancel_patch)
        _cancel_patch = None


def hooked() -> bool:
    """Whether submissions are being timed."""
    return _patch is not None and _patch.active
