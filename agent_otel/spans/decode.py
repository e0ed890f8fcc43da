"""Exported spans -> the toolkit's records: the one place a span becomes a record.

``SpanReader.add`` takes one span (OTLP/JSON shape, as ``spans.otlp_json``
decodes it, or as ``spans.protobuf`` converts a received protobuf span),
recognises its kind and keeps its record; ``finish`` then keeps one record
per call. The report (``report.reader.TraceReader``, which adds what it
keeps across spans: turns, inner failures, the live path's blame, the
services) and the blame service (``receiver.decode``) both read spans
through it, so a tool call means the same thing live and offline. Only the
fields a record uses are converted; any other span only counts and widens
the time window:

- **tool spans** (``gen_ai.operation.name == "execute_tool"``) become a
  ``ToolCall``: requested at the span's start, finished at its end, and
  executing from its ``exec.start`` event (or, without one, from start +
  ``agent.tool.queue.duration``);
- **window-level ``gpu.idle`` spans** (with ``gpu.idle.duration``) become
  an ``IdleWindow`` (with what the live path blamed, every share, where
  the window carries ``gpu.idle.blocked_tools`` and
  ``gpu.idle.blocked_durations``); the per-tool ``gpu.idle`` child spans
  of older versions (with ``gpu.idle.blocked_duration``) are read as a
  share of the call they hang under;
- **``asyncio.loop.blocked`` spans** become a ``LoopBlock``: the blocking
  call and the waiting ones from the span's links (``asyncio.loop.role``),
  the tool from ``asyncio.loop.blocked_by``;
- **other instrumentations' tool spans** (OpenInference
  ``openinference.span.kind = TOOL``, OpenLLMetry ``traceloop.span.kind =
  tool``, and GenAI ``execute_tool`` spans without agent-otel's timing, such
  as the MCP SDK's server span) become ``ToolCall`` records too, with no
  queue phase and executor ``unknown``; one that is the same call as one of
  agent-otel's (below) is dropped;
- **model-call spans** (``gen_ai.operation.name`` ``chat``,
  ``text_completion``, ``generate_content``; OpenInference ``LLM``;
  OpenLLMetry ``llm``) become ``ModelCall`` records;
- **agent spans** (``invoke_agent``; OpenInference ``AGENT``; OpenLLMetry
  ``agent`` and ``workflow``) become ``AgentRun`` records;
- **a model server's request spans** (vLLM's ``llm_request``) become
  ``ServerRequest`` records;
- **failed spans under a parent** (status ERROR, or an ``exception``
  event) are handed on, in case the parent is a tool call.

One call seen by several spans counts once: a tool span under a tool span
of the same tool (an MCP client's span, the MCP SDK's server span under it,
the server's own span under that; the MCP SDK's client request span in
between is looked through) is the same call, and agent-otel's span is kept
(the outermost of them). A model span under a model span is the same model
call. The spans several instrumentations made side by side of one tool or
model call (OpenInference's and OpenLLMetry's LangChain spans beside ours
and each other's) are merged by ``spans.peers``.

Every record carries the GPU pool its process declared: the resource
attribute ``agent.gpu.pool`` ("" for none, ``gpu_pool_of``).

Names read from spans (tools, executors, threads) are made printable
Unicode (a lone surrogate becomes U+FFFD) and shared between records.
Every field has a fast path for what exporters write and falls back to
``spans.otlp_json``'s validating readers for anything else, which either
read it or raise ``SpanFormatError``: a span that raises adds no record.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import Any, Optional

from msgspec import UNSET

from agent_otel.records import NS_PER_S, AgentRun, IdleWindow, LoopBlock, ModelCall, ServerRequest
from agent_otel.spans.calls import U64, CallTable
from agent_otel.spans.ids import rows_among
from agent_otel.spans.otlp_json import (
    OUT_OF_RANGE,
    STATUS_ERROR,
    WRONG_TYPE,
    JsonEvent,
    JsonKeyValue,
    JsonLink,
    JsonSpan,
    JsonStatus,
    JsonValue,
    SpanFormatError,
    Unreadable,
    hex_id,
    nanos,
    value_of,
)
from agent_otel.spans.peers import (
    FAMILY_GENAI,
    FAMILY_OPENINFERENCE,
    Aside,
    family_of,
    merge_model_calls,
    merge_tool_groups,
)
from agent_otel.semconv import (
    AGENT_GPU_SOURCE,
    AGENT_MODEL_SERVER_KV_CACHE_USAGE,
    AGENT_MODEL_SERVER_WAITING_MAX,
    AGENT_TOOL_RETRIES,
    EVENT_EXCEPTION,
    AGENT_EXECUTOR_MAX_WORKERS,
    AGENT_TOOL_EXEC_CPU_TIME,
    ASYNCIO_LOOP_BLOCKED_BY,
    ASYNCIO_LOOP_ROLE,
    BLOCKED_BY_UNKNOWN,
    CODE_STACKTRACE,
    LOOP_ROLE_BLOCKING,
    LOOP_ROLE_WAITING,
    SPAN_LOOP_BLOCKED,
    SPAN_VLLM_REQUEST,
    VLLM_E2E,
    VLLM_TIME_IN_DECODE,
    VLLM_TIME_IN_PREFILL,
    VLLM_TIME_IN_QUEUE,
    VLLM_TIME_TO_FIRST_TOKEN,
    AGENT_GPU_POOL,
    AGENT_TOOL_EXEC_DURATION,
    AGENT_TOOL_EXECUTOR,
    AGENT_TOOL_OUTCOME,
    AGENT_TOOL_UNFINISHED,
    AGENT_TOOL_PHASE,
    AGENT_TOOL_QUEUE_DURATION,
    AGENT_TOOL_TIMEOUT,
    ERROR_TYPE,
    EVENT_EXEC_START,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_EXECUTE_TOOL,
    GEN_AI_OPERATION_INVOKE_AGENT,
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    MCP_METHOD_NAME,
    MCP_METHOD_TOOLS_CALL,
    MODEL_OPERATIONS,
    OPENINFERENCE_AGENT,
    OPENINFERENCE_COMPLETION_TOKENS,
    OPENINFERENCE_LLM,
    OPENINFERENCE_MODEL_NAME,
    OPENINFERENCE_PROMPT_TOKENS,
    OPENINFERENCE_SPAN_KIND,
    OPENINFERENCE_TOOL,
    OPENINFERENCE_TOOL_NAME,
    TRACELOOP_AGENT,
    TRACELOOP_ENTITY_NAME,
    TRACELOOP_LLM,
    TRACELOOP_SPAN_KIND,
    TRACELOOP_TOOL,
    TRACELOOP_WORKFLOW,
    GPU_IDLE_BLOCKED_DURATION,
    GPU_IDLE_BLOCKED_DURATIONS,
    GPU_IDLE_BLOCKED_TOOLS,
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

# A blocked loop's stack text is kept up to this many characters (the span
# already bounds it; this bounds what a hostile input can make us hold).
MAX_STACK_CHARS = 4096

# The executor of a tool span that names none (another library's span).
UNKNOWN_EXECUTOR = "unknown"
# What OpenLLMetry writes as the model of a framework model that names none.
UNKNOWN_MODEL = "unknown"

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
        AGENT_TOOL_UNFINISHED,
        AGENT_TOOL_PHASE,
        AGENT_EXECUTOR_MAX_WORKERS,
        AGENT_TOOL_EXEC_CPU_TIME,
        ERROR_TYPE,
        THREAD_NAME,
        ASYNCIO_LOOP_BLOCKED_BY,
        CODE_STACKTRACE,
        GPU_INDEX,
        GPU_UUID,
        GPU_IDLE_DURATION,
        GPU_IDLE_BLOCKED_DURATION,
        GPU_IDLE_BLOCKED_TOOLS,
        GPU_IDLE_BLOCKED_DURATIONS,
        GPU_UTILIZATION_AVG,
        AGENT_TOOL_EXEC_DURATION,
        GEN_AI_REQUEST_MODEL,
        GEN_AI_RESPONSE_MODEL,
        GEN_AI_USAGE_INPUT_TOKENS,
        GEN_AI_USAGE_OUTPUT_TOKENS,
        GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
        GEN_AI_AGENT_NAME,
        OPENINFERENCE_SPAN_KIND,
        OPENINFERENCE_MODEL_NAME,
        OPENINFERENCE_PROMPT_TOKENS,
        OPENINFERENCE_COMPLETION_TOKENS,
        OPENINFERENCE_TOOL_NAME,
        TRACELOOP_SPAN_KIND,
        TRACELOOP_ENTITY_NAME,
        MCP_METHOD_NAME,
        AGENT_GPU_SOURCE,
        AGENT_TOOL_RETRIES,
    }
)

# How many recent trace ids the reader remembers, to share one int per trace
# between its records (44 bytes each).
TRACE_IDS = 1 << 14

# How far (ns) another instrumentation's tool span may reach beyond one of
# agent-otel's and still be the same call: their clocks are read apart.
_PEER_TOOL_KINDS = {OPENINFERENCE_TOOL, TRACELOOP_TOOL}
_MODEL_KINDS = {OPENINFERENCE_LLM, TRACELOOP_LLM}
# What ``_tool_call`` reads of a tool span besides its name: a peer's tool
# span with none of these (and no event) is set aside (``peers.Aside``).
_ROW_ATTRIBUTES = frozenset(
    {
        GEN_AI_TOOL_NAME,
        GEN_AI_TOOL_CALL_ID,
        AGENT_TOOL_OUTCOME,
        AGENT_TOOL_UNFINISHED,
        AGENT_EXECUTOR_MAX_WORKERS,
        AGENT_TOOL_EXECUTOR,
        AGENT_TOOL_EXEC_CPU_TIME,
        AGENT_TOOL_QUEUE_DURATION,
        AGENT_TOOL_EXEC_DURATION,
        AGENT_TOOL_TIMEOUT,
        AGENT_TOOL_RETRIES,
        ERROR_TYPE,
        THREAD_NAME,
    }
)
_AGENT_KINDS = {OPENINFERENCE_AGENT, TRACELOOP_AGENT, TRACELOOP_WORKFLOW}

# A failure this long (ns) or more before a tool call ended is one the call
# went on after (a retry, a fallback); the call's own failure is recorded at
# its end.
WENT_ON_NS = 10_000_000


@dataclass
class SpanData:
    """The records read from spans (``SpanReader.data``)."""

    calls: CallTable = field(default_factory=CallTable)  # spans.calls: columns, records made on demand
    idle_windows: list[IdleWindow] = field(default_factory=list)
    loop_blocks: list[LoopBlock] = field(default_factory=list)
    span_count: int = 0
    duplicate_count: int = 0
    # earliest start and latest end over every span read (0 when none)
    start_ns: int = 0
    end_ns: int = 0
    model_calls: list[ModelCall] = field(default_factory=list)
    agent_runs: list[AgentRun] = field(default_factory=list)
    # model servers' own spans of the requests (vLLM's llm_request), joined to model calls by report.server_spans
    server_requests: list[ServerRequest] = field(default_factory=list)
    # trace id -> its root span (a span with no parent), gpu.idle traces aside
    roots: dict[int, AgentRun] = field(default_factory=dict)
    # tool spans of other instrumentations: read, and how many were one of agent-otel's calls
    peer_tool_spans: int = 0
    peer_tool_spans_merged: int = 0


def gpu_pool_of(resource: list) -> str:
    """The GPU pool a resource's attributes array declares (``agent.gpu.pool``); "" for none."""
    for item in resource:
        if type(item) is JsonKeyValue and item.key == AGENT_GPU_POOL:
            value = value_of(item.value, AGENT_GPU_POOL)
            return printable(value.strip()) if type(value) is str else ""
    return ""


class SpanReader:
    """The state of one read: records made so far and what dedupes them.

    ``add`` each span object (OTLP/JSON shape) with the GPU pool of its
    resource, then ``finish``; the records are in ``data``. ``add`` raises
    ``SpanFormatError`` for a span field it needs and cannot read, and
    then keeps nothing of the span. A reader that keeps more across spans
    (the report's ``TraceReader``) gives its own ``data`` and overrides the
    ``_keep_*`` methods, which are handed what each span held beyond its
    record (they do nothing here).
    """

    def __init__(self, call_ids: bool = True, data: Optional[SpanData] = None) -> None:
        self.data = SpanData() if data is None else data
        self._call_ids = call_ids  # keep the calls' ids in their records (see report.reader.read_traces)
        self._call_id_hashes = array("q")  # per call: hash(gen_ai.tool.call.id), 0 for none
        self._seen = _SeenSpans()  # every span read, by its ids
        self._parents = array(U64)  # per call: its parent's span id (0: none), 8 bytes each
        self._strings: dict[str, str] = {}
        self._trace_ids: dict[int, int] = {}  # recent trace ids: one int object per trace for its records
        self._ours = bytearray()  # per call: 1 when agent-otel made the span (it has the timing)
        self._families = bytearray()  # per call: which instrumentation made the span (peers.family_of)
        self._aside = Aside()  # peers' tool spans not (yet) rows (peers.Aside)
        self._hops: dict[int, int] = {}  # MCP client request span -> its parent (trace_id << 64 | span id)
        self._model_parents = array(U64)  # per model call, as _parents
        self._model_families: list[int] = []  # per model call, as _families
        self._model_named: list[bool] = []  # per model call: its model's name came from an attribute

    # -- what a reader that keeps more across spans is handed -------------

    def _keep_tool_call(
        self,
        tool: str,
        key: int,
        unfinished: bool,
        timeout: Optional[float],
        exceptions: Optional[list[int]],
        found: dict,
    ) -> None:
        """A tool call's record was kept: its ``agent.tool.unfinished``, its
        timeout (s), the times of the ``exception`` events it went on after.
        Called only for a span that holds one of them or ``agent.tool.retries``
        (most hold none: a call less each)."""

    def _keep_idle_window(
        self,
        window: IdleWindow,
        blame: Optional[list[tuple[str, float]]],
        source: Optional[str],
        kv_usage: Optional[float],
        waiting: Optional[float],
    ) -> None:
        """A ``gpu.idle`` window was kept: what the live path blamed in it
        (tool, seconds), its ``agent.gpu.source``, the model server's KV
        cache usage (0-1) and most requests waiting over it."""

    def _keep_live_share(self, parent: int, seconds: float) -> None:
        """A per-tool ``gpu.idle`` child span (older traces): seconds the live
        path blamed on the call ``parent`` (trace_id << 64 | span id; 0: none)."""

    def _keep_failed_child(self, parent: int, name: str, start_ns: int, end_ns: int) -> None:
        """A failed span of no kind above, under ``parent`` (trace_id << 64 | span id)."""

    def _parents_wanted(self) -> list[int]:
        """The spans (trace_id << 64 | span id) whose tool, where they are a tool call, ``finish``
        should find (it returns them): the MCP client request spans' parents here."""
        return list(self._hops.values())

    def _joined(self, tool_of: dict[int, str]) -> None:
        """Called by ``finish`` before the calls seen twice are dropped (``_parents`` still lines
        up with ``data.calls``): ``tool_of`` is ``finish``'s answer."""

    def add(self, span: JsonSpan, line: int, pool: str = "") -> None:
        """One span: recognise its kind and keep its record.

        Every field has a fast path for what exporters write (ids and times
        as strings, attribute values as one-key objects) and falls back to
        ``spans.otlp_json``'s validating readers for anything else,
        which either read it or raise ``SpanFormatError``.
        """
        data = self.data
        key = _span_key(span)
        if not self._seen.add(key):
            data.duplicate_count += 1
            return
        # (from here on, what raises SpanFormatError leaves no trace of the
        # span: each kind's reader adds its record after everything that can
        # raise, and the span is counted at the end)
        start_ns, end_ns = _span_times(span)
        items = span.attributes
        found: dict[Any, Any]  # key -> JsonValue, or what typed_span kept of another shape
        if items:
            found = {}
            try:
                for item in items:  # (a loop, not a comprehension: no function made per span, 0.2 µs less)
                    found[item.key] = item.value
            except (TypeError, AttributeError):
                found = _wanted(items)  # validates: raises, or reads what the fast path could not
        else:
            found = _NOTHING
        operation = found.get(GEN_AI_OPERATION_NAME)
        if operation is not None:
            if type(operation) is JsonValue and type(operation.stringValue) is str:
                operation = operation.stringValue
            else:
                operation = value_of(operation, GEN_AI_OPERATION_NAME)
        run = None  # the span as an agent run, when it is one
        if operation == GEN_AI_OPERATION_EXECUTE_TOOL:
            self._tool_call(span, found, key, start_ns, end_ns, pool)
        elif operation in MODEL_OPERATIONS:
            self._model_call(span, found, key, start_ns, end_ns, operation, pool)
        elif operation == GEN_AI_OPERATION_INVOKE_AGENT:
            run = self._agent_run(span, found, key, start_ns, end_ns)
        elif span.name == SPAN_GPU_IDLE:
            if GPU_IDLE_BLOCKED_DURATION in found:
                self._live_share(span, found, key)
            else:
                self._idle_window(span, found, start_ns, end_ns, pool)
            self._counted(start_ns, end_ns)
            return  # the GPU timeline's traces hold no turn
        elif span.name == SPAN_LOOP_BLOCKED:
            self._loop_block(span, found, start_ns, end_ns, pool)
        elif span.name == SPAN_VLLM_REQUEST:
            self._server_request(span, found, key, start_ns, end_ns)
        elif OPENINFERENCE_SPAN_KIND in found or TRACELOOP_SPAN_KIND in found or MCP_METHOD_NAME in found:
            kind, tool = found.get(OPENINFERENCE_SPAN_KIND), found.get(OPENINFERENCE_TOOL_NAME)
            if (
                type(kind) is JsonValue
                and kind.stringValue == OPENINFERENCE_TOOL
                and type(tool) is JsonValue
                and type(tool := tool.stringValue) is str
                and tool
                and tool.isascii()
                and not span.events
                and found.keys().isdisjoint(_ROW_ATTRIBUTES)
            ):
                # OpenInference's TOOL span as it is written (half the spans
                # where it runs beside agent-otel): set aside straight away,
                # its tool and family read inline (0.5 µs a span less)
                self._peer_tool_call(
                    span, key, start_ns, end_ns, pool, self._strings.setdefault(tool, tool), FAMILY_OPENINFERENCE
                )
            else:
                run = self._other_instrumentation(span, found, key, start_ns, end_ns, pool)
        # A new kind of span: recognise it here and turn it into a record.
        else:
            self._other_span(span, key, start_ns, end_ns)
        data.span_count += 1
        if start_ns < data.start_ns or not data.start_ns:
            data.start_ns = start_ns
        if end_ns > data.end_ns:
            data.end_ns = end_ns
        if not span.parentSpanId:
            self._root(span, run, operation, key, start_ns, end_ns)

    def _root(
        self, span: JsonSpan, run: Optional[AgentRun], operation: object, key: int, start_ns: int, end_ns: int
    ) -> None:
        """A root span (no parent): its trace's turn, ``run`` where the span is an agent run."""
        if run is None:
            if operation == GEN_AI_OPERATION_EXECUTE_TOOL or operation in MODEL_OPERATIONS:
                # a trace whose root is itself a call has no turn: no record of
                # its root (with a trace per call, a million of them took 200 MB)
                return
            run = AgentRun(self._name(_name_of(span)), start_ns, end_ns, self._trace_id(key), key & _SPAN_ID_MASK)
        self.data.roots[run.trace_id] = run

    def _counted(self, start_ns: int, end_ns: int) -> None:
        """A span read: counted, and the time window widened to it."""
        data = self.data
        data.span_count += 1
        if start_ns < data.start_ns or not data.start_ns:
            data.start_ns = start_ns
        if end_ns > data.end_ns:
            data.end_ns = end_ns

    def _other_span(self, span: JsonSpan, key: int, start_ns: int, end_ns: int) -> None:
        """A span of no kind above that failed under a parent: kept, in case the parent is a tool call."""
        status = span.status
        failed = type(status) is JsonStatus and status.code in (STATUS_ERROR, "STATUS_CODE_ERROR")
        if not failed:
            events = span.events
            if not events or type(events) is not list:
                return
            failed = any(type(event) is JsonEvent and event.name == EVENT_EXCEPTION for event in events)
        if failed:
            parent = self._parent(span)
            if parent:
                self._keep_failed_child((key >> 64) << 64 | parent, self._name(_name_of(span)), start_ns, end_ns)

    def _other_instrumentation(
        self, span: JsonSpan, found: dict, key: int, start_ns: int, end_ns: int, pool: str
    ) -> Optional[AgentRun]:
        """OpenInference's and OpenLLMetry's span kinds, and the MCP SDK's client request span."""
        kind = self._text(found, OPENINFERENCE_SPAN_KIND) or self._text(found, TRACELOOP_SPAN_KIND)
        if kind is None:
            if self._value(found, MCP_METHOD_NAME) == MCP_METHOD_TOOLS_CALL:
                parent = self._parent(span)
                if parent:
                    self._hops[key] = (key >> 64) << 64 | parent
        elif kind in _PEER_TOOL_KINDS:
            if span.events or not found.keys().isdisjoint(_ROW_ATTRIBUTES):
                self._tool_call(span, found, key, start_ns, end_ns, pool)
            else:
                self._peer_tool_call(span, key, start_ns, end_ns, pool, self._tool_name(span, found), family_of(found))
        elif kind in _MODEL_KINDS:
            self._model_call(span, found, key, start_ns, end_ns, "chat", pool)
        elif kind in _AGENT_KINDS:
            return self._agent_run(span, found, key, start_ns, end_ns)
        return None

    def _model_call(
        self, span: JsonSpan, found: dict, key: int, start_ns: int, end_ns: int, operation: str, pool: str
    ) -> None:
        model = None
        for attribute in (GEN_AI_REQUEST_MODEL, OPENINFERENCE_MODEL_NAME, GEN_AI_RESPONSE_MODEL):
            model = self._text(found, attribute)
            if model and model != UNKNOWN_MODEL:
                break
        named = model is not None and model != "" and model != UNKNOWN_MODEL
        if model is None or not named:
            model = self._name(_name_of(span))
        call = ModelCall(
            model,
            start_ns,
            end_ns,
            self._trace_id(key),
            key & _SPAN_ID_MASK,
            self._name(operation),
            self._count(span, found, GEN_AI_USAGE_INPUT_TOKENS, OPENINFERENCE_PROMPT_TOKENS),
            self._count(span, found, GEN_AI_USAGE_OUTPUT_TOKENS, OPENINFERENCE_COMPLETION_TOKENS),
            self._seconds(span, found, GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
            _status_code(span) == STATUS_ERROR,
            pool,
        )
        parent = self._parent(span)
        self.data.model_calls.append(call)
        self._model_parents.append(parent)
        self._model_families.append(family_of(found))
        self._model_named.append(named)

    def _server_request(self, span: JsonSpan, found: dict, key: int, start_ns: int, end_ns: int) -> None:
        """A model server's span of one request (vLLM's ``llm_request``)."""
        model = self._text(found, GEN_AI_RESPONSE_MODEL) or self._text(found, GEN_AI_REQUEST_MODEL) or ""
        self.data.server_requests.append(
            ServerRequest(
                model,
                start_ns,
                end_ns,
                self._trace_id(key),
                key & _SPAN_ID_MASK,
                self._parent(span),
                self._seconds(span, found, VLLM_TIME_IN_QUEUE),
                self._seconds(span, found, VLLM_TIME_TO_FIRST_TOKEN),
                self._seconds(span, found, VLLM_TIME_IN_PREFILL),
                self._seconds(span, found, VLLM_TIME_IN_DECODE),
                self._seconds(span, found, VLLM_E2E),
            )
        )

    def _agent_run(self, span: JsonSpan, found: dict, key: int, start_ns: int, end_ns: int) -> AgentRun:
        value = found.get(GEN_AI_AGENT_NAME)  # read inline where it is printable ASCII, as a tool's name
        name = value.stringValue if type(value) is JsonValue else None
        if type(name) is str and name.isascii():
            name = self._strings.setdefault(name, name)
        else:
            name = self._text(found, GEN_AI_AGENT_NAME)
        name = name or self._text(found, TRACELOOP_ENTITY_NAME)
        run = AgentRun(name or self._name(_name_of(span)), start_ns, end_ns, self._trace_id(key), key & _SPAN_ID_MASK)
        self.data.agent_runs.append(run)
        return run

    def _count(self, span: JsonSpan, found: dict, *keys: str) -> Optional[int]:
        """A token count: the first of ``keys`` the span has, as a whole number
        (read inline where it is a decimal ``intValue`` alone, as exporters write it)."""
        for key in keys:
            value = found.get(key)
            if type(value) is JsonValue and value.stringValue is UNSET and value.boolValue is UNSET:
                raw = value.intValue  # (what value_of reads first: a string or bool value would come first)
                if type(raw) is str and 0 < len(raw) <= 15 and raw.isascii() and raw.isdigit():
                    return int(raw)  # under 1e15
            if value is not None:
                value = value_of(value, key)
            if value is not None:
                if type(value) is bool or type(value) not in (int, float) or not 0 <= value < 1e15:  # type: ignore[operator]
                    wrong = type(value) is bool or type(value) not in (int, float)
                    raise SpanFormatError(
                        f"span {_name_of(span)!r}: {key} is not a token count: {value!r}",
                        WRONG_TYPE if wrong else OUT_OF_RANGE,
                    )
                return int(value)  # type: ignore[call-overload]  # an int or float, checked above
        return None

    def _tool_call(self, span: JsonSpan, found: dict, key: int, start_ns: int, end_ns: int, pool: str) -> None:
        # In one straight function (a call each costs as much as the field):
        # each field read inline where it is as exporters write it (a string
        # value in printable ASCII, a span id in hex, ...); anything else
        # goes through the helper that reads or refuses it.
        data = self.data
        strings = self._strings
        value = found.get(GEN_AI_TOOL_NAME)
        tool = value.stringValue if type(value) is JsonValue else None
        if type(tool) is str and tool and tool.isascii():
            tool = strings.setdefault(tool, tool)
        else:
            tool = self._tool_name(span, found)
        value = found.get(AGENT_TOOL_OUTCOME)
        outcome = value.stringValue if type(value) is JsonValue else None
        outcome = _OUTCOMES.get(outcome) if type(outcome) is str else None
        if outcome is None:
            outcome = self._outcome(span, found)
        unfinished = (
            AGENT_TOOL_UNFINISHED in found and value_of(found[AGENT_TOOL_UNFINISHED], AGENT_TOOL_UNFINISHED) is True
        )
        workers = found.get(AGENT_EXECUTOR_MAX_WORKERS)
        if workers is not None:
            workers = _workers(workers)
        value = found.get(AGENT_TOOL_EXECUTOR)
        executor = value.stringValue if type(value) is JsonValue else None
        if type(executor) is str and executor and executor.isascii():
            executor = strings.setdefault(executor, executor)
        else:
            executor = self._executor(found)
        value = found.get(GEN_AI_TOOL_CALL_ID)
        call_id = value.stringValue if type(value) is JsonValue else None
        if (type(call_id) is not str or not call_id.isascii()) and value is not None:
            call_id = self._text(found, GEN_AI_TOOL_CALL_ID, False)
        cpu_s = self._seconds(span, found, AGENT_TOOL_EXEC_CPU_TIME) if AGENT_TOOL_EXEC_CPU_TIME in found else None
        events = span.events
        value = None if events else found.get(AGENT_TOOL_QUEUE_DURATION)
        if not events and (
            value is None or (type(value) is JsonValue and type(value.doubleValue) is float and not value.doubleValue)
        ):
            exec_ns = start_ns  # a direct call: no exec.start event, the queue (0) in an attribute
        else:
            exec_ns = self._exec_start(span, found, start_ns, end_ns)
        error_type = self._text(found, ERROR_TYPE) if ERROR_TYPE in found else None
        thread = self._text(found, THREAD_NAME) if THREAD_NAME in found else None
        # Everything that can raise first: a span that fails adds nothing.
        timeout = self._seconds(span, found, AGENT_TOOL_TIMEOUT) if AGENT_TOOL_TIMEOUT in found else None
        parent = span.parentSpanId
        if not parent:
            parent = 0
        elif type(parent) is str and len(parent) == 16:
            try:
                parent = int(parent, 16)
            except ValueError:
                parent = self._parent(span)
        else:
            parent = self._parent(span)
        exceptions = self._exceptions(events, end_ns) if events and AGENT_TOOL_RETRIES not in found else None
        data.calls.add(  # a ToolCall's fields
            tool,
            executor,
            start_ns,
            exec_ns,
            end_ns,
            outcome,
            call_id if self._call_ids else None,
            key >> 64,  # (the table keeps the trace id as two 64-bit halves: no int to share)
            key & _SPAN_ID_MASK,
            error_type,
            thread,
            workers,
            pool,
            None if cpu_s is None else round(cpu_s * NS_PER_S),
        )
        self._parents.append(parent)
        self._call_id_hashes.append((hash(call_id) or 1) if call_id else 0)
        if AGENT_TOOL_EXEC_DURATION in found:  # agent-otel made the span: it has the timing
            self._ours.append(1)
            self._families.append(FAMILY_GENAI)
        else:
            self._ours.append(0)
            self._families.append(family_of(found))
            data.peer_tool_spans += 1
        if unfinished or timeout is not None or exceptions or AGENT_TOOL_RETRIES in found:
            self._keep_tool_call(tool, key, unfinished, timeout, exceptions, found)

    def _peer_tool_call(
        self, span: JsonSpan, key: int, start_ns: int, end_ns: int, pool: str, tool: str, family: int
    ) -> None:
        """A peer's tool span with none of ``_ROW_ATTRIBUTES`` and no event, its
        ``tool`` and ``family`` read: set aside (``peers.Aside``), what ``_tool_call``
        would make of it."""
        failed = _status_code(span) == STATUS_ERROR
        parent = self._parent(span)
        data = self.data
        self._aside.add(
            tool,
            start_ns,
            end_ns,
            self._trace_id(key),
            key & _SPAN_ID_MASK,
            parent,
            pool,
            family,
            failed,
            len(data.calls),
        )
        data.peer_tool_spans += 1  # (nothing for _keep_tool_call: such a span holds none of what it is handed)

    def _executor(self, found: dict) -> str:
        """A tool call's executor; ``UNKNOWN_EXECUTOR`` where it names none (another instrumentation's span)."""
        value = found.get(AGENT_TOOL_EXECUTOR)
        executor = value.stringValue if type(value) is JsonValue else None
        if type(executor) is str and executor.isascii() and executor:
            return self._strings.setdefault(executor, executor)
        if value is None:
            return UNKNOWN_EXECUTOR
        return self._text(found, AGENT_TOOL_EXECUTOR) or UNKNOWN_EXECUTOR

    def _outcome(self, span: JsonSpan, found: dict) -> str:
        """A tool call's outcome: ``agent.tool.outcome`` (one of ``OUTCOMES``, the
        shared constant), else from the span's status."""
        value = found.get(AGENT_TOOL_OUTCOME)
        outcome = value.stringValue if type(value) is JsonValue else None
        outcome = _OUTCOMES.get(outcome) if type(outcome) is str else None
        if outcome is None and value is not None:
            outcome = _OUTCOMES.get(self._text(found, AGENT_TOOL_OUTCOME))  # type: ignore[arg-type]
        if outcome is None:
            outcome = OUTCOME_ERROR if _status_code(span) == STATUS_ERROR else OUTCOME_OK
        return outcome

    def _tool_name(self, span: JsonSpan, found: dict) -> str:
        """A tool span's tool: ``gen_ai.tool.name`` (read inline where it is printable
        ASCII), another instrumentation's name for it, else from the span's name."""
        value = found.get(GEN_AI_TOOL_NAME)
        tool = value.stringValue if type(value) is JsonValue else None
        if type(tool) is str and tool.isascii():
            tool = self._strings.setdefault(tool, tool)
        elif value is not None:
            tool = self._text(found, GEN_AI_TOOL_NAME)
        if not tool:  # another instrumentation's tool span
            tool = self._text(found, OPENINFERENCE_TOOL_NAME) or self._text(found, TRACELOOP_ENTITY_NAME)
        if not tool:
            name = span.name
            prefix = SPAN_EXECUTE_TOOL_PREFIX
            tool = self._name(
                name[len(prefix) :] if type(name) is str and name.startswith(prefix) else _name_of(span) or "unknown"
            )
        return tool

    def _exceptions(self, events: object, end_ns: int) -> list[int]:
        """The times of a tool span's ``exception`` events that the call went on after."""
        if type(events) is not list:
            raise SpanFormatError("events is not a JSON array")
        times = []
        for event in events:
            if type(event) is JsonEvent and event.name == EVENT_EXCEPTION:
                time_ns = nanos(event.timeUnixNano, "events[].timeUnixNano")
                if 0 < time_ns <= end_ns - WENT_ON_NS:
                    times.append(time_ns)
        return times

    def _trace_id(self, key: int) -> int:
        """The trace id, one int shared by the records of a trace (of the
        last ``TRACE_IDS`` traces seen: a batch holds a trace's spans close together)."""
        trace_id = key >> 64
        shared = self._trace_ids.setdefault(trace_id, trace_id)
        if shared is trace_id and len(self._trace_ids) > TRACE_IDS:
            self._trace_ids = {trace_id: trace_id}
        return shared

    def _exec_start(self, span: JsonSpan, found: dict, start_ns: int, end_ns: int) -> int:
        """When execution began, kept inside the span: its ``exec.start``
        event, else start + ``agent.tool.queue.duration``."""
        events = span.events
        if not events:  # a direct call: no exec.start event, the queue (0) in an attribute
            value = found.get(AGENT_TOOL_QUEUE_DURATION)
            if value is None or (
                type(value) is JsonValue and type(value.doubleValue) is float and not value.doubleValue
            ):
                return start_ns
        else:
            if type(events) is not list:
                raise SpanFormatError("events is not a JSON array")
            for event in events:
                if type(event) is not JsonEvent:
                    raise SpanFormatError("events[] is not a JSON object")
                if event.name == EVENT_EXEC_START:
                    time_ns = event.timeUnixNano
                    if type(time_ns) is not str or not 0 < len(time_ns) <= 20 or not time_ns.isdigit():
                        time_ns = nanos(time_ns, "events[].timeUnixNano")
                    time_ns = int(time_ns)
                    if time_ns:
                        # the span's own int where they are equal: one object, not two
                        return start_ns if time_ns <= start_ns else end_ns if time_ns >= end_ns else time_ns
        queue_s = self._seconds(span, found, AGENT_TOOL_QUEUE_DURATION)
        if not queue_s:
            return start_ns
        return min(start_ns + round(queue_s * NS_PER_S), end_ns)

    def _idle_window(self, span: JsonSpan, found: dict, start_ns: int, end_ns: int, pool: str) -> None:
        utilization = self._seconds(span, found, GPU_UTILIZATION_AVG)
        window = IdleWindow(
            gpu=self._gpu(span, found),
            start_ns=start_ns,
            end_ns=end_ns,
            utilization_avg=0.0 if utilization is None else utilization,
            uuid=self._text(found, GPU_UUID),
            pool=pool,
        )
        blame = self._window_blame(span, found) if GPU_IDLE_BLOCKED_TOOLS in found else None
        source = self._text(found, AGENT_GPU_SOURCE)
        usage = waiting = None
        if AGENT_MODEL_SERVER_KV_CACHE_USAGE in found:
            usage = self._seconds(span, found, AGENT_MODEL_SERVER_KV_CACHE_USAGE)  # a number >= 0
            if usage is not None and usage <= 1.0:
                waiting = self._seconds(span, found, AGENT_MODEL_SERVER_WAITING_MAX)
            else:
                usage = None
        self.data.idle_windows.append(window)
        self._keep_idle_window(
            window, [(self._name(tool), seconds) for tool, seconds in blame] if blame else None, source, usage, waiting
        )

    def _loop_block(self, span: JsonSpan, found: dict, start_ns: int, end_ns: int, pool: str) -> None:
        blocker: Optional[tuple[int, int]] = None
        waiting = []
        links = span.links
        if links:
            if type(links) is not list:
                raise SpanFormatError("links is not a JSON array")
            for link in links:
                if type(link) is not JsonLink:
                    raise SpanFormatError("links[] is not a JSON object")
                role = None
                attributes = link.attributes
                if attributes:
                    if type(attributes) is not list:
                        raise SpanFormatError("links[].attributes is not a JSON array")
                    for item in attributes:
                        if type(item) is JsonKeyValue and item.key == ASYNCIO_LOOP_ROLE:
                            role = value_of(item.value, ASYNCIO_LOOP_ROLE)
                key = (
                    hex_id(link.traceId, 32, "links[].traceId"),
                    hex_id(link.spanId, 16, "links[].spanId"),
                )
                if role == LOOP_ROLE_BLOCKING:
                    blocker = key
                elif role == LOOP_ROLE_WAITING:
                    waiting.append(key)
        tool = self._text(found, ASYNCIO_LOOP_BLOCKED_BY)
        stack = self._text(found, CODE_STACKTRACE, share=False)
        self.data.loop_blocks.append(
            LoopBlock(
                thread=self._text(found, THREAD_NAME) or "",
                start_ns=start_ns,
                end_ns=end_ns,
                tool=None if tool in (None, "", BLOCKED_BY_UNKNOWN) else tool,
                blocker=blocker,
                waiting=tuple(waiting),
                pool=pool,
                stack=None if stack is None else stack[-MAX_STACK_CHARS:],
            )
        )

    def _window_blame(self, span: JsonSpan, found: dict) -> list[tuple[str, float]]:
        """A window's per-tool totals: what the live path blamed, every share."""
        raw = found[GPU_IDLE_BLOCKED_TOOLS]
        tools: object = _plain_array(raw, "stringValue", str)
        if tools is None:
            tools = value_of(raw, GPU_IDLE_BLOCKED_TOOLS)
        raw = found.get(GPU_IDLE_BLOCKED_DURATIONS)
        durations: object = _plain_array(raw, "doubleValue", float)
        if durations is None and raw is not None:
            durations = value_of(raw, GPU_IDLE_BLOCKED_DURATIONS)
        if (
            type(tools) is not list
            or type(durations) is not list
            or len(tools) != len(durations)
            or not all(type(tool) is str for tool in tools)
            or not all(type(s) in (int, float) and 0 <= s <= _MAX_SECONDS for s in durations)
        ):
            raise SpanFormatError(
                f"span {_name_of(span)!r}: {GPU_IDLE_BLOCKED_TOOLS} and {GPU_IDLE_BLOCKED_DURATIONS} are not "
                f"arrays of tool names and of seconds of one length (got {repr(tools)[:80]} and {repr(durations)[:80]})"
            )
        return list(zip(tools, durations))

    def _live_share(self, span: JsonSpan, found: dict, key: int) -> None:
        self._gpu(span, found)  # a child span names its GPU, like a window
        blocked = self._seconds(span, found, GPU_IDLE_BLOCKED_DURATION) or 0.0
        parent = self._parent(span)
        self._keep_live_share((key >> 64) << 64 | parent if parent else 0, blocked)

    def _parent(self, span: JsonSpan) -> int:
        """The parent's span id (0 for a root span)."""
        parent = span.parentSpanId
        if not parent:
            return 0
        if type(parent) is str and len(parent) == 16:
            try:
                return int(parent, 16)
            except ValueError:
                pass
        return hex_id(parent, 16, "parentSpanId")

    # -- after the last span: join what refers to other spans ----------

    def finish(self) -> dict[int, str]:
        """Drop calls and model calls seen from several sides. Returns
        trace_id << 64 | span id -> tool of each tool call that a span of
        ``_parents_wanted`` hangs under."""
        self._seen = _SeenSpans()
        tool_of = self._dedupe_tool_calls()
        self._dedupe_model_calls()
        self._parents = array(U64)
        self._ours = bytearray()
        self._families = bytearray()
        self._hops = {}
        self._model_parents = array(U64)
        self._model_families = []
        self._model_named = []
        self._call_id_hashes = array("q")
        return tool_of

    def _dedupe_tool_calls(self) -> dict[int, str]:
        """Keep one record per tool call; returns trace_id << 64 | span id -> tool of every
        tool span another span hangs under."""
        data = self.data
        if self._aside and self._aside_joined():
            self._rows_of_aside()  # (a peer's span that others hang under, or that hangs under a tool span)
        calls, parents, ours, hops = data.calls, self._parents, self._ours, self._hops
        # The calls other spans hang under: found by span id, then checked by trace.
        parent_ids = [key & _SPAN_ID_MASK for key in self._parents_wanted()]
        index_of: dict[int, int] = {}
        tool_of: dict[int, str] = {}
        # (the candidates found in the id arrays, in numpy: a pass over the
        # records themselves costs a cache miss a call at a million spans,
        # and a set of the ids 40 MB there)
        highs, lows, span_ids, tools = calls.trace_id.high, calls.trace_id.low, calls.span_id, calls.tool
        for i in rows_among(span_ids, parents, parent_ids):
            key = (highs[i] << 64 | lows[i]) << 64 | span_ids[i]
            index_of[key] = i
            tool_of[key] = tools[i]
        keep = bytearray(b"\x01") * len(calls)
        if index_of:
            # up: call -> its parent record, where that is a span of the same
            # tool (through an MCP client request span in between).
            up: dict[int, int] = {}
            reachable = [key & _SPAN_ID_MASK for key in index_of]  # parents that can lead to a call
            reachable.extend(key & _SPAN_ID_MASK for key in hops)
            for i in rows_among(parents, reachable):
                key = (highs[i] << 64 | lows[i]) << 64 | parents[i]
                j = index_of.get(hops.get(key, key) if hops else key)
                if j is not None and tools[j] == tools[i]:
                    up[i] = j
            # Each chain of same-call spans keeps its outermost agent-otel span
            # (it has the queue and exec timing), else its outermost span.
            chosen: dict[int, tuple[int, int]] = {}  # top of a chain -> (record kept, its depth)
            members: dict[int, list[int]] = {}
            for i in up:
                top, depth = i, 0
                while top in up and depth <= len(up):  # the bound stops a malformed cycle
                    top = up[top]
                    depth += 1
                members.setdefault(top, [top]).append(i)
                current, current_depth = chosen.get(top, (top, 0))
                if (ours[i], -depth) > (ours[current], -current_depth):
                    current, current_depth = i, depth
                chosen[top] = (current, current_depth)
            for top, chain in members.items():
                kept = chosen[top][0]
                for i in chain:
                    if i != kept:
                        keep[i] = 0
        if data.peer_tool_spans:
            self._merge_peer_tool_spans(keep)
        self._joined(tool_of)  # before the calls are deduplicated: self._parents lines up with them
        aside, count = self._aside, len(calls)
        if aside:  # the peers' spans set aside that the merge left: rows, each where it was read
            import numpy as np  # (as in _place_in_numpy)

            flags = np.frombuffer(keep, dtype=np.uint8)
            rows, left = np.flatnonzero(flags[:count]), np.flatnonzero(flags[count:])
            del flags
            for j in left.tolist():
                self._add_aside(j)
            calls.select(aside.order(rows, left, count))
            data.duplicate_count += count + len(aside) - len(calls)
            self._aside = Aside()
        elif not all(keep):
            calls.select([i for i, kept in enumerate(keep) if kept])
            data.duplicate_count += count - len(calls)
        return tool_of

    def _aside_joined(self) -> bool:
        """Whether a peer's span set aside may be in a chain of one call's
        spans or have calls nested in it (what ``_dedupe_tool_calls`` and
        ``_joined`` find by parent): a span something hangs under, or one
        that hangs under a tool span. By span id alone: a span id of
        another trace only makes the spans rows."""
        aside, calls = self._aside, self.data.calls
        if rows_among(
            aside.span_id, self._parents, aside.parent, [key & _SPAN_ID_MASK for key in self._parents_wanted()]
        ):
            return True
        return bool(rows_among(aside.parent, calls.span_id, aside.span_id, [key & _SPAN_ID_MASK for key in self._hops]))

    def _add_aside(self, j: int) -> None:
        """Span ``j`` set aside, a row at the end of the table (as ``_tool_call`` makes it)."""
        aside = self._aside
        start_ns = aside.start_ns[j]
        self.data.calls.add(
            aside.tool[j],
            UNKNOWN_EXECUTOR,
            start_ns,
            start_ns,
            aside.end_ns[j],
            OUTCOME_ERROR if aside.failed[j] else OUTCOME_OK,
            None,
            aside.trace_id[j],
            aside.span_id[j],
            None,
            None,
            None,
            aside.pool[j],
            None,
        )

    def _rows_of_aside(self) -> None:
        """Every span set aside a row, each where it was read, with its parent, family and no call id."""
        aside, calls = self._aside, self.data.calls
        count = len(calls)
        for j in range(len(aside)):
            self._add_aside(j)
        self._parents.extend(aside.parent)
        self._call_id_hashes.extend(bytes(8 * len(aside)))
        self._ours.extend(bytes(len(aside)))
        self._families.extend(aside.family)
        order = aside.order(range(count), range(len(aside)), count)
        calls.select(order)
        self._parents = array(U64, [self._parents[i] for i in order])
        self._call_id_hashes = array("q", [self._call_id_hashes[i] for i in order])
        self._ours = bytearray(self._ours[i] for i in order)
        self._families = bytearray(self._families[i] for i in order)
        self._aside = Aside()

    def _merge_peer_tool_spans(self, keep: bytearray) -> None:
        """Other instrumentations' tool spans of a call agent-otel (or another of them) also saw:
        dropped, the call kept once (``peers.merge_tool_spans``). The spans set aside
        (``peers.Aside``) take part as rows after the table's: ``keep`` grows by them."""
        calls, aside = self.data.calls, self._aside
        count, more = len(calls), len(aside)
        ours, families, ids = self._ours, self._families, self._call_id_hashes
        submits, ends = calls.submit_ns, calls.end_ns
        if more:
            ours, families, ids = ours + bytes(more), families + aside.family, ids + array("q", bytes(8 * more))
            submits, ends = submits + aside.start_ns, ends + aside.end_ns
            keep.extend(b"\x01" * more)
        self.data.peer_tool_spans_merged += merge_tool_groups(
            keep,
            ours,
            families,
            ids,
            submits,
            ends,
            (calls.trace_id, aside.trace_id),
            (calls.tool, aside.tool),
            aside,
            count,
        )

    def _dedupe_model_calls(self) -> None:
        """A model span under a model span (a framework's call, and a client library's under it) is one
        call; so are the spans several instrumentations made of one call side by side (``peers``)."""
        data = self.data
        models = data.model_calls
        if not models:
            return
        keys = {call.trace_id << 64 | call.span_id for call in models}
        kept, families, named = [], [], []
        for call, parent, family, from_attribute in zip(
            models, self._model_parents, self._model_families, self._model_named
        ):
            if not parent or call.trace_id << 64 | parent not in keys:
                kept.append(call)
                families.append(family)
                named.append(from_attribute)
        if len(set(families)) > 1:
            kept = merge_model_calls(kept, families, named)
        data.duplicate_count += len(models) - len(kept)
        data.model_calls = kept

    def _value(self, found: dict, key: str) -> object:
        value = found.get(key)
        return None if value is None else value_of(value, key)

    def _text(self, found: dict, key: str, share: bool = True) -> Optional[str]:
        """A text attribute as printable Unicode, shared between records; None when absent."""
        value = found.get(key)
        if value is None:
            return None
        text = value.stringValue if type(value) is JsonValue else None
        if type(text) is not str:
            text = value_of(value, key)
            if text is None:
                return None
            if type(text) is not str:
                text = str(text)
        if not text.isascii():
            text = printable(text)
        return self._strings.setdefault(text, text) if share else text

    def _name(self, text: str) -> str:
        if not text.isascii():
            text = printable(text)
        return self._strings.setdefault(text, text)

    def _gpu(self, span: JsonSpan, found: dict) -> str:
        index = found.get(GPU_INDEX)
        if type(index) is JsonValue:
            number = index.intValue
            if type(number) is str:
                gpu = self._strings.get(number)
                if gpu is not None:  # an index seen before
                    return gpu
        index = self._value(found, GPU_INDEX)
        if type(index) is bool or type(index) not in (int, str) or str(index) == "":
            raise SpanFormatError(f"span {_name_of(span)!r} has no {GPU_INDEX} (got {index!r})")
        gpu = self._name(str(index))
        raw = found[GPU_INDEX].intValue if type(found[GPU_INDEX]) is JsonValue else None
        if type(raw) is str and raw == gpu:
            self._strings[raw] = gpu
        return gpu

    def _seconds(self, span: JsonSpan, found: dict, key: str) -> Optional[float]:
        """A non-negative number attribute, or None when absent."""
        value = found.get(key)
        if value is None:
            return None
        if type(value) is JsonValue:
            number = value.doubleValue
            if type(number) is float and 0.0 <= number <= _MAX_SECONDS:
                return number
        value = value_of(value, key)
        if value is None:
            return None
        if type(value) is bool or type(value) not in (int, float):
            raise SpanFormatError(f"span {_name_of(span)!r}: {key} is not a non-negative number: {value!r}", WRONG_TYPE)
        if not 0 <= value <= _MAX_SECONDS:  # type: ignore[operator]
            raise SpanFormatError(
                f"span {_name_of(span)!r}: {key} is not a number of seconds from 0 to {_MAX_SECONDS:g}: {value!r}",
                OUT_OF_RANGE,
            )
        return float(value)  # type: ignore[arg-type]


_NOTHING: dict = {}
_UINT64_END = 1 << 64
# The largest number of seconds a span may carry: its nanoseconds fit a
# signed 64-bit integer (292 years).
_MAX_SECONDS = 9.2e9
_OUTCOMES = {outcome: outcome for outcome in OUTCOMES}
_SPAN_ID_MASK = (1 << 64) - 1


class _SeenSpans:
    """The spans read so far, for counting a span seen twice once: a set of
    64-bit hashes of (trace id, span id), open-addressed in an array (16
    bytes a span where a set of ints takes about 90). Two different spans
    share a hash with a probability of about 3e-8 in a million."""

    __slots__ = ("_table", "_mask", "_count")

    def __init__(self) -> None:
        self._table = array(U64, bytes(8 * 1024))
        self._mask = 1023
        self._count = 0

    def add(self, key: int) -> bool:
        """Add a span's ``trace_id << 64 | span_id``; False if it was there."""
        value = (hash((key,)) & _SPAN_ID_MASK) or 1  # a tuple's hash mixes the bits; 0 marks an empty slot
        table, mask = self._table, self._mask
        slot = value & mask
        while True:
            found = table[slot]
            if not found:
                break
            if found == value:
                return False
            slot = (slot + 1) & mask
        table[slot] = value
        self._count += 1
        if self._count * 2 > mask:
            self._grow()
        return True

    def _grow(self) -> None:
        old = self._table
        self._mask = mask = len(old) * 2 - 1
        self._table = table = array(U64, bytes(8 * (mask + 1)))
        if len(old) >= _SEEN_IN_NUMPY:
            _place_in_numpy(old, table, mask)
            return
        for value in old:
            if value:
                slot = value & mask
                while table[slot]:
                    slot = (slot + 1) & mask
                table[slot] = value


# A table of the spans seen this large or larger is grown in numpy (its
# Python loop took 0.23 µs a span, 40 % of the check); a small one (the
# first few thousand spans) in Python.
_SEEN_IN_NUMPY = 1 << 12


def _place_in_numpy(old: array, table: array, mask: int) -> None:
    """Put the values of ``old`` (0: an empty slot) into the empty ``table``
    by linear probing, as ``_SeenSpans.add`` would, in rounds: each value
    still to place takes its slot where it is empty and no other value of
    the round claims it first, else moves on to the next; a value passes a
    slot only when it is taken, so ``add`` finds it from its first slot."""
    import numpy as np  # (as in spans.ids: not at import)

    every = np.frombuffer(old, dtype=np.uint64)
    placed = np.frombuffer(table, dtype=np.uint64)
    for start in range(0, len(every), _PLACED_AT_ONCE):  # (a piece at a time: a few hundred kB of temporaries)
        values = every[start : start + _PLACED_AT_ONCE]
        values = values[values != 0]
        slots = values & np.uint64(mask)
        while len(values):
            free = placed[slots] == 0
            first = np.zeros(len(values), dtype=bool)
            _, claims = np.unique(slots[free], return_index=True)  # the first claim of each free slot
            first[np.flatnonzero(free)[claims]] = True
            placed[slots[first]] = values[first]
            values, slots = values[~first], (slots[~first] + np.uint64(1)) & np.uint64(mask)


_PLACED_AT_ONCE = 1 << 15


def _span_key(span: JsonSpan) -> int:
    """trace id << 64 | span id: read inline where both are hex strings of their length."""
    trace, span_id = span.traceId, span.spanId
    if type(trace) is str and type(span_id) is str and len(trace) == 32 and len(span_id) == 16:
        try:
            return int(trace + span_id, 16)
        except ValueError:
            pass
    return _key(span)


def _key(span: JsonSpan) -> int:
    """trace id << 64 | span id, validated (empty ids are 0)."""
    if type(span.traceId) is Unreadable:
        raise SpanFormatError(span.traceId.message)
    return hex_id(span.traceId, 32, "traceId") << 64 | hex_id(span.spanId, 16, "spanId")


def _wanted(items: object) -> dict:
    """key -> raw AnyValue for the attributes in ``WANTED_ATTRIBUTES``."""
    if not items:
        return _NOTHING
    if type(items) is not list:
        raise SpanFormatError("attributes is not a JSON array")
    found = {}
    for item in items:
        if type(item) is not JsonKeyValue:
            raise SpanFormatError("attributes[] is not a JSON object")
        key = item.key
        if type(key) is str and key in WANTED_ATTRIBUTES:
            found[key] = item.value
    return found


def _plain_array(value: object, kind: str, of: type) -> Optional[list]:
    """An array attribute as exporters write it (an ``arrayValue`` alone, of
    one-key ``{kind: x}`` items with each x of type ``of``): the list of x,
    what ``value_of`` makes of it, without its generic walk; None for
    anything else, which ``value_of`` then reads or refuses."""
    if (
        type(value) is not JsonValue
        or value.stringValue is not UNSET
        or value.boolValue is not UNSET
        or value.intValue is not UNSET
        or value.doubleValue is not UNSET
    ):
        return None
    array = value.arrayValue
    items = array.get("values") if type(array) is dict else None
    if type(items) is not list:
        return None
    found = []
    for item in items:
        if type(item) is not dict or len(item) != 1:
            return None
        x = item.get(kind)
        if type(x) is not of:
            return None
        found.append(x)
    return found


def _workers(value: Any) -> Optional[int]:
    """``agent.executor.max_workers``: a positive whole number, or None
    (read inline where it is a decimal ``intValue`` alone)."""
    raw = value.intValue if type(value) is JsonValue else None
    if type(raw) is str and 0 < len(raw) <= 18 and raw.isascii() and raw.isdigit():
        if value.stringValue is UNSET and value.boolValue is UNSET:  # (they would come first)
            value = int(raw)
    if type(value) is not int:
        value = value_of(value, AGENT_EXECUTOR_MAX_WORKERS)
    return value if type(value) is int and value > 0 else None


def _status_code(span: JsonSpan) -> int:
    status = span.status
    return nanos(status.code, "status.code") if type(status) is JsonStatus else 0


def _span_times(span: JsonSpan) -> tuple[int, int]:
    """(start, end) in epoch ns: read inline where both are decimal strings; a span must start,
    and not end before it starts."""
    start_ns, end_ns = span.startTimeUnixNano, span.endTimeUnixNano
    if type(start_ns) is str and type(end_ns) is str and len(start_ns) <= 20 and len(end_ns) <= 20:
        try:
            start_ns, end_ns = int(start_ns), int(end_ns)
        except ValueError:
            pass
        else:
            if 0 < start_ns <= end_ns < _UINT64_END:
                return start_ns, end_ns
    return _valid_span_times(span)


def _valid_span_times(span: JsonSpan) -> tuple[int, int]:
    """(start, end) in epoch ns, validated; a span must start, and not end before it starts."""
    start_ns = nanos(span.startTimeUnixNano, "startTimeUnixNano")
    end_ns = nanos(span.endTimeUnixNano, "endTimeUnixNano")
    if not start_ns:
        raise SpanFormatError(f"span {span.name!r} has no startTimeUnixNano")
    if end_ns < start_ns:
        raise SpanFormatError(
            f"span {span.name!r} ends (endTimeUnixNano {end_ns}) before it starts ({start_ns})", OUT_OF_RANGE
        )
    return start_ns, end_ns


def _name_of(span: JsonSpan) -> str:
    name = span.name
    return printable(name) if type(name) is str else repr(name)


def printable(text: str) -> str:
    """``text`` with every lone surrogate (text decoded with
    ``surrogateescape``, or a JSON ``\\udcff`` escape) replaced by U+FFFD,
    so it can be written as UTF-8 anywhere."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")
