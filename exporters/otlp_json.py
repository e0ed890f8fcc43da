"""Traces on disk as OTLP/JSON lines, written and read back.

Usage::

    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from agent_otel.exporters.otlp_json import OtlpJsonFileExporter

    provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter("traces.jsonl")))

Each export appends one line holding one ``ExportTraceServiceRequest`` in
the OTLP/JSON encoding, the format the OpenTelemetry Collector's file
exporter writes, so ``agent-otel report`` reads a Collector's file as well
as the toolkit's own. OTLP/JSON is protobuf's JSON mapping with three
rules of its own: trace and span ids are hex strings (not base64), enums
are integers, and field names are lowerCamelCase; 64-bit integers such as
timestamps are decimal strings, and readers accept numbers too.

The reader (``iter_spans``) lives here as well, so one module owns the
format both ways. It uses plain ``json.loads`` and dict walking, no
protobuf, because the report may read millions of spans.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import threading
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import Callable, Iterator, Optional

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agent_otel.errors import ConfigError, InputError

_logger = logging.getLogger(__name__)

# OTLP Status.code: STATUS_CODE_ERROR
STATUS_ERROR = 2

# Lines of other OTLP signals, which a Collector's file exporter may write
# into the same file as traces: skipped, not errors.
_OTHER_SIGNALS = ("resourceMetrics", "resourceLogs", "resourceProfiles")


# ---------------------------------------------------------------- writing


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
        entry = {"resource": _without_empty({"attributes": _attributes_json(resource.attributes)}), "scopeSpans": scope_spans}
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
    context = span.get_span_context()
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
    encoded["status"] = _without_empty({"message": span.status.description or "", "code": span.status.status_code.value})
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
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
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
    After that, nothing raises into the caller: a failed write is logged and
    reported to the span processor as ``FAILURE``. Each line is flushed as
    it is written, so a crash loses at most the batch in flight.
    """

    def __init__(self, path: str):
        self.path = str(path)
        try:
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError("traces file", self.path, f"a writable file ({exc.strerror})") from None
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = encode_spans_json(spans) + "\n"
            with self._lock:
                if self._file.closed:
                    return SpanExportResult.FAILURE
                self._file.write(line)
                self._file.flush()
        except Exception:  # telemetry must never break the agent
            _logger.exception("could not write %d spans to %s", len(spans), self.path)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._file.closed:
                try:
                    self._file.flush()
                except OSError:
                    return False
        return True

    def shutdown(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError:
                _logger.exception("could not close %s", self.path)


# ---------------------------------------------------------------- reading


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict


@dataclass(slots=True)
class SpanRecord:
    """One span as read from a file: ids as ints, times in epoch ns,
    attribute values as plain Python values. ``line`` is where it was read,
    for error messages about its content."""

    trace_id: int
    span_id: int
    parent_span_id: int
    name: str
    start_ns: int
    end_ns: int
    attributes: dict
    events: list[SpanEvent] = field(default_factory=list)
    links: list[tuple[int, int]] = field(default_factory=list)
    status_code: int = 0
    line: int = 0


def iter_spans(path: str, progress: Optional[Callable[[int], None]] = None) -> Iterator[SpanRecord]:
    """Yield every span in an OTLP/JSON lines file, in file order.

    Tolerates what a Collector writes: any number of resources and scopes,
    fields left out when they hold their default value, numbers for 64-bit
    integers, and lines of other signals (skipped). Raises ``InputError``
    naming the file and line for anything else. ``progress`` is called with
    the byte count of each line read.
    """
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if progress is not None:
                progress(len(raw))
            if not raw.strip():
                continue
            try:
                request = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                if raw.startswith(_BINARY_MAGIC) or b"\x00" in raw:
                    raise InputError(path, number, _BINARY_HINT) from None
                raise InputError(path, number, f"not JSON ({_json_reason(exc)})") from None
            try:
                yield from _request_spans(request, number)
            except _Malformed as exc:
                raise InputError(path, number, str(exc)) from None


# gzip, zstd: what a Collector writes with compression turned on.
_BINARY_MAGIC = (b"\x1f\x8b", b"\x28\xb5\x2f\xfd")
_BINARY_HINT = (
    "binary data, not OTLP/JSON lines: write the file uncompressed and as JSON "
    "(the Collector file exporter's defaults: format json, no compression)"
)


class _Malformed(Exception):
    """Raised inside one line's walk; ``iter_spans`` adds file and line."""


def _json_reason(exc: Exception) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _request_spans(request: object, line: int) -> Iterator[SpanRecord]:
    if not isinstance(request, dict):
        raise _Malformed("not an OTLP ExportTraceServiceRequest (expected a JSON object)")
    if "resourceSpans" not in request:
        if any(key in request for key in _OTHER_SIGNALS):
            return
        raise _Malformed("not an OTLP ExportTraceServiceRequest (no resourceSpans)")
    for resource_spans in _list(request, "resourceSpans"):
        for scope_spans in _list(_object(resource_spans, "resourceSpans[]"), "scopeSpans"):
            for span in _list(_object(scope_spans, "scopeSpans[]"), "spans"):
                yield _span(_object(span, "spans[]"), line)


def _span(span: dict, line: int) -> SpanRecord:
    start_ns = _uint(span.get("startTimeUnixNano", 0), "startTimeUnixNano")
    end_ns = _uint(span.get("endTimeUnixNano", 0), "endTimeUnixNano")
    name = span.get("name", "")
    if not start_ns:
        raise _Malformed(f"span {name!r} has no startTimeUnixNano")
    if end_ns < start_ns:
        raise _Malformed(f"span {name!r} ends (endTimeUnixNano {end_ns}) before it starts ({start_ns})")
    status = span.get("status") or {}
    return SpanRecord(
        trace_id=_hex_id(span.get("traceId"), 32, "traceId"),
        span_id=_hex_id(span.get("spanId"), 16, "spanId"),
        parent_span_id=_hex_id(span.get("parentSpanId"), 16, "parentSpanId"),
        name=str(name),
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=_attributes(span.get("attributes")),
        events=[_event(_object(event, "events[]")) for event in _list(span, "events")],
        links=[_link(_object(link, "links[]")) for link in _list(span, "links")],
        status_code=_uint(_object(status, "status").get("code", 0), "status.code"),
        line=line,
    )


def _event(event: dict) -> SpanEvent:
    return SpanEvent(
        name=str(event.get("name", "")),
        time_ns=_uint(event.get("timeUnixNano", 0), "events[].timeUnixNano"),
        attributes=_attributes(event.get("attributes")),
    )


def _link(link: dict) -> tuple[int, int]:
    return _hex_id(link.get("traceId"), 32, "links[].traceId"), _hex_id(link.get("spanId"), 16, "links[].spanId")


def _object(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise _Malformed(f"{where} is not a JSON object")
    return value


def _list(parent: dict, key: str) -> list:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Malformed(f"{key} is not a JSON array")
    return value


def _uint(value: object, where: str) -> int:
    # 64-bit integers are decimal strings in OTLP/JSON; numbers are accepted.
    if isinstance(value, bool):
        raise _Malformed(f"{where} is not an integer: {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise _Malformed(f"{where} is not an integer: {value!r}")
    if not 0 <= number < 1 << 64:
        raise _Malformed(f"{where} is out of range: {value!r}")
    return number


def _hex_id(value: object, digits: int, where: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, str) and len(value) == digits:
        try:
            return int(value, 16)
        except ValueError:
            pass
    hint = ""
    if isinstance(value, str) and _looks_base64(value, digits // 2):
        hint = " (it looks base64: protobuf's JSON mapping, not OTLP/JSON)"
    raise _Malformed(f"{where} is not {digits} hex digits: {value!r}{hint}")


def _looks_base64(value: str, size: int) -> bool:
    try:
        return len(base64.b64decode(value, validate=True)) == size
    except (binascii.Error, ValueError):
        return False


def _attributes(items: object) -> dict:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise _Malformed("attributes is not a JSON array")
    result = {}
    for item in items:
        item = _object(item, "attributes[]")
        key = item.get("key")
        if not isinstance(key, str):
            raise _Malformed(f"attribute key is not a string: {key!r}")
        result[key] = _any_value(item.get("value"), key)
    return result


def _any_value(value: object, key: str) -> object:
    """An ``AnyValue`` as a Python value; an empty one is None."""
    if value is None:
        return None
    value = _object(value, f"attribute {key!r} value")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        raw = value["intValue"]
        try:
            if isinstance(raw, bool) or isinstance(raw, float):
                raise ValueError
            return int(raw)
        except (TypeError, ValueError):
            raise _Malformed(f"attribute {key!r}: intValue is not an integer: {raw!r}") from None
    if "doubleValue" in value:
        raw = value["doubleValue"]
        try:
            if isinstance(raw, bool):
                raise ValueError
            number = float(raw)  # also "NaN", "Infinity", "-Infinity"
        except (TypeError, ValueError):
            raise _Malformed(f"attribute {key!r}: doubleValue is not a number: {raw!r}") from None
        return number
    if "arrayValue" in value:
        array = _object(value["arrayValue"], f"attribute {key!r} arrayValue")
        return [_any_value(item, key) for item in _list(array, "values")]
    if "kvlistValue" in value:
        kvlist = _object(value["kvlistValue"], f"attribute {key!r} kvlistValue")
        return _attributes(kvlist.get("values"))
    if "bytesValue" in value:
        return value["bytesValue"]  # base64 text, kept as written
    return None
