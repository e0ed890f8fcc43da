"""Traces on disk as OTLP/JSON lines: the writer.

Usage::

    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

    provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter("traces.jsonl")))

Each export appends one line holding one ``ExportTraceServiceRequest`` in
the OTLP/JSON encoding (``agent_otel.exporters.otlp_json`` describes the
format and reads it back). The writer is a module of its own, with only the
standard library beside the SDK: ``instrument()`` makes this exporter for
the default traces file, and the reader's typed decoder (msgspec) would add
about ten milliseconds to it.
"""

from __future__ import annotations

import binascii
import json
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Optional

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import INVALID_SPAN_CONTEXT

from agent_otel import forks
from agent_otel.appending import AppendFile
from agent_otel.errors import ConfigError

_logger = logging.getLogger(__name__)


def encode_spans_json(spans: Sequence[ReadableSpan]) -> str:
    """One ``ExportTraceServiceRequest`` as an OTLP/JSON line (no newline).

    Built as plain dicts straight from the SDK's spans: the same JSON as the
    SDK's protobuf encoder followed by ``MessageToDict`` and hex ids (the
    tests hold the two equal), at about a quarter of the cost, which matters
    on the span processor's thread.
    """
    grouped: dict = {}
    for span in spans:
        scopes = grouped.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope, []).append(_span_json(span))
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry = {"scope": _scope_json(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        entry = {
            "resource": _without_empty({"attributes": _attributes_json(resource.attributes)}),
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    # ASCII escapes keep a lone surrogate (text decoded with errors="surrogateescape")
    # from failing the whole batch at write time.
    return json.dumps({"resourceSpans": resource_spans}, separators=(",", ":"))


# SpanFlags: the parent's is_remote is known (0x100), and true (0x200).
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


def _span_json(span: ReadableSpan) -> dict:
    context = span.get_span_context() or INVALID_SPAN_CONTEXT  # an SDK span always has one
    parent = span.parent
    encoded = _without_empty(
        {
            "traceId": f"{context.trace_id:032x}",
            "spanId": f"{context.span_id:016x}",
            "traceState": _trace_state_json(context.trace_state),
            "parentSpanId": f"{parent.span_id:016x}" if parent else "",
            "name": span.name,
            "kind": span.kind.value + 1,  # OTLP counts SPAN_KIND_UNSPECIFIED as 0
            "startTimeUnixNano": str(span.start_time or ""),
            "endTimeUnixNano": str(span.end_time or ""),
            "attributes": _attributes_json(span.attributes),
            "droppedAttributesCount": span.dropped_attributes,
            "events": [_event_json(event) for event in span.events],
            "droppedEventsCount": span.dropped_events,
            "links": [_link_json(link) for link in span.links],
            "droppedLinksCount": span.dropped_links,
            "flags": _flags(parent),
        }
    )
    # status is a message field: written even when it holds defaults.
    encoded["status"] = _without_empty(
        {"message": span.status.description or "", "code": span.status.status_code.value}
    )
    return encoded


def _flags(context) -> int:
    if context is not None and context.is_remote:
        return _FLAG_HAS_IS_REMOTE | _FLAG_IS_REMOTE
    return _FLAG_HAS_IS_REMOTE


def _trace_state_json(trace_state) -> str:
    return ",".join(f"{key}={value}" for key, value in trace_state.items()) if trace_state else ""


def _event_json(event) -> dict:
    return _without_empty(
        {
            "timeUnixNano": str(event.timestamp or ""),
            "name": event.name,
            "attributes": _attributes_json(event.attributes),
            "droppedAttributesCount": event.dropped_attributes,
        }
    )


def _link_json(link) -> dict:
    return _without_empty(
        {
            "traceId": f"{link.context.trace_id:032x}",
            "spanId": f"{link.context.span_id:016x}",
            "attributes": _attributes_json(link.attributes),
            "droppedAttributesCount": link.dropped_attributes,
            "flags": _flags(link.context),
        }
    )


def _scope_json(scope) -> dict:
    if scope is None:
        return {}
    return _without_empty(
        {"name": scope.name, "version": scope.version or "", "attributes": _attributes_json(scope.attributes)}
    )


def _without_empty(message: dict) -> dict:
    # proto3 JSON leaves out fields that hold their default value.
    return {key: value for key, value in message.items() if value}


def _attributes_json(attributes) -> list:
    if not attributes:
        return []
    encoded = []
    for key, value in attributes.items():
        try:
            encoded.append({"key": key, "value": _value_json(value)})
        except TypeError:
            _logger.warning("attribute %s has a value of type %s that OTLP cannot carry", key, type(value).__name__)
    return encoded


def _value_json(value) -> dict:
    """An ``AnyValue`` (a oneof: written even when it holds a default)."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double_json(value)}
    if isinstance(value, bytes):
        return {"bytesValue": binascii.b2a_base64(value, newline=False).decode("ascii")}
    if isinstance(value, Sequence):
        return {"arrayValue": _without_empty({"values": [_value_json(item) for item in value]})}
    if isinstance(value, Mapping):
        return {"kvlistValue": _without_empty({"values": _attributes_json({str(k): v for k, v in value.items()})})}
    raise TypeError(type(value).__name__)


def _double_json(value: float):
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return value


class OtlpJsonFileExporter(SpanExporter):
    """Append each batch of spans to ``path`` as one OTLP/JSON line.

    The file is opened (created if missing, appended to if not) when the
    exporter is made, so a bad path fails at start-up with a ``ConfigError``.
    After that, nothing raises into the caller: a failed write (a full disk)
    leaves no partial line behind, logs one line without a traceback and is
    reported to the span processor as ``FAILURE`` (agent-otel's processor
    counts the spans, and says it once, then once a minute). Each line is
    one ``write()`` to a file opened with ``O_APPEND``, so a crash loses at
    most the batch in flight, and processes forked from the one that opened
    it append whole lines to the same file.
    """

    def __init__(self, path: str, max_bytes: Optional[int] = None):
        self.path = str(path)
        self.max_bytes = max_bytes  # past this size nothing more is written (None: no limit)
        try:
            self._file = AppendFile(self.path)
            self._size = os.path.getsize(self.path)
        except OSError as exc:
            raise ConfigError("traces file", self.path, f"a writable file ({exc.strerror})") from None
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._file.reopen()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = encode_spans_json(spans) + "\n"
        except Exception as exc:  # telemetry must never break the agent
            _logger.warning("could not encode %d spans for %s (%s: %s)", len(spans), self.path, type(exc).__name__, exc)
            return SpanExportResult.FAILURE
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            if self.max_bytes is not None and self._size + len(line) > self.max_bytes:
                _logger.warning(
                    "%s reached its limit of %d MB; later spans are not written",
                    self.path,
                    self.max_bytes // (1024 * 1024),
                )
                return SpanExportResult.FAILURE
            try:
                self._file.append(line)
            except OSError as exc:
                _logger.warning("could not write %d spans to %s (%s)", len(spans), self.path, exc.strerror or exc)
                return SpanExportResult.FAILURE
            self._size += len(line)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every line is written when exported

    def shutdown(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError as exc:
                _logger.warning("could not close %s (%s)", self.path, exc.strerror or exc)
