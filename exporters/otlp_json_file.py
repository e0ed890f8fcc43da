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
import operator
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, Status, StatusCode, TraceState

from agent_otel.support import forks
from agent_otel.support.appending import AppendFile
from agent_otel.errors import ConfigError

_logger = logging.getLogger(__name__)
# What is said while an export succeeds: agent-otel's span processor holds
# back what this module's logger says while it exports (exporters.batch).
_notices = logging.getLogger("agent_otel.traces_file")

# OTLP's intValue is an int64; a Python int outside it is written as its
# decimal text (stringValue), which every reader takes, not as an intValue
# that the Collector and agent-otel's reader refuse.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def encode_spans_json(spans: Sequence[ReadableSpan]) -> str:
    """One ``ExportTraceServiceRequest`` as an OTLP/JSON line (no newline).

    The same JSON as the SDK's protobuf encoder followed by ``MessageToDict``
    and hex ids (the tests hold the two equal), written straight from the
    SDK's spans as bytes, on the span processor's thread for every span. A
    common span (the SDK's, with only ids, a name, kind, times, flags, a
    status without a message and text, boolean, integer and double
    attributes) is one ``%`` of a template kept for its shape (its kind,
    status and parent, its attributes' keys and its values' types), filled
    with its ids and times and each value as msgspec writes it. Any other
    span is written piece by piece (each key's JSON prefix and short text
    and boolean attributes' whole JSON kept for reuse, a bounded number),
    what is rare in it (events, links, trace state, a status message,
    arrays, maps, bytes, doubles that are not finite) built as dicts first
    and written by msgspec. Either way the bytes are those msgspec writes
    for ``_request_json``'s dicts (the tests hold them equal).
    ``bench/encode.py`` and ``bench/instructions.py encode`` measure it.
    """
    return _encode_spans(spans, b"").decode("utf-8")


def _encode_spans(spans: Sequence[ReadableSpan], newline: bytes) -> bytes:
    """``encode_spans_json``'s line as UTF-8, followed by ``newline`` (the exporter's, or none)."""
    encode = _ENCODE or _import_msgspec()
    rejected: list = []
    try:
        line = _request_bytes(spans, encode, rejected, newline)
    except (UnicodeEncodeError, TypeError):
        # A lone surrogate (text decoded with errors="surrogateescape") is not
        # UTF-8, and msgspec refuses subclasses of str (another library's span
        # may hold them): the standard library writes both (ASCII only, the
        # former as an escape).
        rejected = []
        line = json.dumps(_request_json(spans, rejected), separators=(",", ":")).encode("ascii") + newline
    for key, kind in rejected:
        _logger.warning("attribute %s has a value of type %s that OTLP cannot carry", key, kind)
    return line


_ENCODE: Optional[Callable[[object], bytes]] = None  # msgspec.json.Encoder().encode


def _import_msgspec() -> Callable[[object], bytes]:
    # msgspec is imported by the first export, on the export thread: instrument()
    # imports this module on the caller's thread (docs/performance.md, "Start-up").
    # A fork meanwhile would leave the import's module lock held in the child,
    # whose export thread would then wait on it for good: a fork waits for it.
    global _ENCODE
    with forks.background_import():
        import msgspec

    _ENCODE = msgspec.json.Encoder().encode
    return _ENCODE


_NO_GROUP = object()


def _request_bytes(
    spans: Sequence[ReadableSpan], encode: Callable[[object], bytes], rejected: list, newline: bytes
) -> bytes:
    # Grouped as equal resources and scopes, looked up only when they change
    # from the span before: Resource.__hash__ serializes its attributes.
    grouped: dict = {}
    last_resource: object = _NO_GROUP
    last_scope: object = _NO_GROUP
    parts: list = []  # the current group's spans, as pieces of bytes
    events: Any
    links: Any
    entry: Any
    for span in spans:
        readable = _FIELDS_READ.get(type(span))
        if readable is None:
            readable = _fields_readable(span)
        if readable:
            resource, scope = span._resource, span._instrumentation_scope
        else:
            resource, scope = span.resource, span.instrumentation_scope
        if resource is not last_resource or scope is not last_scope:
            parts = grouped.setdefault(resource, {}).setdefault(scope, [])
            last_resource, last_scope = resource, scope
        if parts:
            parts.append(b",")
        if readable:
            # The common span, the SDK's (nothing but its ids, name, kind,
            # times, flags and status and text, boolean, integer and double
            # attributes): one % of the template kept for its shape, with
            # each value as msgspec writes it, its ids and times.
            context, parent, status, store = span._context, span._parent, span._status, span._attributes
            events, links, name = span._events, span._links, span._name
            start_time, end_time = span._start_time, span._end_time
            if (
                type(context) is SpanContext
                and (parent is None or type(parent) is SpanContext)
                and type(status) is Status
                and type(store) is BoundedAttributes
                and type(events) is BoundedList
                and type(links) is BoundedList
                and type(start_time) is int
                and type(end_time) is int
                and start_time
                and end_time
                and name
                # No events or links (a BoundedList's deque) and nothing dropped.
                and not (store.dropped or events._dq or events.dropped or links._dq or links.dropped)  # type: ignore[attr-defined]
                and not status._description
            ):
                trace_id, span_id, _, _, trace_state, _ = context
                kind = _KINDS_BY_ID.get(id(span._kind))
                end = (_ENDS if parent is None or not parent[2] else _ENDS_REMOTE).get(id(status._status_code))
                if kind is not None and end is not None and type(trace_state) is TraceState and not trace_state._dict:
                    attributes = store._dict
                    shape = (kind, end, parent is None, *attributes, *map(type, attributes.values()))
                    entry = _TEMPLATES.get(shape, _NO_TEMPLATE)
                    if entry is _NO_TEMPLATE:
                        entry = _template(shape, len(attributes), encode)
                    if entry is not None:
                        template, doubles, integers = entry
                        values = (*map(encode, attributes.values()),)
                        # msgspec writes a double that is not finite as null, and an
                        # integer beyond int64 as one: those spans are written below.
                        if not (doubles and b"null" in values) and (
                            integers is None
                            or (_INT64_MIN <= min(integers(attributes)) and max(integers(attributes)) <= _INT64_MAX)
                        ):
                            if parent is None:
                                parts.append(
                                    template % (trace_id, span_id, encode(name), start_time, end_time, *values)
                                )
                            else:
                                parts.append(
                                    template
                                    % (trace_id, span_id, parent[1], encode(name), start_time, end_time, *values)
                                )
                            continue
        _span_bytes(span, readable, parts, encode, rejected)
    out = [b'{"resourceSpans":[']
    for number, (resource, scopes) in enumerate(grouped.items()):
        pairs = _attributes_bytes(resource.attributes, encode, rejected)
        out.append(b',{"resource":' if number else b'{"resource":')
        out.append(b'{"attributes":[%b]},"scopeSpans":[' % b",".join(pairs) if pairs else b'{},"scopeSpans":[')
        for count, (scope, parts) in enumerate(scopes.items()):
            out.append(b',{"scope":' if count else b'{"scope":')
            out.append(_scope_bytes(scope, encode, rejected))
            out.append(b',"spans":[')
            out.extend(parts)
            if scope is not None and scope.schema_url:
                out.append(b'],"schemaUrl":%b}' % encode(scope.schema_url))
            else:
                out.append(b"]}")
        out.append(b'],"schemaUrl":%b}' % encode(resource.schema_url) if resource.schema_url else b"]}")
    out.append(b"]}")
    out.append(newline)
    return b"".join(out)


# The common spans' templates, by shape: their kind's and end's pieces, whether
# they have a parent, their attributes' keys and their values' types (None:
# a shape that _span_bytes writes), up to a number of shapes. A shape whose
# keys make a template longer than a limit is not kept (nor its keys with it).
_TEMPLATES: dict[tuple, Optional[tuple]] = {}
_TEMPLATES_LIMIT = 1024
_TEMPLATE_BYTES_LIMIT = 16384
_NO_TEMPLATE = object()
# Each attribute value's JSON around what msgspec writes for the value.
_VALUE_TEMPLATES = {
    str: b'{"stringValue":%b}}',
    bool: b'{"boolValue":%b}}',
    int: b'{"intValue":"%b"}}',
    float: b'{"doubleValue":%b}}',
}


def _template(shape: tuple, count: int, encode: Callable[[object], bytes]) -> Optional[tuple]:
    """The template for spans of ``shape`` (see _request_bytes), whose ``count``
    attributes' keys and then their values' types end it: its bytes, whether it
    has doubles, and a getter of its integers (None if it has none); None if its
    values are of other types."""
    kind, end, no_parent = shape[:3]
    keys, types = shape[3 : 3 + count], shape[3 + count :]
    entry: Optional[tuple] = None
    if all(value_type in _VALUE_TEMPLATES for value_type in types):
        head = (
            b'{"traceId":"%032x","spanId":"%016x"'
            if no_parent
            else b'{"traceId":"%032x","spanId":"%016x","parentSpanId":"%016x"'
        )
        pieces = [head, b',"name":%b', kind, b',"startTimeUnixNano":"%d","endTimeUnixNano":"%d"']
        if keys:
            attributes = [
                b'{"key":%b,"value":' % encode(key).replace(b"%", b"%%") + _VALUE_TEMPLATES[value_type]
                for key, value_type in zip(keys, types)
            ]
            pieces.append(b',"attributes":[%b]' % b",".join(attributes))
        pieces.append(end)
        integers = [key for key, value_type in zip(keys, types) if value_type is int]
        getter = operator.itemgetter(*integers, *integers) if integers else None  # twice: a tuple even for one
        entry = (b"".join(pieces), float in types, getter)
        if len(entry[0]) > _TEMPLATE_BYTES_LIMIT:
            return None
    if len(_TEMPLATES) >= _TEMPLATES_LIMIT:
        _TEMPLATES.clear()
    _TEMPLATES[shape] = entry
    return entry


def _scope_bytes(scope, encode: Callable[[object], bytes], rejected: list) -> bytes:
    if scope is None:
        return b"{}"
    fields = []
    if scope.name:
        fields.append(b'"name":' + encode(scope.name))
    if scope.version:
        fields.append(b'"version":' + encode(scope.version))
    attributes = _attributes_bytes(scope.attributes, encode, rejected)
    if attributes:
        fields.append(b'"attributes":[%b]' % b",".join(attributes))
    return b"{%b}" % b",".join(fields)


# SpanFlags: the parent's is_remote is known (0x100), and true (0x200).
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200
_FLAGS_REMOTE = _FLAG_HAS_IS_REMOTE | _FLAG_IS_REMOTE


# The ReadableSpan properties and methods the encoder reads. Each returns
# its field (``name`` returns ``_name``), or a copy of it (``attributes``,
# ``events``, ``links``), or a count from it (``dropped_*``). A span class
# that keeps every one as the SDK defines it (the SDK's own spans) is read
# from the fields, without a call per property and without the copies.
# Any other span: the properties.
_READ_FIELDS = (
    "get_span_context",
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
    "resource",
    "instrumentation_scope",
)
_FIELDS_READ: dict[type, bool] = {}  # span class -> whether its fields are read directly
_FIELD_NAMES = (
    "context",
    "name",
    "kind",
    "parent",
    "start_time",
    "end_time",
    "status",
    "attributes",
    "events",
    "links",
    "resource",
    "instrumentation_scope",
)


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


def _span_bytes(span: ReadableSpan, readable: bool, parts: list, encode: Callable[[object], bytes], rejected: list):
    # proto3 JSON leaves out fields that hold their default value; the keys
    # are in _span_json's order, and every piece is what msgspec writes for it there.
    attributes: Optional[Mapping]
    if readable:
        context, name, kind, parent, status = span._context, span._name, span._kind, span._parent, span._status
        start_time, end_time = span._start_time, span._end_time
        store, events, links = span._attributes, span._events, span._links
        if type(store) is BoundedAttributes:
            attributes, dropped_attributes = store._dict, store.dropped
        else:  # what ReadableSpan was given (a dict, or None)
            attributes, dropped_attributes = store, 0
    else:
        context, name, kind, parent, status = span.get_span_context(), span.name, span.kind, span.parent, span.status
        start_time, end_time = span.start_time, span.end_time
        attributes, dropped_attributes = span.attributes, span.dropped_attributes
        events, links = span.events, span.links
    append = parts.append
    context = context or INVALID_SPAN_CONTEXT  # an SDK span always has one
    if context.trace_state:
        append(
            b'{"traceId":"%032x","spanId":"%016x","traceState":%b'
            % (context.trace_id, context.span_id, encode(_trace_state_json(context.trace_state)))
        )
    else:
        append(b'{"traceId":"%032x","spanId":"%016x"' % (context.trace_id, context.span_id))
    if parent:
        append(b',"parentSpanId":"%016x"' % parent.span_id)
    if name:
        append((_NAMES.get(name) if type(name) is str else None) or _name_bytes(name, encode))
    append(_KINDS_BY_ID.get(id(kind)) or b',"kind":%d' % _KINDS[kind])
    if type(start_time) is int and type(end_time) is int and start_time and end_time:
        append(b',"startTimeUnixNano":"%d","endTimeUnixNano":"%d"' % (start_time, end_time))
    else:
        if start_time:
            append(b',"startTimeUnixNano":' + encode(str(start_time)))
        if end_time:
            append(b',"endTimeUnixNano":' + encode(str(end_time)))
    if attributes:
        encoded = _attributes_bytes(attributes, encode, rejected)
        if encoded:
            append(b',"attributes":[%b]' % b",".join(encoded))
    if dropped_attributes:
        append(b',"droppedAttributesCount":' + encode(dropped_attributes))
    # An SDK span's events and links are BoundedLists (the properties copy
    # them into tuples, under a lock): their length and drop counts are read
    # from them, and the events and links themselves only where there are some.
    if type(events) is BoundedList:
        if len(events):
            append(b',"events":' + encode([_event_json(event, rejected) for event in list(events)]))
        if events.dropped:
            append(b',"droppedEventsCount":' + encode(events.dropped))
    else:
        if events:
            append(b',"events":' + encode([_event_json(event, rejected) for event in events]))
        if not readable and span.dropped_events:
            append(b',"droppedEventsCount":' + encode(span.dropped_events))
    if type(links) is BoundedList:
        if len(links):
            append(b',"links":' + encode([_link_json(link, rejected) for link in list(links)]))
        if links.dropped:
            append(b',"droppedLinksCount":' + encode(links.dropped))
    else:
        if links:
            append(b',"links":' + encode([_link_json(link, rejected) for link in links]))
        if not readable and span.dropped_links:
            append(b',"droppedLinksCount":' + encode(span.dropped_links))
    # status is a message field: written even when it holds defaults.
    remote = parent is not None and parent.is_remote
    if type(status) is Status and not status._description:
        end = (_ENDS_REMOTE if remote else _ENDS).get(id(status._status_code))
        if end is not None:
            append(end)
            return
    append(
        b',"flags":%d,"status":%b}' % (_FLAGS_REMOTE if remote else _FLAG_HAS_IS_REMOTE, encode(_status_json(status)))
    )


def _status_json(status) -> dict:
    code = _STATUS_CODES[status.status_code]
    if status.description:
        return {"message": status.description, "code": code} if code else {"message": status.description}
    return {"code": code} if code else {}


# Enum members' values, looked up (an Enum's .value is a Python property),
# and by identity where the members are the SDK's (no Enum.__hash__, a Python call).
_KINDS = {kind: kind.value + 1 for kind in SpanKind}  # OTLP counts SPAN_KIND_UNSPECIFIED as 0
_KINDS_BY_ID = {id(kind): b',"kind":%d' % code for kind, code in _KINDS.items()}
_STATUS_CODES = {code: code.value for code in StatusCode}
# A span's last piece, its flags and status, for each status code without a message.
_ENDS = {
    id(code): b',"flags":%d,"status":{%b}}' % (_FLAG_HAS_IS_REMOTE, b'"code":%d' % value if value else b"")
    for code, value in _STATUS_CODES.items()
}
_ENDS_REMOTE = {
    id(code): b',"flags":%d,"status":{%b}}' % (_FLAGS_REMOTE, b'"code":%d' % value if value else b"")
    for code, value in _STATUS_CODES.items()
}


# What repeats is kept as the JSON msgspec wrote for it, up to a number of
# entries (then all are dropped and kept again) and, for text, a length:
# span names, attribute keys' prefixes, and text and boolean attributes
# whole (a tool's name, its outcome).
_NAMES: dict[str, bytes] = {}
_KEYS: dict[str, tuple[bytes, bytes, bytes]] = {}
_PAIRS: dict[tuple[str, object], bytes] = {}
_KEPT_LIMIT = 4096
_KEPT_TEXT_LIMIT = 256


def _name_bytes(name, encode: Callable[[object], bytes]) -> bytes:
    piece = b',"name":' + encode(name)
    if type(name) is str and len(name) <= _KEPT_TEXT_LIMIT:
        if len(_NAMES) >= _KEPT_LIMIT:
            _NAMES.clear()
        _NAMES[name] = piece
    return piece


def _key_bytes(key, encode: Callable[[object], bytes]) -> tuple[bytes, bytes, bytes]:
    """The JSON of an attribute up to its value: the AnyValue, an intValue's text, a doubleValue."""
    pair = b'{"key":%b,"value":' % encode(key)
    prefixes = (pair, pair + b'{"intValue":"', pair + b'{"doubleValue":')
    if type(key) is str and len(key) <= _KEPT_TEXT_LIMIT:
        if len(_KEYS) >= _KEPT_LIMIT:
            _KEYS.clear()
        _KEYS[key] = prefixes
    return prefixes


def _pair_bytes(key, value, encode: Callable[[object], bytes]) -> bytes:
    """A text or boolean attribute's JSON."""
    prefix = (_KEYS.get(key) if type(key) is str else None) or _key_bytes(key, encode)
    if type(value) is str:
        pair = b'%b{"stringValue":%b}}' % (prefix[0], encode(value))
        if len(value) > _KEPT_TEXT_LIMIT:
            return pair
    else:
        pair = prefix[0] + (b'{"boolValue":true}}' if value else b'{"boolValue":false}}')
    if type(key) is str and len(key) <= _KEPT_TEXT_LIMIT:
        if len(_PAIRS) >= _KEPT_LIMIT:
            _PAIRS.clear()
        _PAIRS[(key, value)] = pair
    return pair


def _attributes_bytes(attributes, encode: Callable[[object], bytes], rejected: list) -> list:
    """Each attribute's JSON; a value OTLP cannot carry is left out and its key and type put in ``rejected``."""
    if not attributes:
        return []
    if type(attributes) is not dict:
        # The SDK's attributes (a MappingProxyType over BoundedAttributes)
        # copy their dict at C speed; iterating them calls Python per key.
        copy = getattr(attributes, "copy", None)
        if copy is not None:
            attributes = copy()
    encoded: list = []
    append = encoded.append
    for key, value in attributes.items():
        # The common kinds inline, by exact type (a bool is not an int here);
        # a double that is not finite (x - x is NaN) and the rest: _value_json.
        kind = type(value)
        if kind is str or kind is bool:
            append(_PAIRS.get((key, value)) or _pair_bytes(key, value, encode))
        elif kind is float and value - value == 0.0:
            append(b"%b%b}}" % ((_KEYS.get(key) or _key_bytes(key, encode))[2], encode(value)))
        elif kind is int and _INT64_MIN <= value <= _INT64_MAX:
            append(b'%b%d"}}' % ((_KEYS.get(key) or _key_bytes(key, encode))[1], value))
        else:
            try:
                value_json = _value_json(value, rejected)
            except TypeError:
                rejected.append((key, type(value).__name__))
                continue
            append(b"%b%b}" % ((_KEYS.get(key) or _key_bytes(key, encode))[0], encode(value_json)))
    return encoded


# --- the same as dicts: what the standard library writes where msgspec cannot,
# and the rare parts of a span ------------------------------------------------------


def _request_json(spans: Sequence[ReadableSpan], rejected: list) -> dict:
    grouped: dict = {}
    for span in spans:
        scopes = grouped.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope, []).append(_span_json(span, rejected))
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            entry = {"scope": _scope_json(scope, rejected), "spans": encoded}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        attributes = _attributes_json(resource.attributes, rejected)
        entry = {"resource": {"attributes": attributes} if attributes else {}, "scopeSpans": scope_spans}
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans}


def _span_json(span: ReadableSpan, rejected: list) -> dict:
    # proto3 JSON leaves out fields that hold their default value.
    context = span.get_span_context() or INVALID_SPAN_CONTEXT  # an SDK span always has one
    parent = span.parent
    encoded: dict = {"traceId": f"{context.trace_id:032x}", "spanId": f"{context.span_id:016x}"}
    if context.trace_state:
        encoded["traceState"] = _trace_state_json(context.trace_state)
    if parent:
        encoded["parentSpanId"] = f"{parent.span_id:016x}"
    if span.name:
        encoded["name"] = span.name
    encoded["kind"] = _KINDS[span.kind]
    if span.start_time:
        encoded["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        encoded["endTimeUnixNano"] = str(span.end_time)
    attributes = _attributes_json(span.attributes, rejected)
    if attributes:
        encoded["attributes"] = attributes
    if span.dropped_attributes:
        encoded["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        encoded["events"] = [_event_json(event, rejected) for event in span.events]
    if span.dropped_events:
        encoded["droppedEventsCount"] = span.dropped_events
    if span.links:
        encoded["links"] = [_link_json(link, rejected) for link in span.links]
    if span.dropped_links:
        encoded["droppedLinksCount"] = span.dropped_links
    encoded["flags"] = _flags(parent)
    # status is a message field: written even when it holds defaults.
    encoded["status"] = _status_json(span.status)
    return encoded


def _flags(context) -> int:
    if context is not None and context.is_remote:
        return _FLAGS_REMOTE
    return _FLAG_HAS_IS_REMOTE


def _trace_state_json(trace_state) -> str:
    return ",".join(f"{key}={value}" for key, value in trace_state.items()) if trace_state else ""


def _event_json(event, rejected: list) -> dict:
    encoded: dict = {}
    if event.timestamp:
        encoded["timeUnixNano"] = str(event.timestamp)
    if event.name:
        encoded["name"] = event.name
    attributes = _attributes_json(event.attributes, rejected)
    if attributes:
        encoded["attributes"] = attributes
    if event.dropped_attributes:
        encoded["droppedAttributesCount"] = event.dropped_attributes
    return encoded


def _link_json(link, rejected: list) -> dict:
    return _without_empty(
        {
            "traceId": f"{link.context.trace_id:032x}",
            "spanId": f"{link.context.span_id:016x}",
            "attributes": _attributes_json(link.attributes, rejected),
            "droppedAttributesCount": link.dropped_attributes,
            "flags": _flags(link.context),
        }
    )


def _scope_json(scope, rejected: list) -> dict:
    if scope is None:
        return {}
    return _without_empty(
        {"name": scope.name, "version": scope.version or "", "attributes": _attributes_json(scope.attributes, rejected)}
    )


def _without_empty(message: dict) -> dict:
    # proto3 JSON leaves out fields that hold their default value.
    return {key: value for key, value in message.items() if value}


def _attributes_json(attributes, rejected: list) -> list:
    encoded = []
    for key, value in (attributes or {}).items():
        try:
            encoded.append({"key": key, "value": _value_json(value, rejected)})
        except TypeError:
            rejected.append((key, type(value).__name__))
    return encoded


def _value_json(value, rejected: list) -> dict:
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
        return {"arrayValue": _without_empty({"values": [_value_json(item, rejected) for item in value]})}
    if isinstance(value, Mapping):
        values = _attributes_json({str(k): v for k, v in value.items()}, rejected)
        return {"kvlistValue": _without_empty({"values": values})}
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
    it append whole lines to the same file. Before each write the path is
    checked (one ``stat``): a file deleted or replaced meanwhile (a log
    rotation, a clean-up) is created or opened anew, with one log line; if
    that fails the spans are refused (``FAILURE``: counted), not written
    where nobody reads them.
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
            line = _encode_spans(spans, b"\n")
        except Exception as exc:  # telemetry must never break the agent
            _logger.warning("could not encode %d spans for %s (%s: %s)", len(spans), self.path, type(exc).__name__, exc)
            return SpanExportResult.FAILURE
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            moved = self._file.moved()
            if moved is not None and not self._open_again(moved):
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

    def _open_again(self, moved: str) -> bool:
        """The file was deleted or replaced: write to ``path`` again (under ``_lock``)."""
        try:
            self._file.open_again()
            self._size = os.fstat(self._file.fileno()).st_size
        except OSError as exc:
            _logger.warning(
                "%s was %s and cannot be created again (%s); spans are not written",
                self.path,
                moved,
                exc.strerror or exc,
            )
            return False
        _notices.warning(
            "%s was %s while spans were written to it; opened it again: later spans are in the file at that path",
            self.path,
            moved,
        )
        return True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every line is written when exported

    def shutdown(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError as exc:
                _logger.warning("could not close %s (%s)", self.path, exc.strerror or exc)
