"""Event-loop blocking: a heartbeat on each asyncio loop, and a watchdog thread.

Usage (``instrument()`` does this)::

    monitor = LoopMonitor(tracer, threshold_s=0.1)
    monitor.install()        # loops that start from now on are watched, and those running now
    ...
    monitor.shutdown(1.0)

How it measures. Each watched loop runs a heartbeat every ``threshold / 2``
(``loop.call_later``); the loop's lag is how late a heartbeat runs. The
watchdog thread (``agent-otel-loop-monitor``) wakes when a heartbeat is
``threshold / 2`` overdue: the loop is blocked right now, so it reads the
loop thread's stack (``sys._current_frames``). The innermost tool call on
it is the blocker; the other tool calls on it, and those of the coroutines
suspended on the loop, are waiting for the loop (``stacks.py``), and so are
the model calls made on that loop and in flight (``models.in_flight_on``):
the answer they stream cannot be read while the loop is held. It reads
the stack again every ``threshold / 2`` while the block lasts, and starts a
new segment when another tool call holds the loop. When the overdue
heartbeat runs, the block is over; if it lasted ``threshold`` or more, each
segment becomes a ``LoopBlock`` record (for the metrics and the live
attribution) and an ``asyncio.loop.blocked`` span.

When a block began: for a sync tool call (it holds the thread from its
first instant), at the call's start; otherwise at the heartbeat the loop
missed, up to ``threshold / 2`` after the block truly began. It ends when
the loop runs again.

Which loops: every loop whose ``run_forever`` starts while instrumented
(``asyncio.run``, ``run_until_complete``, ``asyncio.Runner``, and uvloop's
``Loop`` once uvloop is imported), the loop running in the thread that
calls ``install()``, and standard loops already running in other threads
then (found by their ``run_forever`` frame). A loop that stops running is
dropped. With no loop running there is no heartbeat, and the watchdog
thread sleeps without a timeout (it starts with the first loop).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import re
import sys
import threading
import time
import traceback
from collections import deque
from types import CodeType, FrameType, ModuleType
from typing import Any, Optional, Union

from opentelemetry import trace as trace_api
from opentelemetry.trace import Link, SpanContext, TraceFlags

from agent_otel.support import forks
from agent_otel.capture import models, stacks
from agent_otel.capture.on_import import when_imported
from agent_otel.capture.patching import Patches
from agent_otel.support import clock
from agent_otel.support.clock import perf_counter_ns
from agent_otel.records import NS_PER_S, LoopBlock, ToolCall
from agent_otel.semconv import (
    ASYNCIO_LOOP_BLOCKED_BY,
    ASYNCIO_LOOP_BLOCKED_DURATION,
    ASYNCIO_LOOP_ROLE,
    ASYNCIO_LOOP_WAITING_CALLS,
    BLOCKED_BY_UNKNOWN,
    CODE_STACKTRACE,
    LOOP_ROLE_BLOCKING,
    LOOP_ROLE_WAITING,
    SPAN_LOOP_BLOCKED,
    THREAD_ID,
    THREAD_NAME,
)

logger = logging.getLogger("agent_otel")

NOT_SAMPLED = "(not sampled: the watchdog could not run while the loop was blocked)"
STACK_FRAMES = 12  # the top frames of the loop thread's stack, when no tool call holds it
MAX_WAITING_LINKS = 100  # links to waiting calls per span (the SDK keeps 128 links by default)
MAX_RECENT_BLOCKS = 10_000  # finished blocks kept for the live attribution

_UNNAMED_THREAD = re.compile(r"Thread-\d+( \(.*\))?")


def thread_label(name: str) -> str:
    """A thread name as a label value: Python's numbered default names
    (``Thread-3 (serve)``) fold into ``Thread``, as unnamed pools do."""
    return "Thread" if _UNNAMED_THREAD.fullmatch(name) else name


class _Segment:
    """Part of a block during which one tool call (or none) held the loop."""

    __slots__ = ("start_ns", "blocker", "stack")

    def __init__(self, start_ns: int, blocker: Optional[ToolCall], stack: Optional[str]):
        self.start_ns = start_ns  # wall clock
        self.blocker = blocker
        self.stack = stack


class _Episode:
    """A loop seen blocked: since the heartbeat due at ``due_ns`` (perf clock)."""

    __slots__ = ("due_ns", "segments", "waiting")

    def __init__(self, due_ns: int):
        self.due_ns = due_ns
        self.segments: list[_Segment] = []
        self.waiting: dict[int, Union[ToolCall, models.ModelSpan]] = {}  # id -> call


class _Watch:
    """One watched loop: its heartbeat (run on the loop) and what the watchdog saw."""

    __slots__ = (
        "monitor",
        "loop",
        "thread_id",
        "thread_name",
        "due_ns",
        "last_ns",
        "handle",
        "late",
        "stopped",
        "episode",
    )

    def __init__(self, monitor: "LoopMonitor", loop, thread_id: int, thread_name: str):
        self.monitor = monitor
        self.loop = loop
        self.thread_id = thread_id
        self.thread_name = thread_name
        now = perf_counter_ns()
        self.last_ns = now
        self.due_ns = now + monitor.interval_ns
        self.handle = None
        # (due, ran) of heartbeats that ran overdue: appended on the loop's
        # thread, read by the watchdog (deque operations are atomic).
        self.late: deque[tuple[int, int]] = deque()
        self.stopped = False
        self.episode: Optional[_Episode] = None

    def start(self) -> None:
        """Schedule the first heartbeat (on the loop's thread, or before the loop runs)."""
        if not self.stopped:
            self.handle = self.loop.call_later(self.monitor.interval_s, self.beat, context=self.monitor.context)

    def beat(self) -> None:
        if self.stopped:
            return
        now = perf_counter_ns()
        if now - self.due_ns >= self.monitor.overdue_ns:
            self.late.append((self.due_ns, now))
            self.monitor.wake.set()
        self.last_ns = now
        self.due_ns = now + self.monitor.interval_ns
        self.handle = self.loop.call_later(self.monitor.interval_s, self.beat, context=self.monitor.context)

    def stop(self) -> None:
        """On the loop's thread (or with the loop stopped)."""
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()


class LoopMonitor:
    """Watches asyncio event loops and records the stretches they were blocked."""

    def __init__(self, tracer: trace_api.Tracer, *, threshold_s: float = 0.1, max_stack_chars: int = 1024):
        self.tracer = tracer
        self.threshold_ns = round(threshold_s * NS_PER_S)
        self.interval_s = threshold_s / 2
        self.interval_ns = self.threshold_ns // 2
        self.overdue_ns = self.threshold_ns // 2
        self.max_stack_chars = max_stack_chars
        self.context = contextvars.Context()  # the heartbeat runs in no one's context
        # Finished blocks: for the pipeline (metrics), and the recent ones for
        # the live attribution (bounded; a block is ~200 bytes).
        self.finished: deque[LoopBlock] = deque()
        self.recent: deque[LoopBlock] = deque(maxlen=MAX_RECENT_BLOCKS)
        self.wake = threading.Event()
        self._watches: dict[int, _Watch] = {}  # id(loop) -> watch
        self._retired: list[_Watch] = []  # unwatched, with blocks left to record
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self.patches = Patches()
        self._run_forever_code: Optional[CodeType] = None  # asyncio's own run_forever, once hooked
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: only the forking thread (and the loop it runs, if any) is
        left; the other loops' watches and the parent's blocks go, the watchdog restarts."""
        self._lock = threading.Lock()
        self.wake = threading.Event()
        me = threading.get_ident()
        self._watches = {key: watch for key, watch in self._watches.items() if watch.thread_id == me}
        self._retired = []
        self.finished.clear()
        self.recent.clear()
        self._thread = None
        if self._watches and not self._closed:
            self._thread = threading.Thread(target=self._run, name="agent-otel-loop-monitor", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ which loops

    def install(self) -> None:
        """Watch loops from now on: hook ``run_forever``, and watch the loops running now.

        Before the application imports asyncio (or uvloop) no loop can run:
        its ``run_forever`` is hooked when it is imported (``on_import``), so
        ``instrument()`` does not import asyncio.
        """
        global current
        current = self
        when_imported("asyncio", self._hook_asyncio)
        when_imported("uvloop", lambda _module: _hook_uvloop(self))

    def _hook_asyncio(self, asyncio: ModuleType) -> None:
        if current is not self:
            return  # uninstalled before asyncio was imported
        try:
            self._run_forever_code = getattr(asyncio.BaseEventLoop.run_forever, "__code__", None)
            self.patches.wrap(asyncio.BaseEventLoop, "run_forever", _watching_run_forever)
            running = asyncio._get_running_loop()
            if running is not None:
                self.watch(running)
            self._watch_running_elsewhere()
        except Exception as exc:  # an event loop class we do not understand: no loop monitor
            logger.warning(
                "agent-otel: cannot watch asyncio event loops (%s: %s); loop blocking is not measured",
                type(exc).__name__,
                exc,
            )

    def _watch_running_elsewhere(self) -> None:
        """Standard loops already running in other threads (their ``run_forever`` is on the stack)."""
        import asyncio  # imported: install() hooked it

        code = self._run_forever_code
        here = threading.get_ident()
        for thread_id, top in sys._current_frames().items():
            if thread_id == here:
                continue
            frame: Optional[FrameType] = top
            for _ in range(stacks.MAX_DEPTH):
                if frame is None:
                    break
                if frame.f_code is code:
                    loop = frame.f_locals.get("self")
                    if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running():
                        watch = self.watch(loop, thread_id=thread_id, start=False)
                        if watch is not None:
                            try:
                                loop.call_soon_threadsafe(watch.start, context=self.context)
                            except RuntimeError:  # closed meanwhile
                                self._drop(watch)
                    break
                frame = frame.f_back

    def watch(self, loop, thread_id: Optional[int] = None, start: bool = True) -> Optional[_Watch]:
        """Start watching ``loop`` (on its thread, unless ``start`` is False); None if already watched."""
        with self._lock:
            if self._closed or id(loop) in self._watches:
                return None
            if thread_id is None:
                thread_id, name = threading.get_ident(), threading.current_thread().name
            else:
                name = _thread_name(thread_id)
            watch = self._watches[id(loop)] = _Watch(self, loop, thread_id, name)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agent-otel-loop-monitor", daemon=True)
                self._thread.start()
        if start:
            watch.start()
        self.wake.set()
        return watch

    def unwatch(self, loop) -> None:
        """Stop watching ``loop`` (on its thread, as its ``run_forever`` returns).

        A block that lasted to the end (the loop stopped before its overdue
        heartbeat could run) ends now; the watchdog records it.
        """
        with self._lock:
            watch = self._watches.pop(id(loop), None)
        if watch is None:
            return
        now = perf_counter_ns()
        if now - watch.due_ns >= self.overdue_ns:
            watch.late.append((watch.due_ns, now))
        watch.stop()
        with self._lock:
            self._retired.append(watch)
        self.wake.set()

    def _drop(self, watch: _Watch) -> None:
        """Forget a loop that is no longer running (from the watchdog)."""
        with self._lock:
            if self._watches.get(id(watch.loop)) is watch:
                del self._watches[id(watch.loop)]
            watch.stopped = True  # its pending heartbeat, if the loop runs again, does nothing
            watch.episode = None

    def watched(self) -> int:
        with self._lock:
            return len(self._watches)

    # ------------------------------------------------------------ the watchdog

    def _run(self) -> None:
        while True:
            with self._lock:
                closed = self._closed
                watches = list(self._watches.values())
                retired, self._retired = self._retired, []
            if closed:
                # Blocks that ended since the last look (a heartbeat that ran
                # late, a loop that stopped blocked) are recorded before the
                # watchdog ends: an agent that shuts down right after a block
                # still has its span.
                for watch in retired + watches:
                    while watch.late:
                        self._close(watch, *watch.late.popleft())
                return
            timeout: Optional[float] = None
            now = perf_counter_ns()
            for watch in retired + watches:
                try:
                    next_ns = self._check(watch, now)
                except Exception as exc:  # never let the monitor take the agent down
                    logger.debug("agent-otel loop monitor: %s: %s", type(exc).__name__, exc)
                    next_ns = now + self.overdue_ns
                if next_ns is not None:
                    wait = max(0, next_ns - now) / NS_PER_S
                    timeout = wait if timeout is None else min(timeout, wait)
            if timeout is None:  # no loop to watch: sleep until one starts
                self.wake.wait()
                self.wake.clear()
            else:
                # A plain sleep costs less per wake-up than an Event; an
                # overdue heartbeat is read at the next look (readers see it
                # meanwhile: blocks_between).
                time.sleep(timeout)

    def _check(self, watch: _Watch, now: int) -> Optional[int]:
        """Bring one loop's state up to date; returns when to look at it next (perf clock)."""
        while watch.late:
            due, ran = watch.late.popleft()
            self._close(watch, due, ran)
        if watch.stopped:
            return None
        due = watch.due_ns
        if now - due < self.overdue_ns:
            return due + self.overdue_ns
        if not watch.loop.is_running():
            self._drop(watch)
            return None
        episode = watch.episode
        if episode is None or episode.due_ns != due:
            self._open(watch, due)
        else:
            self._resample(watch, episode)
        return now + self.overdue_ns

    def _open(self, watch: _Watch, due: int) -> None:
        """The loop is overdue: blocked right now. See what holds it."""
        episode = _Episode(due)
        frame = sys._current_frames().get(watch.thread_id)
        on_stack = stacks.calls_on_stack(frame)
        for call, _sync in on_stack[1:]:
            episode.waiting[id(call)] = call
        for call in self._suspended_calls(watch.loop):
            episode.waiting.setdefault(id(call), call)
        for model_call in models.in_flight_on(watch.loop):  # model calls waiting for the loop to read their answer
            episode.waiting.setdefault(id(model_call), model_call)
        blocker, sync = on_stack[0] if on_stack else (None, False)
        offset = clock.OFFSET_NS
        start = due + offset
        if blocker is not None and sync and blocker.start_ns:
            # A sync call holds the thread from its first instant, and not
            # before: when the heartbeat was due before the call began (the
            # loop was late, say for want of CPU), the loop still ran until
            # it made the call.
            start = max(watch.last_ns + offset, blocker.start_ns)
        episode.segments.append(_Segment(start, blocker, None if blocker else self._stack(frame)))
        with self._lock:
            watch.episode = episode

    def _resample(self, watch: _Watch, episode: _Episode) -> None:
        """Still blocked: has another tool call (or none) taken the loop?"""
        frame = sys._current_frames().get(watch.thread_id)
        on_stack = stacks.calls_on_stack(frame)
        blocker, sync = on_stack[0] if on_stack else (None, False)
        last = episode.segments[-1]
        if blocker is last.blocker:
            return
        # Not before the last segment began: the timeline may have followed the wall clock back (clock.py).
        now = max(perf_counter_ns() + clock.OFFSET_NS, last.start_ns)
        if blocker is not None and sync and last.start_ns < blocker.start_ns <= now:
            boundary = blocker.start_ns
        elif last.blocker is not None and last.start_ns < last.blocker.end_ns <= now:
            boundary = last.blocker.end_ns
        else:
            boundary = now
        segment = _Segment(boundary, blocker, None if blocker else self._stack(frame))
        with self._lock:  # blocks_between reads the episode
            for call, _sync in on_stack[1:]:
                episode.waiting.setdefault(id(call), call)
            episode.segments.append(segment)

    def _suspended_calls(self, loop) -> list[ToolCall]:
        """The tool calls of the coroutines suspended on ``loop`` (its tasks)."""
        import asyncio  # imported: a loop runs

        try:
            tasks = asyncio.all_tasks(loop)
        except RuntimeError:  # the task set changed under us too often
            return []
        found = []
        for task in tasks:
            coroutine = task.get_coro()
            if coroutine is not None:
                found.extend(stacks.calls_awaiting(coroutine))
        return found

    def _stack(self, frame) -> str:
        """The top frames of the loop thread's stack, bounded (``code.stacktrace``)."""
        if frame is None:
            return "(the loop's thread has no Python frame)"
        text = "".join(traceback.format_list(traceback.extract_stack(frame, limit=STACK_FRAMES)))
        if len(text) > self.max_stack_chars:
            text = "…" + text[len(text) - self.max_stack_chars + 1 :]  # keep the innermost frames
        return text

    def _close(self, watch: _Watch, due: int, ran: int) -> None:
        """A heartbeat ran overdue: the block that delayed it is over."""
        offset = clock.OFFSET_NS
        end = ran + offset
        episode = watch.episode
        if episode is not None and episode.due_ns == due:
            segments, waiting = episode.segments, episode.waiting
        else:
            # Not seen while it lasted (the watchdog could not run: the
            # loop's thread held the GIL throughout).
            segments, waiting = [_Segment(due + offset, None, NOT_SAMPLED)], {}
        end = max(end, segments[-1].start_ns)  # the timeline may have followed the wall clock back (clock.py)
        blocks = _blocks(watch.thread_name, segments, waiting, end)
        if end - segments[0].start_ns < self.threshold_ns:
            blocks = []
        with self._lock:  # readers see the episode or its blocks, never neither
            watch.episode = None
            self.recent.extend(blocks)
        for block in blocks:
            self.finished.append(block)
            self._emit_span(block, watch.thread_id)

    def _emit_span(self, block: LoopBlock, thread_id: int) -> None:
        links = []
        if block.blocker is not None:
            links.append(Link(_span_context(block.blocker), {ASYNCIO_LOOP_ROLE: LOOP_ROLE_BLOCKING}))
        for key in block.waiting[:MAX_WAITING_LINKS]:
            links.append(Link(_span_context(key), {ASYNCIO_LOOP_ROLE: LOOP_ROLE_WAITING}))
        attributes: dict[str, Any] = {
            ASYNCIO_LOOP_BLOCKED_BY: block.tool or BLOCKED_BY_UNKNOWN,
            ASYNCIO_LOOP_BLOCKED_DURATION: block.seconds,
            ASYNCIO_LOOP_WAITING_CALLS: len(block.waiting),
            THREAD_ID: thread_id,
            THREAD_NAME: block.thread,
        }
        if block.stack is not None:
            attributes[CODE_STACKTRACE] = block.stack
        # Its own trace, like a GPU idle window: a blocked loop stalls every
        # coroutine on it, not one agent turn; the links lead to the calls.
        span = self.tracer.start_span(
            SPAN_LOOP_BLOCKED,
            context=trace_api.set_span_in_context(trace_api.INVALID_SPAN),
            attributes=attributes,
            links=links,
            start_time=block.start_ns,
        )
        span.end(end_time=block.end_ns)

    # ------------------------------------------------------------ readers

    def blocks_between(self, start_ns: int, end_ns: int) -> list[LoopBlock]:
        """The blocks overlapping ``[start_ns, end_ns)``: recorded ones, and
        those still going on (``end_ns == 0``) once they pass the threshold."""
        with self._lock:
            found = [block for block in self.recent if block.start_ns < end_ns and block.end_ns > start_ns]
            now = perf_counter_ns()
            offset = clock.OFFSET_NS
            for watch in [*self._watches.values(), *self._retired]:
                episode = watch.episode
                if episode is None or not episode.segments:
                    continue
                # Over, if its overdue heartbeat ran and the watchdog has not read it yet.
                ended = dict(list(watch.late)).get(episode.due_ns)
                end = ended + offset if ended is not None else 0
                if (end or now + offset) - episode.segments[0].start_ns < self.threshold_ns:
                    continue
                for block in _blocks(watch.thread_name, episode.segments, episode.waiting, end):
                    if block.start_ns < end_ns and (block.end_ns == 0 or block.end_ns > start_ns):
                        found.append(block)
        return found

    def lags(self) -> list[tuple[str, float]]:
        """(thread, seconds) per watched loop: how late its latest heartbeat
        ran, or while it is overdue, how long it has been so far."""
        now = perf_counter_ns()
        with self._lock:
            watches = list(self._watches.values())
        lags = []
        for watch in watches:
            overdue = now - watch.due_ns
            lags.append((watch.thread_name, max(0, overdue) / NS_PER_S))
        return lags

    # ------------------------------------------------------------ shutdown

    def shutdown(self, timeout_s: float = 1.0) -> bool:
        global current
        if current is self:
            current = None
        self.patches.restore()
        with self._lock:
            self._closed = True
            watches = list(self._watches.values())
            self._watches.clear()
            self._retired.extend(watches)  # the watchdog's last look (_run)
        for watch in watches:
            watch.stopped = True
            try:
                watch.loop.call_soon_threadsafe(watch.stop, context=self.context)
            except RuntimeError:  # the loop is closed
                pass
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True


def _blocks(
    thread: str, segments: list[_Segment], waiting: dict[int, Union[ToolCall, "models.ModelSpan"]], end_ns: int
) -> list[LoopBlock]:
    """One block's segments as ``LoopBlock`` records (the last one open when
    ``end_ns`` is 0), each with the stack text when no tool call held the loop."""
    waiting_keys = tuple((call.trace_id, call.span_id) for call in waiting.values() if call.span_id)
    blocks = []
    for segment, following in zip(segments, [*segments[1:], None]):
        segment_end = following.start_ns if following is not None else end_ns
        if segment_end and segment_end <= segment.start_ns:
            continue
        blocker = segment.blocker
        key = (blocker.trace_id, blocker.span_id) if blocker is not None and blocker.span_id else None
        blocks.append(
            LoopBlock(
                thread,
                segment.start_ns,
                segment_end,
                blocker.tool if blocker is not None else None,
                key,
                tuple(k for k in waiting_keys if k != key),
                stack=segment.stack,
            )
        )
    return blocks


def _thread_name(thread_id: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == thread_id:
            return thread.name
    return str(thread_id)


def _span_context(key: tuple[int, int]) -> SpanContext:
    return SpanContext(key[0], key[1], is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


# The monitor while instrumented (the run_forever hooks consult it).
current: Optional[LoopMonitor] = None


def _watching_run_forever(original):
    @functools.wraps(original)
    def run_forever(self, *args, **kwargs):
        monitor = current
        watch = monitor.watch(self) if monitor is not None else None
        try:
            return original(self, *args, **kwargs)
        finally:
            if watch is not None:
                monitor.unwatch(self)  # type: ignore[union-attr]

    return run_forever


def _hook_uvloop(monitor: LoopMonitor) -> None:
    """uvloop's ``Loop`` is a Python subclass of its compiled loop, whose
    ``run_until_complete`` calls ``run_forever`` through the class: hook it there."""
    loop_class = getattr(sys.modules.get("uvloop"), "Loop", None)
    if loop_class is None or current is not monitor or "run_forever" in vars(loop_class):
        return
    monitor.patches.wrap(loop_class, "run_forever", _watching_run_forever, inherited=True)
