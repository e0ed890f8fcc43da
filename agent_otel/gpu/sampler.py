"""The background thread that polls a GPU source.

Usage::

    from agent_otel.gpu.sampler import GpuSampler
    sampler = GpuSampler(source, interval_s=0.5, on_samples=detector_feed)
    sampler.start()
    ...
    sampler.shutdown(timeout_s=2.0)

One named daemon thread ("agent-otel-gpu-sampler") polls the source every
``interval_s`` on a fixed schedule and hands each non-empty batch to
``on_samples``, on that same thread, then calls ``after_poll``. Nothing it
does raises into the application: an exception from the source or the
callback is logged once per kind on ``agent_otel.gpu``, counted, and the
loop carries on.

A poll that does not return (a wedged driver) holds only this thread:
``states()`` shows every GPU of the source ``stuck`` once a poll has run
for ``STUCK_POLLS`` intervals (at least ``STUCK_MIN_S``), with the call it
is stuck in, and ``check_stuck()`` says so in one log line (and another
when it returns).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Optional

from agent_otel.support import forks
from agent_otel.config import check
from agent_otel.records import GpuSample
from agent_otel.semconv import GPU_STATE_OK, GPU_STATE_STUCK

log = logging.getLogger("agent_otel.gpu")

THREAD_NAME = "agent-otel-gpu-sampler"
# A poll (or the hand-off of its samples) running this many poll intervals,
# and at least STUCK_MIN_S, is stuck.
STUCK_POLLS = 4
STUCK_MIN_S = 1.0


class GpuSampler:
    """Polls ``source`` on a daemon thread; see the module docstring.

    ``polls`` and ``samples`` count what happened; ``errors`` counts the
    sampler's own failures by kind (``poll:<Exception>`` and
    ``callback:<Exception>``). ``stats()`` adds the source's ``errors``.
    """

    def __init__(
        self,
        source,
        interval_s: float,
        on_samples: Callable[[list[GpuSample]], None],
        after_poll: Optional[Callable[[], None]] = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        check("gpu_poll_interval", interval_s, "interval_s")
        self.source = source
        self.interval_s = interval_s
        self.on_samples = on_samples
        self.after_poll = after_poll
        self.stuck_after_s = max(STUCK_POLLS * interval_s, STUCK_MIN_S)
        self._clock = clock
        # When the poll in progress began (clock), and which step it is in; None between polls.
        self._busy_since: Optional[float] = None
        self._busy_in = "poll"
        self._said_stuck = False
        self.polls = 0
        self.samples = 0
        self.errors: collections.Counter = collections.Counter()
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._started = False
        forks.after_fork_in_child(self.reinit_after_fork)

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def reinit_after_fork(self) -> None:
        """In a forked child: poll again, on a thread of its own, if the parent was polling."""
        running = self._started and not self._stop.is_set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._started = False
        self._busy_since = None  # a poll of the parent's thread: not this process's
        self._said_stuck = False
        if running:
            self.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """Stop polling (after one last poll) and close the source.

        Returns within ``timeout_s``: True if the thread stopped. If a poll
        is stuck in the driver the daemon thread is left behind, the source
        is left open (closing it under a running poll is unsafe), and the
        process can still exit.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():  # the caller says so (instrument()'s shutdown names it)
            return False
        try:
            self.source.close()
        except Exception as exc:
            self._count("close", exc)
        return True

    def stats(self) -> dict:
        """A snapshot: polls, samples, and errors by kind (sampler and source)."""
        errors = collections.Counter(dict(self.errors))
        errors.update(dict(getattr(self.source, "errors", {})))
        return {"polls": self.polls, "samples": self.samples, "errors": dict(errors)}

    def _run(self) -> None:
        next_poll = time.monotonic()
        while True:
            self._poll_once()
            if self._stop.is_set():
                return
            next_poll += self.interval_s
            now = time.monotonic()
            if next_poll < now:  # fell behind (stalled process): skip, don't burst
                next_poll = now + self.interval_s
            if self._stop.wait(next_poll - now):
                self._poll_once()  # the last samples before shutdown
                return

    def states(self) -> dict[str, tuple[str, str]]:
        """Each GPU's sampling state now, by index: ``(state, reason)``, one of
        ``semconv.GPU_STATES``: the source's own (``NvmlSource.states``; ``ok``
        for a source without), or ``stuck`` for all while a poll is stuck,
        with the call it is stuck in."""
        own = getattr(self.source, "states", None)
        states = dict(own()) if own is not None else {}
        for device in self.source.devices():
            states.setdefault(device.index, (GPU_STATE_OK, ""))
        stuck = self.stuck_in()
        if stuck is not None:
            states = dict.fromkeys(states, (GPU_STATE_STUCK, stuck))
        return states

    def stuck_in(self) -> Optional[str]:
        """What the poll in progress is stuck in (the NVML call, or ``poll`` or
        ``callback``), once it has run ``stuck_after_s``; None when not stuck."""
        since = self._busy_since
        if since is None or self._clock() - since < self.stuck_after_s:
            return None
        if self._busy_in == "poll":
            return getattr(self.source, "calling", None) or "poll"
        return self._busy_in

    def check_stuck(self) -> None:
        """Log one line when a poll has been stuck ``stuck_after_s`` (called
        from another thread: the pipeline's, a scrape's)."""
        stuck = self.stuck_in()
        if stuck is not None and not self._said_stuck:
            self._said_stuck = True
            log.warning(
                "GPU sampler: a poll has not returned for %.1f s (stuck in %s; a wedged GPU driver?); "
                "the GPUs show as stuck in agent_otel_gpu_state until it returns",
                self.stuck_after_s,
                stuck,
            )

    def _poll_once(self) -> None:
        """One poll and hand-off; never raises. The thread's loop body."""
        self._busy_in = "poll"
        self._busy_since = started = self._clock()
        try:
            self._poll_and_hand_off()
        finally:
            self._busy_since = None
            if self._said_stuck:
                self._said_stuck = False
                log.warning("GPU sampler: the stuck poll returned after %.1f s", self._clock() - started)

    def _poll_and_hand_off(self) -> None:
        try:
            batch = self.source.poll()
        except Exception as exc:
            self._count("poll", exc)
            batch = []
        finally:
            self.polls += 1
        self._busy_in = "callback"
        if batch:
            self.samples += len(batch)
            try:
                self.on_samples(batch)
            except Exception as exc:
                self._count("callback", exc)
        if self.after_poll is not None:
            try:
                self.after_poll()
            except Exception as exc:
                self._count("callback", exc)

    def _count(self, where: str, exc: Exception) -> None:
        kind = f"{where}:{type(exc).__name__}"
        self.errors[kind] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("GPU sampler: %s raised %r (logged once; counted as %s)", where, exc, kind)
