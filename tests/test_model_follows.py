"""The live path and the model calls: a simulated GPU follows them, and the
GPU's idle time while one is in flight is the model server's (docs/gpu.md,
docs/attribution.md)."""

from __future__ import annotations

import logging
import time

import pytest
from opentelemetry import trace

import agent_otel
from agent_otel.capture import models
from agent_otel.capture.models import ModelSpan, model_calls
from agent_otel.support.clock import now_ns
from agent_otel.gpu.logs import read_gpu_log
from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.records import NS_PER_S

PERIOD_NS = round(NS_PER_S / 6)


def utilization_within(log, start_ns: int, end_ns: int) -> list[float]:
    """The samples whose period lies wholly inside [start, end]."""
    (series,) = log.series.values()
    return [
        u
        for t, u in zip(series.times, series.values)
        if t - PERIOD_NS >= start_ns + 2_000_000 and t <= end_ns - 2_000_000
    ]


def test_a_simulated_gpu_is_busy_while_model_spans_hook_spans_and_peer_spans_are_in_flight(tmp_path, spans):
    log = tmp_path / "gpu.csv"
    handle = agent_otel.instrument(
        traces_exporters="none", frameworks=(), gpu="simulated", gpu_poll_interval=0.05, gpu_log_file=str(log)
    )
    try:
        marks = []

        def stretch(seconds: float) -> None:
            start = now_ns()
            time.sleep(seconds)
            marks.append((start, now_ns()))

        stretch(0.5)  # idle
        with agent_otel.model_span("llama"):
            stretch(0.5)
        stretch(0.5)
        call = ModelSpan.start("llama")  # as the framework hooks record one
        stretch(0.5)
        call.end()
        stretch(0.5)
        peer = trace.get_tracer("openinference.instrumentation.openai").start_span(
            "ChatCompletion", attributes={"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o"}
        )
        stretch(0.5)
        peer.end()
        stretch(0.5)
    finally:
        handle.shutdown()
    samples = read_gpu_log(str(log))
    for number, (start, end) in enumerate(marks):
        within = utilization_within(samples, start, end)
        assert len(within) >= 1, (number, within)
        expected = 1.0 if number % 2 else 0.0  # the odd stretches ran inside a model call
        assert within == [expected] * len(within), (number, within)
    assert model_calls.in_flight_count() == 0


def test_driven_by_hand_and_by_the_model_calls_together():
    gpu = SimulatedGpu()
    gpu.model_call(True)
    with gpu.busy():
        pass
    gpu.model_call(False)
    gpu.model_call(False)  # an end without its start (followed too late) changes nothing
    assert gpu._depth == {"0": 0}


def test_idle_time_while_a_model_call_is_in_flight_is_the_model_servers_live(spans, caplog):
    handle = agent_otel.instrument(
        traces_exporters="none", frameworks=(), gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.2
    )
    gpu = handle.gpu_timeline.source

    @agent_otel.tool
    def fetch() -> None:
        time.sleep(0.6)

    try:
        # A model served elsewhere (the simulated GPU is not the one that serves it).
        model_calls.unfollow(gpu.model_call)
        gpu.run_kernel(0.3)
        with caplog.at_level(logging.WARNING, logger="agent_otel.gpu"):
            for _ in range(2):
                with agent_otel.model_span("remote-llm") as call:
                    time.sleep(0.6)
                    call.first_chunk()
                    time.sleep(0.6)
                fetch()
            gpu.run_kernel(0.3)
            time.sleep(0.3)
    finally:
        model_calls.follow(gpu.model_call)
        handle.shutdown()
    registry = handle.metrics.registry

    def value(name, **labels):
        return registry.get_sample_value(name, labels) or 0.0

    queued = value("agent_gpu_idle_model_seconds_total", gpu="0", model="remote-llm", phase="queued")
    decode = value("agent_gpu_idle_model_seconds_total", gpu="0", model="remote-llm", phase="decode")
    blocked = value("agent_gpu_idle_blocked_seconds_total", gpu="0", tool="fetch", phase="exec")
    # Queued until the first chunk, then streaming, twice, on a GPU that read
    # idle; the first idle window starts on the samples' 1/6 s grid after the
    # kernel, the last ends on it before the next kernel (a period at most).
    chats = [s for s in spans.all() if s.name == "chat remote-llm"]
    fetches = [s for s in spans.all() if s.name == "execute_tool fetch"]
    first = sum(s.attributes["gen_ai.response.time_to_first_chunk"] for s in chats)
    streaming = sum((s.end_time - s.start_time) / NS_PER_S for s in chats) - first
    assert first - 0.2 < queued <= first + 1e-3
    assert decode == pytest.approx(streaming, abs=2e-3)
    fetched = sum((s.end_time - s.start_time) / NS_PER_S for s in fetches)
    assert fetched - 0.2 < blocked <= fetched + 1e-3  # the tool calls, when no model call was in flight
    assert value("agent_gpu_model_idle_ratio", gpu="0") > 0.8
    assert value("agent_gpu_underused_model_seconds_total", gpu="0", model="remote-llm", phase="decode") > 1.0
    contradictions = [r for r in caplog.records if "contradicts the model calls" in r.getMessage()]
    assert len(contradictions) == 1  # once per GPU
    windows = [s for s in spans.all() if s.name == "gpu.idle" and "gpu.idle.duration" in s.attributes]
    assert windows
    model_total = sum(s.attributes.get("gpu.idle.model_duration", 0.0) for s in windows)
    assert model_total == pytest.approx(queued + decode, abs=1e-6)
    with_models = [s for s in windows if "gpu.idle.models" in s.attributes]
    assert set(with_models[0].attributes["gpu.idle.models"]) == {"remote-llm"}
    assert set(with_models[0].attributes["gpu.idle.model_phases"]) <= {"queued", "decode"}


def test_peers_model_spans_are_watched_only_while_a_simulated_gpu_follows_them(spans):
    handle = agent_otel.instrument(traces_exporters="none", frameworks=(), gpu="simulated")
    tracer = trace.get_tracer("openinference.instrumentation.openai")
    try:
        peer = tracer.start_span("ChatCompletion", attributes={"openinference.span.kind": "LLM"})
        assert model_calls.in_flight_count() == 1
        peer.end()
        assert model_calls.in_flight_count() == 0
    finally:
        handle.shutdown()
    assert not models.peer_model_spans.enabled
    after = tracer.start_span("ChatCompletion", attributes={"openinference.span.kind": "LLM"})
    assert model_calls.in_flight_count() == 0  # nobody follows them now: not kept
    after.end()


def test_watching_the_peers_keeps_the_tool_spans_fast_path():
    # The tool spans start without their attributes (or are deferred) only
    # where no span processor reads them at start: the peers' watcher acts on
    # model spans alone, so it leaves that path as it was.
    from opentelemetry.sdk.trace import TracerProvider

    from agent_otel.capture.sdk_span import StartAttributes

    provider = TracerProvider()
    start = StartAttributes(provider.get_tracer("agent_otel"), {"gen_ai.operation.name": "execute_tool"})
    assert start.get() is None
    models.watch_peers(provider)
    models.watch_peers(provider)  # once per provider
    assert start.get() is None
    processors = provider._active_span_processor._span_processors
    assert [getattr(p, "peers", None) for p in processors].count(models.peer_model_spans) == 1
