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
from agent_otel.capture import current, otel_context, recorder, sdk_span

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
    assert otel_context.SPAN_KEY is not None
    assert otel_context.CONTEXT_VAR is not None
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


# ---------------------------------------------------------------- the current context (otel_context)


def test_the_context_functions_give_what_the_public_ones_do():
    from opentelemetry import context as context_api
    from opentelemetry import trace

    span = TracerProvider().get_tracer("test").start_span("s")
    base = context_api.set_value("k", "v")
    made = otel_context.with_span(span, base)
    assert made == trace.set_span_in_context(span, base)
    assert type(made) is type(trace.set_span_in_context(span, base))
    assert trace.get_current_span(made) is span
    assert otel_context.current_span_in(made) is span
    assert otel_context.current_span_in(base) is None
    before = context_api.get_current()
    token = otel_context.attach(made)
    try:
        assert context_api.get_current() is made  # what the public API reads
        assert otel_context.get_current() is made
        assert trace.get_current_span() is span
    finally:
        otel_context.reset(token)
    assert context_api.get_current() is before
    # A token attached through the public API resets here too.
    token = context_api.attach(made)
    otel_context.reset(token)
    assert context_api.get_current() is before


def test_a_token_from_another_context_is_logged_as_the_api_logs_it(caplog):
    import contextvars

    from opentelemetry import context as context_api

    token = contextvars.copy_context().run(otel_context.attach, context_api.set_value("k", "v"))
    with pytest.raises(ValueError):
        otel_context.reset(token)  # the ContextVar's own error: callers log through detach
    with caplog.at_level(logging.ERROR):
        otel_context.detach(token)
    assert "Failed to detach context" in caplog.text


# ---------------------------------------------------------------- attributes at start (StartAttributes)

START = {"gen_ai.operation.name": "execute_tool"}


class _Reads(SpanProcessor):
    """A processor whose on_start reads the span's attributes."""

    def __init__(self):
        self.seen: list[dict] = []

    def on_start(self, span, parent_context=None):
        self.seen.append(dict(span.attributes))


class _Quiet(SpanProcessor):
    def on_start(self, span, parent_context=None):
        """Documented, and nothing else."""


class _SamplerThatReads:
    """A sampler of the user's: it sees the attributes a span starts with."""

    def __init__(self):
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        self.seen: list[dict] = []
        self._on = ALWAYS_ON

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.seen.append(dict(attributes or {}))
        return self._on.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self):
        return "reads"


def _tool_spans(provider, monkeypatch, calls=1):
    """Spans of ``calls`` @tool calls recorded through a Recorder on ``provider``'s tracer."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rec = recorder.Recorder(provider.get_tracer(recorder.SCOPE_NAME))
    monkeypatch.setattr(current, "_recorder", rec)

    @agent_otel.tool
    def lookup(x):
        """Look a thing up."""
        return x

    for _ in range(calls):
        assert lookup(3) == 3
    return rec, exporter.get_finished_spans()


def test_nothing_reads_them_at_start_then_they_go_on_at_the_end(monkeypatch):
    # The SDK's default sampler and processors whose on_start does nothing:
    # the span starts without attributes and exports what it always did.
    provider = TracerProvider()
    provider.add_span_processor(_Quiet())
    rec, (span,) = _tool_spans(provider, monkeypatch)
    assert rec.start_attributes.get() is None
    attributes = dict(span.attributes)
    assert list(attributes)[:4] == [
        "gen_ai.operation.name",
        "gen_ai.tool.name",
        "gen_ai.tool.type",
        "gen_ai.tool.description",
    ]
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["agent.tool.outcome"] == "ok"
    assert span.dropped_attributes == 0


def test_a_processor_that_reads_at_start_sees_them(monkeypatch):
    provider = TracerProvider()
    reads = _Reads()
    provider.add_span_processor(reads)
    rec, (span,) = _tool_spans(provider, monkeypatch)
    assert reads.seen == [START]
    assert dict(span.attributes)["gen_ai.operation.name"] == "execute_tool"
    assert list(span.attributes)[0] == "gen_ai.operation.name"


def test_a_processor_added_later_is_checked_when_it_comes(monkeypatch):
    provider = TracerProvider()
    rec, _ = _tool_spans(provider, monkeypatch)
    assert rec.start_attributes.get() is None
    reads = _Reads()
    provider.add_span_processor(reads)
    assert rec.start_attributes.get() == START
    start = rec.begin(agent_otel.capture.meta.ToolMeta("lookup"))
    rec.end(start)
    assert reads.seen == [START]


def test_a_sampler_of_the_users_sees_them(monkeypatch):
    sampler = _SamplerThatReads()
    provider = TracerProvider(sampler=sampler)
    rec, (span,) = _tool_spans(provider, monkeypatch)
    assert sampler.seen == [START]
    assert rec.start_attributes.get() == START
    assert dict(span.attributes)["gen_ai.operation.name"] == "execute_tool"


def test_the_sdks_samplers_do_not_read_them():
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, ParentBasedTraceIdRatio, TraceIdRatioBased

    for sampler in (ALWAYS_OFF, TraceIdRatioBased(0.5), ParentBasedTraceIdRatio(0.5), ParentBased(ALWAYS_OFF)):
        tracer = TracerProvider(sampler=sampler).get_tracer("test")
        assert sdk_span.StartAttributes(tracer, START).get() is None
    reads = ParentBased(_SamplerThatReads())  # type: ignore[arg-type]
    assert sdk_span.StartAttributes(TracerProvider(sampler=reads).get_tracer("test"), START).get() == START
    # Not the SDK's tracer: always.
    from opentelemetry.trace import NoOpTracer

    assert sdk_span.StartAttributes(NoOpTracer(), START).get() == START


def test_what_counts_as_doing_nothing_at_start():
    class Passes(SpanProcessor):
        def on_start(self, span, parent_context=None):
            pass

    class Returns(SpanProcessor):
        def on_start(self, span, parent_context=None):
            return None

    class Counts(SpanProcessor):
        count = 0

        def on_start(self, span, parent_context=None):
            Counts.count += 1

    assert sdk_span._does_nothing(SpanProcessor().on_start)  # the SDK's base: a docstring
    assert sdk_span._does_nothing(Passes().on_start)
    assert sdk_span._does_nothing(_Quiet().on_start)
    assert sdk_span._does_nothing(SimpleSpanProcessor(InMemorySpanExporter()).on_start)
    assert sdk_span._does_nothing(Returns().on_start)  # compiles to what pass does
    assert not sdk_span._does_nothing(Counts().on_start)
    assert not sdk_span._does_nothing(_Reads().on_start)
    assert not sdk_span._does_nothing(lambda span, parent_context=None: None)  # not a method of its class
    assert not sdk_span._does_nothing(None)
