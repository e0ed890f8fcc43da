"""Exported spans -> the pipeline's records (tool calls, idle windows).

Tool spans are the ones with ``gen_ai.operation.name == "execute_tool"``;
each becomes a ``ToolCall``: requested at the span's start, finished at its
end, and executing from its ``exec.start`` event (or, without one, from
start + ``agent.tool.queue.duration``).

``gpu.idle`` spans come in two kinds (see docs/telemetry.md): the
window-level span of the GPU timeline (with ``gpu.idle.duration``) becomes
an ``IdleWindow``; the per-tool child span (with
``gpu.idle.blocked_duration``) is what the live path blamed, kept only to
compare with the report's own attribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from agent_otel.errors import InputError
from agent_otel.exporters.otlp_json import STATUS_ERROR, SpanRecord, iter_spans
from agent_otel.records import NS_PER_S, IdleWindow, ToolCall
from agent_otel.semconv import (AGENT_EXECUTOR_MAX_WORKERS, AGENT_TOOL_EXECUTOR, AGENT_TOOL_OUTCOME, AGENT_TOOL_PHASE,
                                AGENT_TOOL_QUEUE_DURATION, AGENT_TOOL_TIMEOUT, ERROR_TYPE, EVENT_EXEC_START,
                                GEN_AI_OPERATION_EXECUTE_TOOL, GEN_AI_OPERATION_NAME, GEN_AI_TOOL_CALL_ID,
                                GEN_AI_TOOL_NAME, GPU_IDLE_BLOCKED_DURATION, GPU_INDEX, GPU_UTILIZATION_AVG, GPU_UUID,
                                OUTCOME_ERROR, OUTCOME_OK, OUTCOMES, SPAN_EXECUTE_TOOL_PREFIX, SPAN_GPU_IDLE,
                                THREAD_NAME)

# The executor of a tool span that names none (another library's span).
UNKNOWN_EXECUTOR = "unknown"


@dataclass(slots=True)
class LiveShare:
    """One per-tool ``gpu.idle`` child span: the live path's blame."""

    gpu: str
    tool: str
    phase: str
    blocked_s: float


@dataclass
class TraceData:
    """Everything the report takes from trace files."""

    calls: list[ToolCall] = field(default_factory=list)
    idle_windows: list[IdleWindow] = field(default_factory=list)
    live_shares: list[LiveShare] = field(default_factory=list)
    # tool -> the smallest ``agent.tool.timeout`` (s) its spans carried
    timeouts: dict[str, float] = field(default_factory=dict)
    span_count: int = 0
    duplicate_count: int = 0
    # earliest start and latest end over every span read (0 when none)
    start_ns: int = 0
    end_ns: int = 0


def read_traces(paths: Iterable[str], progress: Optional[Callable[[int], None]] = None) -> TraceData:
    """Read OTLP/JSON trace files into records.

    A span seen twice (the same trace and span id, e.g. files that overlap)
    counts once, and so does a call seen from two sides: a tool span whose
    parent is a tool span of the same tool (an MCP client's span and the
    server's own span under it) is the same call. Raises ``InputError`` naming the file and line for a
    malformed line or a tool span whose attributes cannot be read.
    """
    data = TraceData()
    seen: set[tuple[int, int]] = set()
    tool_by_span: dict[tuple[int, int], str] = {}
    children: list[tuple[str, int, SpanRecord]] = []
    tool_parents: list[tuple[tuple[int, int], ToolCall]] = []
    for path in paths:
        for span in iter_spans(path, progress):
            key = (span.trace_id, span.span_id)
            if key in seen:
                data.duplicate_count += 1
                continue
            seen.add(key)
            data.span_count += 1
            data.start_ns = min(data.start_ns, span.start_ns) if data.start_ns else span.start_ns
            data.end_ns = max(data.end_ns, span.end_ns)
            attributes = span.attributes
            if attributes.get(GEN_AI_OPERATION_NAME) == GEN_AI_OPERATION_EXECUTE_TOOL:
                call = _tool_call(path, span)
                tool_parents.append(((span.trace_id, span.parent_span_id), call))
                tool_by_span[key] = call.tool
                timeout = _seconds(path, span, AGENT_TOOL_TIMEOUT)
                if timeout is not None and timeout > 0:
                    data.timeouts[call.tool] = min(timeout, data.timeouts.get(call.tool, math.inf))
            elif span.name == SPAN_GPU_IDLE:
                if GPU_IDLE_BLOCKED_DURATION in attributes:
                    children.append((path, span.parent_span_id, span))
                else:
                    data.idle_windows.append(_idle_window(path, span))
    for parent, call in tool_parents:
        if tool_by_span.get(parent) == call.tool:
            data.duplicate_count += 1
        else:
            data.calls.append(call)
    for path, parent_id, span in children:
        tool = tool_by_span.get((span.trace_id, parent_id))
        if tool is not None:
            data.live_shares.append(
                LiveShare(
                    gpu=_gpu(path, span),
                    tool=tool,
                    phase=str(span.attributes.get(AGENT_TOOL_PHASE, "")),
                    blocked_s=_seconds(path, span, GPU_IDLE_BLOCKED_DURATION) or 0.0,
                )
            )
    return data


def _tool_call(path: str, span: SpanRecord) -> ToolCall:
    attributes = span.attributes
    tool = attributes.get(GEN_AI_TOOL_NAME)
    if not isinstance(tool, str) or not tool:
        prefix = SPAN_EXECUTE_TOOL_PREFIX
        tool = span.name[len(prefix):] if span.name.startswith(prefix) else "unknown"
    start_ns = _exec_start(path, span)
    outcome = attributes.get(AGENT_TOOL_OUTCOME)
    if outcome not in OUTCOMES:
        outcome = OUTCOME_ERROR if span.status_code == STATUS_ERROR else OUTCOME_OK
    error_type = attributes.get(ERROR_TYPE)
    call_id = attributes.get(GEN_AI_TOOL_CALL_ID)
    thread = attributes.get(THREAD_NAME)
    workers = attributes.get(AGENT_EXECUTOR_MAX_WORKERS)
    return ToolCall(
        tool=tool,
        executor=str(attributes.get(AGENT_TOOL_EXECUTOR) or UNKNOWN_EXECUTOR),
        submit_ns=span.start_ns,
        start_ns=start_ns,
        end_ns=span.end_ns,
        outcome=outcome,
        call_id=None if call_id is None else str(call_id),
        trace_id=span.trace_id,
        span_id=span.span_id,
        error_type=None if error_type is None else str(error_type),
        thread=None if thread is None else str(thread),
        executor_workers=workers if isinstance(workers, int) and workers > 0 else None,
    )


def _exec_start(path: str, span: SpanRecord) -> int:
    """When execution began, kept inside the span."""
    for event in span.events:
        if event.name == EVENT_EXEC_START and event.time_ns:
            return min(max(event.time_ns, span.start_ns), span.end_ns)
    queue_s = _seconds(path, span, AGENT_TOOL_QUEUE_DURATION) or 0.0
    return min(span.start_ns + round(queue_s * NS_PER_S), span.end_ns)


def _idle_window(path: str, span: SpanRecord) -> IdleWindow:
    utilization = _seconds(path, span, GPU_UTILIZATION_AVG)
    uuid = span.attributes.get(GPU_UUID)
    return IdleWindow(
        gpu=_gpu(path, span),
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        utilization_avg=0.0 if utilization is None else utilization,
        uuid=None if uuid is None else str(uuid),
    )


def _gpu(path: str, span: SpanRecord) -> str:
    index = span.attributes.get(GPU_INDEX)
    if isinstance(index, bool) or not isinstance(index, (int, str)) or str(index) == "":
        raise InputError(path, span.line, f"span {span.name!r} has no {GPU_INDEX} (got {index!r})")
    return str(index)


def _seconds(path: str, span: SpanRecord, key: str) -> Optional[float]:
    """A non-negative number attribute, or None when absent."""
    value = span.attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise InputError(path, span.line, f"span {span.name!r}: {key} is not a non-negative number: {value!r}")
    return float(value)
