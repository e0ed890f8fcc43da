"""GPU samples -> idle windows.

Usage::

    from agent_otel.gpu.timeline import find_idle_windows
    windows = find_idle_windows(samples, threshold=0.10, min_idle_s=0.5)

An idle window is a maximal interval in which one GPU's utilization stays at
or below the threshold for at least the minimum idle time. The live path
feeds an ``IdleDetector`` as samples arrive; the offline report calls
``find_idle_windows``, which runs the same detector over a whole log, so both
find the same windows in the same samples.

How a sample maps to time
-------------------------
A sample's utilization covers the sample period that *ends* at its
timestamp (that is what NVML reports). So a sample covers the interval from
the previous sample of the same GPU to its own timestamp, ``(prev, t]``.
Two exceptions, both about not inventing data:

- The first sample of a GPU covers nothing before it: it only marks where
  coverage begins.
- After a gap (more than ``max_gap_s`` since the previous sample of that
  GPU) the next sample starts coverage afresh, like a first sample. An idle
  window open before the gap ends at the last idle sample before it.

With samples every ``p`` seconds, a window's start and end are each within
one sample period ``p`` of the true moment the GPU went idle and busy again
(a period that was only partly idle is idle or busy by its average).
Samples that are not later than the previous sample of their GPU are
dropped: per GPU, time only moves forward.
"""

from __future__ import annotations

import statistics
from typing import Iterable, Optional

from agent_otel.config import DEFAULTS, check
from agent_otel.records import NS_PER_S, GpuSample, IdleWindow

# Larger than the longest spacing the live NVML source produces with its
# defaults (1 s of silence before it reports idle, plus a 0.5 s poll).
DEFAULT_MAX_GAP_S = 3.0
# find_idle_windows widens the gap limit to this many median sample spacings,
# so a log recorded at a slow rate (``dmon -d 5``) is not all gaps.
GAP_SPACINGS = 3


class _IdleRun:
    """The idle stretch in progress on one GPU."""

    __slots__ = ("start_ns", "end_ns", "weighted_sum", "first_value")

    def __init__(self, start_ns: int, end_ns: int, weighted_sum: float, first_value: float):
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.weighted_sum = weighted_sum  # utilization x covered ns
        self.first_value = first_value  # the average if the run covers no time


class _GpuState:
    __slots__ = ("last_ns", "run")

    def __init__(self) -> None:
        self.last_ns: Optional[int] = None
        self.run: Optional[_IdleRun] = None


class IdleDetector:
    """Turns a stream of samples into idle windows, incrementally.

    ``feed`` returns the windows that closed with those samples; ``flush``
    closes the ones still open (at shutdown, or at the end of a log). Not
    thread-safe: feed it from one thread (the sampler's callback).
    """

    def __init__(
        self,
        threshold: float = DEFAULTS.gpu_idle_threshold,
        min_idle_s: float = DEFAULTS.gpu_min_idle,
        *,
        max_gap_s: float = DEFAULT_MAX_GAP_S,
        uuids: Optional[dict[str, str]] = None,
    ):
        # The bounds of the gpu_idle_threshold and gpu_min_idle settings (agent_otel.config).
        check("gpu_idle_threshold", threshold, "idle threshold")
        check("gpu_min_idle", min_idle_s, "min_idle_s")
        if not max_gap_s > 0:
            raise ValueError(f"max_gap_s must be > 0, got {max_gap_s!r}")
        self.threshold = threshold
        self.min_idle_ns = round(min_idle_s * NS_PER_S)
        self.max_gap_ns = round(max_gap_s * NS_PER_S)
        self.uuids = dict(uuids or {})
        self._gpus: dict[str, _GpuState] = {}

    def feed(self, samples: Iterable[GpuSample]) -> list[IdleWindow]:
        """Add samples (any GPUs, time order per GPU); return closed windows."""
        closed: list[IdleWindow] = []
        for sample in sorted(samples, key=lambda s: s.timestamp_ns):
            state = self._gpus.get(sample.gpu)
            if state is None:
                state = self._gpus[sample.gpu] = _GpuState()
            self._add(sample, state, closed)
        return closed

    def flush(self, end_ns: Optional[int] = None) -> list[IdleWindow]:
        """Close every open idle stretch; return those long enough to count.

        A stretch ends at its last idle sample: nothing is extrapolated past
        the evidence. ``end_ns`` is the end of observation (shutdown, or the
        end of a report's window): stretches are cut there if they reach
        past it.
        """
        closed: list[IdleWindow] = []
        for gpu, state in self._gpus.items():
            run = state.run
            state.run = None
            if run is None:
                continue
            if end_ns is not None and run.end_ns > end_ns:
                if end_ns <= run.start_ns:
                    continue
                # The clipped part is still idle; the average is kept as is.
                run.weighted_sum *= (end_ns - run.start_ns) / (run.end_ns - run.start_ns)
                run.end_ns = end_ns
            self._emit(gpu, run, closed)
        return closed

    def open_since(self, gpu: str) -> Optional[int]:
        """Start (epoch ns) of the idle stretch in progress on ``gpu``, if any.

        The stretch becomes a window once it lasts ``min_idle_s``; None when
        the GPU's latest sample was busy or nothing is known about it.
        """
        state = self._gpus.get(gpu)
        if state is None or state.run is None:
            return None
        return state.run.start_ns

    def _add(self, sample: GpuSample, state: _GpuState, closed: list[IdleWindow]) -> None:
        t = sample.timestamp_ns
        if state.last_ns is not None and t <= state.last_ns:
            return
        covered_from = state.last_ns
        if covered_from is not None and t - covered_from > self.max_gap_ns:
            covered_from = None
        state.last_ns = t
        run = state.run
        if run is not None and covered_from is None:
            # Gap: the window ends at the last evidence of idleness.
            self._emit(sample.gpu, run, closed)
            run = state.run = None
        if sample.utilization <= self.threshold:
            if run is None:
                start = t if covered_from is None else covered_from
                state.run = _IdleRun(start, t, sample.utilization * (t - start), sample.utilization)
            else:
                run.weighted_sum += sample.utilization * (t - covered_from)
                run.end_ns = t
        elif run is not None:
            # This busy sample covers (covered_from, t]: the GPU was idle up to covered_from.
            self._emit(sample.gpu, run, closed)
            state.run = None

    def _emit(self, gpu: str, run: _IdleRun, closed: list[IdleWindow]) -> None:
        duration = run.end_ns - run.start_ns
        if duration <= 0 or duration < self.min_idle_ns:
            return
        closed.append(
            IdleWindow(
                gpu=gpu,
                start_ns=run.start_ns,
                end_ns=run.end_ns,
                utilization_avg=run.weighted_sum / duration,
                uuid=self.uuids.get(gpu),
            )
        )


def find_idle_windows(
    samples: Iterable[GpuSample],
    *,
    threshold: float = DEFAULTS.gpu_idle_threshold,
    min_idle_s: float = DEFAULTS.gpu_min_idle,
    uuids: Optional[dict[str, str]] = None,
    max_gap_s: Optional[float] = None,
    end_ns: Optional[int] = None,
) -> list[IdleWindow]:
    """All idle windows in a finished set of samples, sorted by start.

    ``max_gap_s`` defaults to the larger of ``DEFAULT_MAX_GAP_S`` and three
    median sample spacings, so slow logs are not read as all gaps.
    ``end_ns`` is passed to ``IdleDetector.flush``.
    """
    ordered = sorted(samples, key=lambda s: s.timestamp_ns)
    if max_gap_s is None:
        max_gap_s = max(DEFAULT_MAX_GAP_S, GAP_SPACINGS * median_spacing_s(ordered))
    detector = IdleDetector(threshold, min_idle_s, max_gap_s=max_gap_s, uuids=uuids)
    windows = detector.feed(ordered)
    windows.extend(detector.flush(end_ns))
    windows.sort(key=lambda w: (w.start_ns, w.gpu))
    return windows


def median_spacing_s(samples: Iterable[GpuSample]) -> float:
    """Median time between consecutive samples of the same GPU (0 if none)."""
    last: dict[str, int] = {}
    spacings: list[int] = []
    for sample in sorted(samples, key=lambda s: s.timestamp_ns):
        previous = last.get(sample.gpu)
        if previous is not None and sample.timestamp_ns > previous:
            spacings.append(sample.timestamp_ns - previous)
        last[sample.gpu] = sample.timestamp_ns
    return statistics.median(spacings) / NS_PER_S if spacings else 0.0
