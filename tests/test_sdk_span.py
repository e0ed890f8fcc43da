"""The tool span's end attributes written straight into the SDK span's store
(``agent_otel.capture.sdk_span``): exactly what the public calls would give,
limits included, and only where the installed SDK stores attributes the way
the module expects.
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, INVALID_SPAN_CONTEXT

import agent_otel
from agent_otel.capture import recorder, sdk_span

ATTRIBUTES = {
    "gen_ai.tool.name": "lookup",
    "agent.tool.queue.duration": 0.25,
    "agent.tool.exec.duration": 1.5,
    "agent.tool.executor": "pool-with-a-long-name",
    "agent.tool.outcome": "ok",
    "agent.executor.max_workers": 4,
}


def exported(limits: SpanLimits, write) -> tuple[dict, int]:
    """The attributes and dropped count of one span written by ``write(span)``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("execute_tool lookup", attributes={"gen_ai.operation.name": "x"})
    write(span)
    span.end()
    (finished,) = exporter.get_finished_spans()
    return dict(finished.attributes), finished.dropped_attributes


def test_the_installed_sdk_passes_the_probes():
    # An SDK upgrade that moves the attribute store or the current span's
    # context key fails here, not as a silent slow path on every call.
    span = TracerProvider().get_tracer("test").start_span("s")
    assert sdk_span.fast(span)
    assert recorder._SPAN_KEY is not None
    assert not sdk_span.fast(NonRecordingSpan(INVALID_SPAN_CONTEXT))


@pytest.mark.parametrize(
    "limits",
    [
        SpanLimits(),
        SpanLimits(max_span_attributes=4),  # too few: the public path drops the oldest
        SpanLimits(max_attribute_length=8),  # shorter than the executor's name: truncated
        SpanLimits(max_span_attributes=0),
    ],
    ids=["no limits", "count limit", "length limit", "no attributes"],
)
def test_add_exports_what_set_attributes_does(limits):
    public = exported(limits, lambda span: span.set_attributes(ATTRIBUTES))
    direct = exported(limits, lambda span: sdk_span.add(span, ATTRIBUTES, len("pool-with-a-long-name")))
    assert direct == public
    assert list(direct[0]) == list(public[0])  # same order too


def test_an_ended_span_is_not_written(caplog):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("s")
    span.end()
    with caplog.at_level(logging.WARNING):
        sdk_span.add(span, ATTRIBUTES, 32)
    (finished,) = exporter.get_finished_spans()
    assert dict(finished.attributes) == {}
    assert "ended span" in caplog.text  # the public call said so


class _SeenAtStart(SpanProcessor):
    def __init__(self):
        self.seen: list[tuple[str, dict]] = []

    def on_start(self, span, parent_context=None):
        self.seen.append((span.name, dict(span.attributes)))


def test_what_span_processors_see_at_start_and_at_end(agent, spans):
    from opentelemetry import trace

    seen = _SeenAtStart()
    trace.get_tracer_provider().add_span_processor(seen)

    @agent_otel.tool
    def lookup(x):
        """Look a thing up."""
        return x

    try:
        assert lookup(3) == 3
    finally:
        seen.on_start = lambda span, parent_context=None: None  # providers cannot remove a processor
    # on_start (and a sampler): the span's name names the tool, and the operation.
    assert seen.seen == [("execute_tool lookup", {"gen_ai.operation.name": "execute_tool"})]
    (span,) = spans.tools("lookup")
    attributes = dict(span.attributes)
    assert attributes["gen_ai.tool.name"] == "lookup"
    assert attributes["gen_ai.tool.type"] == "function"
    assert attributes["gen_ai.tool.description"] == "Look a thing up."
    assert attributes["agent.tool.queue.duration"] == 0.0
    assert attributes["agent.tool.executor"] == "direct"
    assert attributes["agent.tool.outcome"] == "ok"
    assert attributes["agent.tool.exec.duration"] >= 0
