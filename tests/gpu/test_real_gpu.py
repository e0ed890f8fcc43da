"""On a real NVIDIA GPU: idle windows are found where a real workload slept.

Runs only where NVML finds a GPU and PyTorch can use it; skipped elsewhere
with the reason, also under CI=true (CI never has a GPU: this is the one
place a missing tool is not a failure there). Run it with

    pytest tests/gpu -s

``-s`` shows what it observed (sample spacing, buffer depth, timestamp
clock) for docs/gpu.md. ``bench/gpu_probe.py`` measures more and writes JSON.
"""

import logging
import statistics
import time

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
torch = pytest.importorskip("torch", reason="PyTorch is not installed (it drives the real GPU workload)")

from agent_otel.gpu.nvml import NvmlSource  # noqa: E402
from agent_otel.records import NS_PER_S  # noqa: E402
from agent_otel.gpu.sampler import GpuSampler  # noqa: E402
from agent_otel.gpu.timeline import find_idle_windows  # noqa: E402

# NVIDIA documents sample periods from 1/6 s to 1 s: a window edge may be
# off by one period, plus a little for the workload's own start and stop.
TOLERANCE_S = 1.0 + 0.2
SLEEPS_S = (2.0, 3.0)
BURST_S = 1.5


@pytest.fixture(scope="module")
def nvml_gpu():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU here (NVML: {exc})")
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("NVML found no GPU")
    finally:
        pynvml.nvmlShutdown()
    if not torch.cuda.is_available():
        pytest.skip("PyTorch cannot use the GPU (torch.cuda.is_available() is False)")
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    # NVML indexes ignore CUDA_VISIBLE_DEVICES; the UUID names the GPU torch uses.
    return f"GPU-{uuid}" if uuid is not None else "0"


def burst(seconds):
    """Keep the GPU busy: back-to-back matrix products for ``seconds``."""
    x = torch.randn(4096, 4096, device="cuda")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()


def test_idle_windows_are_found_where_the_workload_slept(nvml_gpu, caplog):
    caplog.set_level(logging.INFO, logger="agent_otel.gpu")
    burst(0.5)  # CUDA start-up outside the measured part
    samples = []
    source = NvmlSource([nvml_gpu])
    assert source.devices(), f"NVML could not open {nvml_gpu}: {source.reason}"
    sampler = GpuSampler(source, 0.5, samples.extend)
    sampler.start()
    sleeps, bursts = [], []

    def timed(record, action, seconds):
        start = time.time_ns()
        action(seconds)
        record.append((start, time.time_ns()))

    try:
        timed(bursts, burst, BURST_S)
        for pause in SLEEPS_S:
            timed(sleeps, time.sleep, pause)  # the agent waits on a tool; the GPU has nothing to do
            timed(bursts, burst, BURST_S)
        time.sleep(1.0)
    finally:
        assert sampler.shutdown(timeout_s=5)

    windows = find_idle_windows(samples, threshold=0.10, min_idle_s=0.5)
    report_observations(nvml_gpu, samples, windows, sleeps, caplog, sampler.stats())

    assert samples, "no samples at all"
    assert sampler.stats()["errors"] == {}
    for start, end in sleeps:
        matches = [
            w for w in windows
            if abs(w.start_ns - start) <= TOLERANCE_S * NS_PER_S and abs(w.end_ns - end) <= TOLERANCE_S * NS_PER_S
        ]
        assert len(matches) == 1, f"no idle window for the sleep {start}-{end}: {windows}"
    for start, end in bursts:
        middle = (start + end) // 2
        assert not any(w.start_ns < middle < w.end_ns for w in windows), f"idle window inside a burst: {windows}"


def report_observations(device, samples, windows, sleeps, caplog, stats):
    """Print what was seen, for docs/gpu.md (run with -s)."""
    times = [s.timestamp_ns for s in samples]
    spacing = [(b - a) / NS_PER_S for a, b in zip(times, times[1:])]
    busy_spacing = [d for d in spacing if d < 0.45]
    clock_lines = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
    pynvml.nvmlInit()
    try:
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(device) if device.startswith("GPU-")
            else pynvml.nvmlDeviceGetHandleByIndex(int(device))
        )
        try:
            _, buffered = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        except pynvml.NVMLError_NotFound:
            buffered = []
        name = pynvml.nvmlDeviceGetName(handle)
    finally:
        pynvml.nvmlShutdown()
    stamps = sorted(s.timeStamp for s in buffered)
    print(f"\nGPU {device} ({name}), {len(samples)} samples, sampler stats {stats}")
    print("clock:", clock_lines)
    if busy_spacing:
        print(
            f"spacing while busy: median {statistics.median(busy_spacing):.4f} s, "
            f"min {min(busy_spacing):.4f} s, max {max(busy_spacing):.4f} s"
        )
    if stamps:
        print(f"buffer depth: {len(stamps)} samples over {(stamps[-1] - stamps[0]) / 1e6:.2f} s")
    for start, end in sleeps:
        print(f"sleep   {start / NS_PER_S:.3f} - {end / NS_PER_S:.3f}")
    for w in windows:
        print(f"window  {w.start_ns / NS_PER_S:.3f} - {w.end_ns / NS_PER_S:.3f} avg {w.utilization_avg:.3f}")
