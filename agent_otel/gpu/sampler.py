"""The background thread that polls a GPU source.

Usage::

    from agent_otel.gpu.sampler import GpuSampler
    sampler = GpuSampler(source, interval_s=0.5, on_samples=detector_feed)
    sampler.start()
    ...
    sampler.shutdown(timeout_s=2.0)

One named daemon thread ("agent-otel-gpu-sampler") polls the source every
``interval_s`` on a fixed schedule and hands each non-empty batch to
``on_samples``, on that same thread. Nothing it does raises into the
application: an exception from the source or the callback is logged once
per kind on ``agent_otel.gpu``, counted, and the loop carries on.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from agent_otel import forks
from agent_otel.config import check
from agent_otel.records import GpuSample

log = logging.getLogger("agent_otel.gpu")

THREAD_NAME = "agent-otel-gpu-sampler"


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
    ):
        check("gpu_poll_interval", interval_s, "interval_s")
        self.source = source
        self.interval_s = interval_s
        self.on_samples = on_samples
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

    def _poll_once(self) -> None:
        """One poll and hand-off; never raises. The thread's loop body."""
        try:
            batch = self.source.poll()
        except Exception as exc:
            self._count("poll", exc)
            return
        finally:
            self.polls += 1
        if not batch:
            return
        self.samples += len(batch)
        try:
            self.on_samples(batch)
        except Exception as exc:
            self._count("callback", exc)

    def _count(self, where: str, exc: Exception) -> None:
        kind = f"{where}:{type(exc).__name__}"
        self.errors[kind] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("GPU sampler: %s raised %r (logged once; counted as %s)", where, exc, kind)
