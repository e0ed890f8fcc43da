"""Traces on disk as OTLP/JSON lines: the format, read back.

Usage::

    from agent_otel.spans.otlp_json import iter_spans

    for span in iter_spans("traces.jsonl"):   # SpanRecord, every field
        ...

Each line holds one ``ExportTraceServiceRequest`` in the OTLP/JSON
encoding, the format the OpenTelemetry Collector's file exporter writes, so
``agent-otel report`` reads a Collector's file as well as the toolkit's own
(written by ``agent_otel.exporters.otlp_json_file.OtlpJsonFileExporter``,
a module of its own so that ``instrument()`` does not load this reader).
OTLP/JSON is protobuf's JSON mapping with three rules of its own: trace and
span ids are hex strings (not base64), enums are integers, and field names
are lowerCamelCase; 64-bit integers such as timestamps are decimal strings,
and readers accept numbers too.

The reader (``iter_spans``; for the report, ``iter_requests`` with
``decode_traces``, then ``typed_resource_spans``) reads with msgspec's
typed decoder: each span becomes the structs below
(``JsonSpan`` and its parts), which hold only the fields the report reads
and skip the others without building them, so no dict is made per span or
attribute. A line is decoded down to its spans' JSON text
(``msgspec.Raw``), and each span is decoded as it is read and freed
before the next: the structs of one span stay in the CPU's cache while
the report reads them, where a whole line's (512 spans, about 750 kB)
did not. A line the typed decoder refuses (an envelope of an unexpected
shape, a lone surrogate, NaN) is parsed again with orjson, or the standard
library's ``json`` for what orjson refuses, checked as before and turned
into the same structs, so it reads, or fails with the same message, as
it would without the fast path; so is a span the typed decoder refuses. ``iter_spans`` gives every field as a
``SpanRecord``. No protobuf: the report may read millions of spans.
Inputs are opened by
``agent_otel.support.inputs``: a file or ``-``, plain, gzip or zstd, as bounded
lines.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from agent_otel.errors import InputError
from agent_otel.support.inputs import STDIN, Input, MiB, open_input

# OTLP Status.code: STATUS_CODE_ERROR
STATUS_ERROR = 2

# Lines of other OTLP signals, which a Collector's file exporter may write
# into the same file as traces: skipped, not errors.
_OTHER_SIGNALS = ("resourceMetrics", "resourceLogs", "resourceProfiles")


# ---------------------------------------------------------------- reading
#
# iter_requests: the input (a file or "-", plain, gzip or zstd) as parsed
#   export requests: one per line, or pretty-printed documents.
# iter_span_dicts: the span objects of those requests, as parsed JSON.
# iter_spans: the same spans as full SpanRecords (ids as ints, attribute
#   values as Python values).
# The report reads span dicts and converts only the fields it keeps, with
# the field helpers below (nanos, hex_id, any_value), which raise
# SpanFormatError for a malformed value.

EXPECTED = "OTLP/JSON lines"
# A pretty-printed document is read whole: this much at most.
MAX_DOCUMENT = 128 * MiB

_FLOAT_MAX = sys.float_info.max

_GPU_LOG_HINT = "this looks like an nvidia-smi GPU log, not traces: pass it to agent-otel report with --gpu-log"


# Why a span was refused (``SpanFormatError.reason``; the blame service
# counts refused spans by it): a number outside its range, a value of
# another type than its field's, or any other broken field.
OUT_OF_RANGE = "out_of_range"
WRONG_TYPE = "wrong_type"
MALFORMED = "malformed"


class SpanFormatError(ValueError):
    """A span field that OTLP/JSON does not allow; the reader adds file and line.

    ``reason``: ``OUT_OF_RANGE``, ``WRONG_TYPE`` or ``MALFORMED``.
    """

    def __init__(self, message: str, reason: str = MALFORMED):
        super().__init__(message)
        self.reason = reason


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


def input_name(path: str) -> str:
    """How error messages name an input (``-`` is standard input)."""
    return "<stdin>" if path == STDIN else str(path)


def iter_requests(
    path: str,
    progress: Optional[Callable[[int], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
    decode: Optional[Callable[[bytes], object]] = None,
) -> Iterator[tuple[int, object]]:
    """Yield ``(line number, parsed JSON)`` for each document in the input.

    Lines are documents (the OTLP/JSON lines a Collector or agent-otel
    writes); an input whose first line opens a JSON value that continues
    on the next lines is read as pretty-printed documents instead. A last
    line cut off (no newline at the end and not JSON: a writer still
    running, or killed) is left out with a warning through ``warn``, as is
    compressed data that stops mid-stream. Raises ``InputError`` naming the
    file and line for anything else. ``progress`` gets the bytes of the
    file read so far, a step at a time. ``decode``, when given, is tried
    on each line first; where it returns None or raises
    ``msgspec.DecodeError`` (or nests too deep) the line is parsed as
    plain JSON.
    """
    with open_input(path, EXPECTED) as source:
        counted = 0
        first = True
        for number, raw in source:
            if progress is not None:
                consumed = source.consumed()
                progress(consumed - counted)
                counted = consumed
            if raw.isspace():
                continue
            document = None
            if decode is not None:
                try:
                    document = decode(raw)
                except (msgspec.DecodeError, RecursionError):
                    pass
            try:
                if document is None:
                    document = _loads(raw)
            except _NotJson as exc:
                if not raw.endswith(b"\n"):  # the last line: nothing after it
                    if warn is not None:
                        warn(_cut_off_message(source.name, number, len(raw)))
                    return
                if first and exc.incomplete:
                    yield from _documents(source, raw, number)
                    return
                if first and _looks_like_gpu_log(raw):
                    raise source.error(number, _GPU_LOG_HINT) from None
                raise source.error(number, f"not JSON ({exc})") from None
            first = False
            yield number, document
        if source.cut_off is not None and warn is not None:
            warn(
                f"{source.name}: the {source.compression} data stops inside line {source.cut_off} "
                "(a writer still running, or killed): read the lines before it"
            )
        if progress is not None:
            progress(source.consumed() - counted)


def iter_span_dicts(
    path: str,
    progress: Optional[Callable[[int], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> Iterator[tuple[dict, int]]:
    """Yield ``(span, line number)`` for every span object in the input, in
    file order, as parsed JSON. Lines of other OTLP signals (which a
    Collector may write into the same file) are skipped."""
    for number, request in iter_requests(path, progress, warn):
        try:
            spans = request_spans(request)
        except SpanFormatError as exc:
            raise InputError(input_name(path), number, str(exc)) from None
        for span in spans:
            yield span, number


def iter_spans(
    path: str,
    progress: Optional[Callable[[int], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
) -> Iterator[SpanRecord]:
    """Yield every span in an OTLP/JSON input as a ``SpanRecord``, in file
    order. Tolerates what a Collector writes: any number of resources and
    scopes, fields left out when they hold their default value, numbers
    for 64-bit integers, lines of other signals. Raises ``InputError``
    naming the file and line for anything else."""
    for span, number in iter_span_dicts(path, progress, warn):
        try:
            yield span_record(span, number)
        except SpanFormatError as exc:
            raise InputError(input_name(path), number, str(exc)) from None


def request_spans(request: object) -> list[dict]:
    """The span objects of one ``ExportTraceServiceRequest``."""
    return [span for _resource, spans in resource_spans(request) for span in spans]


def resource_spans(request: object, any_span: bool = False) -> list[tuple[list, list[dict]]]:
    """(the resource's attributes array, its span objects) for each
    resource of one ``ExportTraceServiceRequest``. ``any_span``: an entry
    of ``spans`` that is no object is kept, for the caller to refuse alone."""
    if type(request) is not dict:
        raise SpanFormatError("not an OTLP ExportTraceServiceRequest (expected a JSON object)")
    entries = request.get("resourceSpans")
    if entries is None:
        if any(key in request for key in _OTHER_SIGNALS):
            return []
        raise SpanFormatError("not an OTLP ExportTraceServiceRequest (no resourceSpans)")
    found: list[tuple[list, list[dict]]] = []
    for entry in _array(entries, "resourceSpans"):
        entry = _object(entry, "resourceSpans[]")
        resource = entry.get("resource")
        resource_attributes = _list(_object(resource, "resource"), "attributes") if resource is not None else []
        spans: list[dict] = []
        for scope_spans in _list(entry, "scopeSpans"):
            scope_found = _list(_object(scope_spans, "scopeSpans[]"), "spans")
            for span in scope_found:
                if type(span) is not dict and not any_span:
                    raise SpanFormatError("spans[] is not a JSON object")
            spans.extend(scope_found)
        found.append((resource_attributes, spans))
    return found


def span_record(span: dict, line: int = 0) -> SpanRecord:
    """A span object as a ``SpanRecord``, every field converted."""
    start_ns, end_ns = span_times(span)
    status = span.get("status") or {}
    return SpanRecord(
        trace_id=hex_id(span.get("traceId"), 32, "traceId"),
        span_id=hex_id(span.get("spanId"), 16, "spanId"),
        parent_span_id=hex_id(span.get("parentSpanId"), 16, "parentSpanId"),
        name=str(span.get("name", "")),
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=attributes(span.get("attributes")),
        events=[_event(_object(event, "events[]")) for event in _list(span, "events")],
        links=[_link(_object(link, "links[]")) for link in _list(span, "links")],
        status_code=nanos(_object(status, "status").get("code", 0), "status.code"),
        line=line,
    )


def span_times(span: dict) -> tuple[int, int]:
    """(start, end) in epoch ns; a span must start, and not end before it starts."""
    start_ns = nanos(span.get("startTimeUnixNano", 0), "startTimeUnixNano")
    end_ns = nanos(span.get("endTimeUnixNano", 0), "endTimeUnixNano")
    if not start_ns:
        raise SpanFormatError(f"span {span.get('name', '')!r} has no startTimeUnixNano")
    if end_ns < start_ns:
        raise SpanFormatError(
            f"span {span.get('name', '')!r} ends (endTimeUnixNano {end_ns}) before it starts ({start_ns})"
        )
    return start_ns, end_ns


def nanos(value: object, where: str) -> int:
    """An unsigned 64-bit integer: a decimal string in OTLP/JSON, a number accepted."""
    if type(value) is str:
        if 0 < len(value) <= 20 and value.isascii() and value.isdigit():
            number = int(value)
            if number < 1 << 64:
                return number
    elif type(value) is int:
        if 0 <= value < 1 << 64:
            return value
    elif type(value) is float and value.is_integer() and 0 <= value < 2.0**64:
        return int(value)
    reason = OUT_OF_RANGE if type(value) in (int, float) or (type(value) is str and value.isdigit()) else WRONG_TYPE
    raise SpanFormatError(f"{where} is not an unsigned 64-bit integer: {_short(value)}", reason)


def hex_id(value: object, digits: int, where: str) -> int:
    """A trace (32 digits) or span (16) id; absent or empty is 0."""
    if value is None or value == "":
        return 0
    if type(value) is str and len(value) == digits and value.isascii():
        try:
            return int(value, 16)
        except ValueError:
            pass
    hint = ""
    if isinstance(value, str) and _looks_base64(value, digits // 2):
        hint = " (it looks base64: protobuf's JSON mapping, not OTLP/JSON)"
    raise SpanFormatError(f"{where} is not {digits} hex digits: {_short(value)}{hint}")


def attributes(items: object) -> dict:
    """An attributes array as a dict of Python values."""
    if items is None:
        return {}
    if type(items) is not list:
        raise SpanFormatError("attributes is not a JSON array")
    result = {}
    for item in items:
        item = _object(item, "attributes[]")
        key = item.get("key")
        if type(key) is not str:
            raise SpanFormatError(f"attribute key is not a string: {_short(key)}")
        result[key] = any_value(item.get("value"), key)
    return result


def any_value(value: object, key: str) -> object:
    """An ``AnyValue`` as a Python value; an empty one is None. Bytes stay
    as their base64 text."""
    if value is None:
        return None
    value = _object(value, f"attribute {key!r} value")
    if "stringValue" in value:
        return str(value["stringValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        raw = value["intValue"]
        if type(raw) is int:
            return raw
        if type(raw) is str and 0 < len(raw) <= 20 and raw.lstrip("-").isascii() and raw.lstrip("-").isdigit():
            return int(raw)
        raise SpanFormatError(f"attribute {key!r}: intValue is not an integer: {_short(raw)}", WRONG_TYPE)
    if "doubleValue" in value:
        raw = value["doubleValue"]
        if type(raw) is float:
            return raw
        if type(raw) is int:
            if -_FLOAT_MAX <= raw <= _FLOAT_MAX:
                return float(raw)
            raise SpanFormatError(
                f"attribute {key!r}: doubleValue is out of a double's range: {_short(raw)}", OUT_OF_RANGE
            )
        if type(raw) is str and len(raw) <= 40:
            try:
                return float(raw)  # also "NaN", "Infinity", "-Infinity"
            except ValueError:
                pass
        raise SpanFormatError(f"attribute {key!r}: doubleValue is not a number: {_short(raw)}", WRONG_TYPE)
    if "arrayValue" in value:
        array = _object(value["arrayValue"], f"attribute {key!r} arrayValue")
        return [any_value(item, key) for item in _list(array, "values")]
    if "kvlistValue" in value:
        kvlist = _object(value["kvlistValue"], f"attribute {key!r} kvlistValue")
        return attributes(kvlist.get("values"))
    if "bytesValue" in value:
        return value["bytesValue"]  # base64 text, kept as written
    return None


def _event(event: dict) -> SpanEvent:
    return SpanEvent(
        name=str(event.get("name", "")),
        time_ns=nanos(event.get("timeUnixNano", 0), "events[].timeUnixNano"),
        attributes=attributes(event.get("attributes")),
    )


def _link(link: dict) -> tuple[int, int]:
    return hex_id(link.get("traceId"), 32, "links[].traceId"), hex_id(link.get("spanId"), 16, "links[].spanId")


def _object(value: object, where: str) -> dict:
    if type(value) is not dict:
        raise SpanFormatError(f"{where} is not a JSON object")
    return value


def _list(parent: dict, key: str) -> list:
    value = parent.get(key)
    if value is None:
        return []
    return _array(value, key)


def _array(value: object, key: str) -> list:
    if type(value) is not list:
        raise SpanFormatError(f"{key} is not a JSON array")
    return value


def _short(value: object) -> str:
    """A value for an error message, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _looks_base64(value: str, size: int) -> bool:
    try:
        return len(base64.b64decode(value, validate=True)) == size
    except (binascii.Error, ValueError):
        return False


# ------------------------------------------------- typed spans, for the report
#
# Only the fields the report reads; msgspec skips the others without
# building them. Leaves are typed Any: the report checks them itself, with
# the messages of the helpers above, so a line is refused by the typed
# decoder only for a container of the wrong shape (then read as JSON and
# converted by typed_resource_spans, raw values kept where the shape is
# wrong, for the report to refuse where it reads them). An AnyValue's
# absent fields are UNSET (a JSON null is None). gc=False: the structs hold
# no cycles, and are cheaper to make and free untracked.


class JsonValue(msgspec.Struct, gc=False):
    """An ``AnyValue``."""

    stringValue: Any = UNSET
    boolValue: Any = UNSET
    intValue: Any = UNSET
    doubleValue: Any = UNSET
    arrayValue: Any = UNSET
    kvlistValue: Any = UNSET
    bytesValue: Any = UNSET


_VALUE_FIELDS = JsonValue.__struct_fields__


class JsonKeyValue(msgspec.Struct, gc=False):
    key: Any = None
    value: Optional[JsonValue] = None


class JsonEvent(msgspec.Struct, gc=False):
    name: Any = None
    timeUnixNano: Any = 0


class JsonLink(msgspec.Struct, gc=False):
    traceId: Any = None
    spanId: Any = None
    attributes: Optional[list[JsonKeyValue]] = None


class JsonStatus(msgspec.Struct, gc=False):
    code: Any = 0


class JsonSpan(msgspec.Struct, gc=False):
    """A span, as the report reads it (defaults: what a left-out field means)."""

    traceId: Any = None
    spanId: Any = None
    parentSpanId: Any = None
    name: Any = ""
    startTimeUnixNano: Any = 0
    endTimeUnixNano: Any = 0
    attributes: Optional[list[JsonKeyValue]] = None
    events: Optional[list[JsonEvent]] = None
    links: Optional[list[JsonLink]] = None
    status: Optional[JsonStatus] = None


class _JsonScopeSpans(msgspec.Struct, gc=False):
    spans: list[msgspec.Raw] = []  # each span's JSON text: decoded one at a time (typed_resource_spans)


class _JsonResource(msgspec.Struct, gc=False):
    attributes: list[JsonKeyValue] = []


class _JsonResourceSpans(msgspec.Struct, gc=False):
    resource: Optional[_JsonResource] = None
    scopeSpans: list[_JsonScopeSpans] = []


class _JsonTraceRequest(msgspec.Struct, gc=False):
    resourceSpans: Union[list[_JsonResourceSpans], UnsetType] = UNSET


# A line up to _WHOLE_LINE bytes is decoded to its spans' structs in one
# call: one pass over its text, not two. Where a Collector or an exporter
# writes one span a line, the report takes 19 % less CPU; at 100 spans a
# line (a batch processor's export, 60-80 kB), the read 5-7 % less and
# 8.5 % fewer instructions. A longer line is decoded down to each span's
# text, and each span as it is read: its structs stay in the CPU's cache
# while the report reads them (whole lines of 512 spans, about 300 kB,
# cost the read 50 % more).
_WHOLE_LINE = 128 * 1024


class _JsonWholeScopeSpans(msgspec.Struct, gc=False):
    spans: list[JsonSpan] = []


class _JsonWholeResourceSpans(msgspec.Struct, gc=False):
    resource: Optional[_JsonResource] = None
    scopeSpans: list[_JsonWholeScopeSpans] = []


class _JsonWholeRequest(msgspec.Struct, gc=False):
    resourceSpans: Union[list[_JsonWholeResourceSpans], UnsetType] = UNSET


_TRACE_DECODER = msgspec.json.Decoder(_JsonTraceRequest)
_WHOLE_DECODER = msgspec.json.Decoder(_JsonWholeRequest)
_SPAN_DECODER = msgspec.json.Decoder(JsonSpan)


def decode_traces(raw: bytes) -> Union[_JsonTraceRequest, _JsonWholeRequest, None]:
    """One line as typed structs (for ``iter_requests``'s ``decode``); None
    for a line without ``resourceSpans``, which is read as JSON (another
    signal's line, or an error to name). Raises ``msgspec.DecodeError``.
    A short line is decoded whole where the typed decoder takes every span
    of it; otherwise (or where it refuses one) down to each span's text."""
    request: Union[_JsonTraceRequest, _JsonWholeRequest]
    if len(raw) <= _WHOLE_LINE:
        try:
            request = _WHOLE_DECODER.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            request = _TRACE_DECODER.decode(raw)
    else:
        request = _TRACE_DECODER.decode(raw)
    return None if request.resourceSpans is UNSET else request


def typed_resource_spans(request: object) -> list[tuple[list, int, Iterator[JsonSpan]]]:
    """(the resource's attributes, how many spans it has, its spans) for
    each resource of one request: decoded by ``decode_traces``, or parsed
    JSON, checked by ``resource_spans`` (which raises ``SpanFormatError``)
    and converted. A decoded request's spans are decoded as they are
    iterated, one at a time (``_typed_spans``)."""
    if type(request) is _JsonWholeRequest:
        whole: list[tuple[list, int, Iterator[JsonSpan]]] = []
        for part in request.resourceSpans:  # type: ignore[union-attr]  # decode_traces: never UNSET
            resource = part.resource.attributes if part.resource is not None else []
            parts = part.scopeSpans
            spans = parts[0].spans if len(parts) == 1 else [span for scope in parts for span in scope.spans]
            whole.append((resource, len(spans), iter(spans)))
        return whole
    if type(request) is _JsonTraceRequest:
        found: list[tuple[list, int, Iterator[JsonSpan]]] = []
        for entry in request.resourceSpans:  # type: ignore[union-attr]  # decode_traces: never UNSET
            resource = entry.resource.attributes if entry.resource is not None else []
            scopes = entry.scopeSpans
            raws = scopes[0].spans if len(scopes) == 1 else [span for scope in scopes for span in scope.spans]
            found.append((resource, len(raws), _typed_spans(raws)))
        return found
    return [
        ([_typed_key_value(item) for item in resource], len(spans), map(_typed_or_unreadable, spans))
        for resource, spans in resource_spans(request, any_span=True)
    ]


def _typed_or_unreadable(span: object) -> JsonSpan:
    return typed_span(span) if type(span) is dict else unreadable_span("spans[] is not a JSON object")


def _typed_spans(raws: list[msgspec.Raw]) -> Iterator[JsonSpan]:
    """Each span's JSON text as a ``JsonSpan``; one the typed decoder refuses
    is parsed as JSON and converted (``typed_span``), as a line is. One that
    is no JSON object comes as an ``unreadable_span``: the spans after it
    are still read."""
    decode = _SPAN_DECODER.decode
    for raw in raws:
        try:
            span = decode(raw)
        except (msgspec.DecodeError, RecursionError):
            try:
                value = _loads(bytes(raw))
            except _NotJson as exc:
                span = unreadable_span(f"not JSON ({exc})")
            else:
                span = typed_span(value) if type(value) is dict else unreadable_span("spans[] is not a JSON object")
        yield span


class Unreadable:
    """The trace id of a span that could not be read at all: reading its ids
    raises ``SpanFormatError`` with ``message`` (``unreadable_span``)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


def unreadable_span(message: str) -> JsonSpan:
    """A stand-in for a span that is no span: its reader refuses it with ``message``, alone."""
    return JsonSpan(Unreadable(message), None, None, "", 0, 0, None, None, None, None)


def typed_span(span: dict) -> JsonSpan:
    """A span object of parsed JSON as a ``JsonSpan``; a field of another
    shape than expected is kept as it is."""
    attributes: Any = span.get("attributes")
    events: Any = span.get("events")
    links: Any = span.get("links")
    status: Any = span.get("status")
    return JsonSpan(
        span.get("traceId"),
        span.get("spanId"),
        span.get("parentSpanId"),
        span.get("name", ""),
        span.get("startTimeUnixNano", 0),
        span.get("endTimeUnixNano", 0),
        [_typed_key_value(item) for item in attributes] if type(attributes) is list else attributes,
        [_typed_event(event) for event in events] if type(events) is list else events,
        [_typed_link(link) for link in links] if type(links) is list else links,
        JsonStatus(status.get("code", 0)) if type(status) is dict else status,
    )


def value_of(value: object, key: str) -> object:
    """``any_value`` of a ``JsonValue`` (or of a raw value kept by ``typed_span``)."""
    if type(value) is JsonValue:
        value = {name: getattr(value, name) for name in _VALUE_FIELDS if getattr(value, name) is not UNSET}
    return any_value(value, key)


def _typed_key_value(item: Any) -> Any:
    if type(item) is not dict:
        return item
    value = item.get("value")
    if type(value) is dict:
        value = JsonValue(**{name: value[name] for name in _VALUE_FIELDS if name in value})
    return JsonKeyValue(item.get("key"), value)


def _typed_event(event: Any) -> Any:
    return JsonEvent(event.get("name"), event.get("timeUnixNano", 0)) if type(event) is dict else event


def _typed_link(link: Any) -> Any:
    if type(link) is not dict:
        return link
    attributes = link.get("attributes")
    return JsonLink(
        link.get("traceId"),
        link.get("spanId"),
        [_typed_key_value(item) for item in attributes] if type(attributes) is list else attributes,
    )


# ------------------------------------------------- parsing one document


class _NotJson(Exception):
    def __init__(self, reason: str, incomplete: bool = False):
        super().__init__(reason)
        self.incomplete = incomplete  # the text ended inside a JSON value


def _loads(raw: bytes) -> object:
    """One document: orjson, which is fast; then the standard library for
    what orjson refuses but JSON allows (a lone surrogate in a \\u escape,
    an integer beyond 64 bits, NaN), and for its error messages."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except RecursionError:
        raise _NotJson("nested too deep") from None
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "replace")
    except json.JSONDecodeError as exc:
        raise _NotJson(exc.msg, incomplete=exc.pos >= len(raw.rstrip())) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _NotJson(str(exc).split(";")[0]) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise _NotJson("nested too deep") from None
    except json.JSONDecodeError as exc:
        raise _NotJson(exc.msg, incomplete=exc.pos >= len(text.rstrip())) from None
    except ValueError as exc:
        raise _NotJson(str(exc).split(";")[0]) from None


_SPACE = re.compile(r"\s*")


def _documents(source: Input, first_line: bytes, number: int) -> Iterator[tuple[int, object]]:
    """The rest of the input as one or more pretty-printed JSON documents."""
    data = first_line + source.read_rest(MAX_DOCUMENT - len(first_line))
    text = data.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    position = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    while position < len(text):
        line = number + text.count("\n", 0, position)
        try:
            document, position = decoder.raw_decode(text, position)
        except RecursionError:
            raise source.error(line, "not JSON (nested too deep)") from None
        except json.JSONDecodeError as exc:
            raise source.error(number + text.count("\n", 0, exc.pos), f"not JSON ({exc.msg})") from None
        except ValueError as exc:
            raise source.error(line, f"not JSON ({str(exc).split(';')[0]})") from None
        yield line, document
        position = _SPACE.match(text, position).end()  # type: ignore[union-attr]


def _cut_off_message(name: str, number: int, size: int) -> str:
    return (
        f"{name}:{number}: the last line is cut off ({size} bytes with no newline at the end: "
        "a writer still running, or killed); read the lines before it"
    )


def _looks_like_gpu_log(raw: bytes) -> bool:
    text = raw.strip().lower()
    if text.startswith(b"#"):
        return b"gpu" in text
    return text.startswith(b"timestamp") and b"utilization" in text
