"""The GPU timeline in process: a simulated GPU, real threads, real time."""

import concurrent.futures as cf
import time

import pytest

import agent_otel


@pytest.fixture
def gpu_agent(spans):
    handle = agent_otel.instrument(
        traces_exporters="none", frameworks=(), gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.2
    )
    yield handle
    agent_otel.uninstrument()


def test_idle_gpu_is_blamed_on_the_tool_that_held_it(gpu_agent, spans):
    gpu = gpu_agent.gpu_timeline.source
    assert gpu.devices()[0].name == "Simulated GPU"

    @agent_otel.tool
    def slow_search(q):
        time.sleep(0.6)
        return q

    gpu.run_kernel(0.3)  # the model thinks
    slow_search("gpu")  # the GPU waits for the tool
    gpu.run_kernel(0.3)  # the model answers
    agent_otel.uninstrument()  # closes the timeline: every window is attributed

    (tool_span,) = spans.tools("slow_search")
    idle = [s for s in spans.all() if s.name == "gpu.idle"]
    window_spans = [s for s in idle if s.parent is None]
    children = [s for s in idle if s.parent is not None]
    blocked = [w for w in window_spans if w.attributes.get("gpu.idle.blocked_by") == "slow_search"]
    assert len(blocked) == 1
    window = blocked[0]
    period = 1 / 6  # the simulated GPU's sample period, like NVML's
    assert window.attributes["gpu.idle.duration"] == pytest.approx(0.6, abs=period + 0.1)
    assert window.attributes["gpu.uuid"] == "GPU-simulated-0"
    assert [link.context.span_id for link in window.links] == [tool_span.context.span_id]
    (child,) = [c for c in children if c.parent.span_id == tool_span.context.span_id]
    assert child.attributes["agent.tool.phase"] == "exec"
    assert child.attributes["gpu.idle.blocked_duration"] == pytest.approx(0.6, abs=period + 0.1)
    assert child.context.trace_id == tool_span.context.trace_id

    value = gpu_agent.metrics.registry.get_sample_value
    blamed = value("agent_gpu_idle_blocked_seconds_total", {"gpu": "0", "tool": "slow_search", "phase": "exec"})
    assert blamed == pytest.approx(child.attributes["gpu.idle.blocked_duration"])
    total_idle = value("agent_gpu_idle_seconds_total", {"gpu": "0"})
    unattributed = value("agent_gpu_idle_unattributed_seconds_total", {"gpu": "0"})
    assert total_idle == pytest.approx(blamed + unattributed)


def test_queue_stall_is_blamed_on_queue(gpu_agent, spans):
    gpu = gpu_agent.gpu_timeline.source

    @agent_otel.tool
    def lookup(i):
        time.sleep(0.5)
        return i

    with cf.ThreadPoolExecutor(1, thread_name_prefix="tools") as pool:
        gpu.run_kernel(0.2)
        first = pool.submit(lookup, 1)
        second = pool.submit(lookup, 2)  # waits 0.5 s for the only worker
        first.result(), second.result()
        gpu.run_kernel(0.2)
    agent_otel.uninstrument()
    value = gpu_agent.metrics.registry.get_sample_value
    queue = value("agent_gpu_idle_blocked_seconds_total", {"gpu": "0", "tool": "lookup", "phase": "queue"})
    exec_ = value("agent_gpu_idle_blocked_seconds_total", {"gpu": "0", "tool": "lookup", "phase": "exec"})
    # 0-0.5 s: two calls in flight, one running, one queued: 0.25 s each.
    # 0.5-1.0 s: one call running: 0.5 s of exec.
    assert queue == pytest.approx(0.25, abs=0.12)
    assert exec_ == pytest.approx(0.75, abs=0.2)


def test_no_gpu_means_no_timeline_and_tools_still_traced(spans):
    from agent_otel.gpu.sources import open_gpu_source

    source = open_gpu_source("auto")
    if source is not None:
        source.close()
        pytest.skip("this machine has a working NVIDIA GPU; tests/gpu covers it")
    handle = agent_otel.instrument(traces_exporters="none", frameworks=(), gpu="nvml")
    try:

        @agent_otel.tool
        def ping():
            return "pong"

        assert ping() == "pong"
        assert len(spans.tools("ping")) == 1
        assert handle.wait_for_gpu(30) is None  # NVML is opened on a thread of its own
        reasons = {
            sample.labels["reason"]: sample.value
            for metric in handle.metrics.registry.collect()
            if metric.name == "agent_otel_gpu_errors"
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
        # Why there is no GPU depends on the machine: no NVML library, no driver, no device.
        assert len(reasons) == 1 and sum(reasons.values()) == 1
        assert set(reasons) <= {"library_not_found", "driver_not_loaded", "no_gpu", "bindings_missing"}
    finally:
        agent_otel.uninstrument()
