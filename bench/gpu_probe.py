"""Every real-GPU check agent-otel needs, in one run, as JSON.

Usage (on a machine with an NVIDIA GPU; about 45 s)::

    python bench/gpu_probe.py --out gpu_probe.json

It ends with ``answers``, the five questions docs/gpu.md (and issue 17)
ask of a real driver:

1. ``buffer_when_idle``: does ``nvmlDeviceGetSamples`` run dry while the
   GPU idles (``NotFound`` or nothing), or keep 0% samples?
2. ``sample_period_s``: the spacing of samples while busy.
3. ``buffer_depth``: how many samples the ring holds (and how many seconds).
4. ``clock``: Unix epoch or CLOCK_BOOTTIME timestamps.
5. ``shortest_idle_found_s``: the shortest sleep of 0.3-3 s between bursts
   that agent-otel's NVML source, sampler and timeline find as an idle
   window at their defaults, with both edges within one sample period.

What it measures besides, for docs/gpu.md:

- NVML itself: driver and NVML versions, the devices, whether GPM metrics
  are supported, and the cost of one ``nvmlDeviceGetUtilizationRates`` and
  one ``nvmlDeviceGetSamples`` call.
- ``nvmlDeviceGetSamples`` at rest: does an idle GPU's buffer run dry
  (``NotFound``, empty, or 0% samples), the buffer depth, and which clock
  the timestamps are on (Unix epoch or CLOCK_BOOTTIME).
- Under a real workload (PyTorch matrix products alternating with sleeps of
  known length): the spacing of samples while busy, what the buffer gives
  while idle, and the idle windows agent-otel's NVML source, sampler and
  timeline find, against the sleeps (start and end errors in seconds).

Each section records its own error and the rest still runs, so a partial
answer still comes back. It needs ``nvidia-ml-py``; PyTorch for the
workload; and the agent-otel checkout (installed, or run from the
repository root) for the end-to-end part.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BURST_S = 1.5
# Idle stretches from below the minimum idle time (0.5 s) to well above it:
# the shortest found answers question 5.
SLEEPS_S = (0.3, 0.45, 0.6, 0.9, 1.2, 2.0, 3.0)
RAW_POLL_S = 0.1
# A window edge may be off by one sample period; this much more is the
# workload's own start and stop (a CUDA synchronize, the Python loop).
EDGE_SLACK_S = 0.1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_probe.json", help="where to write the JSON summary")
    parser.add_argument("--device", default="0", help="NVML index or UUID of the GPU to probe")
    args = parser.parse_args()
    result = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    section(result, "nvml", probe_nvml, args.device)
    if "handle_ok" in result.get("nvml", {}):
        section(result, "at_rest", probe_at_rest, args.device)
        section(result, "workload", probe_workload, args.device)
        section(result, "buffer_capacity", probe_capacity, args.device)
    section(result, "answers", answers, result)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    print("\nThe five questions (docs/gpu.md):")
    for key, value in result["answers"].items():
        print(f"  {key}: {value}")
    print(f"\nwritten to {args.out}")
    return 0


def section(result: dict, name: str, probe, *args) -> None:
    started = time.monotonic()
    try:
        result[name] = probe(*args)
    except Exception as exc:
        result[name] = {"error": repr(exc), "traceback": traceback.format_exc(limit=5)}
    result[name]["seconds"] = round(time.monotonic() - started, 2)


def nvml_handle(pynvml, device: str):
    if device.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(device))
    return pynvml.nvmlDeviceGetHandleByUUID(device)


def probe_nvml(device: str) -> dict:
    import pynvml

    out: dict = {"nvidia_ml_py": getattr(pynvml, "__version__", None)}
    pynvml.nvmlInit()
    out["driver"] = pynvml.nvmlSystemGetDriverVersion()
    out["nvml"] = pynvml.nvmlSystemGetNVMLVersion()
    out["devices"] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        entry = {"index": i, "name": pynvml.nvmlDeviceGetName(h), "uuid": pynvml.nvmlDeviceGetUUID(h)}
        try:
            entry["mig_mode"] = pynvml.nvmlDeviceGetMigMode(h)[0]
        except pynvml.NVMLError as exc:
            entry["mig_mode"] = str(exc)
        out["devices"].append(entry)
    h = nvml_handle(pynvml, device)
    out["handle_ok"] = True
    try:
        out["gpm_supported"] = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except Exception as exc:
        out["gpm_supported"] = repr(exc)
    newest = max((s.timeStamp for s in samples_or_empty(pynvml, h, 0)), default=0)
    out["cost_us"] = {
        "nvmlDeviceGetUtilizationRates": median_call_us(lambda: pynvml.nvmlDeviceGetUtilizationRates(h)),
        "nvmlDeviceGetSamples_new_only": median_call_us(lambda: samples_or_empty(pynvml, h, newest)),
        "nvmlDeviceGetSamples_whole_buffer": median_call_us(lambda: samples_or_empty(pynvml, h, 0), calls=50),
    }
    return out


def median_call_us(call, calls: int = 200) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return round(statistics.median(times) / 1000, 2)


def samples_or_empty(pynvml, h, last_seen: int):
    try:
        return pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_seen)[1]
    except pynvml.NVMLError_NotFound:
        return []


def clocks_now_us() -> dict:
    out = {"epoch": time.time_ns() // 1000}
    if hasattr(time, "CLOCK_BOOTTIME"):
        out["boottime"] = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000
    if hasattr(time, "CLOCK_MONOTONIC"):
        out["monotonic"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return out


def describe_buffer(samples) -> dict:
    stamps = sorted(s.timeStamp for s in samples)
    values = [s.sampleValue.uiVal for s in samples]
    out: dict = {"count": len(stamps)}
    if stamps:
        now = clocks_now_us()
        out["newest_raw_us"] = stamps[-1]
        out["span_s"] = (stamps[-1] - stamps[0]) / 1e6
        out["newest_age_s_by_clock"] = {name: (value - stamps[-1]) / 1e6 for name, value in now.items()}
        out["clock"] = min(now, key=lambda name: abs(now[name] - stamps[-1]))
        out["values"] = {"min": min(values), "max": max(values), "zeros": values.count(0)}
        spacing = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
        if spacing:
            out["spacing_s"] = spacing_stats(spacing)
    return out


def spacing_stats(spacing: list[float]) -> dict:
    return {"median": statistics.median(spacing), "min": min(spacing), "max": max(spacing), "n": len(spacing)}


def probe_at_rest(device: str) -> dict:
    """The GPU with nothing running: what does the buffer hold after 3 s of rest?"""
    import pynvml

    h = nvml_handle(pynvml, device)
    time.sleep(3.0)
    out: dict = {}
    try:
        _, buffered = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        out["whole_buffer"] = describe_buffer(buffered)
    except pynvml.NVMLError as exc:
        out["whole_buffer"] = {"raised": type(exc).__name__}
    newest = out["whole_buffer"].get("newest_raw_us", 0)
    try:
        _, fresh = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, newest)
        out["after_newest"] = {"count": len(fresh)}
    except pynvml.NVMLError as exc:
        out["after_newest"] = {"raised": type(exc).__name__}
    out["utilization_rates_gpu"] = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
    return out


def probe_capacity(device: str) -> dict:
    """What NVML itself says the ring holds: ``nvmlDeviceGetSamples`` called
    with no buffer returns the number of samples to allocate (pynvml does
    this first call itself and keeps the answer to itself, so it is made
    here through the same function pointer)."""
    import ctypes

    import pynvml

    h = nvml_handle(pynvml, device)
    out: dict = {}
    try:
        function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        for label, last_seen in (("from_0", 0), ("from_now", time.time_ns() // 1000)):
            count, value_type = ctypes.c_uint(0), ctypes.c_int(0)
            ret = function(
                h,
                pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                ctypes.c_ulonglong(last_seen),
                ctypes.byref(value_type),
                ctypes.byref(count),
                None,
            )
            out[label] = {"return": int(ret), "count": count.value}
    except Exception as exc:  # a private name of pynvml: may move
        out["error"] = repr(exc)
    return out


def answers(result: dict) -> dict:
    """The five questions, from what the sections measured (None where a section failed)."""
    workload = result.get("workload", {})
    raw = workload.get("raw", {})
    rest = result.get("at_rest", {})
    agent = workload.get("agent_otel", {}) if isinstance(workload.get("agent_otel"), dict) else {}
    described = next(iter(agent.get("source", {}).values()), {}) if agent.get("source") else {}
    idle = raw.get("idle", {})
    outcomes = idle.get("call_outcomes", [])  # what GetSamples answered during the sleeps
    in_sleeps, values = idle.get("samples", 0), idle.get("values", {})
    if not raw:
        dry = None
    elif not in_sleeps:
        dry = f"runs dry while idle (GetSamples during the sleeps answered: {outcomes})"
    elif values.get("max", 0) == 0:
        dry = f"keeps 0% samples while idle ({in_sleeps} samples inside the sleeps, all 0%)"
    else:
        dry = f"keeps samples while idle ({in_sleeps} inside the sleeps, values {values})"
    buffered = workload.get("buffer_after_workload", {})
    capacity = result.get("buffer_capacity", {})
    found = agent.get("sleeps_vs_windows", [])
    within = [m["sleep_s"] for m in found if m.get("within_one_period")]
    return {
        "buffer_when_idle": dry,
        "buffer_at_rest": rest.get("whole_buffer"),
        "sample_period_s": {
            "busy_spacing": raw.get("busy", {}).get("spacing_s"),
            "measured_by_agent_otel": described.get("sample_period_s"),
        },
        "buffer_depth": {
            "samples_after_workload": buffered.get("count"),
            "span_s": buffered.get("span_s"),
            "nvml_says_allocate": capacity,
            "largest_batch_agent_otel_saw": described.get("buffer_depth_seen"),
        },
        "clock": {"raw": raw.get("clock"), "agent_otel": described.get("clock")},
        "shortest_idle_found_s": min(within) if within else None,
        "sleeps_found": within,
        "sleeps_missed": [m["sleep_s"] for m in found if not m.get("within_one_period")],
    }


class RawPoller(threading.Thread):
    """Polls GetSamples every RAW_POLL_S with last_seen, recording every answer."""

    def __init__(self, pynvml, h):
        super().__init__(name="gpu-probe-raw", daemon=True)
        self.pynvml, self.h = pynvml, h
        self.stop = threading.Event()
        self.calls: list[dict] = []
        self.samples: list[tuple[int, int]] = []

    def run(self) -> None:
        last_seen = 0
        while not self.stop.wait(RAW_POLL_S):
            wall = time.time_ns()
            try:
                _, got = self.pynvml.nvmlDeviceGetSamples(self.h, self.pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_seen)
                outcome = len(got)
            except self.pynvml.NVMLError as exc:
                got, outcome = [], type(exc).__name__
            fresh = [(s.timeStamp, s.sampleValue.uiVal) for s in got if s.timeStamp > last_seen]
            if fresh:
                last_seen = max(t for t, _ in fresh)
            self.samples.extend(fresh)
            self.calls.append({"wall_ns": wall, "outcome": outcome})


def probe_workload(device: str) -> dict:
    import pynvml
    import torch

    h = nvml_handle(pynvml, device)
    out: dict = {"torch": torch.__version__, "cuda_device": torch.cuda.get_device_name(0)}
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def burst(seconds: float) -> None:
        nonlocal x
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(4):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()

    burst(0.5)  # CUDA start-up outside the measured part
    end_to_end = start_agent_otel(device)
    out["agent_otel"] = end_to_end.get("error", "running")
    raw = RawPoller(pynvml, h)
    raw.start()
    sleeps, bursts = [], []
    for pause in (None, *SLEEPS_S):
        if pause is not None:
            started = time.time_ns()
            time.sleep(pause)
            sleeps.append((started, time.time_ns()))
        started = time.time_ns()
        burst(BURST_S)
        bursts.append((started, time.time_ns()))
    time.sleep(1.5)
    raw.stop.set()
    raw.join(5)
    out["sleeps_epoch_s"] = [(a / 1e9, b / 1e9) for a, b in sleeps]
    out["bursts_epoch_s"] = [(a / 1e9, b / 1e9) for a, b in bursts]
    out["raw"] = summarize_raw(raw, sleeps, bursts)
    try:
        _, buffered = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
        out["buffer_after_workload"] = describe_buffer(buffered)
    except pynvml.NVMLError as exc:
        out["buffer_after_workload"] = {"raised": type(exc).__name__}
    out["agent_otel"] = finish_agent_otel(end_to_end, sleeps)
    return out


def summarize_raw(raw: RawPoller, sleeps, bursts) -> dict:
    out: dict = {"calls": len(raw.calls), "samples": len(raw.samples)}
    outcomes: dict = {}
    for call in raw.calls:
        key = (
            str(call["outcome"])
            if isinstance(call["outcome"], str)
            else ("empty" if call["outcome"] == 0 else "samples")
        )
        outcomes[key] = outcomes.get(key, 0) + 1
    out["call_outcomes"] = outcomes
    if not raw.samples:
        return out
    newest = max(t for t, _ in raw.samples)
    now = clocks_now_us()
    clock = min(now, key=lambda name: abs(now[name] - newest))
    out["clock"] = clock
    offset_ns = time.time_ns() - now[clock] * 1000 if clock != "epoch" else 0
    converted = [(t * 1000 + offset_ns, v) for t, v in raw.samples]

    def inside(spans, margin_ns):
        return [(t, v) for t, v in converted if any(a + margin_ns <= t <= b - margin_ns for a, b in spans)]

    busy = inside(bursts, 300_000_000)
    idle = inside(sleeps, 300_000_000)
    busy_times = sorted(t for t, _ in busy)
    spacing = [(b - a) / 1e9 for a, b in zip(busy_times, busy_times[1:]) if b - a < 1e9]
    out["busy"] = {"samples": len(busy), "values": value_stats([v for _, v in busy])}
    if spacing:
        out["busy"]["spacing_s"] = spacing_stats(spacing)
    out["idle"] = {"samples": len(idle), "values": value_stats([v for _, v in idle])}
    calls_in_sleeps = [c["outcome"] for c in raw.calls if any(a <= c["wall_ns"] <= b for a, b in sleeps)]
    out["idle"]["call_outcomes"] = sorted({str(o) for o in calls_in_sleeps})
    return out


def value_stats(values: list[int]) -> dict:
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def import_agent_otel():
    """Import the toolkit's GPU modules: installed, or straight from this checkout.

    They need only the standard library and pynvml, but ``agent_otel``'s
    ``__init__`` pulls in OpenTelemetry, which a bare GPU host lacks: the
    fallback registers both packages by path without running their
    ``__init__`` files.
    """
    try:
        import agent_otel.gpu.nvml  # noqa: F401
    except ImportError:
        for name, folder in (("agent_otel", "agent_otel"), ("agent_otel.exporters", "exporters")):
            package = types.ModuleType(name)
            package.__path__ = [str(ROOT / folder)]
            sys.modules[name] = package
    from agent_otel.gpu.nvml import NvmlSource
    from agent_otel.gpu.sampler import GpuSampler
    from agent_otel.gpu.timeline import find_idle_windows

    return NvmlSource, GpuSampler, find_idle_windows


def start_agent_otel(device: str) -> dict:
    """agent-otel's own path at its defaults: the NVML source, the sampler
    thread polling every 0.5 s, and (afterwards) the idle detector."""
    try:
        NvmlSource, GpuSampler, find_idle_windows = import_agent_otel()
        source = NvmlSource([device])
        samples: list = []
        sampler = GpuSampler(source, 0.5, samples.extend)
        sampler.start()
        return {
            "sampler": sampler,
            "source": source,
            "samples": samples,
            "find": find_idle_windows,
            "devices": source.devices(),
            "reason": source.reason,
        }
    except Exception as exc:
        return {"error": repr(exc)}


def finish_agent_otel(state: dict, sleeps) -> dict:
    if "error" in state:
        return {"error": state["error"]}
    sampler = state["sampler"]
    described = state["source"].describe()  # before shutdown closes the source
    stopped = sampler.shutdown(timeout_s=5)
    samples = state["samples"]
    windows = state["find"](samples, threshold=0.10, min_idle_s=0.5)  # the defaults
    finest = state["find"](samples, threshold=0.10, min_idle_s=0.001)  # every idle stretch the samples show
    period_s = next(iter(described.values()), {}).get("sample_period_s") or 1.0
    tolerance_ns = (period_s + EDGE_SLACK_S) * 1e9
    matched = []
    for start, end in sleeps:
        best = min(windows, key=lambda w: abs(w.start_ns - start) + abs(w.end_ns - end), default=None)
        near = (
            best is not None and abs(best.start_ns - start) <= tolerance_ns and abs(best.end_ns - end) <= tolerance_ns
        )
        any_stretch = min(finest, key=lambda w: abs(w.start_ns - start) + abs(w.end_ns - end), default=None)
        matched.append(
            {
                "sleep_s": round((end - start) / 1e9, 3),
                "window_s": best.seconds if near else None,
                "start_error_s": (best.start_ns - start) / 1e9 if near else None,
                "end_error_s": (best.end_ns - end) / 1e9 if near else None,
                "within_one_period": near,
                "stretch_at_min_idle_0_s": any_stretch.seconds
                if any_stretch is not None and abs(any_stretch.start_ns - start) <= tolerance_ns
                else None,
            }
        )
    return {
        "stopped": stopped,
        "stats": sampler.stats(),
        "devices": [d._asdict() for d in state["devices"]],
        "source": described,
        "reason_off": state["reason"],
        "samples": len(samples),
        "windows": [(w.start_ns / 1e9, w.end_ns / 1e9, round(w.utilization_avg, 4)) for w in windows],
        "edge_tolerance_s": period_s + EDGE_SLACK_S,
        "sleeps_vs_windows": matched,
    }


if __name__ == "__main__":
    sys.exit(main())
