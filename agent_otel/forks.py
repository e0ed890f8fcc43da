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
import logging
import os
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


class _BackgroundImports:
    def __init__(self) -> None:
        self.condition = threading.Condition(threading.Lock())
        self.count = 0  # imports in progress
        self.hooked = False

    def __enter__(self) -> None:
        with self.condition:
            self.count += 1
            if not self.hooked and hasattr(os, "register_at_fork"):
                self.hooked = True
                os.register_at_fork(before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_reinit)

    def __exit__(self, *exc_info: object) -> None:
        with self.condition:
            self.count -= 1
            self.condition.notify_all()


_imports = _BackgroundImports()


def background_import() -> _BackgroundImports:
    """Hold while importing on a background thread: ``with forks.background_import(): import x``.
    A fork waits until every such import has finished."""
    return _imports


def _before_fork() -> None:
    # Held through the fork, so that no background import starts meanwhile.
    _imports.condition.acquire()
    _imports.condition.wait_for(lambda: _imports.count == 0, FORK_WAIT_S)


def _after_in_parent() -> None:
    _imports.condition.release()


def _reinit() -> None:
    global _imports
    hooked = _imports.hooked
    _imports = _BackgroundImports()  # the importing threads are the parent's
    _imports.hooked = hooked
