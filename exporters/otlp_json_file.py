"""Traces on disk as OTLP/JSON lines: the writer.

Usage::

    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

    provider.add_span_processor(BatchSpanProcessor(OtlpJsonFileExporter("traces.jsonl")))

Each export appends one line holding one ``ExportTraceServiceRequest`` in
the OTLP/JSON encoding (``agent_otel.exporters.otlp_json`` describes the
format and reads it back). The writer is a module of its own:
``instrument()`` makes this exporter for the default traces file on the
caller's thread, and the reader's typed decoder would add about ten
milliseconds to it. msgspec, which writes the lines, is imported by the
first export, on the export thread.
"""

from __future__ import annotations

import binascii
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanKind, StatusCode

from agent_otel import forks
from agent_otel.appending import AppendFile
from agent_otel.errors import ConfigError

_logger = logging.getLogger(__name__)

# OTLP's intValue is an int64; a Python int outside it is written as its
# decimal text (stringValue), which every reader takes, not as an intValue
# that the Collector and agent-otel's reader refuse.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def encode_spans_json(spans: Sequence[ReadableSpan]) -> str:
    """One ``ExportTraceServiceRequest`` as an OTLP/JSON line (no newline).

    Built as plain dicts straight from the SDK's spans: the same JSON as the
    SDK's protobuf encoder followed by ``MessageToDict`` and hex ids (the
    tests hold the two equal), written by msgspec's encoder. This runs on
    the span processor's thread for every span, so the common attribute
    values (text, integers, booleans, finite doubles) are written inline and
    only the rest goes through ``_value_json``, text and boolean attributes'
    JSON is kept for reuse (a bounded number of short pairs), and each
    resource and scope is encoded once a batch. ``bench/encode.py``
    measures it.
    """
    encode = _ENCODE or _import_msgspec()
    grouped: dict = {}
    last_resource: object = None
    last_scope: object = None
    encoded: list = []
    for span in spans:
        # Grouped as equal resources and scopes, looked up only when they
        # change from the span before: Resource.__hash__ serializes its attributes.
        resource = span.resource
        scope = span.instrumentation_scope
        if resource is not last_resource or scope is not last_scope:
            encoded = grouped.setdefault(resource, {}).setdefault(scope, [])
            last_resource, last_scope = resource, scope
        encoded.append(_span_json(span))
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry = {"scope": _scope_json(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        attributes = _attributes_json(resource.attributes)
        entry = {"resource": {"attributes": attributes} if attributes else {}, "scopeSpans": scope_spans}
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    request = {"resourceSpans": resource_spans}
    try:
        return encode(request).decode("utf-8")
    except (UnicodeEncodeError, TypeError):
        # A lone surrogate (text decoded with errors="surrogateescape") is not
        # UTF-8, and msgspec refuses subclasses of str (another library's span
        # may hold them): the standard library writes both, the former as an
        # ASCII escape.
        return json.dumps(request, separators=(",", ":"), default=_raw_json)


_ENCODE: Optional[Callable[[object], bytes]] = None  # msgspec.json.Encoder().encode
_RAW: Callable[[bytes], object] = bytes  # msgspec.Raw: JSON written as it is


def _import_msgspec() -> Callable[[object], bytes]:
    # msgspec is imported by the first export, on the export thread: instrument()
    # imports this module on the caller's thread (docs/performance.md, "Start-up").
    # A fork meanwhile would leave the import's module lock held in the child,
    # whose export thread would then wait on it for good: a fork waits for it.
    global _ENCODE, _RAW
    with forks.background_import():
        import msgspec

    _RAW = msgspec.Raw
    _ENCODE = msgspec.json.Encoder().encode
    return _ENCODE


def _raw_json(value):
    return json.loads(bytes(value))  # a cached pair, for the standard library's encoder


# Text and boolean attributes repeat (a tool's name, its outcome): each
# pair's JSON is kept, as msgspec.Raw, up to a number of pairs and a length of text.
_PAIRS: dict = {}
_PAIRS_LIMIT = 4096
_PAIR_TEXT_LIMIT = 256


def _pair_json(key: str, value, kind: type):
    pair = {"key": key, "value": {"stringValue": value} if kind is str else {"boolValue": value}}
    if kind is str and len(value) > _PAIR_TEXT_LIMIT or _ENCODE is None:
        return pair
    try:
        raw = _RAW(_ENCODE(pair))
    except (TypeError, UnicodeEncodeError):
        return pair  # encode_spans_json's standard library fallback writes it
    if len(_PAIRS) >= _PAIRS_LIMIT:
        _PAIRS.clear()
    _PAIRS[(key, value)] = raw
    return raw


# SpanFlags: the parent's is_remote is known (0x100), and true (0x200).
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


# The ReadableSpan properties _span_json reads. Each returns its field
# (``name`` returns ``_name``), or a copy of it (``attributes``, ``events``,
# ``links``), or a count from it (``dropped_*``). A span class that keeps
# every one as the SDK defines it (the SDK's own spans) is read from the
# fields, without a call per property and without the copies: about a
# quarter of the encoding of a tool span. Any other span: the properties.
_READ_FIELDS = (
    "name",
    "kind",
    "parent",
    "start_time",
    "end_time",
    "status",
    "attributes",
    "dropped_attributes",
    "events",
    "dropped_events",
    "links",
    "dropped_links",
)
_FIELDS_READ: dict[type, bool] = {}  # span class -> whether its fields are read directly


def _fields_readable(span: ReadableSpan) -> bool:
    """Whether ``span``'s class keeps the SDK's properties, and the span the
    fields they read (checked once per class: ReadableSpan sets them all)."""
    cls = type(span)
    readable = (
        isinstance(span, ReadableSpan)
        and all(getattr(cls, name, None) is getattr(ReadableSpan, name) for name in _READ_FIELDS)
        and all(hasattr(span, "_" + name) for name in _FIELD_NAMES)
    )
    _FIELDS_READ[cls] = readable
    return readable


_FIELD_NAMES = ("name", "kind", "parent", "start_time", "end_time", "status", "attributes", "events", "links")


def _span_json(span: ReadableSpan) -> dict:
    # proto3 JSON leaves out fields that hold their default value; the keys
    # are in the order of the old _without_empty() dicts, so the output is the same.
    context = span.get_span_context() or INVALID_SPAN_CONTEXT  # an SDK span always has one
    readable = _FIELDS_READ.get(type(span))
    if readable is None:
        readable = _fields_readable(span)
    attributes: Optional[Mapping]
    if readable:
        name, kind, parent, status = span._name, span._kind, span._parent, span._status
        start_time, end_time = span._start_time, span._end_time
        store, events, links = span._attributes, span._events, span._links
        if type(store) is BoundedAttributes:
            attributes, dropped_attributes = store._dict, store.dropped
        else:  # what ReadableSpan was given (a dict, or None)
            attributes, dropped_attributes = store, 0
    else:
        name, kind, parent, status = span.name, span.kind, span.parent, span.status
        start_time, end_time = span.start_time, span.end_time
        attributes, dropped_attributes = span.attributes, span.dropped_attributes
        events, links = span.events, span.links
    encoded: dict = {"traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}"}
    if context.trace_state:
        encoded["traceState"] = _trace_state_json(context.trace_state)
    if parent:
        encoded["parentSpanId"] = f"{parent.span_id:016x}"
    if name:
        encoded["name"] = name
    encoded["kind"] = _KINDS_BY_ID.get(id(kind)) or _KINDS[kind]
    if start_time:
        encoded["startTimeUnixNano"] = str(start_time)
    if end_time:
        encoded["endTimeUnixNano"] = str(end_time)
    if attributes:
        encoded_attributes = _attributes_json(attributes)
        if encoded_attributes:
            encoded["attributes"] = encoded_attributes
    if dropped_attributes:
        encoded["droppedAttributesCount"] = dropped_attributes
    # An SDK span's events and links are BoundedLists (the properties copy
    # them into tuples, under a lock): their length and drop counts are read
    # from them, and the events and links themselves only where there are some.
    if type(events) is BoundedList:
        if len(events):
            encoded["events"] = [_event_json(event) for event in list(events)]
        if events.dropped:
            encoded["droppedEventsCount"] = events.dropped
    else:
        if events:
            encoded["events"] = [_event_json(event) for event in events]
        if not readable and span.dropped_events:
            encoded["droppedEventsCount"] = span.dropped_events
    if type(links) is BoundedList:
        if len(links):
            encoded["links"] = [_link_json(link) for link in list(links)]
        if links.dropped:
            encoded["droppedLinksCount"] = links.dropped
    else:
        if links:
            encoded["links"] = [_link_json(link) for link in links]
        if not readable and span.dropped_links:
            encoded["droppedLinksCount"] = span.dropped_links
    encoded["flags"] = _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAG_HAS_IS_REMOTE
    # status is a message field: written even when it holds defaults.
    code = _STATUS_CODES[status.status_code]
    if status.description:
        encoded["status"] = {"message": status.description, "code": code} if code else {"message": status.description}
    else:
        encoded["status"] = {"code": code} if code else {}
    return encoded


_FLAGS_REMOTE = _FLAG_HAS_IS_REMOTE | _FLAG_IS_REMOTE
# Enum members' values, looked up (an Enum's .value is a Python property).
_KINDS = {kind: kind.value + 1 for kind in SpanKind}  # OTLP counts SPAN_KIND_UNSPECIFIED as 0
_KINDS_BY_ID = {id(kind): code for kind, code in _KINDS.items()}  # no Enum.__hash__ (a Python call) per span
_STATUS_CODES = {code: code.value for code in StatusCode}


def _flags(context) -> int:
    if context is not None and context.is_remote:
        return _FLAGS_REMOTE
    return _FLAG_HAS_IS_REMOTE


def _trace_state_json(trace_state) -> str:
    return ",".join(f"{key}={value}" for key, value in trace_state.items()) if trace_state else ""


def _event_json(event) -> dict:
    encoded: dict = {}
    if event.timestamp:
        encoded["timeUnixNano"] = str(event.timestamp)
    if event.name:
        encoded["name"] = event.name
    attributes = event.attributes
    if attributes:
        encoded_attributes = _attributes_json(attributes)
        if encoded_attributes:
            encoded["attributes"] = encoded_attributes
    if event.dropped_attributes:
        encoded["droppedAttributesCount"] = event.dropped_attributes
    return encoded


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
    copy = getattr(attributes, "copy", None)
    if copy is not None:
        # A dict: the SDK's attributes (a MappingProxyType over BoundedAttributes)
        # copy their dict at C speed; iterating them calls Python per key.
        attributes = copy()
    encoded: list = []
    append = encoded.append
    for key, value in attributes.items():
        # The common kinds inline, by exact type (a bool is not an int here);
        # a double that is not finite (x - x is NaN) and the rest: _value_json.
        kind = type(value)
        if kind is str or kind is bool:
            append(_PAIRS.get((key, value)) or _pair_json(key, value, kind))
        elif kind is int and _INT64_MIN <= value <= _INT64_MAX:
            append({"key": key, "value": {"intValue": str(value)}})
        elif kind is float and value - value == 0.0:
            append({"key": key, "value": {"doubleValue": value}})
        else:
            try:
                append({"key": key, "value": _value_json(value)})
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
        return {"intValue": str(value)} if _INT64_MIN <= value <= _INT64_MAX else {"stringValue": str(value)}
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
