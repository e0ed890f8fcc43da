"""One bad span costs one span: fuzzing the span decoders of the blame
service (OTLP protobuf, ``receiver.decode``) and of the report (OTLP/JSON,
``report.reader``) with hostile spans among good ones. Whatever a span
holds (numbers out of range, values of the wrong type, broken ids and
times), it is read or refused alone, by reason; the good spans beside it
are all taken, and nothing else is raised."""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from agent_otel.receiver.decode import SPAN_REASONS, tool_calls
from agent_otel.receiver.server import MALFORMED, OtlpReceiver, Outcome, _Refused
from agent_otel.report.reader import read_traces
from tests.test_report_fuzz import span as json_span

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

T0 = 1_772_442_000_000_000_000
GOOD_TRACE = b"\x77" * 16
POOL = "vllm-a:8000"

# ---------------------------------------------------------------- OTLP protobuf

WANTED = [
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "agent.tool.queue.duration",
    "agent.tool.exec.duration",
    "agent.tool.exec.cpu_time",
    "agent.tool.executor",
    "agent.tool.outcome",
    "agent.tool.timeout",
    "agent.tool.unfinished",
    "agent.tool.retries",
    "agent.executor.max_workers",
    "error.type",
    "thread.name",
    "openinference.span.kind",
    "traceloop.span.kind",
    "mcp.method.name",
]
extreme_double = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e300, 9.3e9, 9.2e9, 1e15, -0.0, 5e-324, 1.7976931348623157e308]),
)
extreme_int = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.sampled_from([-(2**63), 2**63 - 1, 0, -1])
)
text = st.one_of(st.text(max_size=20), st.sampled_from(["execute_tool", "TOOL", "tool", "tools/call", "ok", "error"]))


@st.composite
def any_value(draw, depth: int = 0) -> AnyValue:
    value = AnyValue()
    kind = draw(st.sampled_from(["string", "int", "double", "bool", "bytes", "array", "kvlist", "empty"]))
    if kind == "string":
        value.string_value = draw(st.one_of(text, st.integers(0, 5000).map(lambda n: "t" * n)))
    elif kind == "int":
        value.int_value = draw(extreme_int)
    elif kind == "double":
        value.double_value = draw(extreme_double)
    elif kind == "bool":
        value.bool_value = draw(st.booleans())
    elif kind == "bytes":
        value.bytes_value = draw(st.binary(max_size=20))
    elif kind in ("array", "kvlist") and depth < 2:
        items = draw(st.lists(any_value(depth + 1), max_size=3))
        if kind == "array":
            value.array_value.values.extend(items)
        else:
            for number, item in enumerate(items):
                entry = value.kvlist_value.values.add()
                entry.key = f"k{number}"
                entry.value.CopyFrom(item)
    return value


@st.composite
def hostile_span(draw, span, number: int) -> None:
    """Fill ``span`` (a protobuf Span) with anything at all."""
    span.trace_id = draw(st.sampled_from([b"\x01" * 16, b"", b"\x01" * 15, b"\x01" * 17, bytes(16)]))
    span.span_id = draw(st.one_of(st.just(number.to_bytes(8, "big")), st.binary(max_size=9)))
    span.parent_span_id = draw(st.sampled_from([b"", b"\x05" * 8, b"\x05" * 3]))
    span.name = draw(st.one_of(text, st.just("execute_tool search"), st.just("gpu.idle")))
    span.start_time_unix_nano = draw(st.one_of(st.integers(0, 2**64 - 1), st.just(T0)))
    span.end_time_unix_nano = draw(st.one_of(st.integers(0, 2**64 - 1), st.just(T0 + 10**9)))
    if draw(st.booleans()):
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = "gen_ai.operation.name", "execute_tool"
    for _ in range(draw(st.integers(0, 6))):
        attribute = span.attributes.add()
        attribute.key = draw(st.one_of(st.sampled_from(WANTED), text))
        attribute.value.CopyFrom(draw(any_value()))
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add()
        event.name = draw(st.sampled_from(["exec.start", "exception", "x"]))
        event.time_unix_nano = draw(st.one_of(st.integers(0, 2**64 - 1), st.just(T0 + 5)))
    span.status.code = draw(st.sampled_from([0, 1, 2]))


def good_span(span, number: int) -> None:
    span.trace_id, span.span_id, span.name = GOOD_TRACE, (1000 + number).to_bytes(8, "big"), "execute_tool search"
    span.start_time_unix_nano, span.end_time_unix_nano = T0 + number, T0 + number + 10**9
    for key, value in (("gen_ai.operation.name", "execute_tool"), ("gen_ai.tool.name", "search")):
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = key, value
    attribute = span.attributes.add()
    attribute.key, attribute.value.double_value = "agent.tool.queue.duration", 0.25


@st.composite
def requests(draw) -> tuple[ExportTraceServiceRequest, int, int]:
    """A request of good tool spans with hostile ones among them; (it, good spans, all spans)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    pool = resource_spans.resource.attributes.add()
    pool.key, pool.value.string_value = "agent.gpu.pool", POOL
    spans = resource_spans.scope_spans.add().spans
    good = draw(st.integers(0, 4))
    order = draw(st.permutations(["good"] * good + ["bad"] * draw(st.integers(1, 4))))
    for number, kind in enumerate(order):
        span = spans.add()
        if kind == "good":
            good_span(span, number)
        else:
            draw(hostile_span(span, number))
    return request, good, len(order)


def one_hostile(key: str, value: AnyValue) -> tuple[ExportTraceServiceRequest, int, int]:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    good_span(spans.add(), 0)
    bad = spans.add()
    good_span(bad, 1)
    bad.trace_id = b"\x01" * 16
    attribute = bad.attributes.add()
    attribute.key = key
    attribute.value.CopyFrom(value)
    return request, 1, 2


@FUZZ
@given(requests())
@example(one_hostile("agent.tool.queue.duration", AnyValue(double_value=1e300)))
@example(one_hostile("agent.tool.exec.cpu_time", AnyValue(double_value=1e300)))
@example(one_hostile("agent.tool.timeout", AnyValue(double_value=float("inf"))))
@example(one_hostile("agent.executor.max_workers", AnyValue(string_value="x" * 100_000)))
def test_the_service_takes_every_good_span_and_refuses_each_bad_one_alone(drawn):
    request, good, total = drawn
    decoded = tool_calls(ExportTraceServiceRequest.FromString(request.SerializeToString()))
    # Every span is a call, a duplicate or refused for a known reason: none is lost, none raises.
    assert len(decoded.calls) + decoded.duplicates + sum(decoded.refused.values()) == total
    assert set(decoded.refused) <= set(SPAN_REASONS)
    taken = {call.span_id for call in decoded.calls if call.trace_id == int.from_bytes(GOOD_TRACE, "big")}
    assert taken == {1000 + n for n in range(total) if n in _good_numbers(request)}
    assert len(taken) == good
    for call in decoded.calls:
        assert call.pool == POOL or call.pool == ""
        assert max(len(call.tool), len(call.executor), len(call.call_id or ""), len(call.error_type or "")) <= 512
    for message in decoded.examples.values():
        assert len(message) <= 300


def _good_numbers(request: ExportTraceServiceRequest) -> set[int]:
    spans = request.resource_spans[0].scope_spans[0].spans
    return {n for n, span in enumerate(spans) if span.trace_id == GOOD_TRACE}


@FUZZ
@given(st.one_of(st.binary(max_size=200), requests().map(lambda drawn: drawn[0].SerializeToString())), st.data())
def test_any_body_is_a_response_or_a_malformed_refusal(body, data):
    if body and data.draw(st.booleans()):  # damage a byte
        at = data.draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([data.draw(st.integers(0, 255))]) + body[at + 1 :]
    receiver = OtlpReceiver(lambda request, peer, transport: Outcome(), grpc_endpoint=None, http_endpoint=None)
    try:
        receiver.handle(body, "peer", "grpc")
    except _Refused as refusal:
        assert refusal.reason == MALFORMED


# ---------------------------------------------------------------- OTLP/JSON (the report)


def good_json_span(number: int) -> dict:
    return {
        "traceId": GOOD_TRACE.hex(),
        "spanId": f"{1000 + number:016x}",
        "name": "execute_tool search",
        "startTimeUnixNano": str(T0 + number),
        "endTimeUnixNano": str(T0 + number + 10**9),
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "search"}},
            {"key": "agent.tool.queue.duration", "value": {"doubleValue": 0.25}},
        ],
    }


@FUZZ
@given(st.integers(1, 4), st.lists(json_span, min_size=1, max_size=4), st.booleans())
@example(2, [{**good_json_span(7), "traceId": "01" * 16, "attributes": [
    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
    {"key": "agent.tool.queue.duration", "value": {"doubleValue": 1e300}}]}], False)  # fmt: skip
@example(1, [5, "x", None], True)
def test_the_report_reads_every_good_span_and_leaves_each_bad_one_out_with_one_warning(good, hostile, ascii):
    spans = [good_json_span(n) for n in range(good)] + hostile
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}, ensure_ascii=ascii)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "traces.jsonl")
        with open(path, "wb") as handle:
            handle.write(line.encode("utf-8", "surrogatepass") + b"\n")
        data = read_traces([path])
    ours = [i for i in range(len(data.calls)) if data.calls.trace_id[i] == int.from_bytes(GOOD_TRACE, "big")]
    assert sorted(data.calls.span_id[i] for i in ours) == [1000 + n for n in range(good)]
    skipped = [warning for warning in data.warnings if "left out" in warning]
    assert len(skipped) == (1 if data.skipped_spans else 0)
    assert data.span_count + data.duplicate_count + data.skipped_spans == len(spans)
