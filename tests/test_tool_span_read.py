"""The tool span's read (``spans.decode.SpanReader._tool_call``): each field
read inline where it is as exporters write it, and every other form of it
read or refused by its helper as before. Each case is one span; what the
reader keeps of it (or the reason it refuses it) is checked."""

from __future__ import annotations

import pytest

from agent_otel.spans.decode import SpanReader
from agent_otel.spans.otlp_json import SpanFormatError, typed_span

T0 = 1_772_442_000_000_000_000


def _span(attributes: dict, **fields: object) -> dict:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "parentSpanId": "00f067aa0ba902b7",
        "name": "execute_tool search",
        "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 2_000_000_000),
        "attributes": [{"key": key, "value": value} for key, value in attributes.items()],
    }
    span.update(fields)
    return span


OURS = {
    "gen_ai.operation.name": {"stringValue": "execute_tool"},
    "gen_ai.tool.name": {"stringValue": "search"},
    "agent.tool.executor": {"stringValue": "io"},
    "agent.tool.outcome": {"stringValue": "ok"},
    "agent.tool.exec.duration": {"doubleValue": 1.5},
}


def _read(span: dict) -> SpanReader:
    reader = SpanReader()
    reader.add(typed_span(span), 1)
    return reader


@pytest.mark.parametrize(
    "change, field, expected",
    [
        ({}, "tool", "search"),
        ({"gen_ai.tool.name": {"stringValue": ""}}, "tool", "search"),  # empty: from the span's name
        ({"gen_ai.tool.name": {"stringValue": "r\u00e9sum\u00e9"}}, "tool", "r\u00e9sum\u00e9"),
        ({"gen_ai.tool.name": {"stringValue": "bad\udcff"}}, "tool", "bad\ufffd"),
        ({"gen_ai.tool.name": {"intValue": "7"}}, "tool", "7"),
        ({"agent.tool.outcome": {"stringValue": "timeout"}}, "outcome", "timeout"),
        ({"agent.tool.outcome": {"stringValue": "weird"}}, "outcome", "ok"),  # not an outcome: the status's
        ({"agent.tool.executor": {"stringValue": ""}}, "executor", "unknown"),
        ({"agent.tool.executor": {"stringValue": "pool-\u00e9"}}, "executor", "pool-\u00e9"),
        ({"agent.tool.queue.duration": {"doubleValue": 0.0}}, "start_ns", T0),
        ({"agent.tool.queue.duration": {"doubleValue": 0.5}}, "start_ns", T0 + 500_000_000),
        ({"agent.tool.queue.duration": {"intValue": "1"}}, "start_ns", T0 + 1_000_000_000),
    ],
)
def test_each_form_of_a_tool_spans_fields_is_read_as_its_helper_reads_it(change, field, expected):
    reader = _read(_span({**OURS, **change}))
    (call,) = list(reader.data.calls)
    assert getattr(call, field) == expected


def test_the_outcome_falls_back_to_an_error_status():
    span = _span({**OURS, "agent.tool.outcome": {"stringValue": "weird"}}, status={"code": 2})
    (call,) = list(_read(span).data.calls)
    assert call.outcome == "error"


def test_the_exec_start_event_and_the_parent_are_read():
    span = _span(OURS, parentSpanId="00F067AA0BA902B7", events=[{"name": "exec.start", "timeUnixNano": str(T0 + 7)}])
    reader = _read(span)
    (call,) = list(reader.data.calls)
    assert call.start_ns == T0 + 7 and list(reader._parents) == [0x00F067AA0BA902B7]
    root = _read(_span(OURS, parentSpanId=""))
    assert list(root._parents) == [0]


@pytest.mark.parametrize(
    "fields",
    [
        {"parentSpanId": "00f067aa0ba902"},  # too short
        {"parentSpanId": "00f067aa0ba902zz"},  # not hex
        {"parentSpanId": 12},
        {"events": [{"name": "exec.start", "timeUnixNano": "soon"}]},
        {"events": "exec.start"},
    ],
)
def test_a_malformed_parent_or_event_refuses_the_span_alone(fields):
    reader = SpanReader()
    with pytest.raises(SpanFormatError):
        reader.add(typed_span(_span(OURS, **fields)), 1)
    assert len(reader.data.calls) == 0 and reader.data.span_count == 0
    reader.add(typed_span(_span(OURS, spanId="b7ad6b7169203332")), 2)  # the next span is read
    assert len(reader.data.calls) == 1
