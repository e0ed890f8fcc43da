"""GPU utilization from NVML, NVIDIA's management library.

Usage::

    from agent_otel.gpu.nvml import NvmlSource
    source = NvmlSource()          # every GPU; or NvmlSource(["0", "GPU-8f..."])
    samples = source.poll()        # call every ~0.5 s from a background thread

Reads ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` from the
driver's ring buffer, passing the last timestamp seen so each poll returns
only new samples: the driver's own sample period (1/6 s to 1 s by product)
at the cost of one call per GPU per poll. Devices without samples fall back
to ``nvmlDeviceGetUtilizationRates`` once per poll. Processes are never
enumerated (those calls take milliseconds and serialize in the driver).

Three facts shape the code:

- An idle GPU stops producing samples (the call returns nothing or raises
  ``NVMLError_NotFound``): the buffer runs dry. So a gap between two
  consecutive real samples longer than the device's measured sample period
  (``agent_otel.gpu.timeline.is_gap``) is idle time, however short: when
  samples resume, a 0% sample is added where the first new sample's period
  began, and the timeline counts the gap idle. While the silence goes on, a
  device with no new sample for ``idle_after_s`` gets a synthetic 0% sample
  at each poll (one sample period before the poll, the latest moment the
  silence proves idle), so a stall still going on is visible.
- The buffer is a ring of limited depth. Data lost rather than never
  recorded (the sampler thread was away longer than the ring holds, and the
  ring came back full with a gap before it) is missing data: a ``MISSING``
  sample marks the stretch, it is counted in ``errors["samples_lost"]`` and
  logged once, and the timeline counts it neither idle nor busy. The depth
  is learned as the largest batch NVML has returned (the first poll returns
  the whole ring); where it is underestimated, lost data is assumed more
  often, never idle time.
- The sample timestamps are microseconds on a clock the driver picks: the
  Unix epoch on some, time since boot (CLOCK_BOOTTIME) on others. The first
  sample seen tells which (it is close to one and decades from the other);
  samples are converted to epoch ns, and the raw value is kept for the next
  call's ``last_seen``.

The sample period is measured per device: the lower quartile of the last
64 spacings between consecutive samples (the spacings while busy are one
period; the gaps while idle are longer). Until two samples have been seen,
NVIDIA's longest documented period (1 s) stands in, so no gap is taken for
idle before the period is known.

Nothing here raises into the application: no bindings, no library, no GPU,
no permission, an unsupported device or a GPU lost mid-run each give one log
line on ``agent_otel.gpu`` and a count in ``errors``. ``pynvml`` (from the
``nvidia-ml-py`` distribution) is imported only when a source is created.
"""

from __future__ import annotations

import collections
import logging
import time
import warnings
from typing import Any, Callable, Optional

from agent_otel.support import clock as process_clock
from agent_otel.support.clock import now_ns
from agent_otel.gpu.device import GpuDevice
from agent_otel.gpu.timeline import is_gap
from agent_otel.records import MISSING, GpuSample
from agent_otel.semconv import GPU_SOURCE_NVML, GPU_STATE_ERROR, GPU_STATE_LOST, GPU_STATE_OK

log = logging.getLogger("agent_otel.gpu")

# The longest sample period NVML uses (NVIDIA documents 1/6 s to 1 s): a
# device silent for longer than this has stopped sampling because it is idle.
DEFAULT_IDLE_AFTER_S = 1.0
# Assumed until two consecutive samples show the device's own period: the
# longest documented, so that no gap is read as idle before it is measured.
UNMEASURED_PERIOD_NS = 1_000_000_000
# Spacings kept per device to measure its sample period.
PERIOD_SPACINGS = 64
# A sample stamped later than the poll's own clock read plus this is refused
# (a driver's bad timestamp): a sample's time is the end of a period already over.
AHEAD_LIMIT_NS = 1_000_000_000
# Refused raw timestamps remembered per device, so a bad sample the driver
# returns on every poll (it stays in its ring) is counted once.
REFUSED_KEPT = 64

# NVML error class -> the kind counted in ``errors`` (a Prometheus label).
_ERROR_KINDS = {
    "NVMLError_LibraryNotFound": "library_not_found",
    "NVMLError_DriverNotLoaded": "driver_not_loaded",
    "NVMLError_NoPermission": "no_permission",
    "NVMLError_GpuIsLost": "gpu_lost",
    "NVMLError_NotSupported": "not_supported",
    "NVMLError_Uninitialized": "uninitialized",
    "NVMLError_InvalidArgument": "unknown_device",
    "NVMLError_NotFound": "unknown_device",
}
# After these a device is not polled again: retrying cannot help.
_FATAL_KINDS = {"gpu_lost", "no_permission", "not_supported", "uninitialized"}

# c_nvmlValue_t field to read for each NVML_VALUE_TYPE_*.
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def error_kind(exc: BaseException) -> str:
    """The ``errors`` key for an exception raised by pynvml."""
    return _ERROR_KINDS.get(type(exc).__name__, "nvml_error")


def _boottime_ns() -> Optional[int]:
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime_ns(clock) if clock is not None else None


def detect_clock(raw_us: int) -> str:
    """``"epoch"`` or ``"boottime"``: whichever clock is now closer to ``raw_us``."""
    boot_ns = _boottime_ns()
    if boot_ns is None:
        return "epoch"
    epoch_distance = abs(time.time_ns() // 1000 - raw_us)
    boot_distance = abs(boot_ns // 1000 - raw_us)
    return "epoch" if epoch_distance <= boot_distance else "boottime"


def clock_offset_ns(clock: str) -> int:
    """What to add to ``raw_us * 1000`` to put a sample on the process's
    timeline (``agent_otel.support.clock.now_ns``: epoch ns from the monotonic clock,
    kept within a millisecond of the wall clock), the timeline every tool
    span is on.

    Read afresh on each poll: the timeline follows the wall clock only in
    steps of over a millisecond (``clock.follow_wall_clock``), and
    CLOCK_BOOTTIME keeps its own rate; a fixed offset would let GPU samples
    drift away from the tool calls over hours.
    """
    wall, offset = process_clock.wall_offset_ns()
    # Whole milliseconds: the few microseconds between two clock reads are
    # not drift, and would make the same sample convert differently each poll.
    drift = round(process_clock.OFFSET_NS - offset, -6)
    boot_ns = _boottime_ns() if clock == "boottime" else None
    return drift + (wall - boot_ns if boot_ns is not None else 0)


class _Device:
    __slots__ = (
        "handle",
        "info",
        "mode",
        "last_seen",
        "clock",
        "spacings",
        "period_ns",
        "last_real_ns",
        "last_emitted_ns",
        "depth",
        "polled_ns",
        "lost_s",
        "active",
        "refused",
        "unknown",
        "state",
    )

    def __init__(self, handle, info: GpuDevice):
        self.handle = handle
        self.info = info
        self.mode = "samples"  # or "rates" once samples turn out unsupported
        self.last_seen = 0  # raw NVML timestamp (µs) of the newest sample read
        self.clock: Optional[str] = None
        self.spacings: collections.deque[int] = collections.deque(maxlen=PERIOD_SPACINGS)
        self.period_ns = UNMEASURED_PERIOD_NS
        self.last_real_ns = 0  # newest real sample, converted
        self.last_emitted_ns = 0  # newest sample returned by poll()
        self.depth = 0  # the most samples one GetSamples call returned: the ring holds at least this many
        self.polled_ns = 0  # when GetSamples last answered (samples, or a dry buffer)
        self.lost_s = 0.0  # seconds of samples lost to ring overflows
        self.active = True
        self.refused: collections.deque[int] = collections.deque(maxlen=REFUSED_KEPT)  # raw stamps
        # Samples were refused since the last good one: the gap before the
        # next good sample is unknown, not idle.
        self.unknown = False
        self.state = (GPU_STATE_OK, "")  # (state, reason)

    def measure(self, spacing_ns: int) -> None:
        """Add one spacing between consecutive real samples to the period estimate."""
        if spacing_ns <= 0:
            return
        self.spacings.append(spacing_ns)
        ordered = sorted(self.spacings)
        self.period_ns = ordered[(len(ordered) - 1) // 4]


class NvmlSource:
    """Samples NVIDIA GPUs through NVML; see the module docstring.

    ``devices`` selects GPUs by NVML index ("0") or UUID ("GPU-..."); NVML
    indexes ignore CUDA_VISIBLE_DEVICES, UUIDs are unambiguous. ``reason``
    says why the source has no devices, when it has none. ``quiet`` leaves
    the one log line about that to the caller (``open_gpu_source("auto")``).
    """

    kind = GPU_SOURCE_NVML
    # It vouches for the gaps between its samples: idle where its buffer ran
    # dry, MISSING samples where data was lost.
    reports_gaps = True

    def __init__(
        self,
        devices: Optional[list[str]] = None,
        *,
        idle_after_s: float = DEFAULT_IDLE_AFTER_S,
        quiet: bool = False,
        clock: Callable[[], int] = now_ns,
    ):
        self.errors: collections.Counter = collections.Counter()
        self.reason: Optional[str] = None
        # The NVML function running now, if any: what a poll that does not
        # return is stuck in (``GpuSampler`` shows it).
        self.calling: Optional[str] = None
        self._clock = clock
        self._idle_after_ns = round(idle_after_s * 1e9)
        self._opened_ns = clock()
        self._nvml = None
        self._devices: list[_Device] = []
        self._logged: set[tuple[str, str]] = set()
        try:
            self._open(devices)
        except Exception as exc:  # never into the application, whatever NVML does
            self._fail(error_kind(exc), f"NVML failed while opening: {exc!r}")
        if not self._devices and self.reason is None:
            self._fail("no_gpu", "NVML found no GPU" if devices is None else "none of the selected GPUs was found")
        if self.reason is not None and not quiet:
            log.warning("GPU sampling via NVML is off: %s", self.reason)

    def devices(self) -> list[GpuDevice]:
        return [device.info for device in self._devices if device.active]

    def describe(self) -> dict[str, dict]:
        """What was learned about each device's sampling, by index: the
        mode (``samples`` or ``rates``), the timestamp clock, the measured
        sample period (None until measured), the ring depth seen and the
        seconds of samples lost to ring overflows."""
        return {
            device.info.index: {
                "mode": device.mode,
                "clock": device.clock,
                "sample_period_s": device.period_ns / 1e9 if device.spacings else None,
                "buffer_depth_seen": device.depth,
                "lost_s": round(device.lost_s, 6),
            }
            for device in self._devices
        }

    def states(self) -> dict[str, tuple[str, str]]:
        """Each device's state after the last poll, by index: ``("ok", "")``,
        ``("error", kind)`` (the poll raised, or its samples were refused) or
        ``("lost", kind)`` (no longer sampled); ``kind`` is the ``errors`` key."""
        return {device.info.index: device.state for device in self._devices}

    def poll(self) -> list[GpuSample]:
        samples: list[GpuSample] = []
        for device in self._devices:
            if not device.active:
                continue
            try:
                samples.extend(self._poll_device(device))
            except Exception as exc:
                self._device_error(device, exc)
        self.calling = None
        return samples

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        self._devices = []
        if nvml is not None:
            self.calling = "nvmlShutdown"
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass  # shutting down: nothing left to protect
            self.calling = None

    # -- opening ---------------------------------------------------------

    def _open(self, wanted: Optional[list[str]]) -> None:
        try:
            with warnings.catch_warnings():
                # The deprecated `pynvml` distribution warns on import; the
                # module it provides is the same.
                warnings.simplefilter("ignore", FutureWarning)
                import pynvml
        except ImportError:
            self._fail("bindings_missing", "the nvidia-ml-py package is not installed (pip install 'agent-otel[gpu]')")
            return
        self.calling = "nvmlInit"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._fail(error_kind(exc), f"NVML did not initialise: {exc}")
            return
        finally:
            self.calling = None
        self._nvml = pynvml
        if wanted is None:
            labels = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        else:
            labels = [str(w).strip() for w in wanted]
        for label in labels:
            try:
                if label.isdigit():
                    handle = pynvml.nvmlDeviceGetHandleByIndex(int(label))
                else:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(label)
                info = self._describe(handle, label)
            except pynvml.NVMLError as exc:
                kind = error_kind(exc)
                self.errors[kind] += 1
                log.warning("GPU %s is not sampled: %s (%s)", label, exc, kind)
                continue
            if all(device.info.index != info.index for device in self._devices):
                self._devices.append(_Device(handle, info))

    def _describe(self, handle, label: str) -> GpuDevice:
        nvml: Any = self._nvml  # pynvml, loaded when the source opened
        index = str(int(label)) if label.isdigit() else str(nvml.nvmlDeviceGetIndex(handle))
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError:
            uuid = None
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError:
            name = "NVIDIA GPU"
        return GpuDevice(index=index, uuid=uuid, name=name)

    def _fail(self, kind: str, reason: str) -> None:
        self.errors[kind] += 1
        self.reason = reason
        self.close()

    # -- polling ---------------------------------------------------------

    def _poll_device(self, device: _Device) -> list[GpuSample]:
        nvml: Any = self._nvml  # pynvml, loaded when the source opened
        now_ns = self._clock()
        if device.mode == "samples":
            self.calling = "nvmlDeviceGetSamples"
            try:
                value_type, raw = nvml.nvmlDeviceGetSamples(
                    device.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, device.last_seen
                )
                return self._from_samples(device, value_type, raw, now_ns)
            except nvml.NVMLError_NotFound:
                return self._from_samples(device, None, [], now_ns)  # the buffer ran dry: idle
            except nvml.NVMLError_NotSupported:
                self.errors["samples_not_supported"] += 1
                self._log_once(
                    device,
                    "samples_not_supported",
                    "keeps no utilization samples; reading its utilization rate each poll instead",
                )
                device.mode = "rates"
        self.calling = "nvmlDeviceGetUtilizationRates"
        return self._from_rate(device, nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu, now_ns)

    def _from_samples(self, device: _Device, value_type, raw, now_ns: int) -> list[GpuSample]:
        polled_before, device.polled_ns = device.polled_ns, now_ns
        device.state = (GPU_STATE_OK, "")
        for sample in raw:  # NVML returns only samples after last_seen: an older one is a bad timestamp
            if sample.timeStamp < device.last_seen:
                self._refuse(device, sample.timeStamp, "timestamp_behind", "before the last sample read")
        fresh = self._in_window(
            device, sorted((s for s in raw if s.timeStamp > device.last_seen), key=lambda s: s.timeStamp), now_ns
        )
        if not fresh:
            if device.state[0] != GPU_STATE_OK:
                return self._unknown(device, now_ns)
            return self._silence(device, now_ns)
        # The ring held at least as many samples as the largest batch before
        # this one; a batch that large, after a poll later than that many
        # periods, may have lost what came before it.
        full = (
            device.depth > 0
            and len(fresh) >= device.depth
            and (now_ns - polled_before > device.depth * device.period_ns)
        )
        device.depth = max(device.depth, len(raw))
        first_read = device.last_seen == 0
        device.last_seen = fresh[-1][0].timeStamp
        field = _VALUE_FIELDS.get(value_type, "uiVal")
        samples: list[GpuSample] = []
        unknown, device.unknown = device.unknown, False
        for position, (sample, t) in enumerate(fresh):
            previous = device.last_real_ns
            gap = bool(previous) and is_gap(t - previous, device.period_ns)
            period_start = t - device.period_ns
            if previous and t > previous:
                device.measure(t - previous)
            device.last_real_ns = max(previous, t)
            # Skip what predates this source, and what arrived after a
            # synthetic idle sample already covered its time.
            if t < self._opened_ns or t <= device.last_emitted_ns:
                continue
            if gap and period_start > device.last_emitted_ns:
                if position == 0 and unknown:
                    # Samples were refused in the gap: the GPU was not idle, nor known busy.
                    samples.append(GpuSample(device.info.index, period_start, MISSING))
                elif position == 0 and full and not first_read:
                    # The ring came back full: what was before it was overwritten.
                    self._lost(device, period_start - max(previous, device.last_emitted_ns), now_ns - polled_before)
                    samples.append(GpuSample(device.info.index, period_start, MISSING))
                else:
                    # The buffer ran dry: the GPU was idle until this sample's period began.
                    samples.append(GpuSample(device.info.index, period_start, 0.0))
            device.last_emitted_ns = t
            samples.append(GpuSample(device.info.index, t, _ratio(getattr(sample.sampleValue, field))))
        return samples

    def _in_window(self, device: _Device, fresh: list, now_ns: int) -> list[tuple[Any, int]]:
        """The new samples with their times on the timeline, but those stamped
        outside the poll's window: later than now (plus ``AHEAD_LIMIT_NS``),
        or before the previous sample. Those are a driver's bad timestamps:
        refused, counted once each (``timestamp_ahead``, ``timestamp_behind``),
        logged once per device, and the device's state says so. Taken, one
        hour ahead would read as an hour of idle GPU, and 2**64-1 as the newest
        sample for good (nothing after it would ever be read)."""
        kept: list[tuple[Any, int]] = []
        offsets: dict[str, int] = {}
        previous = device.last_real_ns
        for sample in fresh:
            stamp = sample.timeStamp
            clock = device.clock or detect_clock(stamp)
            offset = offsets.get(clock)
            if offset is None:
                offset = offsets[clock] = clock_offset_ns(clock)
            t = stamp * 1000 + offset
            if t > now_ns + AHEAD_LIMIT_NS:
                self._refuse(device, stamp, "timestamp_ahead", f"{(t - now_ns) / 1e9:.3g} s after the poll")
                continue
            if previous and t < previous:
                self._refuse(
                    device, stamp, "timestamp_behind", f"{(previous - t) / 1e9:.3g} s before the one before it"
                )
                continue
            if device.clock is None:
                device.clock = clock
                log.info("GPU %s: NVML sample timestamps are on the %s clock", device.info.index, clock)
            kept.append((sample, t))
            previous = t
        return kept

    def _refuse(self, device: _Device, stamp: int, kind: str, how: str) -> None:
        if stamp in device.refused:
            return  # counted when first seen (the driver returns it again while its ring holds it)
        device.refused.append(stamp)
        device.state = (GPU_STATE_ERROR, kind)
        device.unknown = True
        self.errors[kind] += 1
        self._log_once(
            device,
            kind,
            f"NVML returned a sample stamped {stamp} µs, {how}: refused, and counted as {kind} "
            "(logged once; counted for each such sample)",
        )

    def _unknown(self, device: _Device, now_ns: int) -> list[GpuSample]:
        """Every new sample was refused: the stretch up to one period before
        now is missing data, neither idle nor busy (the GPU made samples)."""
        at = now_ns - device.period_ns
        if at <= device.last_emitted_ns:
            return []
        device.last_emitted_ns = at
        device.last_real_ns = max(device.last_real_ns, at)
        return [GpuSample(device.info.index, at, MISSING)]

    def _silence(self, device: _Device, now_ns: int) -> list[GpuSample]:
        """No new sample: once silent for ``idle_after_s``, a synthetic idle
        sample up to one period before now (the buffer ran dry, and could
        not have lost anything: it received nothing)."""
        silent_since = max(device.last_real_ns, self._opened_ns)
        at = now_ns - min(device.period_ns, self._idle_after_ns)
        if now_ns - silent_since >= self._idle_after_ns and at > device.last_emitted_ns:
            device.last_emitted_ns = at
            return [GpuSample(device.info.index, at, 0.0)]
        return []

    def _lost(self, device: _Device, lost_ns: int, away_ns: int) -> None:
        self.errors["samples_lost"] += 1
        device.lost_s += lost_ns / 1e9
        self._log_once(
            device,
            "samples_lost",
            f"NVML's sample buffer overflowed while the sampler was away ({away_ns / 1e9:.1f} s since its "
            f"previous poll; the buffer holds at least {device.depth} samples, "
            f"{device.depth * device.period_ns / 1e9:.1f} s): {lost_ns / 1e9:.1f} s of samples lost, counted as "
            "missing data, neither idle nor busy (logged once; counted each time)",
        )

    def _from_rate(self, device: _Device, percent, now_ns: int) -> list[GpuSample]:
        # One read per poll stands for the whole poll interval: no gaps to read.
        device.state = (GPU_STATE_OK, "")
        if now_ns <= device.last_emitted_ns:
            return []
        device.last_emitted_ns = now_ns
        return [GpuSample(device.info.index, now_ns, _ratio(percent))]

    def _device_error(self, device: _Device, exc: Exception) -> None:
        kind = error_kind(exc)
        self.errors[kind] += 1
        if kind in _FATAL_KINDS:
            device.active = False
            device.state = (GPU_STATE_LOST, kind)
            self._log_once(device, kind, f"{exc} ({kind}); no longer sampled")
        else:
            device.state = (GPU_STATE_ERROR, kind)
            self._log_once(device, kind, f"{exc!r} ({kind}); counted, sampling continues")

    def _log_once(self, device: _Device, kind: str, message: str) -> None:
        key = (device.info.index, kind)
        if key not in self._logged:
            self._logged.add(key)
            log.warning("GPU %s (%s): %s", device.info.index, device.info.uuid or device.info.name, message)


def _ratio(percent) -> float:
    return min(max(float(percent) / 100.0, 0.0), 1.0)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
