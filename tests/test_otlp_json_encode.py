"""The OTLP/JSON encoder against the one it replaced: the same JSON value for
every kind of span and attribute value, random ones included.

``reference_encode_spans_json`` below is the encoder before msgspec wrote
the lines (plain dicts and ``json.dumps``), kept here as the reference. The
encoder writes bytes (a template per span shape, pieces for the rest); every
line is also compared byte for byte with the same spans built as dicts by the
encoder's own ``_request_json`` and written by msgspec (the standard library
where msgspec cannot), which is how the encoder wrote them before.
"""

from __future__ import annotations

import binascii
import json
import math
import random
from collections.abc import Mapping, Sequence

import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from agent_otel.exporters import otlp_json_file
from agent_otel.spans.otlp_json import iter_spans
from agent_otel.exporters.otlp_json_file import encode_spans_json

# --- the reference: the encoder as it was -------------------------------------------


def reference_encode_spans_json(spans: Sequence[ReadableSpan]) -> str:
    """One ``ExportTraceServiceRequest`` as an OTLP/JSON line (no newline).

    Built as plain dicts straight from the SDK's spans: the same JSON as the
    SDK's protobuf encoder followed by ``MessageToDict`` and hex ids (the
    tests hold the two equal), at about a quarter of the cost, which matters
    on the span processor's thread.
    """
    grouped: dict = {}
    for span in spans:
        scopes = grouped.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope, []).append(_ref_span_json(span))
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry = {"scope": _ref_scope_json(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        entry = {
            "resource": _ref_without_empty({"attributes": _ref_attributes_json(resource.attributes)}),
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    # ASCII escapes keep a lone surrogate (text decoded with errors="surrogateescape")
    # from failing the whole batch at write time.
    return json.dumps({"resourceSpans": resource_spans}, separators=(",", ":"))


# SpanFlags: the parent's is_remote is known (0x100), and true (0x200).
_ref_FLAG_HAS_IS_REMOTE = 0x100
_ref_FLAG_IS_REMOTE = 0x200


def _ref_span_json(span: ReadableSpan) -> dict:
    context = span.get_span_context() or INVALID_SPAN_CONTEXT  # an SDK span always has one
    parent = span.parent
    encoded = _ref_without_empty(
        {
            "traceId": f"{context.trace_id:032x}",
            "spanId": f"{context.span_id:016x}",
            "traceState": _ref_trace_state_json(context.trace_state),
            "parentSpanId": f"{parent.span_id:016x}" if parent else "",
            "name": span.name,
            "kind": span.kind.value + 1,  # OTLP counts SPAN_KIND_UNSPECIFIED as 0
            "startTimeUnixNano": str(span.start_time or ""),
            "endTimeUnixNano": str(span.end_time or ""),
            "attributes": _ref_attributes_json(span.attributes),
            "droppedAttributesCount": span.dropped_attributes,
            "events": [_ref_event_json(event) for event in span.events],
            "droppedEventsCount": span.dropped_events,
            "links": [_ref_link_json(link) for link in span.links],
            "droppedLinksCount": span.dropped_links,
            "flags": _ref_flags(parent),
        }
    )
    # status is a message field: written even when it holds defaults.
    encoded["status"] = _ref_without_empty(
        {"message": span.status.description or "", "code": span.status.status_code.value}
    )
    return encoded


def _ref_flags(context) -> int:
    if context is not None and context.is_remote:
        return _ref_FLAG_HAS_IS_REMOTE | _ref_FLAG_IS_REMOTE
    return _ref_FLAG_HAS_IS_REMOTE


def _ref_trace_state_json(trace_state) -> str:
    return ",".join(f"{key}={value}" for key, value in trace_state.items()) if trace_state else ""


def _ref_event_json(event) -> dict:
    return _ref_without_empty(
        {
            "timeUnixNano": str(event.timestamp or ""),
            "name": event.name,
            "attributes": _ref_attributes_json(event.attributes),
            "droppedAttributesCount": event.dropped_attributes,
        }
    )


def _ref_link_json(link) -> dict:
    return _ref_without_empty(
        {
            "traceId": f"{link.context.trace_id:032x}",
            "spanId": f"{link.context.span_id:016x}",
            "attributes": _ref_attributes_json(link.attributes),
            "droppedAttributesCount": link.dropped_attributes,
            "flags": _ref_flags(link.context),
        }
    )


def _ref_scope_json(scope) -> dict:
    if scope is None:
        return {}
    return _ref_without_empty(
        {"name": scope.name, "version": scope.version or "", "attributes": _ref_attributes_json(scope.attributes)}
    )


def _ref_without_empty(message: dict) -> dict:
    # proto3 JSON leaves out fields that hold their default value.
    return {key: value for key, value in message.items() if value}


def _ref_attributes_json(attributes) -> list:
    if not attributes:
        return []
    encoded = []
    for key, value in attributes.items():
        try:
            encoded.append({"key": key, "value": _ref_value_json(value)})
        except TypeError:
            pass  # the encoder logs it
    return encoded


def _ref_value_json(value) -> dict:
    """An ``AnyValue`` (a oneof: written even when it holds a default)."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        # Changed on purpose from the encoder before: beyond int64, the decimal text.
        return {"intValue": str(value)} if -(2**63) <= value < 2**63 else {"stringValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _ref_double_json(value)}
    if isinstance(value, bytes):
        return {"bytesValue": binascii.b2a_base64(value, newline=False).decode("ascii")}
    if isinstance(value, Sequence):
        return {"arrayValue": _ref_without_empty({"values": [_ref_value_json(item) for item in value]})}
    if isinstance(value, Mapping):
        return {
            "kvlistValue": _ref_without_empty({"values": _ref_attributes_json({str(k): v for k, v in value.items()})})
        }
    raise TypeError(type(value).__name__)


def _ref_double_json(value: float):
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return value


# --- the spans -----------------------------------------------------------------------

EVERY_KIND = {
    "text": "web_search",
    "empty text": "",
    "non-ascii": 'naïve 東京 \U0001f600 \u2028 \x00\x1f\x7f "quoted" \\',
    "zero": 0,
    "negative": -5,
    "int64 max": 2**63 - 1,
    "beyond int64": 2**64 + 7,
    "below int64": -(2**70),
    "double": 0.25,
    "tiny double": 7.213e-06,
    "huge double": 1e300,
    "zero double": -0.0,
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "true": True,
    "false": False,
    "bytes": b"\x00\xff binary",
    "empty bytes": b"",
    "strs": ("net", "slow", ""),
    "ints": (1, -2, 2**65),
    "doubles": (1.5, float("nan"), float("-inf")),
    "bools": (True, False),
    "empty": (),
}


def sdk_spans(values: Mapping = EVERY_KIND) -> list:
    """Spans made by the SDK: two resources, several scopes, a remote parent
    with trace state, links, events, every status and kind, and every value
    kind the SDK keeps, interleaved so that the grouping changes span to span."""
    memory = InMemorySpanExporter()
    providers = [
        TracerProvider(resource=Resource.create({"service.name": "svc"}, schema_url="https://example.com/1")),
        TracerProvider(resource=Resource.create({"service.name": "other", "n": 3})),
    ]
    for provider in providers:
        provider.add_span_processor(SimpleSpanProcessor(memory))
    tracers = [
        providers[0].get_tracer("agent_otel", "0.1.0", schema_url="https://example.com/s", attributes={"lib": 1}),
        providers[0].get_tracer("other"),
        providers[1].get_tracer("agent_otel"),
    ]
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    parent_context = trace.set_span_in_context(NonRecordingSpan(remote))
    for number in range(12):
        tracer = tracers[number % len(tracers)]
        kind = list(SpanKind)[number % len(SpanKind)]
        context = parent_context if number % 2 else None
        links = [Link(remote, {"why": "retry"}), Link(remote)] if number % 3 == 0 else []
        with tracer.start_as_current_span(f"span {number}", context=context, kind=kind, links=links) as span:
            span.set_attributes(values if number % 4 else {"only": "one"})
            span.add_event("exec.start", {"worker": "io_0", "q": 1.5})
            if number % 5 == 0:
                span.add_event("")  # no name, no attributes
            with tracer.start_as_current_span("" if number == 7 else "child") as child:
                child.set_status(Status(StatusCode.ERROR, "boom") if number % 2 else Status(StatusCode.ERROR))
            if number % 3 == 1:
                span.set_status(Status(StatusCode.OK))
    spans = memory.get_finished_spans()
    assert len(spans) == 24
    return list(spans)


def dicts_encoded(spans) -> str:
    """The line as the encoder wrote it before it wrote bytes: its dicts, by msgspec."""
    request = otlp_json_file._request_json(spans, [])
    try:
        return msgspec.json.encode(request).decode("utf-8")
    except (UnicodeEncodeError, TypeError):
        return json.dumps(request, separators=(",", ":"))


def assert_same(spans, again: bool = True) -> str:
    line = encode_spans_json(spans)
    assert isinstance(line, str) and "\n" not in line
    assert json.loads(line) == json.loads(reference_encode_spans_json(spans))
    assert line == dicts_encoded(spans)  # byte for byte
    if again:
        assert encode_spans_json(spans) == line  # and again, from what was kept
    return line


def test_every_kind_of_sdk_span_encodes_as_the_reference_did():
    spans = sdk_spans()
    line = assert_same(spans)
    request = json.loads(line)
    assert len(request["resourceSpans"]) == 2
    assert [len(r["scopeSpans"]) for r in request["resourceSpans"]] == [2, 1]
    written = {
        s["name"]: s for r in request["resourceSpans"] for ss in r["scopeSpans"] for s in ss["spans"] if "name" in s
    }
    values = {a["key"]: a["value"] for a in written["span 1"]["attributes"]}
    assert values["beyond int64"] == {"stringValue": str(2**64 + 7)}
    assert values["int64 max"] == {"intValue": str(2**63 - 1)}
    assert values["nan"] == {"doubleValue": "NaN"} and values["-inf"] == {"doubleValue": "-Infinity"}
    assert values["bytes"] == {"bytesValue": "AP8gYmluYXJ5"}
    assert values["empty"] == {"arrayValue": {}}
    assert values["non-ascii"] == {"stringValue": EVERY_KIND["non-ascii"]}
    assert written["span 1"]["traceState"] == "k=v" and written["span 1"]["flags"] == 0x300
    for one in spans:  # single spans too: each its own batch
        assert_same([one])


def test_the_bytes_are_the_references_for_ascii_text_and_plain_doubles():
    # Key order and separators as before; msgspec writes UTF-8 rather than
    # \u escapes, and exponents as 1e-7 rather than 1e-07, so only there the
    # bytes differ (the JSON value never does: the test above).
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("agent_otel", "0.1.0").start_as_current_span("invoke_agent a") as root:
        root.add_event("x", {"n": 1})
        with provider.get_tracer("agent_otel", "0.1.0").start_as_current_span(
            "execute_tool web_search",
            attributes={"gen_ai.tool.name": "web_search", "agent.tool.queue.duration": 0.25, "n": 2, "ok": True},
        ) as span:
            span.set_status(Status(StatusCode.ERROR, "boom"))
    spans = memory.get_finished_spans()
    assert encode_spans_json(spans) == reference_encode_spans_json(spans)


class Level(int):
    pass


class Name(str):
    pass


def test_values_beyond_the_sdks_checks_encode_as_the_reference_did(caplog):
    # Another library's ReadableSpan may carry anything: maps, None, nested
    # arrays, subclasses, values OTLP cannot carry (dropped, with a warning).
    context = SpanContext(2**128 - 1, 2**64 - 1, is_remote=False)
    attributes = {
        "map": {"a": 1, "b": {"c": [1, "x", None]}, 3: "key made text"},
        "empty map": {},
        "none": None,
        "nested": [[1, 2], ["a"], [], [None]],
        "list": [1.5, "mixed", True, b"\x01"],
        "int subclass": Level(7),
        "str subclass": Name("n"),
        "enum kind": SpanKind.CLIENT,
        "cannot": object(),
        "cannot inside": [1, object()],
        "after": "kept",
    }
    event = Event("e", attributes={"m": {"k": "v"}, "bad": object()}, timestamp=5)
    spans = [
        ReadableSpan(
            "odd",
            context=context,
            parent=SpanContext(1, 2, is_remote=False),
            resource=Resource({"r": ("a", "b")}),
            attributes=attributes,
            events=[event],
            links=[Link(INVALID_SPAN_CONTEXT, {"l": 1})],
            instrumentation_scope=InstrumentationScope("s", attributes={"x": 1.0}),
            start_time=0,
            end_time=10,
        ),
        ReadableSpan("no scope", context=context, resource=Resource({})),
    ]
    with caplog.at_level("WARNING", logger="agent_otel.exporters.otlp_json_file"):
        line = assert_same(spans, again=False)
    written = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    keys = [a["key"] for a in written["attributes"]]
    assert "cannot" not in keys and "cannot inside" not in keys and keys[-1] == "after"
    assert "startTimeUnixNano" not in written and written["endTimeUnixNano"] == "10"
    assert sum("OTLP cannot carry" in r.getMessage() for r in caplog.records) == 4  # with the event's


def test_a_lone_surrogate_is_written_as_an_escape_and_read_back(tmp_path):
    odd = "tool " + b"\xff".decode("utf-8", "surrogateescape")
    spans = [
        ReadableSpan(
            odd,
            context=SpanContext(1, 2, is_remote=False),
            resource=Resource({}),
            attributes={odd: odd, "list": [odd]},
        )
    ]
    line = assert_same(spans)
    assert "\\udcff" in line


# --- the fuzz --------------------------------------------------------------------------


def random_text(rng: random.Random) -> str:
    alphabet = 'abc "\\/\x00\x1f\x7fé東\u2028\U0001f600'
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
    return text + "\udcff" if rng.random() < 0.02 else text


def random_double(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.1:
        return rng.choice([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308])
    if pick < 0.5:
        return rng.uniform(-1e6, 1e6)
    return rng.uniform(-1, 1) * 10.0 ** rng.randrange(-30, 30)


def random_value(rng: random.Random, depth: int = 0):
    pick = rng.randrange(11 if depth < 2 else 7)
    if pick == 0:
        return random_text(rng)
    if pick == 1:
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 2**64, -(2**100)]) + rng.randrange(-3, 4)
    if pick == 2:
        return rng.randrange(-(2**40), 2**40)
    if pick == 3:
        return random_double(rng)
    if pick == 4:
        return rng.random() < 0.5
    if pick == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(5)))
    if pick == 6:
        return None
    if pick in (7, 8):
        return tuple(random_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    if pick == 9:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {random_text(rng): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


@pytest.mark.parametrize("seed", range(4))
def test_random_attribute_values_encode_as_the_reference_did(seed):
    rng = random.Random(seed)
    resources = [Resource({"service.name": "a"}), Resource({"service.name": "b", "v": random_double(rng)})]
    spans = []
    for number in range(150):
        attributes = {random_text(rng) + str(k): random_value(rng) for k in range(rng.randrange(12))}
        events = [
            Event(random_text(rng), {"k": random_value(rng)}, timestamp=rng.randrange(2**63))
            for _ in range(rng.randrange(3))
        ]
        spans.append(
            ReadableSpan(
                random_text(rng),
                context=SpanContext(rng.getrandbits(128), rng.getrandbits(64), is_remote=False),
                parent=SpanContext(1, rng.getrandbits(64), is_remote=rng.random() < 0.5) if number % 2 else None,
                resource=rng.choice(resources),
                attributes=attributes,
                events=events,
                kind=rng.choice(list(SpanKind)),
                status=Status(rng.choice(list(StatusCode)), random_text(rng) or None),
                start_time=rng.randrange(2**63),
                end_time=rng.randrange(2**63),
            )
        )
    assert_same(spans)
    for start in range(0, len(spans), 7):  # and in small batches
        assert_same(spans[start : start + 7])


def test_what_is_written_is_read_back(tmp_path):
    from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

    path = tmp_path / "traces.jsonl"
    exporter = OtlpJsonFileExporter(str(path))
    spans = sdk_spans(EVERY_KIND)
    exporter.export(spans)
    exporter.shutdown()
    records = list(iter_spans(str(path)))
    assert sorted(r.name for r in records) == sorted(s.name for s in spans)
    by_name = {r.name: r for r in records}
    assert by_name["span 1"].attributes["non-ascii"] == EVERY_KIND["non-ascii"]
    assert by_name["span 1"].attributes["tiny double"] == 7.213e-06
    # OTLP's intValue is an int64: beyond it, the value's decimal text.
    assert by_name["span 1"].attributes["int64 max"] == 2**63 - 1
    assert by_name["span 1"].attributes["beyond int64"] == str(2**64 + 7)
    assert by_name["span 1"].attributes["ints"] == [1, -2, str(2**65)]


def test_the_kept_attribute_encodings_are_bounded():
    # Text attributes' JSON is kept for reuse; distinct values without end
    # (a call id, a query) must not grow memory without end: 12,000 distinct
    # 200-character values (three times the pairs kept), about 7 MB if all were kept.
    import gc
    import tracemalloc

    context = SpanContext(1, 2, is_remote=False)
    resource = Resource({})

    def batch(start: int) -> list:
        return [
            ReadableSpan("s", context=context, resource=resource, attributes={"q": f"{n:0200d}"})
            for n in range(start, start + 500)
        ]

    encode_spans_json(batch(0))  # the first export imports msgspec
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, 12_000, 500):
            line = encode_spans_json(batch(start))
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][-1]["attributes"][0]["value"] == {
        "stringValue": f"{11_999:0200d}"
    }
    assert kept < 5_000_000, f"{kept} bytes kept after encoding"


def test_events_and_links_over_the_limits_and_spans_not_the_sdks_encode_as_the_reference_did():
    # An SDK span's events and links are read from its BoundedLists (their
    # length and drop counts), not through the properties that copy them:
    # the SDK's spans must hold them so (else every span pays the copies
    # again), and the counts must come out as the reference writes them.
    from opentelemetry.sdk.trace import ReadableSpan, SpanLimits
    from opentelemetry.sdk.util import BoundedList

    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=1, max_links=1))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("limits")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    with tracer.start_as_current_span("over", links=[Link(remote, {"n": 1}), Link(remote, {"n": 2})]) as span:
        span.add_event("first")
        span.add_event("second", {"k": "v"})
    with tracer.start_as_current_span("plain"):
        pass
    spans = list(memory.get_finished_spans())
    assert all(type(s._events) is BoundedList and type(s._links) is BoundedList for s in spans)
    written = {s["name"]: s for s in json.loads(assert_same(spans))["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    assert written["over"]["droppedEventsCount"] == 1 and written["over"]["droppedLinksCount"] == 1
    assert [e["name"] for e in written["over"]["events"]] == ["second"]
    assert "events" not in written["plain"] and "droppedEventsCount" not in written["plain"]
    # A span another library made, its events and links plain tuples: the properties.
    other = ReadableSpan(
        "other",
        context=SpanContext(0x1, 0x2, is_remote=False),
        events=tuple(spans[0].events),
        links=tuple(spans[0].links),
        resource=spans[0].resource,
    )
    assert_same([other])
    assert [
        e["name"]
        for e in json.loads(encode_spans_json([other]))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"]
    ] == ["second"]


def test_the_sdks_spans_are_read_from_their_fields_and_a_span_that_overrides_a_property_through_it():
    # The encoder reads an SDK span's fields, not its properties, where the
    # span's class keeps every property as ReadableSpan defines it: the SDK's
    # classes must pass (else each span pays the properties again), and a
    # class that overrides one is read through its properties.
    from opentelemetry.sdk.trace import ReadableSpan

    from agent_otel.exporters import otlp_json_file

    spans = sdk_spans()
    assert_same(spans)
    assert otlp_json_file._FIELDS_READ[type(spans[0])] is True

    class Renamed(ReadableSpan):
        @property
        def name(self) -> str:
            return "renamed " + self._name

    span = spans[1]
    renamed = Renamed(
        span.name,
        context=span.get_span_context(),
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes,
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
    line = assert_same([renamed])
    assert otlp_json_file._FIELDS_READ[Renamed] is False
    assert json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] == "renamed " + span.name


# --- the templates ---------------------------------------------------------------------


def tool_like_spans(attributes_per_span: list, remote_parent: bool = False) -> list:
    """SDK spans with the given attributes, each in a span of its own, children of a span."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agent_otel", "0.1.0")
    context = None
    if remote_parent:
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))  # sampled
        context = trace.set_span_in_context(NonRecordingSpan(remote))
    with tracer.start_as_current_span("invoke_agent", context=context):
        for number, attributes in enumerate(attributes_per_span):
            kind = list(SpanKind)[number % len(SpanKind)]
            with tracer.start_as_current_span("execute_tool %s" % number, kind=kind, attributes=attributes) as span:
                if number % 3 == 1:
                    span.set_status(Status(StatusCode.ERROR))
                elif number % 3 == 2:
                    span.set_status(Status(StatusCode.OK))
    spans = list(memory.get_finished_spans())
    assert len(spans) == len(attributes_per_span) + 1
    return spans


@pytest.mark.parametrize("remote_parent", [False, True])
def test_the_sdks_common_spans_take_a_template_and_write_the_same_bytes(remote_parent):
    otlp_json_file._TEMPLATES.clear()
    common = {
        "gen_ai.tool.name": "web_search",
        "agent.tool.exec.duration": 0.00013385,
        "agent.tool.exec.cpu_time": 5.38e-06,
        "n": 2**63 - 1,
        "m": -(2**63),
        "ok": True,
        "no": False,
        "text": 'naïve 東京 \U0001f600 \u2028 \x00\x1f\x7f "quoted" \\ 100%s %d %%',
        "100% sure %s": "key with percent signs",
        'a "quoted" key \\ é': "",
    }
    spans = tool_like_spans([common, {}, {"x": 1.5}, common], remote_parent)
    line = assert_same(spans)
    shapes = [shape for shape, entry in otlp_json_file._TEMPLATES.items() if entry is not None]
    assert len(shapes) == 5  # every span above took one (kinds and statuses differ): the bytes are theirs
    assert any("100% sure %s" in shape for shape in shapes)
    written = {s["name"]: s for s in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    values = {a["key"]: a["value"] for a in written["execute_tool 0"]["attributes"]}
    assert values["n"] == {"intValue": str(2**63 - 1)} and values["m"] == {"intValue": str(-(2**63))}
    assert values["100% sure %s"] == {"stringValue": "key with percent signs"} and values["text"] == {
        "stringValue": common["text"]
    }
    assert "attributes" not in written["execute_tool 1"]


def test_values_a_template_cannot_hold_are_written_as_before():
    # msgspec writes a double that is not finite as null and an integer beyond
    # int64 as a number: OTLP wants "NaN", "Infinity" and the integer's text.
    # The same shape with ordinary values before and after: templates and not.
    otlp_json_file._TEMPLATES.clear()
    values = [0.5, math.nan, math.inf, -math.inf, 1.0]
    integers = [1, 2**63, -(2**63) - 1, 2**64, 3]
    spans = tool_like_spans([{"d": d, "i": i, "s": "x"} for d, i in zip(values, integers)])
    line = assert_same(spans)
    written = {s["name"]: s for s in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    got = {name: {a["key"]: a["value"] for a in span.get("attributes", [])} for name, span in written.items()}
    assert got["execute_tool 1"]["d"] == {"doubleValue": "NaN"}
    assert got["execute_tool 2"]["d"] == {"doubleValue": "Infinity"}
    assert got["execute_tool 1"]["i"] == {"stringValue": str(2**63)}
    assert got["execute_tool 3"]["i"] == {"stringValue": str(2**64)}
    assert got["execute_tool 4"] == {"d": {"doubleValue": 1.0}, "i": {"intValue": "3"}, "s": {"stringValue": "x"}}


def test_the_kept_templates_are_bounded():
    otlp_json_file._TEMPLATES.clear()
    limit = otlp_json_file._TEMPLATES_LIMIT
    spans = tool_like_spans([{f"key {n}": n} for n in range(limit + 10)])
    for start in range(0, len(spans), 256):
        assert_same(spans[start : start + 256])
    assert 0 < len(otlp_json_file._TEMPLATES) <= limit
    # A shape with keys too long for a template is written the other way and not kept.
    otlp_json_file._TEMPLATES.clear()
    long_keys = tool_like_spans([{"k" * otlp_json_file._TEMPLATE_BYTES_LIMIT: 1.5, "n": 1}])
    assert_same(long_keys)
    assert not any(len(shape) > 3 and "n" in shape for shape in otlp_json_file._TEMPLATES)
