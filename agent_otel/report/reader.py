"""Exported spans -> the report's compact records.

One pass over the inputs' span objects (``exporters.otlp_json``), with
Python's cyclic garbage collector paused: it would otherwise rescan the
growing heap again and again, which made reading a million spans cost
more per span than reading ten thousand. Each span is recognised by kind
in ``TraceReader.add``, the one place where a kind of span is turned into
a record (the blame service, ``agent_otel.receiver``, turns the spans it
receives over OTLP into records here too); only the fields the analysis
uses are converted, and any other span only counts and widens the time
window:

- **tool spans** (``gen_ai.operation.name == "execute_tool"``) become a
  ``ToolCall``: requested at the span's start, finished at its end, and
  executing from its ``exec.start`` event (or, without one, from start +
  ``agent.tool.queue.duration``);
- **window-level ``gpu.idle`` spans** (with ``gpu.idle.duration``) become
  an ``IdleWindow``;
- **per-tool ``gpu.idle`` child spans** (with ``gpu.idle.blocked_duration``)
  hold what the live path blamed: summed per tool, to compare with the
  report's own attribution.

Every record carries the GPU pool its process declared: the resource
attribute ``agent.gpu.pool`` ("" for none).

Names read from spans (tools, executors, threads) are made printable
Unicode (a lone surrogate becomes U+FFFD) and shared between records.
"""

from __future__ import annotations

import gc
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

from agent_otel.errors import InputError
from agent_otel.exporters.otlp_json import (
    STATUS_ERROR,
    SpanFormatError,
    any_value,
    hex_id,
    input_name,
    iter_requests,
    nanos,
    resource_spans,
    span_times,
)
from agent_otel.records import NS_PER_S, IdleWindow, ToolCall
from agent_otel.semconv import (
    AGENT_EXECUTOR_MAX_WORKERS,
    AGENT_GPU_POOL,
    AGENT_TOOL_EXECUTOR,
    AGENT_TOOL_OUTCOME,
    AGENT_TOOL_PHASE,
    AGENT_TOOL_QUEUE_DURATION,
    AGENT_TOOL_TIMEOUT,
    ERROR_TYPE,
    EVENT_EXEC_START,
    GEN_AI_OPERATION_EXECUTE_TOOL,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GPU_IDLE_BLOCKED_DURATION,
    GPU_IDLE_DURATION,
    GPU_INDEX,
    GPU_UTILIZATION_AVG,
    GPU_UUID,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOMES,
    SPAN_EXECUTE_TOOL_PREFIX,
    SPAN_GPU_IDLE,
    THREAD_NAME,
)

# The executor of a tool span that names none (another library's span).
UNKNOWN_EXECUTOR = "unknown"

# The attributes any kind of span is recognised or read by; the others are
# skipped without being converted.
WANTED_ATTRIBUTES = frozenset(
    {
        GEN_AI_OPERATION_NAME,
        GEN_AI_TOOL_NAME,
        GEN_AI_TOOL_CALL_ID,
        AGENT_TOOL_QUEUE_DURATION,
        AGENT_TOOL_EXECUTOR,
        AGENT_TOOL_OUTCOME,
        AGENT_TOOL_TIMEOUT,
        AGENT_TOOL_PHASE,
        AGENT_EXECUTOR_MAX_WORKERS,
        ERROR_TYPE,
        THREAD_NAME,
        GPU_INDEX,
        GPU_UUID,
        GPU_IDLE_DURATION,
        GPU_IDLE_BLOCKED_DURATION,
        GPU_UTILIZATION_AVG,
    }
)


@dataclass
class TraceData:
    """Everything the report takes from trace files."""

    calls: list[ToolCall] = field(default_factory=list)
    idle_windows: list[IdleWindow] = field(default_factory=list)
    # tool -> seconds the live path's gpu.idle child spans blamed on it;
    # None when the traces hold no such spans
    live_blocked_s: Optional[dict[str, float]] = None
    # tool -> the smallest ``agent.tool.timeout`` (s) its spans carried
    timeouts: dict[str, float] = field(default_factory=dict)
    span_count: int = 0
    duplicate_count: int = 0
    # earliest start and latest end over every span read (0 when none)
    start_ns: int = 0
    end_ns: int = 0
    # inputs that held nothing at all (no line that is not blank)
    empty_inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (reference counting still frees
    memory): the report builds millions of objects that live until it
    ends, and each collection would rescan all of them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_traces(paths: Iterable[str], progress: Optional[Callable[[int], None]] = None) -> TraceData:
    """Read OTLP/JSON trace inputs (files, or ``-`` for standard input) into records.

    A span seen twice (the same trace and span id, e.g. files that overlap)
    counts once, and so does a call seen from two sides: a tool span whose
    parent is a tool span of the same tool (an MCP client's span and the
    server's own span under it) is the same call. Raises ``InputError``
    naming the file and line for a malformed line or a span field the
    report needs and cannot read.
    """
    reader = TraceReader()
    data = reader.data
    with paused_gc():
        for path in paths:
            name = input_name(path)
            reader.name = name
            documents = spans_before = 0
            spans_before = data.span_count + data.duplicate_count
            for number, request in iter_requests(path, progress, data.warnings.append):
                documents += 1
                try:
                    for resource, spans in resource_spans(request):
                        pool = gpu_pool_of(resource)
                        for span in spans:
                            reader.add(span, number, pool)
                except SpanFormatError as exc:
                    raise InputError(name, number, str(exc)) from None
            if not documents:
                data.empty_inputs.append(name)
                data.warnings.append(f"{name} is empty")
            elif data.span_count + data.duplicate_count == spans_before:
                data.warnings.append(f"no spans in {name}")
        reader.finish()
    return data


def gpu_pool_of(resource: list) -> str:
    """The GPU pool a resource's attributes array declares (``agent.gpu.pool``); "" for none."""
    for item in resource:
        if type(item) is dict and item.get("key") == AGENT_GPU_POOL:
            value = any_value(item.get("value"), AGENT_GPU_POOL)
            return printable(value.strip()) if type(value) is str else ""
    return ""


class TraceReader:
    """The state of one read: records made so far and what dedupes them.

    ``add`` each span object (OTLP/JSON shape) with the GPU pool of its
    resource, then ``finish``; the records are in ``data``. ``add`` raises
    ``SpanFormatError`` for a span field it needs and cannot read.
    """

    def __init__(self) -> None:
        self.data = TraceData()
        self.name = ""
        self._seen: set[int] = set()  # trace_id << 64 | span_id of every span read
        self._parents: list[int] = []  # per call: trace_id << 64 | parent span id (0: none)
        self._referenced: dict[int, int] = {}  # parent keys of tool and child spans (interned)
        self._live: dict[int, float] = {}  # parent key -> seconds blamed by gpu.idle children
        self._strings: dict[str, str] = {}

    # -- one span: recognise its kind, keep what the analysis needs ------

    def add(self, span: dict, line: int, pool: str = "") -> None:
        data = self.data
        trace_id = hex_id(span.get("traceId"), 32, "traceId")
        key = trace_id << 64 | hex_id(span.get("spanId"), 16, "spanId")
        if key in self._seen:
            data.duplicate_count += 1
            return
        self._seen.add(key)
        data.span_count += 1
        start_ns, end_ns = span_times(span)
        if not data.start_ns or start_ns < data.start_ns:
            data.start_ns = start_ns
        if end_ns > data.end_ns:
            data.end_ns = end_ns
        found = _wanted(span.get("attributes"))
        operation = found.get(GEN_AI_OPERATION_NAME)
        if operation is not None and any_value(operation, GEN_AI_OPERATION_NAME) == GEN_AI_OPERATION_EXECUTE_TOOL:
            self._tool_call(span, found, trace_id, key, start_ns, end_ns, pool)
        elif span.get("name") == SPAN_GPU_IDLE:
            if GPU_IDLE_BLOCKED_DURATION in found:
                self._live_share(span, found, trace_id)
            else:
                self._idle_window(span, found, start_ns, end_ns, pool)
        # A new kind of span: recognise it here and turn it into a record.

    def _tool_call(self, span: dict, found: dict, trace_id: int, key: int, start_ns: int, end_ns: int,
                   pool: str) -> None:
        data = self.data
        tool = self._text(found, GEN_AI_TOOL_NAME)
        if not tool:
            name = span.get("name")
            prefix = SPAN_EXECUTE_TOOL_PREFIX
            tool = self._name(name[len(prefix):]) if type(name) is str and name.startswith(prefix) else "unknown"
        outcome = self._text(found, AGENT_TOOL_OUTCOME)
        if outcome not in OUTCOMES:
            status = span.get("status")
            code = nanos(status.get("code", 0), "status.code") if type(status) is dict else 0
            outcome = OUTCOME_ERROR if code == STATUS_ERROR else OUTCOME_OK
        workers = self._value(found, AGENT_EXECUTOR_MAX_WORKERS)
        call = ToolCall(
            tool,
            self._text(found, AGENT_TOOL_EXECUTOR) or UNKNOWN_EXECUTOR,
            start_ns,
            self._exec_start(span, found, start_ns, end_ns),
            end_ns,
            outcome,
            self._text(found, GEN_AI_TOOL_CALL_ID, share=False),
            trace_id,
            key & 0xFFFF_FFFF_FFFF_FFFF,
            self._text(found, ERROR_TYPE),
            self._text(found, THREAD_NAME),
            workers if type(workers) is int and workers > 0 else None,
            pool,
        )
        # Everything that can raise first: a span that fails adds nothing.
        timeout = self._seconds(span, found, AGENT_TOOL_TIMEOUT)
        parent = self._parent(span, trace_id)
        data.calls.append(call)
        self._parents.append(parent)
        if timeout is not None and timeout > 0:
            data.timeouts[tool] = min(timeout, data.timeouts.get(tool, math.inf))

    def _exec_start(self, span: dict, found: dict, start_ns: int, end_ns: int) -> int:
        """When execution began, kept inside the span."""
        events = span.get("events")
        if events:
            if type(events) is not list:
                raise SpanFormatError("events is not a JSON array")
            for event in events:
                if type(event) is not dict:
                    raise SpanFormatError("events[] is not a JSON object")
                if event.get("name") == EVENT_EXEC_START:
                    time_ns = nanos(event.get("timeUnixNano", 0), "events[].timeUnixNano")
                    if time_ns:
                        return min(max(time_ns, start_ns), end_ns)
        queue_s = self._seconds(span, found, AGENT_TOOL_QUEUE_DURATION) or 0.0
        return min(start_ns + round(queue_s * NS_PER_S), end_ns)

    def _idle_window(self, span: dict, found: dict, start_ns: int, end_ns: int, pool: str) -> None:
        utilization = self._seconds(span, found, GPU_UTILIZATION_AVG)
        self.data.idle_windows.append(
            IdleWindow(
                gpu=self._gpu(span, found),
                start_ns=start_ns,
                end_ns=end_ns,
                utilization_avg=0.0 if utilization is None else utilization,
                uuid=self._text(found, GPU_UUID),
                pool=pool,
            )
        )

    def _live_share(self, span: dict, found: dict, trace_id: int) -> None:
        self._gpu(span, found)  # a child span names its GPU, like a window
        blocked = self._seconds(span, found, GPU_IDLE_BLOCKED_DURATION) or 0.0
        parent = self._parent(span, trace_id)
        if parent:
            self._live[parent] = self._live.get(parent, 0.0) + blocked
        if self.data.live_blocked_s is None:
            self.data.live_blocked_s = {}

    def _parent(self, span: dict, trace_id: int) -> int:
        parent_id = hex_id(span.get("parentSpanId"), 16, "parentSpanId")
        if not parent_id:
            return 0
        key = trace_id << 64 | parent_id
        return self._referenced.setdefault(key, key)

    # -- after the last span: join what refers to other spans ----------

    def finish(self) -> None:
        """Drop calls seen from two sides, and give the live path's blame
        to the tools whose spans the children hang under."""
        data = self.data
        referenced = self._referenced
        tool_of: dict[int, str] = {}
        for call in data.calls:
            key = call.trace_id << 64 | call.span_id
            if key in referenced:
                tool_of[key] = call.tool
        if tool_of:
            kept = [call for call, parent in zip(data.calls, self._parents) if tool_of.get(parent) != call.tool]
            data.duplicate_count += len(data.calls) - len(kept)
            data.calls = kept
        if data.live_blocked_s is not None:
            for parent, seconds in self._live.items():
                tool = tool_of.get(parent)
                if tool is not None:
                    data.live_blocked_s[tool] = data.live_blocked_s.get(tool, 0.0) + seconds
        self._seen.clear()
        self._parents.clear()

    # -- fields ----------------------------------------------------------

    def _value(self, found: dict, key: str) -> object:
        value = found.get(key)
        return None if value is None else any_value(value, key)

    def _text(self, found: dict, key: str, share: bool = True) -> Optional[str]:
        """A text attribute as printable Unicode, shared between records; None when absent."""
        value = found.get(key)
        if value is None:
            return None
        value = any_value(value, key)
        if value is None:
            return None
        return self._name(value if type(value) is str else str(value), share)

    def _name(self, text: str, share: bool = True) -> str:
        if not text.isascii():
            text = printable(text)
        return self._strings.setdefault(text, text) if share else text

    def _gpu(self, span: dict, found: dict) -> str:
        index = self._value(found, GPU_INDEX)
        if type(index) is bool or type(index) not in (int, str) or str(index) == "":
            raise SpanFormatError(f"span {_name_of(span)!r} has no {GPU_INDEX} (got {index!r})")
        return self._name(str(index))

    def _seconds(self, span: dict, found: dict, key: str) -> Optional[float]:
        """A non-negative number attribute, or None when absent."""
        value = self._value(found, key)
        if value is None:
            return None
        if type(value) is bool or type(value) not in (int, float) or not value >= 0 or math.isinf(value):  # type: ignore[operator]
            raise SpanFormatError(f"span {_name_of(span)!r}: {key} is not a non-negative number: {value!r}")
        return float(value)  # type: ignore[arg-type]


_NOTHING: dict = {}


def _wanted(items: object) -> dict:
    """key -> raw AnyValue for the attributes in ``WANTED_ATTRIBUTES``."""
    if not items:
        return _NOTHING
    if type(items) is not list:
        raise SpanFormatError("attributes is not a JSON array")
    found = {}
    for item in items:
        if type(item) is not dict:
            raise SpanFormatError("attributes[] is not a JSON object")
        key = item.get("key")
        if key in WANTED_ATTRIBUTES:
            found[key] = item.get("value")
    return found


def _name_of(span: dict) -> str:
    name = span.get("name", "")
    return printable(name) if type(name) is str else repr(name)


def printable(text: str) -> str:
    """``text`` with every lone surrogate (text decoded with
    ``surrogateescape``, or a JSON ``\\udcff`` escape) replaced by U+FFFD,
    so it can be written as UTF-8 anywhere."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")
