"""Traces on disk as OTLP/JSON lines, read back: the documented import path.

The reader lives in ``agent_otel.spans.otlp_json`` (span decoding has one
home, beside the contract: docs/architecture.md); its public names are
importable from here as before::

    from agent_otel.exporters.otlp_json import iter_spans

    for span in iter_spans("traces.jsonl"):   # SpanRecord, every field
        ...
"""

from __future__ import annotations

from agent_otel.spans.otlp_json import (
    EXPECTED,
    MALFORMED,
    MAX_DOCUMENT,
    OUT_OF_RANGE,
    STATUS_ERROR,
    WRONG_TYPE,
    JsonEvent,
    JsonKeyValue,
    JsonLink,
    JsonSpan,
    JsonStatus,
    JsonValue,
    SpanEvent,
    SpanFormatError,
    SpanRecord,
    Unreadable,
    any_value,
    attributes,
    decode_traces,
    hex_id,
    input_name,
    iter_requests,
    iter_span_dicts,
    iter_spans,
    nanos,
    request_spans,
    resource_spans,
    span_record,
    span_times,
    typed_resource_spans,
    typed_span,
    unreadable_span,
    value_of,
)

__all__ = [
    "EXPECTED",
    "MALFORMED",
    "MAX_DOCUMENT",
    "OUT_OF_RANGE",
    "STATUS_ERROR",
    "WRONG_TYPE",
    "JsonEvent",
    "JsonKeyValue",
    "JsonLink",
    "JsonSpan",
    "JsonStatus",
    "JsonValue",
    "SpanEvent",
    "SpanFormatError",
    "SpanRecord",
    "Unreadable",
    "any_value",
    "attributes",
    "decode_traces",
    "hex_id",
    "input_name",
    "iter_requests",
    "iter_span_dicts",
    "iter_spans",
    "nanos",
    "request_spans",
    "resource_spans",
    "span_record",
    "span_times",
    "typed_resource_spans",
    "typed_span",
    "unreadable_span",
    "value_of",
]
