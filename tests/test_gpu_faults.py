"""GPU faults are seen, and never hold up the agent.

Against faulty stand-ins for NVML (``pynvml`` replaced in ``sys.modules``;
its errors are the real ``NVMLError_*`` classes and its samples the real
ctypes structures), through the real ``agent_otel.gpu.nvml.NvmlSource``:
samples stamped outside the poll's window, a GPU lost or failing on every
poll, a poll that does not return, an ``nvmlInit`` or ``nvmlShutdown`` that
hangs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py provides the real NVML error classes")

from opentelemetry import trace as trace_api  # noqa: E402

import agent_otel  # noqa: E402
from agent_otel.attribution.engine import BlameEngine  # noqa: E402
from agent_otel.attribution.live import LiveTimeline  # noqa: E402
from agent_otel.exporters.prometheus import LiveReadings, Metrics  # noqa: E402
from agent_otel.gpu.nvml import NvmlSource  # noqa: E402
from agent_otel.gpu.sampler import GpuSampler  # noqa: E402
from agent_otel.records import NS_PER_S, ToolCall  # noqa: E402
from agent_otel.semconv import METRIC_GPU_ERRORS, METRIC_GPU_STATE  # noqa: E402
from tests.helpers.nvml_driver import DriverGpu, StandInNvml, VirtualClock  # noqa: E402

# The stand-in driver stamps its samples with the wall clock, as NVML does.
pytestmark = pytest.mark.usefixtures("wall_clock_on_the_timeline")

PERIOD_S = 1 / 6
POLL_NS = NS_PER_S // 2


class FaultyNvml(StandInNvml):
    """The stand-in driver, with faults: ``extra`` samples (raw µs, percent)
    returned with every answer of GetSamples (a bad sample stays in NVML's
    ring, so the driver returns it on every poll), ``samples_error`` raised
    by GetSamples, and ``hang`` (an Event) that GetSamples, nvmlInit or
    nvmlShutdown waits for."""

    def __init__(self, gpus):
        super().__init__(gpus)
        self.extra: list[tuple[int, int]] = []
        self.samples_error: Exception | None = None
        self.hang: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {name: threading.Event() for name in ("init", "samples", "shutdown")}

    def _maybe_hang(self, name):
        self.entered[name].set()
        if name in self.hang:
            assert self.hang[name].wait(60)

    def nvmlInit(self):
        self._maybe_hang("init")

    def nvmlShutdown(self):
        self._maybe_hang("shutdown")

    def nvmlDeviceGetSamples(self, gpu, sampling_type, last_seen):
        self._maybe_hang("samples")
        if self.samples_error is not None:
            raise self.samples_error
        try:
            value_type, samples = super().nvmlDeviceGetSamples(gpu, sampling_type, last_seen)
        except pynvml.NVMLError_NotFound:
            value_type, samples = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, []
        for stamp, percent in self.extra:
            sample = pynvml.c_nvmlSample_t()
            sample.timeStamp = stamp
            sample.sampleValue.uiVal = percent
            samples.append(sample)
        if not samples:
            raise pynvml.NVMLError_NotFound()
        return value_type, samples


def busy_run(monkeypatch, inject, polls_before=6, polls_after=12):
    """A GPU busy the whole time, a tool call in flight the whole time, polled
    every 0.5 s; ``inject(nvml, gpu)`` adds the fault after ``polls_before``
    polls. Returns (source, samples before, samples after, the engine's idle
    seconds and blame)."""
    clock = VirtualClock()
    gpu = DriverGpu(clock, period_s=PERIOD_S)
    nvml = FaultyNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source = NvmlSource(clock=clock)
    engine = BlameEngine(max_gap_s=None)
    call = ToolCall(tool="fetch", executor="direct", submit_ns=clock(), start_ns=clock())
    before, after, idle_s, blocked_s = [], [], 0.0, 0.0
    for poll in range(polls_before + polls_after):
        if poll == polls_before:
            inject(nvml, gpu)
        clock.advance_to(clock() + POLL_NS)
        samples = source.poll()
        (before if poll < polls_before else after).extend(samples)
        update = engine.feed(samples, [call])
        idle_s += sum(update.idle.idle_s.values())
        blocked_s += sum(update.idle.blocked_s.values())
    return source, before, after, idle_s, blocked_s


@pytest.mark.parametrize(
    "stamp",
    [
        pytest.param(lambda gpu: gpu.clock() // 1000 + 3600 * 10**6, id="an hour ahead"),
        pytest.param(lambda gpu: 2**64 - 1, id="2**64-1"),
    ],
)
@pytest.mark.parametrize("percent", [0, 100])
def test_a_sample_stamped_ahead_is_refused_counted_once_and_sampling_goes_on(monkeypatch, caplog, stamp, percent):
    caplog.set_level(logging.WARNING, logger="agent_otel.gpu")
    states = []

    def inject(nvml, gpu):
        nvml.extra.append((stamp(gpu), percent))

    source, before, after, idle_s, blocked_s = busy_run(monkeypatch, inject)
    states.append(source.states())
    assert before and all(s.utilization == 1.0 for s in before)
    # Every sample after the bad one is read (about three per poll), none of them idle.
    assert len(after) >= 12 * 2 and all(s.utilization == 1.0 for s in after), after
    assert max(s.timestamp_ns for s in after) <= source._clock()
    assert idle_s == 0.0 and blocked_s == 0.0
    assert source.errors == {"timestamp_ahead": 1}  # returned on every poll, counted once
    assert states == [{"0": ("ok", "")}]  # refused when it came; the polls since were good
    [line] = [r.getMessage() for r in caplog.records if "timestamp_ahead" in r.getMessage()]
    assert "refused" in line


def test_a_sample_older_than_the_last_one_read_is_refused_and_counted(monkeypatch):
    def inject(nvml, gpu):
        nvml.extra.append((gpu.clock() // 1000 - 10 * 10**6, 0))  # 10 s in the past, an idle reading

    source, _, after, idle_s, _ = busy_run(monkeypatch, inject)
    assert len(after) >= 24 and all(s.utilization == 1.0 for s in after)
    assert idle_s == 0.0
    assert source.errors == {"timestamp_behind": 1}


def test_a_driver_whose_every_sample_is_stamped_ahead_gives_missing_data_not_idle(monkeypatch):
    """Each poll brings new samples, all stamped an hour ahead: the GPU made
    samples (it was not idle), and what it did is unknown."""

    clock = VirtualClock()
    gpu = DriverGpu(clock, period_s=PERIOD_S)
    nvml = FaultyNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    source = NvmlSource(clock=clock)
    engine = BlameEngine(max_gap_s=None)
    idle_s = missing_s = 0.0
    states = []
    for poll in range(12):
        clock.advance_to(clock() + POLL_NS)
        if poll >= 4:  # the driver's clock broke: every new sample is stamped an hour ahead
            gpu.ring.clear()
            gpu.next_ns = clock() + 10 * 3600 * NS_PER_S
            nvml.extra = [(clock() // 1000 + 3600 * 10**6 + poll, 100)]
        update = engine.feed(source.poll(), [])
        idle_s += sum(update.idle.idle_s.values())
        missing_s += sum(update.missing_s.values())
        states.append(source.states()["0"])
    assert idle_s == 0.0
    assert missing_s >= 3.0  # 8 polls of 0.5 s, less the first period
    assert source.errors == {"timestamp_ahead": 8}
    assert states[:4] == [("ok", "")] * 4 and states[4:] == [("error", "timestamp_ahead")] * 8


def scrape(metrics: Metrics) -> dict:
    values = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name in (METRIC_GPU_STATE, METRIC_GPU_ERRORS):
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def timeline_on(monkeypatch, nvml_gpus=1):
    clock = VirtualClock()
    gpus = [DriverGpu(clock, index=i, period_s=PERIOD_S) for i in range(nvml_gpus)]
    nvml = FaultyNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    metrics = Metrics(live=LiveReadings(gpu_states=lambda: timeline.gpu_states()))  # as instrument() wires it
    timeline = LiveTimeline(NvmlSource(clock=clock), tracer=trace_api.NoOpTracer(), metrics=metrics)
    return clock, nvml, metrics, timeline


@pytest.mark.parametrize(
    "error, state, reason",
    [(pynvml.NVMLError_GpuIsLost, "lost", "gpu_lost"), (pynvml.NVMLError_Unknown, "error", "nvml_error")],
)
def test_a_lost_or_failing_gpu_shows_on_metrics_at_its_first_failed_poll(monkeypatch, error, state, reason):
    clock, nvml, metrics, timeline = timeline_on(monkeypatch)
    clock.advance_to(clock() + POLL_NS)
    timeline.sampler._poll_once()  # the sampler thread's loop body
    assert scrape(metrics)[(METRIC_GPU_STATE, (("gpu", "0"), ("reason", ""), ("state", "ok")))] == 1
    nvml.samples_error = error()
    for poll in range(3):
        clock.advance_to(clock() + POLL_NS)
        timeline.sampler._poll_once()  # no samples come: counted all the same
        values = scrape(metrics)
        assert values[(METRIC_GPU_STATE, (("gpu", "0"), ("reason", reason), ("state", state)))] == 1
        assert len([key for key in values if key[0] == METRIC_GPU_STATE]) == 1  # one series per GPU
        expected = 1 if state == "lost" else poll + 1  # a lost GPU is not polled again
        assert values[(METRIC_GPU_ERRORS, (("reason", reason),))] == expected
    if state == "error":  # it recovers: ok again
        nvml.samples_error = None
        clock.advance_to(clock() + POLL_NS)
        timeline.sampler._poll_once()
        assert scrape(metrics)[(METRIC_GPU_STATE, (("gpu", "0"), ("reason", ""), ("state", "ok")))] == 1


def test_a_poll_stuck_in_the_driver_shows_as_stuck_while_it_lasts(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="agent_otel.gpu")
    clock = VirtualClock()
    nvml = FaultyNvml([DriverGpu(clock, index=0, period_s=PERIOD_S), DriverGpu(clock, index=1, period_s=PERIOD_S)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    seconds = [0.0]  # the sampler's clock: the test moves it
    metrics = Metrics(live=LiveReadings(gpu_states=lambda: timeline.gpu_states()))  # as instrument() wires it
    timeline = LiveTimeline(NvmlSource(clock=clock), tracer=trace_api.NoOpTracer(), metrics=metrics)
    sampler = timeline.sampler = GpuSampler(
        timeline.source, 0.5, timeline.on_samples, timeline._count_source_errors, clock=lambda: seconds[0]
    )
    release = nvml.hang["samples"] = threading.Event()
    poller = threading.Thread(target=sampler._poll_once, daemon=True)
    try:
        poller.start()
        assert nvml.entered["samples"].wait(30)
        seconds[0] = 1.9  # under 4 polls of 0.5 s: not stuck yet
        assert {state for _, state, _ in timeline.gpu_states()} == {"ok"}
        seconds[0] = 2.1
        assert timeline.gpu_states() == [
            ("0", "stuck", "nvmlDeviceGetSamples"),
            ("1", "stuck", "nvmlDeviceGetSamples"),
        ]
        key = (METRIC_GPU_STATE, (("gpu", "1"), ("reason", "nvmlDeviceGetSamples"), ("state", "stuck")))
        assert scrape(metrics)[key] == 1
        timeline._check_stuck([])  # the pipeline's drain, every 0.25 s: said once
        stuck_lines = [r.getMessage() for r in caplog.records if "has not returned" in r.getMessage()]
        assert len(stuck_lines) == 1 and "nvmlDeviceGetSamples" in stuck_lines[0]
    finally:
        release.set()
        poller.join(30)
    assert {state for _, state, _ in timeline.gpu_states()} == {"ok"}
    assert any("the stuck poll returned" in r.getMessage() for r in caplog.records)


def test_a_hung_nvml_shutdown_does_not_hold_up_the_agents_shutdown(monkeypatch, caplog):
    clock = VirtualClock()
    nvml = FaultyNvml([DriverGpu(clock, period_s=PERIOD_S)])
    release = nvml.hang["shutdown"] = threading.Event()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    handle = agent_otel.instrument(traces_exporters="none", frameworks=(), gpu="nvml", gpu_poll_interval=0.05)
    try:
        assert handle.wait_for_gpu(30) is not None
        with caplog.at_level(logging.WARNING, logger="agent_otel"):
            assert handle.shutdown(timeout_s=1.0) is False  # bounded: returns, and says what still runs
        assert nvml.entered["shutdown"].is_set()
        [line] = [r.getMessage() for r in caplog.records if "shutdown gave up after" in r.getMessage()]
        assert "GPU sampling" in line
        taken = float(line.split("gave up after ")[1].split(" s")[0])
        assert taken < 1.0  # the time it took (the GPU part is given half), not the timeout
    finally:
        release.set()


HUNG_INIT = """
    import json, os, sys, threading, time
    sys.path.insert(0, {helpers!r})
    import pynvml as real
    from nvml_driver import DriverGpu, StandInNvml

    entered, release = threading.Event(), threading.Event()

    class WedgedDriver(StandInNvml):
        # A wedged driver: nvmlInit, or every read of samples, never returns (until the test ends).
        def nvmlInit(self):
            if {hang!r} == "nvmlInit":
                entered.set()
                release.wait(120)

        def nvmlDeviceGetSamples(self, *args):
            if {hang!r} == "nvmlDeviceGetSamples":
                entered.set()
                release.wait(120)
            return super().nvmlDeviceGetSamples(*args)

    sys.modules["pynvml"] = WedgedDriver([DriverGpu(time.time_ns)])
    import agent_otel
    from agent_otel.support import forks
    from agent_otel.wiring import instrumentation

    instrumentation.GpuStart.STUCK_S = 0.2  # 5 s, in use
    started = time.monotonic()
    handle = agent_otel.instrument(traces_file={traces!r}, traces_exporters="none", frameworks=(), gpu={gpu!r})
    instrument_s = time.monotonic() - started

    @agent_otel.tool
    def search(q):
        return q

    assert entered.wait(60)
    search("parent")
    forks_s, codes = [], []
    for _ in range(2):
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            search("child")
            # Its own search for the GPU hangs too (it forked before the search found one);
            # its spans go out meanwhile. (shutdown() would give the search half its time first.)
            os._exit(0 if handle.force_flush(30) else 3)
        forks_s.append(time.monotonic() - started)
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    hung = not release.is_set() and (handle.gpu_timeline is None) == ({hang!r} == "nvmlInit")
    deadline = time.monotonic() + 10
    counted = None
    while {hang!r} == "nvmlInit" and time.monotonic() < deadline and not counted:
        time.sleep(0.05)
        counted = handle.metrics.registry.get_sample_value("agent_otel_gpu_errors_total", {{"reason": "nvml_init_stuck"}})
    handle.shutdown(timeout_s=1)
    release.set()
    print(json.dumps({{"instrument_s": instrument_s, "forks_s": forks_s, "codes": codes, "hung": hung, "counted": counted,
                      "fork_wait_s": forks.FORK_WAIT_S}}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is not available on this platform")
@pytest.mark.parametrize("gpu, hang", [("auto", "nvmlInit"), ("nvml", "nvmlInit"), ("nvml", "nvmlDeviceGetSamples")])
def test_a_hung_nvml_call_holds_up_neither_instrument_nor_fork_nor_tool_calls(tmp_path, gpu, hang):
    traces = tmp_path / "traces.jsonl"
    helpers = os.path.join(os.path.dirname(__file__), "helpers")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    code = textwrap.dedent(HUNG_INIT.format(helpers=helpers, traces=str(traces), gpu=gpu, hang=hang))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["hung"] and outcome["codes"] == [0, 0], outcome
    if hang == "nvmlInit":  # said and counted while it lasts (the stuck poll: test_a_poll_stuck_...)
        assert outcome["counted"] == 1, outcome
        assert result.stderr.count("NVML has not answered") == 1, result.stderr
    # instrument() returned while the call was still hung (it returns only after the script's
    # end otherwise: the run would time out); a fork that waited for the search would take
    # FORK_WAIT_S (5 s).
    assert max(outcome["forks_s"]) < outcome["fork_wait_s"] / 2, outcome
    names = [span["name"] for line in traces.read_text().splitlines() for span in _spans(json.loads(line))]
    assert names.count("execute_tool search") == 3


def _spans(request: dict) -> list[dict]:
    return [span for rs in request["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]


def test_the_blame_service_shows_a_lost_gpu_at_once_not_a_watermark_late(monkeypatch):
    from agent_otel.attribution.service import PoolTimeline

    clock = VirtualClock()
    nvml = FaultyNvml([DriverGpu(clock, period_s=PERIOD_S)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    metrics = Metrics(live=LiveReadings(gpu_states=lambda: timeline.gpu_states()))  # as the blame service wires it
    timeline = PoolTimeline(
        NvmlSource(clock=clock), pool="vllm-a:8000", watermark_s=30.0, tracer=trace_api.NoOpTracer(), metrics=metrics
    )
    nvml.samples_error = pynvml.NVMLError_GpuIsLost()
    timeline.sampler._poll_once()
    values = scrape(metrics)
    assert values[(METRIC_GPU_STATE, (("gpu", "0"), ("reason", "gpu_lost"), ("state", "lost")))] == 1
    assert values[(METRIC_GPU_ERRORS, (("reason", "gpu_lost"),))] == 1
