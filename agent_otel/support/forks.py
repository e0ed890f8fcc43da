"""What happens in a child process after ``os.fork()``.

Prefork servers (gunicorn with ``--preload``, uvicorn's workers,
``multiprocessing`` with the fork start method) fork after ``instrument()``.
The child gets a copy of the parent's memory but only the thread that
called ``fork()``: every lock another thread held at that moment stays held
for good, and every background thread is gone. So each part that owns a
lock or a thread registers, when it is made, a method that puts it right in
the child: fresh locks, its own copy of the parent's queues emptied (the
parent exports those), its threads started again. Nothing is checked per
call: the cost is paid once, at fork.

Usage (the pattern the OpenTelemetry SDK uses for its batch processor)::

    class Part:
        def __init__(self):
            self._lock = threading.Lock()
            forks.after_fork_in_child(self.reinit_after_fork)

        def reinit_after_fork(self) -> None:
            self._lock = threading.Lock()

Hooks run in the order they were registered, which is the order the parts
were made, so a part's hook finds the parts it depends on already put
right. The parent registers weak references: a part that is gone is
skipped.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import signal
import sys
import threading
import weakref
from typing import Callable, Optional

logger = logging.getLogger("agent_otel")


def after_fork_in_child(function: Callable[[], None]) -> None:
    """Call ``function`` in every child forked from now on.

    A bound method is held weakly (a part that is gone is skipped); a plain
    function, for a module's own state, is held for good. A hook that fails
    logs one line: the child goes on, with whatever telemetry is left.
    """
    if not hasattr(os, "register_at_fork"):  # a platform without fork()
        return
    reference: Callable[[], Optional[Callable[[], None]]]
    if inspect.ismethod(function):
        reference = weakref.WeakMethod(function)
    else:

        def reference(function: Callable[[], None] = function) -> Optional[Callable[[], None]]:
            return function

    def hook() -> None:
        bound = reference()
        if bound is None:
            return
        try:
            bound()
        except Exception as exc:
            logger.warning(
                "agent-otel: after fork, %s failed (%s: %s); telemetry in this process may be incomplete",
                getattr(bound, "__qualname__", bound),
                type(exc).__name__,
                exc,
            )

    os.register_at_fork(after_in_child=hook)


# ------------------------------------------------------------ imports on background threads
#
# Python's import system locks each module while it executes. A fork while
# another thread is importing leaves that module's lock held in the child
# for good: the child's next import of that module (or of one it was in the
# middle of) waits forever. What instrument() defers to a background thread
# (NVML and the GPU timeline's modules, prometheus_client, an OTLP
# exporter) is imported inside ``background_import()``, and a fork waits
# until none is in progress (at most FORK_WAIT_S, then it goes ahead).

FORK_WAIT_S = 5.0


_tokens = itertools.count()  # one per background import, never reused (not even in a child)


class _BackgroundImports:
    def __init__(self) -> None:
        self.condition = threading.Condition(threading.Lock())
        self.running: set[int] = set()  # the imports in progress
        # Those a fork already waited FORK_WAIT_S for: stuck (a wedged driver
        # under an import), so no later fork waits for them again.
        self.given_up: set[int] = set()

    def enter(self) -> int:
        with self.condition:
            token = next(_tokens)
            self.running.add(token)
            return token

    def exit(self, token: int) -> None:
        with self.condition:
            self.running.discard(token)
            self.given_up.discard(token)
            self.condition.notify_all()

    def waited_for(self) -> bool:
        """No import a fork should wait for is in progress (read under ``condition``)."""
        return not self.running - self.given_up


_imports = _BackgroundImports()


class _BackgroundImport:
    """One ``with forks.background_import():`` block."""

    def __init__(self) -> None:
        self.token = -1

    def __enter__(self) -> None:
        self.token = _imports.enter()

    def __exit__(self, *exc_info: object) -> None:
        _imports.exit(self.token)


def background_import() -> _BackgroundImport:
    """Hold while importing on a background thread: ``with forks.background_import(): import x``.
    A fork waits until every such import has finished, at most ``FORK_WAIT_S``
    for the same ones: one still running then is taken as stuck (a wedged
    driver under it), and later forks no longer wait for it."""
    return _BackgroundImport()


def _before_fork() -> None:
    # Held through the fork, so that no background import starts meanwhile.
    _imports.condition.acquire()
    if not _imports.condition.wait_for(_imports.waited_for, FORK_WAIT_S):
        stuck = _imports.running - _imports.given_up
        _imports.given_up |= stuck


def _after_in_parent() -> None:
    _imports.condition.release()


def _reinit() -> None:
    global _imports
    _imports = _BackgroundImports()  # the importing threads are the parent's


# Registered when this module loads, before any part registers its own hook
# (every part imports this module first): in a child, the hooks of the parts,
# which may start threads that import, run after this one made _imports anew.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_reinit)


# ------------------------------------------------------------ the end of a multiprocessing worker
#
# A multiprocessing worker started by fork or forkserver (Linux's default
# from Python 3.14) ends with os._exit(): no atexit hook runs. What runs is
# multiprocessing's own exit, from Process._bootstrap: its finalizers
# (util.Finalize), after it cleared those the worker inherited and called
# the functions registered with util.register_after_fork. A worker that its
# pool terminates (Pool.terminate(), the end of a ``with Pool()`` block,
# Process.terminate()) gets SIGTERM, whose default action ends it at once.
# SIGKILL (os._exit, the OOM killer) ends a process with nothing run at all.

_term_flushes: list[tuple[Callable[[], object], float]] = []
_exit = {"flushing": False}  # multiprocessing's exit (the main thread) runs the flushes


def _exiting(flush: Callable[[], object]) -> Callable[[], object]:
    def at_exit() -> object:
        _exit["flushing"] = True
        return flush()

    return at_exit


def at_worker_exit(owner: object, flush: Callable[[], object], timeout_s: float) -> None:
    """Call ``flush`` (which returns within ``timeout_s``) as this process ends,
    if it is or becomes a ``multiprocessing`` worker: from multiprocessing's
    finalizers when the worker returns, and from a SIGTERM handler when its
    pool terminates it (only where SIGTERM has its default action, which the
    handler then takes: the worker still ends by SIGTERM). Call it when
    ``owner`` is set up and in a forked child (after fork, the parent's
    finalizers are cleared). Without ``multiprocessing`` loaded it does
    nothing: the process is no worker, and a worker forked from it later
    calls it again."""
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return
    # Held weakly by what multiprocessing keeps for every process: an owner
    # shut down and gone is not kept alive by it (instrument() again, later).
    reference: Callable[[], Optional[Callable[[], object]]]
    if inspect.ismethod(flush):
        reference = weakref.WeakMethod(flush)
    else:

        def reference(flush: Callable[[], object] = flush) -> Optional[Callable[[], object]]:
            return flush

    def at_exit(owner: object) -> None:
        bound = reference()
        if bound is not None:
            mp_util.Finalize(owner, _exiting(bound), exitpriority=10)
            _flush_on_sigterm(bound, timeout_s)

    # A forked worker that has not begun its run yet: multiprocessing calls
    # this then, after it cleared the finalizers the worker inherited (so do
    # forkserver's workers; spawned ones clear nothing and call nothing).
    mp_util.register_after_fork(owner, at_exit)
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    if mp.parent_process() is not None or getattr(mp.current_process(), "_inheriting", False):
        # A worker already running (it set itself up: a pool's initializer, its
        # target), or a spawned or forkserver worker importing the parent's
        # __main__ (multiprocessing marks it inheriting meanwhile).
        at_exit(owner)


def _flush_on_sigterm(flush: Callable[[], object], timeout_s: float) -> None:
    if flush in (each for each, _ in _term_flushes):
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works on the main thread only; finalizers still flush a worker that returns
    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, _flush_then_end):
            return  # the application handles SIGTERM itself: its exit flushes
        signal.signal(signal.SIGTERM, _flush_then_end)
    except (ValueError, OSError):
        return
    _term_flushes.append((flush, timeout_s))


def _flush_then_end(signum: int, frame: object) -> None:
    """SIGTERM in a worker: flush (bounded), then end by SIGTERM, as without it."""
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM ends the worker at once
    if _exit["flushing"]:
        # It was already ending, flushing on the thread this handler interrupted:
        # waiting here would hold that flush up. It ends when the flush is done.
        return
    flushes = list(_term_flushes)

    def run() -> None:
        for flush, _ in flushes:
            try:
                flush()
            except Exception:
                pass  # ending anyway

    # On a thread of its own: the main thread was interrupted somewhere, maybe
    # holding a lock the flush needs; then the flush's time runs out instead.
    thread = threading.Thread(target=run, name="agent-otel-exit", daemon=True)
    thread.start()
    thread.join(sum(timeout for _, timeout in flushes) + 1.0)
    os.kill(os.getpid(), signum)
