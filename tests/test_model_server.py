"""A model server's own metrics as a GPU source (agent_otel.gpu.server).

Each engine's exposition is written from its documented metric families
(tests/helpers/model_server.py) and served over HTTP on 127.0.0.1; the
server restarts (counters back to zero), answers slowly, fails and
vanishes, and neither the source nor the agent breaks. Timestamps come
from a clock the test moves, so what a sample covers is exact.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import math
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_otel import semconv
from agent_otel.attribution.live import LiveTimeline
from agent_otel.attribution.options import GpuOptions
from agent_otel.config import load_settings
from agent_otel.errors import ConfigError
from agent_otel.exporters.prometheus import Metrics
from agent_otel.gpu.server import ModelServerSource, ServerTimeline, WithModelServer, read_exposition
from agent_otel.gpu.sources import open_gpu_source
from agent_otel.records import NS_PER_S, ServerSample
from tests.helpers.model_server import FakeModelServer, sglang, tgi, vllm_v0, vllm_v1
from tests.helpers.nvml_driver import VirtualClock as _VirtualClock

# Idle windows from half a second (gpu_min_idle), as the scripts below read every 0.5 s.
MIN_IDLE_HALF_S = dataclasses.replace(GpuOptions.default(), min_idle_s=0.5)


class VirtualClock(_VirtualClock):
    def advance(self, ns: int) -> None:
        self.advance_to(self.now + ns)


@pytest.fixture
def server():
    fake = FakeModelServer(vllm_v1(running=0, waiting=0, kv=0.0, prompt=0, generation=0))
    yield fake
    fake.stop()


def source_on(server: FakeModelServer, clock=None, **options) -> ModelServerSource:
    return ModelServerSource(server.url, clock=clock or VirtualClock(), **options)


# ---------------------------------------------------------------- each engine's families


@pytest.mark.parametrize(
    "body, engine, running, waiting, kv",
    [
        (vllm_v1(3, 5, 0.42, 100, 200), "vllm", 3, 5, 0.42),
        (vllm_v1(4, 6, 0.30, 100, 200, engines=2), "vllm", 4, 6, 0.30),  # data parallel: counts add up
        (vllm_v0(2, 1, 0.25, 10, 20), "vllm", 2, 1, 0.25),
        (sglang(7, 2, 0.61, 10, 20), "sglang", 7, 2, 0.61),
        (tgi(1, 9, 3, 40), "tgi", 1, 9, None),
    ],
)
def test_each_engines_documented_families_are_read(server, body, engine, running, waiting, kv):
    server.body = body
    source = source_on(server)
    [sample] = source.poll()
    assert sample.gpu == semconv.SERVER_GPU_INDEX and sample.utilization == 1.0  # requests run
    [reading] = source.server_samples()
    assert (reading.engine, reading.running, reading.waiting) == (engine, running, waiting)
    assert reading.kv_cache_usage == (None if kv is None else pytest.approx(kv))
    assert reading.server == f"127.0.0.1:{server.port}"
    assert source.server_samples() == []  # drained
    assert not source.errors


@pytest.mark.parametrize(
    "write",
    [
        lambda generation: vllm_v1(0, 0, 0.1, 50, generation),
        lambda generation: vllm_v0(0, 0, 0.1, 50, generation),
        lambda generation: sglang(0, 0, 0.1, 50, generation),
        lambda generation: tgi(0, 0, 5, generation),
    ],
    ids=["vllm", "vllm-v0", "sglang", "tgi"],
)
def test_busy_when_requests_run_or_the_work_counters_moved_idle_otherwise(server, write):
    clock = VirtualClock()
    server.body = write(100)
    source = source_on(server, clock)
    utilizations = []
    for generation in (100, 100, 130, 130):  # idle, idle, worked between scrapes, idle
        server.body = write(generation)
        clock.advance(NS_PER_S // 2)
        utilizations += [s.utilization for s in source.poll()]
    assert utilizations == [0.0, 0.0, 1.0, 0.0]


def test_samples_are_stamped_on_the_sources_clock_and_cover_the_period_since_the_last(server):
    clock = VirtualClock()
    source = source_on(server, clock)
    stamps = []
    for _ in range(3):
        clock.advance(NS_PER_S // 2)
        stamps += [s.timestamp_ns for s in source.poll()]
    assert [b - a for a, b in zip(stamps, stamps[1:])] == [NS_PER_S // 2] * 2


def test_an_endpoint_of_no_known_engine_is_named_once_never_guessed(server, caplog):
    server.body = "# TYPE triton_queue gauge\ntriton_queue 3\n# TYPE process_cpu_seconds_total counter\n" + (
        "process_cpu_seconds_total 1.5\n"
    )
    source = source_on(server)
    with caplog.at_level(logging.WARNING, logger="agent_otel.gpu"):
        for _ in range(5):
            assert source.poll() == []
    lines = [r.getMessage() for r in caplog.records if "none of the metric families" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "process, triton" in lines[0] and server.url in lines[0]
    assert source.errors["model_server_unknown_metrics"] == 5
    assert source.server_samples() == []


def test_a_family_the_engine_documents_but_the_endpoint_lacks_is_named_once(server, caplog):
    server.body = vllm_v1(1, 0, 0.5, 1, 1).replace("kv_cache_usage_perc", "something_else")
    source = source_on(server)
    with caplog.at_level(logging.WARNING, logger="agent_otel.gpu"):
        for _ in range(3):
            source.poll()
    lines = [r.getMessage() for r in caplog.records if "has no" in r.getMessage()]
    assert lines == [
        f"agent-otel: the vllm server at {server.url} has no "
        "vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc; no KV-cache usage is shown"
    ]
    assert {r.kv_cache_usage for r in source.server_samples()} == {None}


def test_a_server_that_restarts_resets_its_counters_and_is_read_afresh(server, caplog):
    clock = VirtualClock()
    server.body = vllm_v1(0, 0, 0.2, 5000, 90000)
    source = source_on(server, clock)
    source.poll()
    server.stop()
    server.body = vllm_v1(0, 0, 0.0, 0, 0)  # the new process: counters from zero
    server.start()
    clock.advance(NS_PER_S // 2)
    with caplog.at_level(logging.WARNING, logger="agent_otel.gpu"):
        [after_restart] = source.poll()
    assert after_restart.utilization == 0.0  # went down to zero: nothing computed since
    assert source.errors["model_server_restarted"] == 1
    assert any("restarted" in r.getMessage() for r in caplog.records)
    server.body = vllm_v1(0, 0, 0.1, 40, 12)  # it worked since the restart
    clock.advance(NS_PER_S // 2)
    [worked] = source.poll()
    assert worked.utilization == 1.0
    assert source.errors["model_server_restarted"] == 1


def test_a_slow_server_times_out_without_holding_the_sampler_and_its_gap_is_missing_data(server):
    clock = VirtualClock()
    source = source_on(server, clock, timeout_s=0.2)
    assert [s.utilization for s in source.poll()] == [0.0]
    server.delay_s = 3.0
    clock.advance(NS_PER_S // 2)
    started = time.monotonic()
    assert source.poll() == []
    assert time.monotonic() - started < 2.5  # the timeout, not the server's 3 s
    assert source.errors["model_server_timeout"] == 1
    server.delay_s = 0.0
    clock.advance(NS_PER_S // 2)
    [marker] = source.poll()
    assert math.isnan(marker.utilization)  # what happened meanwhile is not known
    clock.advance(NS_PER_S // 2)
    assert [s.utilization for s in source.poll()] == [0.0]


def test_a_server_that_vanishes_or_fails_counts_the_reason_and_comes_back(server, caplog):
    clock = VirtualClock()
    source = source_on(server, clock)
    source.poll()
    server.stop()
    with caplog.at_level(logging.WARNING, logger="agent_otel.gpu"):
        for _ in range(3):
            clock.advance(NS_PER_S // 2)
            assert source.poll() == []
    assert source.errors["model_server_unreachable"] == 3
    assert len([r for r in caplog.records if "could not read" in r.getMessage()]) == 1
    server.start()
    server.status = 500
    clock.advance(NS_PER_S // 2)
    assert source.poll() == []
    assert source.errors["model_server_http_500"] == 1
    server.status = 200
    server.body = "this is not { the text format"
    clock.advance(NS_PER_S // 2)
    assert source.poll() == []
    assert source.errors["model_server_unreadable"] == 1
    server.body = vllm_v1(1, 2, 0.3, 1, 1)
    clock.advance(NS_PER_S // 2)
    assert math.isnan(source.poll()[0].utilization)
    clock.advance(NS_PER_S // 2)
    assert source.poll()[0].utilization == 1.0


# ---------------------------------------------------------------- opening it, alone or beside a GPU source


def test_open_gpu_source_reads_the_server_alone_or_beside_the_gpu(server):
    alone = open_gpu_source("model_server", model_server=server.url)
    assert isinstance(alone, ModelServerSource) and [d.index for d in alone.devices()] == ["server"]
    beside = open_gpu_source("simulated", model_server=server.url)
    assert isinstance(beside, WithModelServer)
    assert beside.kind == "simulated" and [d.index for d in beside.devices()] == ["0"]
    server.body = vllm_v1(2, 4, 0.5, 1, 1)
    samples = beside.poll()
    assert {s.gpu for s in samples} <= {"0"}  # the GPU's samples only: the server adds readings
    assert [(r.running, r.waiting) for r in beside.server_samples()] == [(2, 4)]
    with beside.busy():  # what the simulated GPU offers still works through it
        pass
    beside.close()


def test_a_missing_or_bad_url_is_a_configuration_error_naming_the_setting():
    with pytest.raises(ConfigError, match="model_server_metrics"):
        open_gpu_source("model_server")
    with pytest.raises(ConfigError, match="model_server_metrics"):
        open_gpu_source("model_server", model_server="vllm-a:8000")
    settings = load_settings({}, {"AGENT_OTEL_MODEL_SERVER_METRICS": "http://vllm-a:8000/metrics"})
    assert settings.model_server_metrics == "http://vllm-a:8000/metrics"
    assert load_settings({"gpu": "model_server"}, {}).gpu == "model_server"


def test_read_exposition_takes_the_v1_kv_cache_name_before_the_old_one():
    both = vllm_v0(1, 0, 0.25, 1, 1) + "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.75\n"
    assert read_exposition(both).kv_cache_usage == 0.75


# ---------------------------------------------------------------- on the timeline


def test_the_queue_length_is_kept_on_the_timeline_and_on_the_idle_windows_spans(server):
    clock = VirtualClock()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = Metrics()
    source = source_on(server, clock)
    timeline = LiveTimeline(source, MIN_IDLE_HALF_S, tracer=provider.get_tracer("test"), metrics=metrics)
    origin = clock()
    script = [(2, 0, 0.5)] * 2 + [(0, 3, 0.4)] * 6 + [(1, 0, 0.5)] * 2  # (running, waiting, kv) every 0.5 s
    generation = 0
    for running, waiting, kv in script:
        generation += 10 * running
        server.body = vllm_v1(running, waiting, kv, 10, generation)
        clock.advance(NS_PER_S // 2)
        timeline.on_samples(source.poll())
    timeline.shutdown(timeout_s=1.0)
    assert isinstance(timeline.server, ServerTimeline) and len(timeline.server) == len(script)
    load = timeline.server.load(origin + 3 * NS_PER_S // 2, origin + 4 * NS_PER_S)
    assert (load.waiting_max, load.running_max, load.kv_cache_usage) == (3, 0, pytest.approx(0.4))
    [window] = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_GPU_IDLE]
    assert window.attributes[semconv.AGENT_MODEL_SERVER_WAITING_MAX] == 3
    assert window.attributes[semconv.AGENT_MODEL_SERVER_KV_CACHE_USAGE] == pytest.approx(0.4)
    assert window.attributes[semconv.AGENT_GPU_SOURCE] == semconv.GPU_SOURCE_SERVER
    scrape = metrics.registry.get_sample_value
    label = {"server": f"127.0.0.1:{server.port}"}
    assert scrape(semconv.METRIC_SERVER_RUNNING, label) == 1
    assert scrape(semconv.METRIC_SERVER_WAITING, label) == 0
    assert scrape(semconv.METRIC_SERVER_KV_CACHE, label) == 0.5


def test_the_server_timeline_is_bounded_and_holds_the_state_between_scrapes():
    timeline = ServerTimeline(max_samples=100)
    timeline.add(ServerSample("s:1", i * NS_PER_S, 1.0, float(i), None, "tgi") for i in range(1000))
    assert len(timeline) == 100
    held = timeline.load(5000 * NS_PER_S, 5001 * NS_PER_S)  # after the last scrape: the last state
    assert held is not None and held.waiting_max == 999 and held.kv_cache_usage is None
    assert timeline.load(0, NS_PER_S) is None  # forgotten


def test_an_agent_with_a_server_that_never_answers_runs_unharmed():
    import agent_otel
    from agent_otel import tool

    dead = FakeModelServer()
    url = dead.url
    dead.stop()
    handle = agent_otel.instrument(
        gpu="model_server",
        model_server_metrics=url,
        gpu_poll_interval=0.05,
        traces_exporters=("none",),
        frameworks=(),
    )
    try:

        @tool
        def lookup(x: int) -> int:
            return x + 1

        assert [lookup(i) for i in range(3)] == [1, 2, 3]
        timeline = handle.wait_for_gpu()
        assert timeline is not None
        deadline = time.monotonic() + 10
        while not timeline.sampler.stats()["errors"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert timeline.sampler.stats()["errors"].get("model_server_unreachable", 0) >= 1
    finally:
        assert handle.shutdown(timeout_s=5.0)
    trace.get_tracer_provider()  # the process's tracing still works


def test_the_blame_service_reads_a_model_server_alone_and_exports_its_queue(server):
    import os
    import re
    import subprocess
    import sys
    import urllib.request

    server.body = vllm_v1(running=0, waiting=3, kv=0.7, prompt=10, generation=10)  # stalled: queued, idle
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    # The pool's own price wins over the plain one.
    env.update(
        {"OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1", "AGENT_OTEL_GPU_HOUR_PRICE": "1,pool:vllm-a:8000=4.2"}
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_otel.commands.cli",
            "gpu-exporter",
            "--pool",
            "vllm-a:8000",
            "--gpu",
            "model_server",
            "--model-server",
            server.url,
            "--prometheus-port",
            "0",
            "--otlp-grpc",
            "127.0.0.1:0",
            "--otlp-http",
            "off",
            "--watermark",
            "0.5",
            "--poll-interval",
            "0.1",
            "--min-idle",
            "0.2",
            "--duration",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = process.stdout.readline()
        assert "sampling 1 GPU(s) via model_server: server model server at 127.0.0.1" in first, first
        url = re.search(r"metrics at (\S+)", process.stdout.readline()).group(1)
        label = f'server="127.0.0.1:{server.port}"'

        def scrape() -> str:
            return urllib.request.urlopen(url, timeout=5).read().decode()

        deadline = time.monotonic() + 20
        while not re.search(r'^agent_gpu_idle_seconds_total\{gpu="server"\} [1-9]', scrape(), flags=re.M):
            assert time.monotonic() < deadline, scrape()
            time.sleep(0.1)
        text = scrape()
        assert f"agent_model_server_requests_waiting{{{label}}} 3.0" in text
        assert f"agent_model_server_requests_running{{{label}}} 0.0" in text
        assert f"agent_model_server_kv_cache_usage_ratio{{{label}}} 0.7" in text
        assert 'agent_gpu_hour_price{gpu="server"} 4.2' in text
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr


class InFlight:
    """The recorder's table of calls in flight, as the live timeline reads it."""

    def __init__(self, *calls):
        self.inflight = {id(call): call for call in calls}


def test_the_kv_cache_held_while_a_tool_blocks_the_idle_gpu_is_counted_per_tool(server):
    from agent_otel.records import ToolCall

    clock = VirtualClock()
    metrics = Metrics()
    source = source_on(server, clock)
    # A tool call in flight the whole time: every idle second is blamed on it.
    call = ToolCall("search", "direct", clock() - NS_PER_S, clock() - NS_PER_S, trace_id=1, span_id=2)
    timeline = LiveTimeline(
        source, MIN_IDLE_HALF_S, tracer=trace.get_tracer("test"), metrics=metrics, recorder=InFlight(call)
    )
    script = [(1, 0, 0.9)] * 2 + [(0, 2, 0.6)] * 5 + [(1, 0, 0.9)] * 2  # the idle readings: 60 % of the cache
    generation = 0
    for running, waiting, kv in script:
        generation += 10 * running
        server.body = vllm_v1(running, waiting, kv, 10, generation)
        clock.advance(NS_PER_S // 2)
        timeline.on_samples(source.poll())
    timeline.shutdown(timeout_s=1.0)
    scrape = metrics.registry.get_sample_value
    blamed = scrape(semconv.METRIC_GPU_IDLE_BLOCKED, {"gpu": "server", "tool": "search", "phase": "exec"})
    assert blamed == pytest.approx(2.5)  # five idle periods of 0.5 s
    held = scrape(semconv.METRIC_GPU_IDLE_KV_CACHE_HELD, {"gpu": "server", "tool": "search"})
    assert held == pytest.approx(0.6 * 2.5)


FORK_SCRIPT = """
import os, sys, threading, time
import agent_otel

handle = agent_otel.instrument(gpu="simulated", model_server_metrics=sys.argv[1], gpu_poll_interval=0.01,
                               traces_exporters="none", frameworks=())
timeline = handle.gpu_timeline
deadline = time.monotonic() + 20
while len(timeline.server) < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
assert len(timeline.server) >= 3, "the parent reads the server"
# Another thread holds both locks of the server's readings at the fork.
held = threading.Event()
def hold():
    with timeline.server._lock, timeline.source.server._lock:
        held.set()
        time.sleep(5)
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    try:
        before = len(timeline.server)
        timeline.server.load(0, time.time_ns())  # does not block on the parent's held lock
        deadline = time.monotonic() + 20
        while len(timeline.server) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if len(timeline.server) > before else 3)  # the child's sampler reads the server again
    except BaseException:
        os._exit(4)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
handle.shutdown(timeout_s=5.0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is not available on this platform")
def test_a_child_forked_while_the_readings_are_locked_reads_the_server_on_its_own(server):
    import subprocess
    import sys

    server.body = vllm_v1(1, 2, 0.3, 1, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, server.url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "child 0", done.stdout + done.stderr
