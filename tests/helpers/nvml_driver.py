"""A stand-in for NVML's driver that samples like the real one, on a clock the test moves.

``StandInNvml`` replaces the ``pynvml`` module (install it in
``sys.modules``); its errors are the real ``NVMLError_*`` classes of
nvidia-ml-py and its samples the real ``c_nvmlSample_t`` structures, so
``agent_otel.gpu.nvml.NvmlSource`` runs its real code paths. Each
``DriverGpu`` samples like NVML: every ``period_s``, on a fixed grid, the
percentage of the period that ends then in which the GPU was busy, into a
ring buffer of ``depth`` samples (the oldest overwritten). With
``keeps_zeros=False`` (what NVML is reported to do) an idle period leaves
no sample, so the buffer runs dry while the GPU idles and
``nvmlDeviceGetSamples`` raises ``NVMLError_NotFound``; with
``keeps_zeros=True`` it records 0% samples instead.

Time is a ``VirtualClock`` (epoch ns, started at the real time so that the
source takes the timestamps for the epoch clock); tests move it, so the
edges of every idle stretch are known exactly.
"""

from __future__ import annotations

import bisect
import collections
import time

import pynvml


class VirtualClock:
    """Epoch nanoseconds that only move when told to."""

    def __init__(self) -> None:
        self.now = time.time_ns()

    def __call__(self) -> int:
        return self.now

    def advance_to(self, ns: int) -> None:
        assert ns >= self.now, "virtual time only moves forward"
        self.now = ns


class DriverGpu:
    """One GPU as the driver samples it; ``set(utilization)`` changes what it does from now on."""

    def __init__(
        self,
        clock: VirtualClock,
        *,
        index: int = 0,
        period_s: float = 1 / 6,
        depth: int = 120,
        keeps_zeros: bool = False,
        history_s: float = 10.0,
    ):
        self.clock = clock
        self.index = index
        self.uuid = f"GPU-standin-{index}"
        self.period_ns = round(period_s * 1e9)
        self.keeps_zeros = keeps_zeros
        self.ring: collections.deque = collections.deque(maxlen=depth)
        # The GPU was busy for history_s before the test began: a running
        # server's buffer is full when the source opens.
        self.times = [clock() - round(history_s * 1e9)]
        self.values = [1.0 if history_s else 0.0]
        self.next_ns = self.times[0] + self.period_ns + 12_345_678 % self.period_ns  # an arbitrary grid phase
        self.set(0.0 if not history_s else 1.0)

    def set(self, utilization: float) -> None:
        self.times.append(self.clock())
        self.values.append(utilization)

    def _value_at(self, t: int) -> float:
        return self.values[bisect.bisect_right(self.times, t) - 1]

    def _average(self, start: int, end: int) -> float:
        cuts = [start] + [t for t in self.times if start < t < end] + [end]
        return sum(self._value_at(a) * (b - a) for a, b in zip(cuts, cuts[1:])) / (end - start)

    def advance(self) -> None:
        """Take the samples whose periods have ended by now."""
        while self.next_ns <= self.clock():
            percent = round(100 * self._average(self.next_ns - self.period_ns, self.next_ns))
            if percent > 0 or self.keeps_zeros:
                self.ring.append((self.next_ns // 1000, percent))
            self.next_ns += self.period_ns

    def samples_after(self, last_seen_us: int) -> list:
        self.advance()
        fresh = [(stamp, percent) for stamp, percent in self.ring if stamp > last_seen_us]
        if not fresh:
            raise pynvml.NVMLError_NotFound()
        out = []
        for stamp, percent in fresh:
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = stamp
            sample.sampleValue.uiVal = percent
            out.append(sample)
        return out


class StandInNvml:
    """The pynvml calls NvmlSource makes, answered by ``DriverGpu`` objects."""

    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus):
        self.gpus = list(gpus)
        self.calls = 0

    def __getattr__(self, name):
        if name.startswith("NVMLError_"):
            return getattr(pynvml, name)  # the real classes
        raise AttributeError(name)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self.gpus[index]

    def nvmlDeviceGetIndex(self, gpu):
        return gpu.index

    def nvmlDeviceGetUUID(self, gpu):
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu):
        return "Stand-in GPU"

    def nvmlDeviceGetSamples(self, gpu, sampling_type, last_seen):
        assert sampling_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        self.calls += 1
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, gpu.samples_after(last_seen)
