"""On a real NVIDIA GPU: idle windows are found where a real workload slept.

Runs only where NVML finds a GPU and PyTorch can use it; skipped elsewhere
with the reason, also under CI=true (CI never has a GPU: this is the one
place a missing tool is not a failure there). Run it with

    pytest tests/gpu -s

``-s`` prints the answers to the five questions of docs/gpu.md: does the
buffer run dry while idle or keep 0% samples, the sample period, the
buffer depth, the clock, and the shortest idle stretch found.
``bench/gpu_probe.py`` measures more and writes JSON.
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

# A window edge may be off by one sample period (as measured by the source;
# NVIDIA documents 1/6 s to 1 s), plus a little for the workload's own start
# and stop (a CUDA synchronize, the Python loop).
EDGE_SLACK_S = 0.15
# From the shortest stall the toolkit must find at its defaults (issue 17:
# 0.6 s, just above gpu_min_idle) to well above it.
SLEEPS_S = (0.6, 0.9, 1.2, 2.0, 3.0)
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
        [described] = source.describe().values()  # before shutdown closes the source
        assert sampler.shutdown(timeout_s=5)

    windows = find_idle_windows(samples, threshold=0.10, min_idle_s=0.5)
    report_observations(nvml_gpu, samples, windows, sleeps, caplog, sampler.stats(), described)

    assert samples, "no samples at all"
    assert sampler.stats()["errors"] == {}
    period_s = described["sample_period_s"] or 1.0
    tolerance_ns = (period_s + EDGE_SLACK_S) * NS_PER_S
    for start, end in sleeps:
        matches = [
            w for w in windows if abs(w.start_ns - start) <= tolerance_ns and abs(w.end_ns - end) <= tolerance_ns
        ]
        assert len(matches) == 1, f"no idle window for the sleep {(end - start) / NS_PER_S:.2f} s: {windows}"
    for start, end in bursts:
        middle = (start + end) // 2
        assert not any(w.start_ns < middle < w.end_ns for w in windows), f"idle window inside a burst: {windows}"


def report_observations(device, samples, windows, sleeps, caplog, stats, described):
    """Print the answers to the five questions, for docs/gpu.md (run with -s)."""
    times = [s.timestamp_ns for s in samples]
    spacing = [(b - a) / NS_PER_S for a, b in zip(times, times[1:])]
    busy_spacing = [d for d in spacing if d < 0.45]
    clock_lines = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
    pynvml.nvmlInit()
    try:
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(device)
            if device.startswith("GPU-")
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
    print(f"\nGPU {device} ({name}), {len(samples)} samples, sampler stats {stats}, source {described}")
    # 1. Does the buffer run dry while idle? The source's samples inside the
    # sleeps are its own idle samples when it does, the driver's 0% when not.
    inside = [s for s in samples if any(a + 0.2 * NS_PER_S < s.timestamp_ns < b - 0.2 * NS_PER_S for a, b in sleeps)]
    spaced = [(b.timestamp_ns - a.timestamp_ns) / NS_PER_S for a, b in zip(inside, inside[1:])]
    print(
        f"1. while idle: {len(inside)} samples inside the sleeps, spaced {sorted(spaced)[:5]}... s "
        "(about the sample period: the driver keeps 0% samples; about the 0.5 s poll or none: it runs dry)"
    )
    if busy_spacing:
        print(
            f"2. sample period: spacing while busy median {statistics.median(busy_spacing):.4f} s, "
            f"min {min(busy_spacing):.4f} s, max {max(busy_spacing):.4f} s; measured by the source "
            f"{described['sample_period_s']} s"
        )
    if stamps:
        print(
            f"3. buffer depth: {len(stamps)} samples over {(stamps[-1] - stamps[0]) / 1e6:.2f} s "
            f"(the largest batch the source saw: {described['buffer_depth_seen']})"
        )
    print("4. clock:", clock_lines, described["clock"])
    period_ns = (described["sample_period_s"] or 1.0) * NS_PER_S
    found = [
        round((b - a) / NS_PER_S, 3)
        for a, b in sleeps
        if any(
            abs(w.start_ns - a) <= period_ns + EDGE_SLACK_S * NS_PER_S
            and abs(w.end_ns - b) <= period_ns + EDGE_SLACK_S * NS_PER_S
            for w in windows
        )
    ]
    print(f"5. shortest idle stretch found: {min(found) if found else None} s (found: {found})")
    for start, end in sleeps:
        print(f"sleep   {start / NS_PER_S:.3f} - {end / NS_PER_S:.3f}")
    for w in windows:
        print(f"window  {w.start_ns / NS_PER_S:.3f} - {w.end_ns / NS_PER_S:.3f} avg {w.utilization_avg:.3f}")
