"""The GPU sampler thread: polls on schedule, never raises, stops in bounded time."""

import logging
import threading
import time

import pytest

from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.records import GpuSample
from agent_otel.gpu.sampler import THREAD_NAME, GpuSampler
from agent_otel.gpu.timeline import IdleDetector


def wait_until(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


class ScriptedSource:
    """A source whose poll does what the test says, and counts closes."""

    kind = "simulated"

    def __init__(self, poll):
        self._poll = poll
        self.closed = 0

    def devices(self):
        return []

    def poll(self):
        return self._poll()

    def close(self):
        self.closed += 1


def test_an_agent_with_a_simulated_gpu_gets_idle_windows_from_the_sampler_thread():
    gpu = SimulatedGpu(sample_period_s=0.02)
    detector = IdleDetector(threshold=0.1, min_idle_s=0.2)
    windows = []
    threads = []

    def on_samples(samples):
        threads.append(threading.current_thread().name)
        windows.extend(detector.feed(samples))

    sampler = GpuSampler(gpu, 0.05, on_samples)
    sampler.start()
    assert THREAD_NAME in [t.name for t in threading.enumerate()]
    gpu.run_kernel(0.2)
    time.sleep(0.4)  # the GPU waits on a tool call
    gpu.run_kernel(0.2)
    assert wait_until(lambda: windows)
    assert sampler.shutdown(timeout_s=5)

    [window] = windows
    assert 0.4 - 2 * 0.02 <= window.seconds <= 0.4 + 0.3  # a busy machine may oversleep
    assert set(threads) == {THREAD_NAME}
    assert sampler.samples >= 40  # 0.8 s at 50 samples a second, at least
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]


def test_failing_polls_and_callbacks_are_logged_once_counted_and_survived(caplog):
    caplog.set_level(logging.WARNING, logger="agent_otel.gpu")
    calls = {"poll": 0}

    def flaky_poll():
        calls["poll"] += 1
        if calls["poll"] % 2:
            raise RuntimeError("driver hiccup")
        return [GpuSample("0", time.time_ns(), 0.5)]

    def broken_callback(samples):
        raise KeyError("bug in the consumer")

    sampler = GpuSampler(ScriptedSource(flaky_poll), 0.005, broken_callback)
    sampler.start()
    assert wait_until(lambda: sampler.polls >= 10)
    assert sampler.shutdown(timeout_s=5)

    stats = sampler.stats()
    assert stats["polls"] == calls["poll"]
    assert stats["errors"]["poll:RuntimeError"] == (calls["poll"] + 1) // 2
    assert stats["errors"]["callback:KeyError"] == calls["poll"] // 2
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "driver hiccup" in messages[0] and "poll:RuntimeError" in messages[0]


def test_shutdown_returns_in_bounded_time_even_if_a_poll_is_stuck(caplog):
    release = threading.Event()
    entered = threading.Event()

    def stuck_poll():
        entered.set()
        release.wait(30)
        return []

    source = ScriptedSource(stuck_poll)
    sampler = GpuSampler(source, 0.01, lambda samples: None)
    sampler.start()
    assert entered.wait(10)

    started = time.monotonic()
    stopped = sampler.shutdown(timeout_s=0.2)
    took = time.monotonic() - started

    assert stopped is False
    assert took < 2.0
    assert source.closed == 0  # not closed under a running poll
    assert sampler.running  # left behind; instrument()'s shutdown names it in its one line
    release.set()


def test_shutdown_takes_a_last_poll_then_closes_the_source():
    source = ScriptedSource(lambda: [])
    sampler = GpuSampler(source, 60, lambda samples: None)  # would not poll again for a minute
    sampler.start()
    assert wait_until(lambda: sampler.polls == 1)

    started = time.monotonic()
    assert sampler.shutdown(timeout_s=5)
    assert time.monotonic() - started < 2.0
    assert sampler.polls == 2  # the last poll, without waiting out the interval
    assert source.closed == 1


def test_source_errors_show_in_stats():
    gpu = SimulatedGpu()
    gpu.errors["gpu_lost"] += 1
    sampler = GpuSampler(gpu, 0.5, lambda samples: None)

    assert sampler.stats() == {"polls": 0, "samples": 0, "errors": {"gpu_lost": 1}}


@pytest.mark.parametrize("interval", [0, -1])
def test_the_interval_must_be_positive(interval):
    with pytest.raises(ValueError, match="interval_s"):
        GpuSampler(SimulatedGpu(), interval, lambda samples: None)
