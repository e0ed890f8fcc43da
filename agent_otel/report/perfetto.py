"""The report's timeline as Chrome trace-event JSON, for Perfetto
(ui.perfetto.dev) and chrome://tracing.

Layout:

- Process "GPUs": a counter track per GPU (``GPU <n> utilization %``, from
  the GPU log's samples) and a thread track per GPU (``GPU <n> idle``)
  with one slice per idle window; a simulated GPU's are ``GPU <n>
  (simulated) ...``.
- One process per executor: ``queue`` tracks with a slice for each call's
  wait, and worker tracks with a slice for each call's execution. Worker
  tracks are named after the span's ``thread.name`` when it has one, else
  inferred (``worker 1 (inferred)``...), as few as the peak concurrency
  needs; calls that overlap on one named thread (asyncio tasks) get extra
  tracks, because a thread track's slices must not overlap.
- A flow arrow from each idle window to every call it was blamed on, bound
  to the call's exec slice (or queue slice, for the part spent queued).
- Process "Agent turns": one slice per turn (``args``: its model, tool
  queue, tool exec and other seconds), on as many tracks as overlapping
  turns need.
- Process "Models": per model, tracks with one slice per model call
  (``args``: tokens, time to first chunk).

Timestamps are microseconds from the report window's start;
``otherData.origin_unix_ns`` holds that start in Unix epoch nanoseconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

from agent_otel.attribution import gpu_key
from agent_otel.records import ToolCall
from agent_otel.report.analysis import Analysis
from agent_otel.report.parts import Report, report_parts
from agent_otel.report.stats import assign_rows
from agent_otel.semconv import PHASE_EXEC, PHASE_QUEUE, SPAN_GPU_IDLE

GPU_PID = 1
FLOW_NAME = "blocked by"
TURNS_NAME = "Agent turns"
MODELS_NAME = "Models"


def trace_events(analysis: Analysis) -> dict:
    """Every record drawn (from the analysis), on the tracks of the report's parts."""
    report = report_parts(analysis)
    origin = analysis.start_ns

    def us(ns: int) -> float:
        return round((ns - origin) / 1000, 3)

    events: list[dict] = []
    _name(events, "process_name", GPU_PID, None, "GPUs")
    gpu_tid: dict[str, int] = {}
    for number, gpu in enumerate(sorted({g.gpu for g in report.gpus} | set(analysis.samples)), start=1):
        gpu_tid[gpu] = number
        label = f"GPU {gpu} (simulated)" if gpu in analysis.simulated_gpus else f"GPU {gpu}"
        _name(events, "thread_name", GPU_PID, number, f"{label} idle")
        for sample in analysis.samples.get(gpu, ()):
            events.append(
                {
                    "ph": "C",
                    "name": f"{label} utilization %",
                    "pid": GPU_PID,
                    "ts": us(sample.timestamp_ns),
                    "args": {"utilization": round(sample.utilization * 100, 2)},
                }
            )
    for attribution in analysis.attributions:
        window = attribution.window
        events.append(
            {
                "ph": "X",
                "name": SPAN_GPU_IDLE,
                "cat": "gpu",
                "pid": GPU_PID,
                "tid": gpu_tid[gpu_key(window)],
                "ts": us(window.start_ns),
                "dur": round(us(window.end_ns) - us(window.start_ns), 3),
                "args": {
                    "gpu": gpu_key(window),
                    "idle_s": round(window.seconds, 6),
                    "utilization_avg": round(window.utilization_avg, 4),
                    "blocked_by": attribution.blocked_by,
                    "unattributed_s": round(attribution.unattributed_s, 6),
                },
            }
        )

    tracks = _call_tracks(analysis.calls, events)
    _turns_and_models(analysis, report, events, us, first_pid=max((t[0] for t in tracks.values()), default=GPU_PID) + 1)
    blocked = analysis.blocked_by_call()
    for call in analysis.calls:
        pid, queue_tid, exec_tid = tracks[id(call)]
        args = {
            "tool": call.tool,
            "call_id": call.call_id,
            "trace_id": f"{call.trace_id:032x}",
            "span_id": f"{call.span_id:016x}",
            "outcome": call.outcome,
            "queue_s": round(call.queue_seconds, 6),
            "exec_s": round(call.exec_seconds, 6),
            "gpu_idle_blocked_s": round(blocked[id(call)], 6),
        }
        if queue_tid is not None:
            events.append(_slice(call.tool, PHASE_QUEUE, pid, queue_tid, us(call.submit_ns), us(call.start_ns), args))
        events.append(_slice(call.tool, PHASE_EXEC, pid, exec_tid, us(call.start_ns), us(call.end_ns), args))

    flow_id = 0
    for attribution in analysis.attributions:
        window = attribution.window
        for share in attribution.shares:
            if share.blocked_s <= 0:
                continue
            target = _flow_target(share.call, share.start_ns, share.end_ns, tracks)
            if target is None:
                continue
            flow_id += 1
            pid, tid, ns = target
            middle = (share.start_ns + share.end_ns) // 2
            common = {"name": FLOW_NAME, "cat": "blame", "id": flow_id}
            events.append({"ph": "s", **common, "pid": GPU_PID, "tid": gpu_tid[gpu_key(window)], "ts": us(middle)})
            events.append({"ph": "f", "bp": "e", **common, "pid": pid, "tid": tid, "ts": us(ns)})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "origin_unix_ns": str(origin),
            "window_start": report.window.start,
            "generator": "agent-otel report",
        },
    }


def _call_tracks(calls: Sequence[ToolCall], events: list[dict]) -> dict[int, tuple[int, Optional[int], int]]:
    """Give every call its (pid, queue tid or None, exec tid), naming the
    processes and threads as they are made."""
    tracks: dict[int, tuple[int, Optional[int], int]] = {}
    by_executor: dict[str, list[ToolCall]] = defaultdict(list)
    for call in calls:
        by_executor[call.executor].append(call)
    for pid, executor in enumerate(sorted(by_executor), start=GPU_PID + 1):
        _name(events, "process_name", pid, None, f"executor {executor}")
        executor_calls = by_executor[executor]
        next_tid = 1
        exec_tid: dict[int, int] = {}
        by_thread: dict[Optional[str], list[ToolCall]] = defaultdict(list)
        for call in executor_calls:
            by_thread[call.thread].append(call)
        for thread in sorted(by_thread, key=lambda name: (name is None, name or "")):
            thread_calls = by_thread[thread]
            rows = assign_rows([(c.start_ns, c.end_ns) for c in thread_calls])
            for row in range(max(rows) + 1):
                if thread is None:
                    label = f"worker {row + 1} (inferred)"
                else:
                    label = thread if row == 0 else f"{thread} ({row + 1})"
                _name(events, "thread_name", pid, next_tid + row, label)
            for call, row in zip(thread_calls, rows):
                exec_tid[id(call)] = next_tid + row
            next_tid += max(rows) + 1
        queued = [call for call in executor_calls if call.start_ns > call.submit_ns]
        queue_rows = assign_rows([(c.submit_ns, c.start_ns) for c in queued])
        queue_tid = {id(call): next_tid + row for call, row in zip(queued, queue_rows)}
        for row in range(max(queue_rows, default=-1) + 1):
            _name(events, "thread_name", pid, next_tid + row, f"queue {row + 1}")
        for call in executor_calls:
            tracks[id(call)] = (pid, queue_tid.get(id(call)), exec_tid[id(call)])
    return tracks


def _turns_and_models(analysis: Analysis, report: Report, events: list[dict], us, first_pid: int) -> None:
    """The turns, then the model calls, each in a process of its own after the executors."""
    turns = sorted(analysis.turns, key=lambda t: t.start_ns)
    if turns:
        pid = first_pid
        first_pid += 1
        _name(events, "process_name", pid, None, TURNS_NAME)
        rows = assign_rows([(t.start_ns, t.end_ns) for t in turns])
        for row in range(max(rows) + 1):
            _name(events, "thread_name", pid, row + 1, f"turns {row + 1}")
        for turn, row in zip(turns, rows):
            events.append(
                _slice(
                    turn.name,
                    "turn",
                    pid,
                    row + 1,
                    us(turn.start_ns),
                    us(turn.end_ns),
                    {
                        "trace_id": f"{turn.trace_id:032x}",
                        "source": turn.source,
                        "client_cpu_s": round(turn.client_cpu_s, 6),
                        "model_s": round(turn.model_s, 6),
                        "tool_queue_s": round(turn.tool_queue_s, 6),
                        "tool_exec_s": round(turn.tool_exec_s, 6),
                        "other_s": round(turn.other_s, 6),
                    },
                )
            )
    if analysis.model_calls:
        pid = first_pid
        _name(events, "process_name", pid, None, MODELS_NAME)
        next_tid = 1
        for stats in report.models:
            calls = [c for c in analysis.model_calls if c.model == stats.model]
            rows = assign_rows([(c.start_ns, c.end_ns) for c in calls])
            for row in range(max(rows) + 1):
                _name(
                    events,
                    "thread_name",
                    pid,
                    next_tid + row,
                    stats.model if row == 0 else f"{stats.model} ({row + 1})",
                )
            for call, row in zip(calls, rows):
                events.append(
                    _slice(
                        call.model,
                        "model",
                        pid,
                        next_tid + row,
                        us(call.start_ns),
                        us(call.end_ns),
                        {
                            "trace_id": f"{call.trace_id:032x}",
                            "span_id": f"{call.span_id:016x}",
                            "operation": call.operation,
                            "input_tokens": call.input_tokens,
                            "output_tokens": call.output_tokens,
                            "time_to_first_chunk_s": call.first_chunk_s,
                            "failed": call.failed,
                        },
                    )
                )
            next_tid += max(rows) + 1


def _flow_target(call: ToolCall, a: int, b: int, tracks: dict) -> Optional[tuple[int, int, int]]:
    """Where a blame arrow ends: inside the exec slice if the blamed stretch
    [a, b) reaches into execution, else inside the queue slice."""
    pid, queue_tid, exec_tid = tracks[id(call)]
    lo, hi = max(a, call.start_ns), min(b, call.end_ns)
    if hi > lo:
        return pid, exec_tid, (lo + hi) // 2
    lo, hi = max(a, call.submit_ns), min(b, call.start_ns)
    if hi > lo and queue_tid is not None:
        return pid, queue_tid, (lo + hi) // 2
    return None


def _slice(name: str, category: str, pid: int, tid: int, start_us: float, end_us: float, args: dict) -> dict:
    return {
        "ph": "X",
        "name": name,
        "cat": category,
        "pid": pid,
        "tid": tid,
        "ts": start_us,
        "dur": round(end_us - start_us, 3),
        "args": args,
    }


def _name(events: list[dict], kind: str, pid: int, tid: Optional[int], name: str) -> None:
    event = {"ph": "M", "name": kind, "pid": pid, "ts": 0, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    events.append(event)
