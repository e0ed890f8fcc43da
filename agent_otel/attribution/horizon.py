"""The recent finished tool calls the live path attributes GPU time to.

GPU time is only known once the samples covering it have arrived, a little
after the calls that were in flight then have finished, so the live engine
keeps the finished calls it may still ask for, and asks for the ones that
overlap each new stretch. Memory stays bounded twice over: by time, and
past ``max_calls`` the oldest are dropped (and counted in ``dropped``).

By time: the engine says, after each batch, from when on it may still ask
(``keep_from``: the part of an open idle window not yet blamed, the
stretch the next sample of each GPU covers, at most ``horizon_s`` behind
the newest sample); calls ending after that stay however old they are,
and the others, blamed already, go. Until the engine has said (and for a
horizon used on its own) calls that ended more than ``horizon_s`` before
the newest end seen go. So a window longer than the horizon is blamed like
a short one; only a burst of more than ``max_calls`` calls loses its
oldest calls (their time then shows as unattributed), and ``dropped``
counts only those: calls not yet blamed in full.

Calls still in flight are not stored here; the live loop passes them to
``attribute`` separately.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from operator import attrgetter
from typing import Iterable

from agent_otel.support import forks
from agent_otel.errors import ConfigError
from agent_otel.records import NS_PER_S, ToolCall

_END = attrgetter("end_ns")


class CallHorizon:
    """A thread-safe, bounded store of finished tool calls, ordered by end."""

    def __init__(self, horizon_s: float, max_calls: int):
        if not horizon_s > 0:
            raise ConfigError("horizon_s", horizon_s, "a number of seconds > 0")
        if max_calls < 1:
            raise ConfigError("max_calls", max_calls, "an integer >= 1")
        self.horizon_ns = int(horizon_s * NS_PER_S)
        self.max_calls = max_calls
        self._lock = threading.Lock()
        # Two parallel lists sorted by end, so a query is one binary search
        # and pruning is one slice deletion. Calls arrive roughly in end
        # order, so keeping them sorted costs little.
        self._ends: list[int] = []
        self._calls: list[ToolCall] = []
        self._newest_ns = 0
        self._keep_from_ns: int | None = None
        self._dropped = 0
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the calls kept are the parent's, blamed by the parent."""
        self._lock = threading.Lock()
        self._ends, self._calls = [], []

    def add(self, call: ToolCall) -> None:
        self.add_many((call,))

    def add_many(self, calls: Iterable[ToolCall]) -> None:
        """Store finished calls; a call still in flight is a ValueError."""
        batch = sorted(calls, key=_END)  # stable: calls ending together keep their order
        if batch and not batch[0].end_ns:
            raise ValueError(f"call {batch[0].tool!r} is still in flight; pass it to attribute() directly")
        with self._lock:
            if batch:
                ends, stored = self._ends, self._calls
                batch_ends = list(map(_END, batch))
                # Calls mostly finish in order: those ending at or after the
                # newest stored end are appended in one go, the others inserted.
                first = bisect_left(batch_ends, ends[-1]) if ends else 0
                for call, end in zip(batch[:first], batch_ends):
                    position = bisect_right(ends, end)
                    ends.insert(position, end)
                    stored.insert(position, call)
                ends += batch_ends[first:]
                stored += batch[first:]
                self._newest_ns = max(self._newest_ns, ends[-1])
            self._prune()

    def overlapping(self, start_ns: int, end_ns: int) -> list[ToolCall]:
        """The stored calls in flight at some instant of [start_ns, end_ns)."""
        with self._lock:
            first = bisect_right(self._ends, start_ns)
            return [call for call in self._calls[first:] if call.submit_ns < end_ns and call.submit_ns < call.end_ns]

    def keep_from(self, ns: int | None) -> None:
        """Keep the calls that end after ``ns`` whatever their age, and no
        others: nothing before ``ns`` will be asked for (None: keep the calls
        of the last ``horizon_s``)."""
        with self._lock:
            self._keep_from_ns = ns
            self._prune()

    @property
    def dropped(self) -> int:
        """How many calls were dropped to stay within ``max_calls`` (calls not yet blamed in full)."""
        with self._lock:
            return self._dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def _prune(self) -> None:
        cutoff = self._newest_ns - self.horizon_ns if self._keep_from_ns is None else self._keep_from_ns
        expired = bisect_left(self._ends, cutoff)
        excess = len(self._calls) - expired - self.max_calls
        if excess > 0:
            self._dropped += excess
            expired += excess
        del self._ends[:expired]
        del self._calls[:expired]
