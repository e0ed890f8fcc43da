"""The blame service takes the pool's model-call spans too: while one is in
flight, the GPU's idle time is the model server's (docs/attribution.md)."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agent_otel.attribution.service import PoolTimeline
from agent_otel.exporters.prometheus import Metrics
from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.receiver.decode import NOT_A_TOOL_SPAN, tool_calls
from agent_otel.records import NS_PER_S, ModelCall, ToolCall
from tests.helpers.nvml_driver import VirtualClock

POOL = "vllm-a:8000"


def test_model_calls_of_the_pool_take_the_idle_time_from_the_tools():
    clock = VirtualClock()
    origin = clock()
    metrics = Metrics()
    # busy 1 s, idle 6 s, busy 1 s
    gpu = SimulatedGpu([(1.0, 0.95), (6.0, 0.0), (1.0, 0.95)], sample_period_s=1 / 6, clock=clock)
    timeline = PoolTimeline(
        gpu, pool=POOL, watermark_s=8.0, tracer=trace.get_tracer("test"), metrics=metrics, clock=clock
    )

    def at(seconds: float) -> int:
        return origin + round(seconds * NS_PER_S)

    fetch = ToolCall("fetch", "tools", at(1.0), at(1.0), at(7.0), trace_id=1, span_id=1, pool=POOL)
    chat = ModelCall("llama", at(2.0), at(5.0), trace_id=1, span_id=2, first_chunk_s=1.0, pool=POOL)
    elsewhere = ModelCall("llama", at(5.0), at(7.0), trace_id=1, span_id=3, pool="vllm-b:8000")
    polled = origin
    for seconds in (0.5 * k for k in range(1, 41)):
        polled = at(seconds)
        clock.advance_to(polled)
        if seconds == 7.5:
            timeline.add_calls([fetch], [chat, elsewhere, chat])  # sent twice: counted once
        released = timeline.source.poll()
        if released:
            timeline.on_samples(released)
    timeline.shutdown()

    def value(name, **labels):
        return metrics.registry.get_sample_value(name, {"gpu": "0", **labels}) or 0.0

    assert value("agent_gpu_idle_model_seconds_total", model="llama", phase="queued") == pytest.approx(1.0, abs=1e-6)
    assert value("agent_gpu_idle_model_seconds_total", model="llama", phase="decode") == pytest.approx(2.0, abs=1e-6)
    # the tool is to blame for the rest of the window: 1-2 s and 5-7 s; the other pool's model call changes nothing
    assert value("agent_gpu_idle_blocked_seconds_total", tool="fetch", phase="exec") == pytest.approx(3.0, abs=1e-6)
    # every idle second once: the tools', the model server's or nobody's
    assert value("agent_gpu_idle_unattributed_seconds_total") + 6.0 == pytest.approx(
        value("agent_gpu_idle_seconds_total"), abs=1e-6
    )


def test_the_receiver_takes_model_spans_and_refuses_the_rest():
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    attribute = resource_spans.resource.attributes.add()
    attribute.key, attribute.value.string_value = "agent.gpu.pool", POOL
    spans = resource_spans.scope_spans.add()
    for number, (name, operation) in enumerate((("chat llama", "chat"), ("GET /", None)), start=1):
        span = spans.spans.add()
        span.trace_id, span.span_id = bytes(range(16)), number.to_bytes(8, "big")
        span.name, span.start_time_unix_nano, span.end_time_unix_nano = name, 10**18, 10**18 + 10**9
        if operation:
            item = span.attributes.add()
            item.key, item.value.string_value = "gen_ai.operation.name", operation
            item = span.attributes.add()
            item.key, item.value.string_value = "gen_ai.request.model", "llama"
    decoded = tool_calls(request)
    assert [(m.model, m.pool, m.seconds) for m in decoded.models] == [("llama", POOL, 1.0)]
    assert decoded.refused == {NOT_A_TOOL_SPAN: 1}


@pytest.mark.parametrize("name", ["otelcol-config.yaml", "gateway.yaml"])
def test_the_collector_routes_model_spans_to_the_blame_services_but_not_to_span_metrics(name):
    import pathlib

    import yaml

    config = yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "collector" / name).read_text())
    pipeline = config["service"]["pipelines"]["traces/model_spans"]
    assert pipeline["exporters"] == ["routing/blame"] and "filter/model_spans" in pipeline["processors"]
    (condition,) = config["processors"]["filter/model_spans"]["trace_conditions"]
    for kept in ('"chat"', '"text_completion"', '"generate_content"', '"LLM"', '"llm"'):
        assert f"!= {kept}" in condition
