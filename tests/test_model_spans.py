"""``agent_otel.model_span`` and ``agent_span``: the model half of a turn on the timeline."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import agent_otel
from agent_otel.capture import models


def test_a_model_call_is_a_genai_client_span_with_usage(agent, spans):
    with agent_otel.model_span("llama-3-70b", provider="vllm") as call:
        time.sleep(0.05)
        call.usage(input_tokens=812, output_tokens=64)
        call.response_model = "llama-3-70b-instruct"

    (span,) = spans.models()
    assert span.name == "chat llama-3-70b"
    assert span.kind == SpanKind.CLIENT
    assert span.instrumentation_scope.name == "agent_otel"
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "llama-3-70b",
        "gen_ai.provider.name": "vllm",
        "gen_ai.usage.input_tokens": 812,
        "gen_ai.usage.output_tokens": 64,
        "gen_ai.response.model": "llama-3-70b-instruct",
    }
    assert (span.end_time - span.start_time) / 1e9 >= 0.05 * 0.95


def test_a_streamed_call_records_the_time_to_its_first_chunk(agent, spans):
    async def stream():
        async with agent_otel.model_span("gpt-4o", operation="text_completion", stream=True) as call:
            await asyncio.sleep(0.08)
            for _ in range(3):
                call.first_chunk()  # only the first counts
                await asyncio.sleep(0.04)

    asyncio.run(stream())

    (span,) = spans.models("gpt-4o")
    assert span.name == "text_completion gpt-4o"
    assert span.attributes["gen_ai.request.stream"] is True
    time_to_first_chunk = span.attributes["gen_ai.response.time_to_first_chunk"]
    assert 0.08 * 0.95 <= time_to_first_chunk < 0.08 + 2.0
    assert time_to_first_chunk < (span.end_time - span.start_time) / 1e9


def test_spans_inside_are_children_and_exceptions_pass_through(agent, spans):
    failure = ConnectionResetError("the inference server went away")

    @agent_otel.tool
    def lookup(key: str) -> str:
        return key

    with pytest.raises(ConnectionResetError) as raised:
        with agent_otel.agent_span("support") as turn:
            lookup("a")
            with agent_otel.model_span("llama-3-70b"):
                raise failure

    assert raised.value is failure
    (model,) = spans.models()
    (tool,) = spans.tools("lookup")
    (agent_run,) = [s for s in spans.all() if s.name == "invoke_agent support"]
    assert agent_run.context.span_id == turn.get_span_context().span_id
    assert agent_run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent_run.attributes["gen_ai.agent.name"] == "support"
    assert model.parent.span_id == tool.parent.span_id == agent_run.context.span_id
    for span in (model, agent_run):
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes["error.type"] == "ConnectionResetError"


def test_without_instrument_nothing_is_recorded(spans):
    with agent_otel.agent_span("support"):
        with agent_otel.model_span("llama-3-70b") as call:
            call.first_chunk()
            call.usage(input_tokens=1, output_tokens=2)
    assert spans.all() == []


def peer_instrumentor():
    """Stands for an OpenInference instrumentation (module name is what is detected).
    Made when a test asks: opentelemetry-instrumentation takes a tenth of a second
    to import, in every xdist worker that collects this module."""
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

    class PeerInstrumentor(BaseInstrumentor):
        __module__ = "openinference.instrumentation.testpeer"

        def instrumentation_dependencies(self):
            return ()

        def _instrument(self, **kwargs):
            pass

        def _uninstrument(self, **kwargs):
            pass

    return PeerInstrumentor()


@pytest.mark.parametrize(
    "mode, with_peer, recorded",
    [("auto", False, True), ("auto", True, False), ("on", True, True), ("off", False, False)],
)
def test_the_model_spans_setting_decides_for_the_framework_hooks(spans, mode, with_peer, recorded):
    peer = peer_instrumentor()
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), model_spans=mode)
    try:
        if with_peer:
            peer.instrument()
        assert models.hooks_record() is recorded
        assert (models.peer_instrumentation() == "openinference.instrumentation.testpeer") is with_peer
    finally:
        peer.uninstrument()
        agent_otel.uninstrument()
    assert models.hooks_record() is False  # not instrumented


def test_model_spans_setting_is_validated(monkeypatch):
    monkeypatch.setenv("AGENT_OTEL_MODEL_SPANS", "sometimes")
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:  # refused and said; the declared default is used
        (error,) = handle.config_errors
        assert "AGENT_OTEL_MODEL_SPANS" in str(error) and "'sometimes'" in str(error)
    finally:
        agent_otel.uninstrument()
