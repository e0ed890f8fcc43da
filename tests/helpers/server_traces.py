"""The model server's side of a recorded run: vLLM's llm_request spans, as
vLLM makes them on its own host (vllm/tracing.py,
vllm/v1/engine/output_processor.py), and gpu.idle window spans carrying
the server's readings, as the live path and the blame service write them."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agent_otel import semconv
from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter
from helpers.traces import RecordedRun


def vllm_attributes(queue: float, ttft: float, prefill: float, decode: float, e2e: float) -> dict:
    return {
        "gen_ai.response.model": "llama-3-70b",
        "gen_ai.request.id": "cmpl-1",
        "gen_ai.usage.prompt_tokens": 812,
        "gen_ai.usage.completion_tokens": 64,
        semconv.VLLM_TIME_IN_QUEUE: queue,
        semconv.VLLM_TIME_TO_FIRST_TOKEN: ttft,
        semconv.VLLM_TIME_IN_PREFILL: prefill,
        semconv.VLLM_TIME_IN_DECODE: decode,
        semconv.VLLM_E2E: e2e,
        "gen_ai.latency.time_in_model_inference": prefill + decode,
    }


class ServerTraces:
    """The model server's own tracer provider and traces file, as vLLM has them on its host."""

    def __init__(self, path):
        self.provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
        self.provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(str(path))))
        self.tracer = self.provider.get_tracer("vllm.entrypoints")

    def request(self, headers: dict, start: int, end: int, **latencies: float) -> None:
        """What vLLM does per request: extract the caller's context, start llm_request in it."""
        context = TraceContextTextMapPropagator().extract({k.lower(): v for k, v in headers.items()})
        span = self.tracer.start_span(
            semconv.SPAN_VLLM_REQUEST,
            context=context,
            kind=SpanKind.SERVER,
            attributes=vllm_attributes(**latencies),
            start_time=start,
        )
        span.end(end_time=end)


def kv_window(run: RecordedRun, start: float, end: float, usage: float | None, waiting: float = 2.0) -> None:
    attributes = {
        "gpu.index": 0,
        "gpu.uuid": "GPU-00000000",
        "gpu.idle.duration": end - start,
        "gpu.utilization.avg": 0.0,
        semconv.AGENT_GPU_SOURCE: semconv.GPU_SOURCE_SERVER,
    }
    if usage is not None:
        attributes[semconv.AGENT_MODEL_SERVER_KV_CACHE_USAGE] = usage
        attributes[semconv.AGENT_MODEL_SERVER_WAITING_MAX] = waiting
        attributes[semconv.AGENT_MODEL_SERVER_RUNNING_MAX] = 0.0
    run.span("gpu.idle", start, end, attributes)


def headers_of(span: trace.Span) -> dict:
    carrier: dict = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier
