"""One line, not a flood: how the toolkit says that something degraded.

An exporter that cannot reach its endpoint fails on every batch; a full
disk fails on every write. Each distinct problem is logged once, when it
first happens; if it goes on, at most one more line a minute says how many
times it happened since. The lines go to the ``agent_otel`` loggers at
WARNING, so with no logging configured Python prints just the message on
stderr, and an application that configures logging routes them as usual.

Usage::

    problems = Problems(logging.getLogger("agent_otel.export"))
    problems.report(("otlp", "UNAVAILABLE"), "agent-otel: exporting spans to %s failed: %s", sink, detail)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Hashable

from agent_otel.support import forks

REPEAT_INTERVAL_S = 60.0
# Distinct problems remembered; past this, new ones share one key (and one line a minute).
MAX_KEYS = 256


class Problems:
    """Logs each distinct problem once, then at most once per ``interval_s`` with a count."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ):
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        # key -> [when last logged, times since then]
        self._seen: dict[Hashable, list] = {}
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def report(self, key: Hashable, message: str, *args: object, count: int = 1) -> bool:
        """Note ``count`` occurrences of ``key``; log ``message % args`` if it is due (the repeat line
        counts occurrences). Returns whether it logged."""
        now = self._clock()
        with self._lock:
            state = self._seen.get(key)
            if state is None:
                if len(self._seen) >= MAX_KEYS:
                    key = ("too many kinds of problem",)
                    state = self._seen.get(key)
                if state is None:
                    self._seen[key] = [now, 0]  # the line about to be logged covers these
                    repeats = -1
            if state is not None:
                state[1] += count
                if now - state[0] < self._interval_s:
                    return False
                repeats, since = state[1], now - state[0]
                state[0], state[1] = now, 0
        if repeats < 0:
            self._logger.warning(message, *args)
        else:
            self._logger.warning(message + " (%d times in the last %.0f s)", *args, repeats, since)
        return True

    def reinit_after_fork(self) -> None:
        # The child reports its own problems, starting afresh.
        self._lock = threading.Lock()
        self._seen = {}
