"""Deferred spans (``deferred_spans``, capture/deferred.py): the hot path makes no
SDK span; the pipeline builds it after the call. The spans exported must be
the ones the default path exports, field by field.

Each scenario runs twice, in the default mode and deferred, with the same
sequential ids (an id generator that counts) and the same clock (the
recorder's and the executor hook's clock, a counter), and the exported
spans (``ReadableSpan.to_json()``, the scope, and the span processors'
view) are compared whole.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    Sampler,
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

import agent_otel
from agent_otel.capture import current, deferred, executors, meta, recorder, wrappers
from agent_otel.capture.deferred import DeferredSpan


class Counting(IdGenerator):
    """Ids 1, 2, 3, ...: the same in both modes when the spans are made in the same order."""

    def __init__(self):
        self._next = itertools.count(1)

    def generate_span_id(self) -> int:
        return next(self._next)

    def generate_trace_id(self) -> int:
        return next(self._next) << 64


class Clock:
    def __init__(self):
        self._next = itertools.count(1_000_000, 1_000)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return next(self._next)


class Seen(SpanProcessor):
    """What a span processor is given: on_start then on_end, and on which thread."""

    def __init__(self):
        self.calls: list[tuple[str, str, str]] = []

    def on_start(self, span, parent_context=None):
        pass

    def on_end(self, span):
        self.calls.append(("end", span.name, threading.current_thread().name))


def _exported(monkeypatch, deferred: bool, scenario, sampler=None):
    """The spans ``scenario(tracer)`` exports, in the mode, as comparable data."""
    provider = TracerProvider(id_generator=Counting(), **({"sampler": sampler} if sampler else {}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen = Seen()
    provider.add_span_processor(seen)
    clock = Clock()
    monkeypatch.setattr(recorder, "perf_counter_ns", clock)
    monkeypatch.setattr(executors, "perf_counter_ns", clock)
    cpu = Clock()
    monkeypatch.setattr(wrappers, "thread_time_ns", cpu)
    monkeypatch.setattr(meta, "thread_time_ns", cpu)
    monkeypatch.setattr(meta, "_META_CACHE", {})  # each run's tool_span starts with the same CPU sampling
    rec = recorder.Recorder(provider.get_tracer(recorder.SCOPE_NAME, agent_otel.__version__), deferred_spans=deferred)
    monkeypatch.setattr(current, "_recorder", rec)
    monitor = executors.ExecutorMonitor()
    executors.install(monitor)
    try:
        scenario(provider.get_tracer("child"))
    finally:
        executors.uninstall()
        monkeypatch.setattr(current, "_recorder", None)
    assert not rec.inflight
    built_before_drain = len(exporter.get_finished_spans())
    from agent_otel.exporters.prometheus import Metrics
    from agent_otel.wiring.pipeline import Pipeline

    Pipeline(rec, monitor, Metrics()).drain(spans=True)
    spans = sorted(exporter.get_finished_spans(), key=lambda span: span.context.span_id)
    return (
        [(json.loads(span.to_json()), span.instrumentation_scope) for span in spans],
        built_before_drain,
        seen.calls,
        rec,
    )


def _both(monkeypatch, scenario, sampler=None):
    default, _, _, _ = _exported(monkeypatch, False, scenario, sampler)
    deferred, before_drain, seen, rec = _exported(monkeypatch, True, scenario, sampler)
    assert deferred == default
    return default, before_drain, seen, rec


def _direct(child_tracer):
    @agent_otel.tool
    def lookup(x):
        """Look a thing up."""
        span = trace.get_current_span()
        span.set_attribute("user.key", [1, 2])
        span.add_event("user.event", {"n": 1}, timestamp=5)
        with child_tracer.start_as_current_span("GET", start_time=10, end_on_exit=False) as child:
            child.end(end_time=20)
        return x * 2

    assert lookup(3) == 6


def test_a_direct_call_with_a_child_span_exports_the_same_span(monkeypatch):
    spans, before_drain, seen, _ = _both(monkeypatch, _direct)
    ((tool, _),) = [s for s in spans if s[0]["name"] == "execute_tool lookup"]
    ((child, _),) = [s for s in spans if s[0]["name"] == "GET"]
    assert child["parent_id"] == tool["context"]["span_id"]
    assert child["context"]["trace_id"] == tool["context"]["trace_id"]
    assert tool["attributes"]["user.key"] == [1, 2]
    assert tool["attributes"]["agent.tool.outcome"] == "ok"
    assert [e["name"] for e in tool["events"]] == ["user.event"]
    # Deferred: only the child was exported during the call; the tool span by the drain, on its thread.
    assert before_drain == 1
    assert seen == [("end", "GET", "MainThread"), ("end", "execute_tool lookup", "MainThread")]


def test_async_calls_nested_in_a_parent_span_export_the_same_spans(monkeypatch):
    def scenario(child_tracer):
        @agent_otel.tool
        async def fetch(x):
            await asyncio.sleep(0)
            with child_tracer.start_as_current_span("inner", start_time=1, end_on_exit=False) as inner:
                inner.end(end_time=2)
            return x

        @agent_otel.tool
        async def outer(x):
            return await fetch(x) + await fetch(x + 1)

        async def main():
            with child_tracer.start_as_current_span("agent", start_time=1, end_on_exit=False) as root:
                assert await outer(1) == 3
                root.end(end_time=3)

        asyncio.run(main())

    spans, *_ = _both(monkeypatch, scenario)
    names = {s["context"]["span_id"]: s for s, _ in spans}
    by_name = {}
    for s, _ in spans:
        by_name.setdefault(s["name"], []).append(s)
    (outer,) = by_name["execute_tool outer"]
    (root,) = by_name["agent"]
    assert outer["parent_id"] == root["context"]["span_id"]
    assert [f["parent_id"] for f in by_name["execute_tool fetch"]] == [outer["context"]["span_id"]] * 2
    assert all(names[i["parent_id"]]["name"] == "execute_tool fetch" for i in by_name["inner"])


def test_a_failed_call_exports_the_same_span(monkeypatch):
    def scenario(child_tracer):
        @agent_otel.tool
        def broken():
            trace.get_current_span().set_status(Status(StatusCode.UNSET))
            raise KeyError("missing")

        with pytest.raises(KeyError, match="missing"):
            broken()

    spans, *_ = _both(monkeypatch, scenario)
    ((tool, _),) = spans
    assert tool["status"]["status_code"] == "ERROR"
    assert tool["attributes"]["error.type"] == "KeyError"
    assert [e["name"] for e in tool["events"]] == ["exception"]


def test_calls_queued_on_an_executor_export_the_same_spans(monkeypatch):
    def scenario(child_tracer):
        @agent_otel.tool
        def work(x):
            return x + 1

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool") as pool:
            assert [pool.submit(work, i).result() for i in range(3)] == [1, 2, 3]

    spans, *_ = _both(monkeypatch, scenario)
    assert len(spans) == 3
    for tool, _ in spans:
        assert tool["attributes"]["agent.tool.executor"] == "pool"
        assert [e["name"] for e in tool["events"]] == ["exec.start"]
        assert tool["attributes"]["agent.tool.queue.duration"] > 0


def test_a_generator_and_a_tool_span_block_export_the_same_spans(monkeypatch):
    def scenario(child_tracer):
        @agent_otel.tool
        def numbers(n):
            yield from range(n)

        assert list(numbers(3)) == [0, 1, 2]
        with agent_otel.tool_span("inline", call_id="call-1") as span:
            span.update_name("execute_tool renamed")

    spans, *_ = _both(monkeypatch, scenario)
    assert sorted(s["name"] for s, _ in spans) == ["execute_tool numbers", "execute_tool renamed"]


SAMPLERS = {
    "off": ALWAYS_OFF,
    "ratio": TraceIdRatioBased(0.5),
    "parent-off": ParentBased(ALWAYS_OFF),
    "parent-ratio": ParentBasedTraceIdRatio(0.3),
    # Not made of bounds: new_span asks should_sample.
    "nested": ParentBased(ParentBased(TraceIdRatioBased(0.5)), local_parent_sampled=ALWAYS_OFF),
}


@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_the_samplers_decide_as_on_the_default_path(monkeypatch, sampler):
    def scenario(child_tracer):
        @agent_otel.tool
        def lookup(x):
            with child_tracer.start_as_current_span("GET", start_time=1, end_on_exit=False) as child:
                child.end(end_time=2)
            return x

        for i in range(8):
            assert lookup(i) == i

    spans, _, _, rec = _both(monkeypatch, scenario, sampler)
    assert rec.deferred
    assert (rec._decide is None) == (sampler is SAMPLERS["nested"])
    if sampler is ALWAYS_OFF:
        assert spans == []


def test_the_bounds_decide_as_the_sdks_samplers():
    samplers = [
        ALWAYS_ON,
        ALWAYS_OFF,
        TraceIdRatioBased(0.25),
        TraceIdRatioBased(0.0),
        TraceIdRatioBased(1.0),
        ParentBased(ALWAYS_ON),
        ParentBased(TraceIdRatioBased(0.5), remote_parent_sampled=ALWAYS_OFF, local_parent_not_sampled=ALWAYS_ON),
        ParentBasedTraceIdRatio(0.7),
    ]
    state = TraceState([("vendor", "x")])
    random = RandomIdGenerator()

    def parents(trace_id):
        yield None
        yield trace.INVALID_SPAN
        for remote in (False, True):
            for flags in (0, 1, 3):
                context = SpanContext(trace_id, 9, is_remote=remote, trace_flags=TraceFlags(flags), trace_state=state)
                yield trace.NonRecordingSpan(context)

    class Ids(RandomIdGenerator):
        trace_id = 0

        def generate_trace_id(self) -> int:
            return self.trace_id

    ids = Ids()
    for sampler in samplers:
        decide = deferred.bounds(sampler)
        assert decide is not None
        for _ in range(300):
            ids.trace_id = random.generate_trace_id()
            for parent in parents(random.generate_trace_id()):
                context = trace.set_span_in_context(parent) if parent is not None else Context()
                span = deferred.new_span(sampler, decide, ids, meta.ToolMeta("t"), None, context, parent)
                got = span.get_span_context()
                expected = sampler.should_sample(context, got.trace_id, "execute_tool t", SpanKind.INTERNAL, None, ())
                assert got.trace_flags.sampled == (expected.decision is Decision.RECORD_AND_SAMPLE)
                assert isinstance(span, DeferredSpan) == expected.decision.is_recording()
                assert got.trace_state == (expected.trace_state if expected.trace_state is not None else TraceState())
                if parent is not None and parent.get_span_context().is_valid:
                    assert got.trace_id == parent.get_span_context().trace_id
                    assert got.trace_flags.random_trace_id == parent.get_span_context().trace_flags.random_trace_id


def test_the_span_inside_the_call_is_the_tool_spans_context_and_keeps_what_is_set(monkeypatch):
    inside = []

    def scenario(child_tracer):
        @agent_otel.tool
        def lookup():
            inside.append(trace.get_current_span())
            trace.get_current_span().set_attribute("user.late", "kept")

        lookup()

    deferred, *_ = _exported(monkeypatch, True, scenario)
    ((tool, _),) = deferred
    (span,) = inside
    assert isinstance(span, DeferredSpan)
    assert span.get_span_context().span_id == int(tool["context"]["span_id"], 16)
    assert tool["attributes"]["user.late"] == "kept"
    # After the call the span takes nothing (as an ended SDK span).
    assert not span.is_recording()
    span.set_attribute("after", 1)
    assert span.ops == [("set_attribute", "user.late", "kept")]


class _Starts(SpanProcessor):
    def on_start(self, span, parent_context=None):
        self.started = True


def deferred_recorder(monkeypatch, tracer) -> recorder.Recorder:
    """A Recorder with deferred_spans on, over ``tracer``, installed as the current one for the test."""
    rec = recorder.Recorder(tracer, deferred_spans=True)
    monkeypatch.setattr(current, "_recorder", rec)
    return rec


def test_a_processor_whose_on_start_does_work_takes_the_default_path(monkeypatch):
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rec = deferred_recorder(monkeypatch, provider.get_tracer(recorder.SCOPE_NAME))

    @agent_otel.tool
    def lookup():
        return type(trace.get_current_span()).__name__

    assert lookup() == "DeferredSpan"
    provider.add_span_processor(_Starts())
    assert lookup() == "_Span"
    assert len(rec.spans) == 1  # the first call's, waiting for the pipeline


def test_a_tracer_that_is_not_the_sdks_takes_the_default_path(monkeypatch):
    rec = deferred_recorder(monkeypatch, trace.NoOpTracer())
    assert not rec.deferred

    @agent_otel.tool
    def lookup():
        return 1

    assert lookup() == 1
    assert not rec.spans


def test_the_setting_reaches_the_recorder_and_force_flush_builds(spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), deferred_spans=True)
    try:
        assert handle.recorder.deferred

        @agent_otel.tool
        def lookup():
            return 1

        lookup()
        handle.force_flush()
        (span,) = spans.tools("lookup")
        assert span.attributes["agent.tool.outcome"] == "ok"
    finally:
        agent_otel.uninstrument()


def test_a_span_that_fails_to_build_is_reported_and_the_rest_built(monkeypatch, caplog):
    def scenario(child_tracer):
        @agent_otel.tool
        def lookup(x):
            if x == 1:
                trace.get_current_span().set_attribute("user.bad", "x")
            return x

        for i in range(3):
            lookup(i)

    build = recorder.Recorder.build_span

    def fails_on_the_bad_one(self, replay, deferred):
        if deferred.ops:
            raise RuntimeError("cannot build")
        build(self, replay, deferred)

    monkeypatch.setattr(recorder.Recorder, "build_span", fails_on_the_bad_one)
    with caplog.at_level("WARNING", logger="agent_otel"):
        deferred, _, _, rec = _exported(monkeypatch, True, scenario)
    assert [tool["attributes"]["agent.tool.outcome"] for tool, _ in deferred] == ["ok", "ok"]
    assert not rec.spans
    assert "deferred spans failed (RuntimeError: cannot build)" in caplog.text


def test_shutdown_builds_the_spans_of_calls_that_ended_after_the_pipelines_last_drain(spans, monkeypatch):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), deferred_spans=True)
    rec = handle.recorder
    active = rec.begin(meta.ToolMeta("late"), attach=False)  # ended on the shutdown thread
    last_drain = handle.pipeline.shutdown

    def then_the_call_ends(timeout_s):
        done = last_drain(timeout_s)
        rec.end(active)
        return done

    monkeypatch.setattr(handle.pipeline, "shutdown", then_the_call_ends)
    agent_otel.uninstrument()
    (span,) = spans.tools("late")
    assert span.attributes["agent.tool.outcome"] == "ok"
    assert not rec.spans


def test_calls_a_stuck_pipeline_never_built_are_counted_as_dropped_at_shutdown(spans, monkeypatch):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), deferred_spans=True)
    rec = handle.recorder
    stuck = [rec.begin(meta.ToolMeta("stuck"), attach=False) for _ in range(3)]
    last_drain = handle.pipeline.shutdown

    def times_out(timeout_s):  # the calls end while the pipeline's last drain hangs
        last_drain(timeout_s)
        for active in stuck:
            rec.end(active)
        return False

    monkeypatch.setattr(handle.pipeline, "shutdown", times_out)
    assert agent_otel.uninstrument(timeout_s=1.0) is False
    assert spans.tools("stuck") == []
    dropped = handle.metrics.registry.get_sample_value("agent_otel_spans_dropped_total", {"kind": "tool"})
    assert dropped == 3


class _ReadsAttributes(Sampler):
    """A sampler of the user's: it may read the attributes, so the span must start with them."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self):
        return "reads"


def test_a_sampler_of_the_users_and_a_disabled_tracer_take_the_default_path(monkeypatch):
    provider = TracerProvider(sampler=_ReadsAttributes())
    rec = deferred_recorder(monkeypatch, provider.get_tracer(recorder.SCOPE_NAME))

    @agent_otel.tool
    def lookup():
        return type(trace.get_current_span()).__name__

    assert lookup() == "_Span"
    rec = deferred_recorder(monkeypatch, TracerProvider().get_tracer(recorder.SCOPE_NAME))
    assert lookup() == "DeferredSpan"
    monkeypatch.setattr(rec, "_enabled", lambda: False)  # as Tracer._is_enabled() of a disabled tracer
    assert lookup() == "_Span"
    assert len(rec.spans) == 1


def test_the_pipeline_thread_builds_them_and_a_drain_before_a_scrape_does_not(monkeypatch):
    from agent_otel.exporters.prometheus import Metrics
    from agent_otel.wiring.pipeline import Pipeline

    provider = TracerProvider()
    seen = Seen()
    provider.add_span_processor(seen)
    rec = deferred_recorder(monkeypatch, provider.get_tracer(recorder.SCOPE_NAME))

    @agent_otel.tool
    def lookup():
        return 1

    lookup()
    pipeline = Pipeline(rec, None, Metrics(), interval_s=0.02)
    pipeline.drain()  # as before a scrape or a GPU poll: the metrics only
    assert len(rec.spans) == 1 and seen.calls == []
    pipeline.start()
    try:
        deadline = time.monotonic() + 10
        while not seen.calls and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        pipeline.shutdown(5.0)
    assert seen.calls == [("end", "execute_tool lookup", "agent-otel-pipeline")]


def test_a_tool_that_calls_itself_has_one_span_in_both_modes(monkeypatch):
    def scenario(child_tracer):
        @agent_otel.tool
        def countdown(n):
            return 0 if n == 0 else countdown(n - 1) + 1

        assert countdown(3) == 3

    spans, *_ = _both(monkeypatch, scenario)
    assert [tool["name"] for tool, _ in spans] == ["execute_tool countdown"]


def test_an_exception_recorded_in_the_tool_keeps_the_stack_it_had_then(monkeypatch):
    # The exception goes on up the stack after it was recorded (its
    # traceback grows): the event says where it was when recorded, as the
    # SDK span's record_exception does.
    def scenario(child_tracer):
        @agent_otel.tool
        def fails():
            try:
                raise ValueError("bad input")
            except ValueError as exc:
                trace.get_current_span().record_exception(exc, {"user.note": "x"}, timestamp=7)
                raise

        def caller():
            fails()

        with pytest.raises(ValueError):
            caller()

    spans, *_ = _both(monkeypatch, scenario)
    ((tool, _),) = spans
    recorded = [e for e in tool["events"] if e["attributes"].get("user.note") == "x"]
    assert len(recorded) == 1
    assert "caller" not in recorded[0]["attributes"]["exception.stacktrace"]
