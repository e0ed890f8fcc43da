"""The NVML backend against a stand-in ``pynvml`` that raises the real error classes.

The stand-in replaces ``pynvml`` in ``sys.modules``; its samples are the
real ctypes structures and its errors the real ``NVMLError_*`` classes from
nvidia-ml-py, so the code paths are the ones a real GPU takes.
"""

import logging
import sys
import threading
import time

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py provides the real NVML error classes")

from agent_otel.gpu.sources import open_gpu_source  # noqa: E402
from agent_otel.gpu.nvml import NvmlSource, clock_offset_ns, detect_clock  # noqa: E402
from agent_otel.records import NS_PER_S  # noqa: E402
from agent_otel.gpu.sampler import GpuSampler  # noqa: E402

# The stand-in driver stamps its samples with the wall clock, as NVML does (see the fixture).
pytestmark = pytest.mark.usefixtures("wall_clock_on_the_timeline")

BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)
needs_boottime = pytest.mark.skipif(BOOTTIME is None, reason="CLOCK_BOOTTIME exists on Linux only")


def epoch_us(seconds_ago=0.0):
    return time.time_ns() // 1000 - round(seconds_ago * 1e6)


def boot_us(seconds_ago=0.0):
    return time.clock_gettime_ns(BOOTTIME) // 1000 - round(seconds_ago * 1e6)


def nvml_samples(*pairs):
    """(raw timestamp µs, percent) pairs -> real c_nvmlSample_t structures."""
    out = []
    for stamp, percent in pairs:
        sample = pynvml.c_nvmlSample_t()
        sample.timeStamp = stamp
        sample.sampleValue.uiVal = percent
        out.append(sample)
    return out


class FakeGpu:
    def __init__(self, index, uuid):
        self.index, self.uuid = index, uuid
        self.answers = []  # what GetSamples returns next: a list of samples or an exception
        self.rate = 77  # busy: a rate read where samples were due would show
        self.rate_error = None
        self.last_seen_args = []


class StandInNvml:
    """Just the pynvml calls the backend may make; anything else it touches is recorded."""

    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    NVML_VALUE_TYPE_UNSIGNED_INT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus=(), init_error=None):
        self.gpus = list(gpus)
        self.init_error = init_error
        self.unexpected = []
        self.shutdowns = 0

    def __getattr__(self, name):
        if name.startswith("NVMLError_"):
            return getattr(pynvml, name)  # the real classes
        if not name.startswith("__"):  # the import system probes dunders
            self.unexpected.append(name)
        raise AttributeError(name)

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetIndex(self, gpu):
        return gpu.index

    def nvmlDeviceGetUUID(self, gpu):
        return gpu.uuid

    def nvmlDeviceGetName(self, gpu):
        return "NVIDIA H200"

    def nvmlDeviceGetSamples(self, gpu, sampling_type, last_seen):
        assert sampling_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        gpu.last_seen_args.append(last_seen)
        answer = gpu.answers.pop(0) if gpu.answers else pynvml.NVMLError_NotFound()
        if isinstance(answer, Exception):
            raise answer
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, answer

    def nvmlDeviceGetUtilizationRates(self, gpu):
        if gpu.rate_error is not None:
            raise gpu.rate_error
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu = gpu.rate
        return rates


@pytest.fixture
def install(monkeypatch):
    def install(nvml):
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        return nvml

    return install


@pytest.fixture
def gpu_log(caplog):
    caplog.set_level(logging.INFO, logger="agent_otel.gpu")
    return lambda level=logging.WARNING: [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_epoch_timestamps_are_used_as_they_are_and_last_seen_is_passed_back(install):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    source = NvmlSource()
    first, second = epoch_us(-0.1), epoch_us(-0.3)  # just after the source opened
    gpu.answers = [nvml_samples((first, 40), (second, 100)), nvml_samples((second + 166_000, 7))]

    batch = source.poll()
    later = source.poll()

    assert [(s.gpu, s.timestamp_ns, s.utilization) for s in batch] == [
        ("0", first * 1000, 0.40),
        ("0", second * 1000, 1.0),
    ]
    assert [(s.timestamp_ns, s.utilization) for s in later] == [((second + 166_000) * 1000, 0.07)]
    assert gpu.last_seen_args == [0, second]
    assert detect_clock(first) == "epoch"


@needs_boottime
def test_boot_time_timestamps_are_converted_onto_the_wall_clock(install):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    source = NvmlSource(idle_after_s=60)
    time.sleep(0.05)
    raw = boot_us(0.02)  # a sample taken 20 ms ago, on the boot-time clock
    gpu.answers = [nvml_samples((raw, 55))]

    [sample] = source.poll()

    expected_ns = time.time_ns() - 20_000_000
    assert abs(sample.timestamp_ns - expected_ns) < NS_PER_S // 2  # the clocks are decades apart
    assert sample.utilization == 0.55
    assert gpu.last_seen_args == [0]
    gpu.answers = [nvml_samples((raw + 166_000, 0))]
    source.poll()
    assert gpu.last_seen_args == [0, raw]  # the raw value, not the converted one
    assert detect_clock(raw) == "boottime"
    assert abs(clock_offset_ns("boottime") - (time.time_ns() - time.clock_gettime_ns(BOOTTIME))) < 10_000_000


def test_samples_follow_the_process_timeline_when_the_wall_clock_is_moved(monkeypatch):
    # NTP stepped the wall clock 5 s ahead after the process anchored its
    # timeline: epoch-stamped samples move back onto the timeline the tool
    # spans are on, and boot-time ones likewise.
    real_time_ns = time.time_ns
    assert abs(clock_offset_ns("epoch")) < 1_000_000  # nothing moved yet: whole milliseconds only
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + 5 * NS_PER_S)
    assert abs(clock_offset_ns("epoch") + 5 * NS_PER_S) <= 1_000_000
    boot_offset = real_time_ns() - time.clock_gettime_ns(BOOTTIME)
    assert abs(clock_offset_ns("boottime") - boot_offset) < 10_000_000


def test_a_thread_preempted_between_two_clock_reads_does_not_move_the_timeline(monkeypatch):
    # The timeline and the wall clock agree; each clock read takes 1 µs, and
    # the thread is preempted for 1.5 ms after the first read of each
    # function: read once each, the two clocks would seem that far apart.
    from agent_otel.support import clock

    now = [1_000_000_000_000]
    reads = []

    def read():
        reads.append(now[0])
        now[0] += 1_500_000 if len(reads) == 1 else 1_000
        return reads[-1]

    monkeypatch.setattr(clock, "perf_counter_ns", read)
    monkeypatch.setattr(time, "time_ns", read)
    monkeypatch.setattr(clock, "OFFSET_NS", 0)
    assert clock_offset_ns("epoch") == 0  # GPU samples are not moved
    reads.clear()
    assert clock.follow_wall_clock() == 0  # nor is the timeline
    assert clock.OFFSET_NS == 0


def test_buffered_samples_from_before_the_source_opened_are_skipped(install):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    old, older = epoch_us(20), epoch_us(30)  # left in the driver's buffer before we started
    gpu.answers = [nvml_samples((older, 90), (old, 90))]
    source = NvmlSource(idle_after_s=60)

    assert source.poll() == []
    source.poll()
    assert gpu.last_seen_args == [0, old]  # but they still move last_seen on


def test_an_idle_gpu_gets_a_synthetic_zero_sample_once_it_has_been_silent(install):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    source = NvmlSource(idle_after_s=0.5)
    gpu.answers = [nvml_samples((epoch_us(-0.001), 100)), [], pynvml.NVMLError_NotFound()]

    busy = source.poll()
    assert [s.utilization for s in busy] == [1.0]
    assert source.poll() == []  # silent, but not for long enough to call it idle
    time.sleep(0.55)
    before = time.time_ns()
    [idle] = source.poll()  # NotFound: the buffer ran dry
    after = time.time_ns()

    assert idle.utilization == 0.0
    # One sample period before the poll (the period is not measured yet, so
    # the longest documented, 1 s, capped at idle_after_s): the silence
    # proves the GPU idle only up to the last period that would have shown.
    assert before - 500_000_000 <= idle.timestamp_ns <= after - 500_000_000
    assert source.errors == {}  # silence is idleness, not an error


def test_when_samples_resume_the_idle_stretch_ends_where_their_period_began(install):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    source = NvmlSource(idle_after_s=0.3)
    t0 = epoch_us(-0.001)
    gpu.answers = [nvml_samples((t0, 90), (t0 + 100_000, 80))]  # the device samples every 100 ms
    assert len(source.poll()) == 2
    time.sleep(0.45)
    [idle] = source.poll()  # silent: idle
    resumed = epoch_us(-0.2)  # busy again, well after that poll
    gpu.answers = [nvml_samples((resumed, 100))]

    assert [(s.timestamp_ns, s.utilization) for s in source.poll()] == [
        (resumed * 1000 - 100_000_000, 0.0),
        (resumed * 1000, 1.0),
    ]
    assert idle.timestamp_ns < resumed * 1000 - 100_000_000


def test_devices_are_listed_and_selected_by_index_or_uuid(install, gpu_log):
    install(StandInNvml([FakeGpu(0, "GPU-aaa"), FakeGpu(1, "GPU-bbb"), FakeGpu(2, "GPU-ccc")]))

    everything = NvmlSource()
    chosen = NvmlSource(["GPU-ccc", "0", "GPU-nope"])

    assert [d.index for d in everything.devices()] == ["0", "1", "2"]
    assert everything.devices()[1].uuid == "GPU-bbb" and everything.devices()[1].name == "NVIDIA H200"
    assert [(d.index, d.uuid) for d in chosen.devices()] == [("2", "GPU-ccc"), ("0", "GPU-aaa")]
    assert chosen.errors == {"unknown_device": 1}
    assert [m for m in gpu_log() if "GPU-nope" in m] == ["GPU GPU-nope is not sampled: Not Found (unknown_device)"]


def test_samples_not_supported_falls_back_to_the_utilization_rate(install, gpu_log):
    gpu = FakeGpu(0, "GPU-0")
    gpu.answers = [pynvml.NVMLError_NotSupported()]
    gpu.rate = 63
    install(StandInNvml([gpu]))
    source = NvmlSource()

    [first] = source.poll()
    gpu.rate = 5
    [second] = source.poll()

    assert (first.utilization, second.utilization) == (0.63, 0.05)
    assert second.timestamp_ns > first.timestamp_ns
    assert gpu.last_seen_args == [0]  # GetSamples is not asked again
    assert source.errors == {"samples_not_supported": 1}
    assert len(gpu_log()) == 1 and "utilization rate" in gpu_log()[0]


def test_no_library_no_bindings_and_no_gpu_each_give_one_line_and_a_count(install, gpu_log):
    install(StandInNvml(init_error=pynvml.NVMLError_LibraryNotFound()))
    no_library = NvmlSource()
    assert (no_library.devices(), no_library.poll()) == ([], [])
    assert no_library.errors == {"library_not_found": 1}
    assert gpu_log() == ["GPU sampling via NVML is off: NVML did not initialise: NVML Shared Library Not Found"]

    install(StandInNvml(init_error=pynvml.NVMLError_DriverNotLoaded()))
    assert NvmlSource().errors == {"driver_not_loaded": 1}

    install(StandInNvml([]))
    no_gpu = NvmlSource()
    assert no_gpu.errors == {"no_gpu": 1}
    assert no_gpu.reason == "NVML found no GPU"

    install(None)  # `import pynvml` raises ImportError
    no_bindings = NvmlSource()
    assert no_bindings.errors == {"bindings_missing": 1}
    assert "nvidia-ml-py" in no_bindings.reason
    assert len(gpu_log()) == 4


def test_auto_without_a_gpu_is_off_with_one_info_line_and_never_simulated(install, gpu_log):
    install(StandInNvml(init_error=pynvml.NVMLError_LibraryNotFound()))

    assert open_gpu_source("auto") is None
    assert gpu_log(logging.WARNING) == []
    assert gpu_log(logging.INFO) == [
        "no NVIDIA GPU found (NVML did not initialise: NVML Shared Library Not Found); GPU sampling is off"
    ]


def test_auto_with_a_gpu_gives_nvml(install):
    install(StandInNvml([FakeGpu(0, "GPU-0")]))
    source = open_gpu_source("auto", devices=["0"])
    assert source.kind == "nvml" and [d.uuid for d in source.devices()] == ["GPU-0"]


def test_no_permission_stops_that_gpu_only(install, gpu_log):
    locked, fine = FakeGpu(0, "GPU-locked"), FakeGpu(1, "GPU-fine")
    install(StandInNvml([locked, fine]))
    source = NvmlSource(idle_after_s=60)
    locked.answers = [pynvml.NVMLError_NoPermission()]
    fine.answers = [nvml_samples((epoch_us(-0.01), 80)), nvml_samples((epoch_us(-0.2), 90))]

    assert [s.gpu for s in source.poll()] == ["1"]
    assert [s.gpu for s in source.poll()] == ["1"]
    assert len(locked.last_seen_args) == 1  # not asked again
    assert [d.index for d in source.devices()] == ["1"]
    assert source.errors == {"no_permission": 1}
    assert gpu_log() == ["GPU 0 (GPU-locked): Insufficient Permissions (no_permission); no longer sampled"]


def test_a_transient_error_is_counted_each_time_logged_once_and_sampling_goes_on(install, gpu_log):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    source = NvmlSource(idle_after_s=60)
    gpu.answers = [pynvml.NVMLError_Unknown(), pynvml.NVMLError_Unknown(), nvml_samples((epoch_us(-0.01), 30))]

    assert source.poll() == [] and source.poll() == []
    assert [s.utilization for s in source.poll()] == [0.30]
    assert source.errors == {"nvml_error": 2}
    assert len(gpu_log()) == 1


def test_a_gpu_lost_mid_run_is_dropped_and_the_sampler_keeps_running(install, gpu_log):
    lost, fine = FakeGpu(0, "GPU-lost"), FakeGpu(1, "GPU-fine")
    nvml = install(StandInNvml([lost, fine]))
    source = NvmlSource(idle_after_s=60)
    origin = epoch_us(-0.001)  # after the source opened
    fine.answers = [nvml_samples((origin + 10_000 * i, 50)) for i in range(1000)]
    lost.answers = [nvml_samples((origin, 60)), pynvml.NVMLError_GpuIsLost()]
    received = []
    sampler = GpuSampler(source, 0.01, received.extend)

    sampler.start()
    deadline = time.monotonic() + 10
    while sampler.polls < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.shutdown(timeout_s=5)

    assert sampler.polls >= 20
    assert len(lost.last_seen_args) == 2  # polled until lost, then left alone
    assert [s.gpu for s in received].count("0") == 1
    assert [s.gpu for s in received].count("1") >= 19
    assert sampler.stats()["errors"] == {"gpu_lost": 1}
    assert gpu_log() == ["GPU 0 (GPU-lost): GPU is lost (gpu_lost); no longer sampled"]
    assert nvml.shutdowns == 1  # the sampler closed the source
    assert nvml.unexpected == []  # nothing else touched: no process enumeration


def test_the_real_bindings_without_a_gpu_degrade_cleanly(gpu_log):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML; tests/gpu/ covers the real GPU")

    source = NvmlSource()

    assert source.devices() == [] and source.poll() == []
    assert sum(source.errors.values()) == 1
    assert len(gpu_log()) == 1 and gpu_log()[0].startswith("GPU sampling via NVML is off")
    source.close()


def test_sample_timestamps_are_on_the_epoch_in_nanoseconds(install):
    gpu = FakeGpu(0, "GPU-0")
    install(StandInNvml([gpu]))
    source = NvmlSource()
    gpu.answers = [nvml_samples((epoch_us(-0.05), 10))]

    [sample] = source.poll()

    assert abs(sample.timestamp_ns - time.time_ns()) < 5 * NS_PER_S


@needs_boottime
def test_end_to_end_a_driver_that_goes_quiet_when_idle(install):
    """A stand-in driver that, like NVML, samples on the boot-time clock every
    50 ms while the GPU is busy and keeps nothing while it is idle."""
    from agent_otel.gpu.timeline import find_idle_windows

    gpu = FakeGpu(0, "GPU-0")
    nvml = install(StandInNvml([gpu]))
    buffer, busy, stop = [], threading.Event(), threading.Event()

    def driver():
        while not stop.wait(0.05):
            if busy.is_set():
                buffer.append((boot_us(), 100))

    def get_samples(device, sampling_type, last_seen):
        fresh = [s for s in list(buffer) if s[0] > last_seen]
        if not fresh:
            raise pynvml.NVMLError_NotFound()
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, nvml_samples(*fresh)

    nvml.nvmlDeviceGetSamples = get_samples
    threading.Thread(target=driver, daemon=True).start()
    received = []
    sampler = GpuSampler(NvmlSource(idle_after_s=0.2), 0.1, received.extend)
    sampler.start()
    try:
        busy.set()
        time.sleep(0.5)
        busy.clear()
        idle_from = time.time_ns()
        time.sleep(1.0)
        idle_to = time.time_ns()
        busy.set()
        time.sleep(0.5)
    finally:
        assert sampler.shutdown(timeout_s=5)
        stop.set()

    windows = find_idle_windows(received, threshold=0.1, min_idle_s=0.5)
    [window] = windows
    # One 50 ms sample period, plus slack for a busy machine's thread scheduling.
    assert abs(window.start_ns - idle_from) <= 150_000_000
    assert abs(window.end_ns - idle_to) <= 150_000_000
