"""Received OTLP protobuf spans -> the OTLP/JSON shape ``spans.decode`` reads.

The blame service receives ``ExportTraceServiceRequest`` messages
(``opentelemetry-proto``); each span is given to ``SpanReader`` in the
OTLP/JSON shape (hex ids, camelCase keys, ``AnyValue`` objects), with only
the fields it reads (ids, name, times, the attributes it looks at,
events, status), through ``spans.otlp_json.typed_span``. Every text is
cut to ``text.NAME_LIMIT`` characters here, where it enters: a sender
cannot make the service hold more per span than that.
"""

from __future__ import annotations

import base64
from typing import Any, Iterable

from agent_otel.semconv import AGENT_GPU_POOL
from agent_otel.spans.decode import WANTED_ATTRIBUTES
from agent_otel.spans.otlp_json import JsonSpan, typed_span
from agent_otel.support.text import NAME_LIMIT, valid_text


def span_of(span: Any) -> JsonSpan:
    """A protobuf ``Span`` as ``SpanReader.add`` takes it; raises ``SpanFormatError`` as ``typed_span`` does."""
    return typed_span(span_json(span))


def gpu_pool(attributes: Iterable[Any]) -> str:
    """The GPU pool a protobuf resource's attributes declare (``agent.gpu.pool``); "" for none."""
    for item in attributes:
        if item.key == AGENT_GPU_POOL:
            value = item.value
            return (
                valid_text(value.string_value.strip(), NAME_LIMIT)
                if value.WhichOneof("value") == "string_value"
                else ""
            )
    return ""


def span_json(span: Any) -> dict:
    """The fields of a protobuf ``Span`` the reader reads, in the OTLP/JSON shape."""
    encoded = {
        "traceId": span.trace_id.hex(),
        "spanId": span.span_id.hex(),
        "name": valid_text(span.name, NAME_LIMIT),
        "startTimeUnixNano": span.start_time_unix_nano,
        "endTimeUnixNano": span.end_time_unix_nano,
        "attributes": [
            {"key": item.key, "value": _value(item.value)} for item in span.attributes if item.key in WANTED_ATTRIBUTES
        ],
        "status": {"code": span.status.code},
    }
    if span.parent_span_id:
        encoded["parentSpanId"] = span.parent_span_id.hex()
    if span.events:
        encoded["events"] = [{"name": event.name, "timeUnixNano": event.time_unix_nano} for event in span.events]
    return encoded


def _value(value: Any) -> dict:
    """A protobuf ``AnyValue`` as its OTLP/JSON object."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return {"stringValue": valid_text(value.string_value, NAME_LIMIT)}
    if kind == "int_value":
        return {"intValue": value.int_value}
    if kind == "double_value":
        return {"doubleValue": value.double_value}
    if kind == "bool_value":
        return {"boolValue": value.bool_value}
    if kind == "array_value":
        return {"arrayValue": {"values": [_value(item) for item in value.array_value.values]}}
    if kind == "kvlist_value":
        return {
            "kvlistValue": {
                "values": [{"key": item.key, "value": _value(item.value)} for item in value.kvlist_value.values]
            }
        }
    if kind == "bytes_value":
        return {"bytesValue": base64.b64encode(value.bytes_value).decode("ascii")}
    return {}
