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
from agent_otel.records import NS_PER_S, OUTCOMES, IdleWindow, ToolCall

TOOL_OPERATION = "execute_tool"
IDLE_SPAN = "gpu.idle"
EXEC_START_EVENT = "exec.start"
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
            if attributes.get("gen_ai.operation.name") == TOOL_OPERATION:
                call = _tool_call(path, span)
                tool_parents.append(((span.trace_id, span.parent_span_id), call))
                tool_by_span[key] = call.tool
                timeout = _seconds(path, span, "agent.tool.timeout")
                if timeout is not None and timeout > 0:
                    data.timeouts[call.tool] = min(timeout, data.timeouts.get(call.tool, math.inf))
            elif span.name == IDLE_SPAN:
                if "gpu.idle.blocked_duration" in attributes:
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
                    phase=str(span.attributes.get("agent.tool.phase", "")),
                    blocked_s=_seconds(path, span, "gpu.idle.blocked_duration") or 0.0,
                )
            )
    return data


def _tool_call(path: str, span: SpanRecord) -> ToolCall:
    attributes = span.attributes
    tool = attributes.get("gen_ai.tool.name")
    if not isinstance(tool, str) or not tool:
        prefix = TOOL_OPERATION + " "
        tool = span.name[len(prefix):] if span.name.startswith(prefix) else "unknown"
    start_ns = _exec_start(path, span)
    outcome = attributes.get("agent.tool.outcome")
    if outcome not in OUTCOMES:
        outcome = "error" if span.status_code == STATUS_ERROR else "ok"
    error_type = attributes.get("error.type")
    call_id = attributes.get("gen_ai.tool.call.id")
    thread = attributes.get("thread.name")
    workers = attributes.get("agent.executor.max_workers")
    return ToolCall(
        tool=tool,
        executor=str(attributes.get("agent.tool.executor") or UNKNOWN_EXECUTOR),
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
        if event.name == EXEC_START_EVENT and event.time_ns:
            return min(max(event.time_ns, span.start_ns), span.end_ns)
    queue_s = _seconds(path, span, "agent.tool.queue.duration") or 0.0
    return min(span.start_ns + round(queue_s * NS_PER_S), span.end_ns)


def _idle_window(path: str, span: SpanRecord) -> IdleWindow:
    utilization = _seconds(path, span, "gpu.utilization.avg")
    uuid = span.attributes.get("gpu.uuid")
    return IdleWindow(
        gpu=_gpu(path, span),
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        utilization_avg=0.0 if utilization is None else utilization,
        uuid=None if uuid is None else str(uuid),
    )


def _gpu(path: str, span: SpanRecord) -> str:
    index = span.attributes.get("gpu.index")
    if isinstance(index, bool) or not isinstance(index, (int, str)) or str(index) == "":
        raise InputError(path, span.line, f"span {span.name!r} has no gpu.index (got {index!r})")
    return str(index)


def _seconds(path: str, span: SpanRecord, key: str) -> Optional[float]:
    """A non-negative number attribute, or None when absent."""
    value = span.attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise InputError(path, span.line, f"span {span.name!r}: {key} is not a non-negative number: {value!r}")
    return float(value)
