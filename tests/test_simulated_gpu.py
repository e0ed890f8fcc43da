"""The simulated GPU: scripted and driven, sampled like NVML."""

import threading
import time

import pytest

from agent_otel.errors import ConfigError
from agent_otel.gpu.sources import open_gpu_source
from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.records import NS_PER_S
from agent_otel.gpu.timeline import find_idle_windows

MS = 1_000_000


class FakeClock:
    def __init__(self, start_ns=1_000 * NS_PER_S):
        self.now = start_ns

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += round(seconds * NS_PER_S)


def test_it_is_called_simulated_wherever_it_shows():
    gpu = open_gpu_source("simulated", devices=["0", "1"])

    assert gpu.kind == "simulated"
    assert [(d.index, d.uuid, d.name) for d in gpu.devices()] == [
        ("0", "GPU-simulated-0", "Simulated GPU"),
        ("1", "GPU-simulated-1", "Simulated GPU"),
    ]


def test_scripted_phases_give_the_average_of_each_sample_period():
    clock = FakeClock()
    start = clock.now
    gpu = SimulatedGpu([(1.0, 0.9), (0.5, 0.0), (0.6, 1.0)], sample_period_s=0.25, clock=clock)

    clock.advance(2.5)
    samples = gpu.poll()

    assert [s.timestamp_ns - start for s in samples] == [i * 250 * MS for i in range(1, 11)]
    assert [round(s.utilization, 6) for s in samples] == [
        0.9,
        0.9,
        0.9,
        0.9,  # 0-1 s at 90%
        0.0,
        0.0,  # 1-1.5 s idle
        1.0,
        1.0,  # 1.5-2 s busy
        0.4,  # 2-2.1 s busy, then the script is over: idle
        0.0,
    ]
    assert gpu.poll() == []  # nothing new until time passes


def test_driven_busy_time_is_spread_over_the_periods_it_touches():
    clock = FakeClock()
    gpu = SimulatedGpu(sample_period_s=0.25, clock=clock)

    clock.advance(0.1)
    with gpu.busy():
        clock.advance(0.25)  # busy from 0.10 to 0.35 s
    clock.advance(0.4)

    assert [round(s.utilization, 6) for s in gpu.poll()] == [0.6, 0.4, 0.0]


def test_busy_nests_across_threads_and_the_gpu_is_idle_once_all_have_left():
    gpu = SimulatedGpu(sample_period_s=0.01)
    inside = threading.Barrier(8)

    def fake_model_call():
        with gpu.busy():
            inside.wait(timeout=10)  # all eight overlap
            time.sleep(0.02)

    threads = [threading.Thread(target=fake_model_call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.05)

    samples = gpu.poll()
    assert max(s.utilization for s in samples) == 1.0
    assert [s.utilization for s in samples[-2:]] == [0.0, 0.0]


def test_a_pause_between_two_model_calls_becomes_one_idle_window():
    clock_reads = []

    def clock():
        clock_reads.append(time.time_ns())
        return clock_reads[-1]

    gpu = SimulatedGpu(sample_period_s=0.05, clock=clock)
    gpu.run_kernel(0.3)
    time.sleep(0.6)  # the agent runs a slow tool here
    gpu.run_kernel(0.3)
    samples = gpu.poll()

    # reads: creation, busy, idle (truth: start), busy (truth: end), idle, poll
    idle_from, idle_to = clock_reads[2], clock_reads[3]
    [window] = find_idle_windows(samples, threshold=0.1, min_idle_s=0.3)
    assert abs(window.start_ns - idle_from) <= 50 * MS
    assert abs(window.end_ns - idle_to) <= 50 * MS
    assert idle_to - idle_from >= 600 * MS


def test_phases_and_specs_are_checked():
    with pytest.raises(ValueError, match="utilization in 0..1"):
        SimulatedGpu([(1.0, 90)])
    with pytest.raises(
        ConfigError, match='\'nvidia\'.*"auto", "nvml", "simulated", "replay:PATH", "model_server" or "off"'
    ):
        open_gpu_source("nvidia")
    assert open_gpu_source("off") is None
