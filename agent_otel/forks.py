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
