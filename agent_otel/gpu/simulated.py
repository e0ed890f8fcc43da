"""A simulated GPU, for the demo and for tests on machines without a GPU.

Usage::

    from agent_otel.gpu.simulated import SimulatedGpu
    gpu = SimulatedGpu()                     # driven: idle until told otherwise
    with gpu.busy():                         # a fake model call keeps it busy
        time.sleep(0.3)
    gpu.run_kernel(0.3)                      # the same, in one call

    scripted = SimulatedGpu([(2.0, 0.95), (1.5, 0.0), (2.0, 0.9)])

It is named simulated wherever it shows (device name "Simulated GPU", UUID
"GPU-simulated-0", source kind "simulated"), so its numbers are never
mistaken for a real GPU's. It samples like NVML: one sample per sample
period, each the average utilization over the period ending at its
timestamp, from the history of its state, on the process's timeline
(``agent_otel.support.clock``), the tool calls' (NVML stamps with the wall clock,
which the NVML source maps onto it). Unlike NVML it keeps sampling while
idle (0% samples). Scripted phases start when the source is created;
after the last one the GPU is idle. Driven busy time adds on top: the
utilization at any instant is the larger of the two.

With ``instrument(gpu="simulated")`` the model calls drive it: every
device is busy while a model call agent-otel records in the process is in
flight (``model_span``, the framework hooks' model spans, other
instrumentations' model spans), through ``model_call`` (docs/gpu.md).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

from agent_otel.support import forks
from agent_otel.support.clock import now_ns
from agent_otel.records import NS_PER_S, GpuSample
from agent_otel.semconv import GPU_SOURCE_SIMULATED, SIMULATED_GPU_NAME, SIMULATED_GPU_UUID_PREFIX

from agent_otel.gpu.device import GpuDevice

DEFAULT_SAMPLE_PERIOD_S = 1 / 6  # NVML's shortest sample period


class _Steps:
    """A step function of time: ``value_at(t)`` is the value of the last
    change at or before ``t`` (0 before the first)."""

    def __init__(self, changes: Sequence[tuple[int, float]] = ()):
        self.times = [t for t, _ in changes]
        self.values = [v for _, v in changes]

    def set(self, t: int, value: float) -> None:
        self.times.append(t)
        self.values.append(value)

    def value_at(self, t: int) -> float:
        i = bisect.bisect_right(self.times, t)
        return self.values[i - 1] if i else 0.0

    def changes_within(self, start: int, end: int) -> list[int]:
        return self.times[bisect.bisect_right(self.times, start) : bisect.bisect_left(self.times, end)]

    def forget_before(self, t: int) -> None:
        """Drop changes that no longer matter for times >= t."""
        keep_from = max(bisect.bisect_right(self.times, t) - 1, 0)
        del self.times[:keep_from]
        del self.values[:keep_from]


class SimulatedGpu:
    """A simulated GPU source; see the module docstring."""

    kind = GPU_SOURCE_SIMULATED

    def __init__(
        self,
        phases: Optional[Sequence[tuple[float, float]]] = None,
        *,
        devices: Optional[list[str]] = None,
        sample_period_s: float = DEFAULT_SAMPLE_PERIOD_S,
        clock: Callable[[], int] = now_ns,
    ):
        if sample_period_s <= 0:
            raise ValueError(f"sample_period_s must be > 0, got {sample_period_s!r}")
        self.errors: collections.Counter = collections.Counter()  # never counts: nothing fails here
        self._clock = clock
        self._period_ns = round(sample_period_s * NS_PER_S)
        self._lock = threading.Lock()
        self._start_ns = clock()
        self._script = _Steps(self._script_changes(phases or ()))
        labels = [str(d) for d in devices] if devices else ["0"]
        self._devices = [
            GpuDevice(index=label, uuid=SIMULATED_GPU_UUID_PREFIX + label, name=SIMULATED_GPU_NAME) for label in labels
        ]
        self._driven = {label: _Steps() for label in labels}
        self._depth = {label: 0 for label in labels}
        self._next_ns = {label: self._start_ns + self._period_ns for label in labels}
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        """In a forked child: the parent's threads that kept it busy are not here."""
        self._lock = threading.Lock()
        now = self._clock()
        for gpu, depth in self._depth.items():
            if depth:
                self._depth[gpu] = 0
                self._driven[gpu].set(now, 0.0)

    def _script_changes(self, phases: Sequence[tuple[float, float]]) -> list[tuple[int, float]]:
        changes, t = [], self._start_ns
        for seconds, utilization in phases:
            if seconds < 0 or not 0.0 <= utilization <= 1.0:
                raise ValueError(f"a phase is (seconds >= 0, utilization in 0..1), got {(seconds, utilization)!r}")
            changes.append((t, float(utilization)))
            t += round(seconds * NS_PER_S)
        if changes:
            changes.append((t, 0.0))
        return changes

    @contextlib.contextmanager
    def busy(self, gpu: str = "0") -> Iterator[None]:
        """Keep ``gpu`` at 100% for the duration of the block (thread-safe, nests)."""
        self._enter(gpu)
        try:
            yield
        finally:
            self._leave(gpu)

    def model_call(self, started: bool) -> None:
        """A model call started (True) or ended (False): every device is busy
        while at least one is in flight (``capture.models.model_calls`` calls it)."""
        for device in self._devices:
            if started:
                self._enter(device.index)
            else:
                self._leave(device.index)

    def run_kernel(self, seconds: float, gpu: str = "0") -> None:
        """Block for ``seconds`` with ``gpu`` busy, like a synchronous model call."""
        with self.busy(gpu):
            time.sleep(seconds)

    def _enter(self, gpu: str) -> None:
        with self._lock:
            self._depth[gpu] += 1
            if self._depth[gpu] == 1:
                self._driven[gpu].set(self._clock(), 1.0)

    def _leave(self, gpu: str) -> None:
        with self._lock:
            if self._depth[gpu] == 0:  # entered in a parent process before a fork
                return
            self._depth[gpu] -= 1
            if self._depth[gpu] == 0:
                self._driven[gpu].set(self._clock(), 0.0)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def poll(self) -> list[GpuSample]:
        now = self._clock()
        samples: list[GpuSample] = []
        with self._lock:
            for device in self._devices:
                gpu, driven = device.index, self._driven[device.index]
                while self._next_ns[gpu] <= now:
                    end = self._next_ns[gpu]
                    samples.append(GpuSample(gpu, end, self._average(driven, end - self._period_ns, end)))
                    self._next_ns[gpu] = end + self._period_ns
                driven.forget_before(self._next_ns[gpu] - self._period_ns)
        return samples

    def _average(self, driven: _Steps, start: int, end: int) -> float:
        """Mean utilization over [start, end): the larger of script and driven state."""
        cuts = sorted({start, end, *self._script.changes_within(start, end), *driven.changes_within(start, end)})
        total = 0.0
        for a, b in zip(cuts, cuts[1:]):
            total += max(self._script.value_at(a), driven.value_at(a)) * (b - a)
        return total / (end - start)

    def close(self) -> None:
        """Nothing to release; present for the GpuSource shape."""
