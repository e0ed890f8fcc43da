"""GPU samples -> idle windows, utilization segments and missing data.

Usage::

    from agent_otel.gpu.timeline import find_idle_windows, read_timeline
    windows = find_idle_windows(samples, threshold=0.10, min_idle_s=0.5)
    timeline = read_timeline(samples)   # windows, segments, missing seconds

An idle window is a maximal interval in which one GPU's utilization stays at
or below the threshold for at least the minimum idle time. The live path
feeds an ``IdleDetector`` as samples arrive; the offline report calls
``read_timeline``, which runs the same detector over a whole log, so both
find the same windows in the same samples.

How a sample maps to time
-------------------------
A sample's utilization covers the sample period that *ends* at its
timestamp (that is what NVML reports). So a sample covers the interval from
the previous sample of the same GPU to its own timestamp, ``(prev, t]``:
one ``UtilizationSegment``. Exceptions, all about not inventing data:

- The first sample of a GPU covers nothing before it: it only marks where
  coverage begins.
- A sample whose utilization is ``MISSING`` (NaN) says the stretch since
  the previous sample is missing data: the source knows it lost it (NVML's
  sample buffer overflowed). It is counted (``missing_s``), is neither idle
  nor busy, and ends an idle window open before it at its last idle
  sample; coverage starts afresh at the marker.
- A spacing longer than ``max_gap_s`` between two samples is missing data
  too, when nothing vouches for it (a log's gap). ``max_gap_s=None``: the
  source vouches for every gap itself (the NVML source turns the gaps its
  driver leaves while idle into idle samples and marks lost data).

What a gap between samples means depends on the source, and this module
holds the one rule for both readings: a spacing is a gap when it is longer
than ``GAP_TOLERANCE`` sample periods (``is_gap``). NVML's buffer runs dry
while the GPU idles, so the NVML source reads a gap in its own samples as
idle time (a 0% sample where the next sample's period began); an
``nvidia-smi`` log is written every interval whatever the GPU does, so a
gap in one is missing data (``find_idle_windows`` and ``read_timeline``
set ``max_gap_s`` from its median spacing, with the coarser tolerance its
whole-second timestamps need).

With samples every ``p`` seconds, a window's start and end are each within
one sample period ``p`` of the true moment the GPU went idle and busy again
(a period that was only partly idle is idle or busy by its average). A
window never reaches past its idle samples, but whether a stretch lasts the
minimum idle time counts the idle parts of the busy samples on either side
too, ``(1 - utilization)`` of their periods: a 0.6 s stall holds only two or
three whole periods of 1/6 s, and is still a stall of 0.6 s. A busy sample
between two idle stretches counts for the one before it.
Samples that are not later than the previous sample of their GPU are
dropped: per GPU, time only moves forward.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Optional

from agent_otel.config import DEFAULTS, check
from agent_otel.records import MISSING, NS_PER_S, GpuSample, IdleWindow, UtilizationSegment

# The gap limit for sources that do not vouch for their gaps (a replayed
# log, a simulated GPU): a spacing longer than this is missing data.
DEFAULT_MAX_GAP_S = 3.0
# find_idle_windows widens the gap limit to this many median sample spacings,
# so a log recorded at a slow rate (``dmon -d 5``) is not all gaps, and a
# whole-second timestamp that rounds a 1 s spacing up to 2 s is not one.
GAP_SPACINGS = 3
# A source that samples on a fixed period (NVML's driver) has left a gap
# when two consecutive samples are further apart than this many periods:
# one missing sample makes the spacing 2 periods, the next sample on time
# 1 period, and 1.5 tolerates timing jitter of up to half a period either way.
GAP_TOLERANCE = 1.5


def is_gap(spacing_ns: int, period_ns: int, tolerance: float = GAP_TOLERANCE) -> bool:
    """Whether two samples ``spacing_ns`` apart leave a gap, for a source
    that samples every ``period_ns``."""
    return spacing_ns > tolerance * period_ns


def is_missing(utilization: float) -> bool:
    """True for ``MISSING`` (NaN): the utilization of that stretch is unknown."""
    return utilization != utilization


class TimelineStep(NamedTuple):
    """What one batch of samples changed: the idle windows it closed, and
    the stretches it covered (utilization ``MISSING`` where data was lost)."""

    windows: list[IdleWindow]
    segments: list[UtilizationSegment]


class _IdleRun:
    """The idle stretch in progress on one GPU."""

    __slots__ = ("start_ns", "end_ns", "weighted_sum", "first_value", "edges_ns")

    def __init__(self, start_ns: int, end_ns: int, weighted_sum: float, first_value: float, lead_ns: int = 0):
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.weighted_sum = weighted_sum  # utilization x covered ns
        self.first_value = first_value  # the average if the run covers no time
        # The idle parts of the busy samples on either side: they count
        # towards the minimum idle time, not into the window.
        self.edges_ns = lead_ns


class _GpuState:
    __slots__ = ("last_ns", "spare_ns", "run", "missing_ns")

    def __init__(self) -> None:
        self.last_ns: Optional[int] = None
        # The idle part of the newest sample, when it was busy and did not
        # end a run: it counts towards the length of a run that starts next.
        self.spare_ns = 0
        self.run: Optional[_IdleRun] = None
        self.missing_ns = 0


class IdleDetector:
    """Turns a stream of samples into idle windows, incrementally.

    ``feed`` returns the windows that closed with those samples (``step``
    also returns the stretches they covered); ``flush`` closes the ones
    still open (at shutdown, or at the end of a log). ``open_window`` shows
    a window while it is still open. Not thread-safe: feed it from one
    thread (the sampler's callback).

    ``max_gap_s``: a spacing longer than this between two samples of a GPU
    is missing data; None when the source vouches for its gaps (see the
    module docstring). ``pool``: the GPU pool the windows and segments
    belong to (``IdleWindow.pool``).
    """

    def __init__(
        self,
        threshold: float = DEFAULTS.gpu_idle_threshold,
        min_idle_s: float = DEFAULTS.gpu_min_idle,
        *,
        max_gap_s: Optional[float] = DEFAULT_MAX_GAP_S,
        uuids: Optional[dict[str, str]] = None,
        pool: str = "",
    ):
        # The bounds of the gpu_idle_threshold and gpu_min_idle settings (agent_otel.config).
        check("gpu_idle_threshold", threshold, "idle threshold")
        check("gpu_min_idle", min_idle_s, "min_idle_s")
        if max_gap_s is not None and not max_gap_s > 0:
            raise ValueError(f"max_gap_s must be > 0 (or None), got {max_gap_s!r}")
        self.threshold = threshold
        self.min_idle_ns = round(min_idle_s * NS_PER_S)
        self.max_gap_ns = None if max_gap_s is None else round(max_gap_s * NS_PER_S)
        self.uuids = dict(uuids or {})
        self.pool = pool  # the GPU pool the windows and segments belong to ("" for none)
        self._gpus: dict[str, _GpuState] = {}

    def feed(self, samples: Iterable[GpuSample]) -> list[IdleWindow]:
        """Add samples (any GPUs, time order per GPU); return closed windows."""
        return self.step(samples).windows

    def step(self, samples: Iterable[GpuSample]) -> TimelineStep:
        """Add samples; return the windows they closed and the stretches they covered."""
        closed: list[IdleWindow] = []
        segments: list[UtilizationSegment] = []
        for sample in sorted(samples, key=lambda s: s.timestamp_ns):
            state = self._gpus.get(sample.gpu)
            if state is None:
                state = self._gpus[sample.gpu] = _GpuState()
            self._add(sample, state, closed, segments)
        return TimelineStep(closed, segments)

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

    def open_window(self, gpu: str) -> Optional[tuple[int, int]]:
        """``(start_ns, end_ns)`` of the idle window still open on ``gpu``:
        the stretch in progress, up to its newest idle sample, once it lasts
        ``min_idle_s``; None before that or when there is none."""
        state = self._gpus.get(gpu)
        run = state.run if state is not None else None
        if run is None or not self._counts(run):
            return None
        return run.start_ns, run.end_ns

    def gpus(self) -> list[str]:
        """The GPUs seen so far."""
        return list(self._gpus)

    def covered_to(self, gpu: str) -> Optional[int]:
        """Timestamp of ``gpu``'s newest sample: the next one covers the time after it."""
        state = self._gpus.get(gpu)
        return state.last_ns if state is not None else None

    @property
    def missing_s(self) -> dict[str, float]:
        """Seconds of missing data per GPU so far (marked lost, or gaps over ``max_gap_s``)."""
        return {gpu: state.missing_ns / NS_PER_S for gpu, state in self._gpus.items() if state.missing_ns}

    def _add(
        self, sample: GpuSample, state: _GpuState, closed: list[IdleWindow], segments: list[UtilizationSegment]
    ) -> None:
        t = sample.timestamp_ns
        if state.last_ns is not None and t <= state.last_ns:
            return
        covered_from = state.last_ns
        state.last_ns = t
        utilization = sample.utilization
        missing = is_missing(utilization)
        if covered_from is not None and (
            missing or (self.max_gap_ns is not None and t - covered_from > self.max_gap_ns)
        ):
            # Missing data: neither idle nor busy. An open window ends at its
            # last evidence of idleness; coverage starts afresh at t.
            state.missing_ns += t - covered_from
            segments.append(UtilizationSegment(sample.gpu, covered_from, t, MISSING, self.pool))
            covered_from = None
            if state.run is not None:
                self._emit(sample.gpu, state.run, closed)
                state.run = None
        if missing:
            state.spare_ns = 0
            return  # a marker: it carries no reading of its own
        if covered_from is not None:
            segments.append(UtilizationSegment(sample.gpu, covered_from, t, utilization, self.pool))
        run = state.run
        spare, state.spare_ns = state.spare_ns, 0
        if utilization <= self.threshold:
            if run is None:
                start = t if covered_from is None else covered_from
                state.run = _IdleRun(start, t, utilization * (t - start), utilization, spare)
            else:
                run.weighted_sum += utilization * (t - covered_from)  # type: ignore[operator]  # set: run open
                run.end_ns = t
        elif covered_from is not None:
            idle_part = round((1.0 - utilization) * (t - covered_from))
            if run is not None:
                # This busy sample covers (covered_from, t]: the GPU was idle up to covered_from.
                run.edges_ns += idle_part
                self._emit(sample.gpu, run, closed)
                state.run = None
            else:
                state.spare_ns = idle_part

    def _counts(self, run: _IdleRun) -> bool:
        """Whether a stretch is long enough to be a window: its idle samples'
        time, plus the idle parts of the busy samples next to it."""
        duration = run.end_ns - run.start_ns
        return duration > 0 and duration + run.edges_ns >= self.min_idle_ns

    def _emit(self, gpu: str, run: _IdleRun, closed: list[IdleWindow]) -> None:
        duration = run.end_ns - run.start_ns
        if not self._counts(run):
            return
        closed.append(
            IdleWindow(
                gpu=gpu,
                start_ns=run.start_ns,
                end_ns=run.end_ns,
                utilization_avg=run.weighted_sum / duration,
                uuid=self.uuids.get(gpu),
                pool=self.pool,
            )
        )


@dataclass
class Timeline:
    """A finished set of samples read as a whole: idle windows sorted by
    start, every covered stretch (``MISSING`` where data was lost) in time
    order per GPU, and the seconds of missing data per GPU."""

    windows: list[IdleWindow] = field(default_factory=list)
    segments: list[UtilizationSegment] = field(default_factory=list)
    missing_s: dict[str, float] = field(default_factory=dict)


def read_timeline(
    samples: Iterable[GpuSample],
    *,
    threshold: float = DEFAULTS.gpu_idle_threshold,
    min_idle_s: float = DEFAULTS.gpu_min_idle,
    uuids: Optional[dict[str, str]] = None,
    max_gap_s: Optional[float] = None,
    end_ns: Optional[int] = None,
) -> Timeline:
    """Run the idle detector over a finished set of samples (a log).

    ``max_gap_s`` defaults to the larger of ``DEFAULT_MAX_GAP_S`` and
    ``GAP_SPACINGS`` median sample spacings: a log is written every
    interval whatever the GPU does, so a longer gap in it is missing data.
    ``end_ns`` is passed to ``IdleDetector.flush``.
    """
    ordered = sorted(samples, key=lambda s: s.timestamp_ns)
    if max_gap_s is None:
        max_gap_s = max(DEFAULT_MAX_GAP_S, GAP_SPACINGS * median_spacing_s(ordered))
    detector = IdleDetector(threshold, min_idle_s, max_gap_s=max_gap_s, uuids=uuids)
    step = detector.step(ordered)
    windows = step.windows + detector.flush(end_ns)
    windows.sort(key=lambda w: (w.start_ns, w.gpu))
    return Timeline(windows, step.segments, detector.missing_s)


def find_idle_windows(
    samples: Iterable[GpuSample],
    *,
    threshold: float = DEFAULTS.gpu_idle_threshold,
    min_idle_s: float = DEFAULTS.gpu_min_idle,
    uuids: Optional[dict[str, str]] = None,
    max_gap_s: Optional[float] = None,
    end_ns: Optional[int] = None,
) -> list[IdleWindow]:
    """All idle windows in a finished set of samples, sorted by start
    (``read_timeline``'s windows; same parameters)."""
    return read_timeline(
        samples, threshold=threshold, min_idle_s=min_idle_s, uuids=uuids, max_gap_s=max_gap_s, end_ns=end_ns
    ).windows


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
