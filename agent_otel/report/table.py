"""The report as text tables for a terminal or a pipe.

On a terminal the tables fit its width (the least important columns go
first) and use colour unless ``NO_COLOR`` is set; piped, they are plain
text with every column, one recommendation per line.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from dataclasses import dataclass
from typing import Optional, TextIO

from agent_otel.report.cost import money_text
from agent_otel.report.analysis import GPU_FROM_LOGS, GPU_FROM_TRACES, Analysis
from agent_otel.report.parts import (
    Cost,
    EventLoop,
    Executor,
    Gpu,
    KvCache,
    Model,
    ModelServer,
    Report,
    Slo,
    Tool,
    report_parts,
)

BOLD, DIM, RED, YELLOW, CYAN, RESET = "\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[33m", "\x1b[36m", "\x1b[0m"
MAX_NAME = 40


def terminal_style(stream: TextIO) -> tuple[Optional[int], bool]:
    """(width, colour) for writing to ``stream``: (None, False) unless it is a terminal."""
    if not stream.isatty():
        return None, False
    colour = not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return shutil.get_terminal_size((100, 24)).columns, colour


@dataclass
class Column:
    header: str
    priority: int  # lower is kept longer when the terminal is narrow
    left: bool = False


def render(analysis: Analysis, *, width: Optional[int] = None, colour: bool = False) -> str:
    """The whole report. ``width`` None means no limit (plain output).

    Drawn from the report's parts (``report.parts``), so the table shows the JSON's numbers.
    """
    report = report_parts(analysis)
    paint = _Painter(colour)
    out: list[str] = []
    what, _ = report.run_name()
    title = f"agent-otel report: {visible(what)}" if what else "agent-otel report"
    out.extend(_wrap(title, width, title, paint(BOLD, title)))
    out.extend(_wrap("  " + _summary(report), width))
    for warning in report.inputs.warnings:
        out.extend(paint(YELLOW, line) for line in _wrap("warning: " + visible(warning), width))
    out.append("")
    underuse_known = report.underuse_known
    if underuse_known:
        out.append(paint(BOLD, "Tools, by GPU capacity they left unused (GPU-seconds)"))
    else:
        out.append(paint(BOLD, "Tools, by GPU idle time they blocked (GPU-seconds)"))
    out.extend(_tools(report.tools, width, paint))
    out.append("")
    if report.slos:
        out.append(paint(BOLD, "Latency SLOs, from each call's duration (breaking first)"))
        out.extend(_slos(report.slos, width, paint))
        out.append("")
    out.append(paint(BOLD, "Turns: where the end-to-end time went"))
    out.extend(_turns(report, width))
    out.append("")
    out.append(paint(BOLD, "Models"))
    out.extend(_models(report.models, width, paint))
    out.extend(_model_server(report.models, width))
    out.append("")
    if report.model_server is not None:
        out.append(paint(BOLD, "Model calls, split by the model servers' own spans (seconds)"))
        out.extend(_server_split(report.model_server, width, paint))
        out.append("")
    out.append(paint(BOLD, "Executors"))
    out.extend(_executors(report.executors, width, paint))
    out.append("")
    out.append(paint(BOLD, "GPUs"))
    out.extend(_gpus(report.gpus, width, paint))
    out.append("")
    if report.kv_cache is not None:
        out.append(paint(BOLD, "Model server KV cache held while tools blocked the idle GPU"))
        out.extend(_kv_cache(report.kv_cache, width, paint))
        out.append("")
    if report.cost is not None:
        out.append(paint(BOLD, "What the GPU idle time costs (gpu_hour_price)"))
        out.extend(_cost(report.cost, width, paint))
        out.append("")
    if report.event_loops:
        out.append(paint(BOLD, "Event loops, by time blocked (asyncio.loop.blocked spans)"))
        out.extend(_loops(report.event_loops, width, paint))
        out.append("")
    out.append(paint(BOLD, "Recommendations"))
    if not report.recommendations:
        out.append("  none: the data shows nothing to change")
    for recommendation in report.recommendations:
        kind = f"[{recommendation.kind}]"
        out.extend(_wrap(f"- {kind} {visible(recommendation.message)}", width, kind, paint(CYAN, kind)))
        if recommendation.remedy:
            out.extend("    " + visible(line) for line in recommendation.remedy.splitlines())
    return "\n".join(out) + "\n"


def _wrap(text: str, width: Optional[int], plain: str = "", painted: str = "") -> list[str]:
    """Wrap to the terminal (not when piped), then colour ``plain`` in the first line."""
    lines = textwrap.wrap(text, width - 1, subsequent_indent="  ", break_on_hyphens=False) if width else [text]
    if plain:
        lines[0] = lines[0].replace(plain, painted, 1)
    return lines


def _summary(report: Report) -> str:
    inputs = report.inputs
    if not inputs.spans:
        return "(no spans)"
    _, when = report.run_name()
    source = {
        GPU_FROM_LOGS: "GPU idle from " + ", ".join(visible(log.path) for log in inputs.gpu_logs),
        GPU_FROM_TRACES: "GPU idle from gpu.idle spans",
    }.get(inputs.gpu_source, "no GPU idle data")
    simulated = report.simulated_gpus
    if simulated:
        source += f" (simulated GPU {', '.join(visible(gpu) for gpu in simulated)}: not a real GPU)"
    return f"{when}, {inputs.tool_calls} tool calls, {source}"


def _tools(tools: tuple[Tool, ...], width: Optional[int], paint: _Painter) -> list[str]:
    columns = [
        Column("TOOL", 0, left=True),
        Column("UNUSED", 0),
        Column("BLOCKED", 0),
        Column("IN QUEUE", 1),
        Column("IN EXEC", 1),
        Column("CALLS", 2),
        Column("ERRORS", 2),
        Column("P50", 4),
        Column("P95", 2),
        Column("P99", 3),
        Column("QUEUE P95", 3),
        Column("EXEC P95", 3),
    ]
    rows = [
        [
            _name(t.tool, width),
            _opt(t.gpu_underused_blocked_s),
            _sec(t.gpu_idle_blocked_s),
            _sec(t.gpu_idle_blocked_queue_s),
            _sec(t.gpu_idle_blocked_exec_s),
            str(t.calls),
            paint(RED, str(t.errors)) if t.errors else "0",
            _sec(t.duration_p50_s),
            _sec(t.duration_p95_s),
            _sec(t.duration_p99_s),
            _sec(t.queue_p95_s),
            _sec(t.exec_p95_s),
        ]
        for t in tools
    ]
    # Shown when the traces hold the data: CPU time (sync calls) and blocked event loops.
    if any(t.loop_blocks for t in tools):
        columns.append(Column("LOOP BLOCKED", 1))
        for row, t in zip(rows, tools):
            row.append(_sec(t.loop_blocked_s) if t.loop_blocks else "0")
    if any(t.exec_cpu_share is not None for t in tools):
        columns.append(Column("CPU", 3))
        for row, t in zip(rows, tools):
            share, kind = t.exec_cpu_share, t.wait_kind
            row.append("-" if share is None else f"{share:.0%}" + (f" {kind}" if kind else ""))
    return _table(columns, rows, width, paint)


def _slos(slos: tuple[Slo, ...], width: Optional[int], paint: _Painter) -> list[str]:
    columns = [
        Column("TOOL", 0, left=True),
        Column("SLO", 0, left=True),
        Column("COMPLIANCE", 0),
        Column("", 0, left=True),
        Column("CALLS", 1),
        Column("OVER", 1),
        Column("BUDGET SPENT", 2),
    ]
    rows = [
        [
            _name(s.tool, width),
            f"{s.objective * 100:.6g}% within {s.threshold_s:g} s" + ("" if s.on_bucket_bound else " *"),
            f"{s.compliance:.1%}",
            "met" if s.met else paint(RED, "BREAKS"),
            str(s.calls),
            str(s.over),
            f"{s.budget_spent:.0%}",
        ]
        for s in slos
    ]
    lines = _table(columns, rows, width, paint)
    if not all(s.on_bucket_bound for s in slos):
        lines.extend(
            _wrap(
                "  * not a bound of the duration histograms: measured exactly here, but the alert rules "
                "cannot alert on it (docs/dashboards.md#latency-slos)",
                width,
            )
        )
    return lines


def _loops(loops: tuple[EventLoop, ...], width: Optional[int], paint: _Painter) -> list[str]:
    columns = [
        Column("THREAD", 0, left=True),
        Column("BLOCKS", 0),
        Column("BLOCKED", 0),
        Column("LONGEST", 1),
        Column("BLOCKED BY", 2, left=True),
    ]
    rows = [
        [
            _name(loop.thread, width),
            str(loop.blocks),
            _sec(loop.blocked_s),
            _sec(loop.longest_s),
            ", ".join(f"{visible(by.tool)} {_sec(by.blocked_s)}" for by in loop.by_tool[:3])
            + (", ..." if len(loop.by_tool) > 3 else ""),
        ]
        for loop in loops
    ]
    return _table(columns, rows, width, paint)


def _turns(report: Report, width: Optional[int]) -> list[str]:
    turns = report.turns
    count = turns.count
    if not count:
        return _wrap("  none: no tool or model calls in the traces", width)
    total = turns.end_to_end_s or 1.0
    wall = report.window.seconds
    overlapping = turns.end_to_end_s > wall * 1.001 + 1e-6  # turns ran at once: their sum is no wall time
    source = (
        "invoke_agent spans"
        if turns.from_agent_spans == count
        else "traces"
        if not turns.from_agent_spans
        else f"{turns.from_agent_spans} invoke_agent spans, {count - turns.from_agent_spans} traces"
    )
    parts = " + ".join(
        f"{label} {_sec1(seconds)} s ({percent(seconds / total)})"
        for label, seconds in (
            ("client CPU", turns.client_cpu_s),
            ("model", turns.model_s),
            ("tool queue", turns.tool_queue_s),
            ("tool exec", turns.tool_exec_s),
            ("other", turns.other_s),
        )
        if seconds or label != "client CPU"  # shown where the client blocked its loop at all
    )
    summed = (
        f"{_sec1(turns.end_to_end_s)} s summed over turns that ran at once (the run lasted {_sec1(wall)} s)"
        if overlapping
        else f"{_sec1(turns.end_to_end_s)} s end to end"
    )
    lines = _wrap(
        f"  {count} turn{'s' if count != 1 else ''} ({source}): {summed} = {parts}; per turn p50 "
        f"{_sec(turns.end_to_end_p50_s)} s, p95 {_sec(turns.end_to_end_p95_s)} s",
        width,
    )
    for tool in report.tools:
        if tool.latency_share is None or not tool.latency_share and not tool.gpu_idle_blocked_s:
            continue
        lines.extend(
            _wrap(
                f"  {visible(tool.tool)} idles the GPU {amount(tool.gpu_idle_blocked_per_call_s)} s per call "
                f"({amount(tool.gpu_idle_blocked_s)} s blamed over {tool.calls} "
                f"call{'s' if tool.calls != 1 else ''}), in flight for {percent(tool.latency_share)} "
                "of the turns' time",
                width,
            )
        )
    return lines


def _model_server(models: tuple[Model, ...], width: Optional[int]) -> list[str]:
    """A sentence per model the GPU idled on (docs/attribution.md, the model server)."""
    lines = []
    for model in models:
        if model.gpu_idle_blocked_s:
            lines.extend(
                _wrap(
                    f"  the model server idles the GPU {amount(model.gpu_idle_blocked_s)} s while "
                    f"{visible(model.model)} calls are in flight ({amount(model.gpu_idle_blocked_queued_s)} s "
                    f"before their first token, {amount(model.gpu_idle_blocked_decode_s)} s streaming)",
                    width,
                )
            )
    return lines


def amount(seconds: float) -> str:
    """Seconds for a sentence, never rounded to a misleading 0.0: one decimal
    from a second up, two significant digits below (0.032)."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.1f}"
    return f"{seconds:.2g}"


def _models(models: tuple[Model, ...], width: Optional[int], paint: _Painter) -> list[str]:
    if not models:
        return _wrap("  no model-call spans (chat, text_completion, generate_content) in the traces", width)
    columns = [
        Column("MODEL", 0, left=True),
        Column("CALLS", 0),
        Column("TIME", 0),
        Column("P50", 1),
        Column("P95", 1),
        Column("FIRST CHUNK P50", 2),
        Column("IN TOKENS", 3),
        Column("OUT TOKENS", 3),
        Column("ERRORS", 2),
        Column("GPU IDLE", 0),  # the model server's share: idle while its calls were in flight
    ]
    rows = [
        [
            _name(m.model, width),
            str(m.calls),
            _sec(m.seconds),
            _sec(m.duration_p50_s),
            _sec(m.duration_p95_s),
            "-" if m.time_to_first_chunk_p50_s is None else _sec(m.time_to_first_chunk_p50_s),
            "-" if m.input_tokens is None else str(m.input_tokens),
            "-" if m.output_tokens is None else str(m.output_tokens),
            paint(RED, str(m.errors)) if m.errors else "0",
            _sec(m.gpu_idle_blocked_s),
        ]
        for m in models
    ]
    return _table(columns, rows, width, paint)


def _sec1(seconds: float) -> str:
    """Seconds for a sentence: one decimal."""
    return f"{seconds:.1f}"


def percent(ratio: float) -> str:
    return f"{round(ratio * 100):.0f} %"


def _executors(executors: tuple[Executor, ...], width: Optional[int], paint: _Painter) -> list[str]:
    columns = [
        Column("EXECUTOR", 0, left=True),
        Column("SUBMITTED", 0),
        Column("WAIT P95", 0),
        Column("QUEUED", 1),
        Column("MAX QUEUED", 1),
        Column("MAX RUNNING", 2),
        Column("PEAK IN FLIGHT", 3),
        Column("MAX WORKERS", 4),
    ]
    rows = [
        [
            _name(e.executor, width),
            str(e.submissions),
            _sec(e.wait_p95_s),
            str(e.queued_calls),
            str(e.max_queue_depth),
            str(e.max_concurrent_exec),
            str(e.peak_in_flight),
            "?" if e.max_workers is None else str(e.max_workers),
        ]
        for e in executors
    ]
    return _table(columns, rows, width, paint)


def _gpus(gpus: tuple[Gpu, ...], width: Optional[int], paint: _Painter) -> list[str]:
    if not gpus:
        return ["  no gpu.idle spans in the traces and no --gpu-log: the GPU was never idle, or was not sampled"]
    columns = [
        Column("GPU", 0, left=True),
        Column("BUSY", 0),
        Column("IDLE", 0),
        Column("BLOCKED BY TOOLS", 0),
        Column("MODEL SERVER", 0),
        Column("UNATTRIBUTED", 0),
        Column("UTIL AVG", 1),
        Column("UNUSED", 1),
        Column("UNUSED BY TOOLS", 1),
        Column("MISSING", 2),
    ]
    rows = [
        [
            visible(g.gpu) + (" (simulated)" if g.simulated else ""),
            _sec(g.busy_s),
            _sec(g.idle_s),
            _sec(g.idle_blocked_s),
            _sec(g.idle_model_s),
            _sec(g.idle_unattributed_s),
            "-" if g.utilization_avg is None else f"{g.utilization_avg:.0%}",
            _opt(g.underused_s),
            _opt(g.underused_blocked_s),
            _opt(g.missing_s),
        ]
        for g in gpus
    ]
    return _table(columns, rows, width, paint)


def _server_split(server: ModelServer, width: Optional[int], paint: _Painter) -> list[str]:
    lines = _wrap(
        f"  {server.totals.model_calls} model calls joined to {server.requests} server spans "
        f"(by parent {server.joined_by_parent}, by trace and time {server.joined_by_time}; "
        f"{server.unjoined} unjoined)",
        width,
    )
    columns = [
        Column("MODEL", 0, left=True),
        Column("CALLS", 0),
        Column("TIME", 0),
        Column("CLIENT+NET", 0),
        Column("QUEUE", 0),
        Column("PREFILL", 0),
        Column("DECODE", 0),
        Column("SERVER OTHER", 1),
    ]
    rows = [
        [
            _name(m.model, width),
            str(m.split.model_calls),
            _sec(m.split.seconds),
            _sec(m.split.client_network_s),
            _sec(m.split.server_queue_s),
            _sec(m.split.prefill_s),
            _sec(m.split.decode_s),
            _sec(m.split.server_other_s),
        ]
        for m in server.models
    ]
    return lines + (_table(columns, rows, width, paint) if rows else [])


def _kv_cache(kv: KvCache, width: Optional[int], paint: _Painter) -> list[str]:
    average = "-" if kv.kv_cache_usage_avg is None else percent(kv.kv_cache_usage_avg)
    lines = _wrap(
        f"  over {kv.windows} idle windows ({_sec(kv.idle_s)} s) the server's KV cache was {average} "
        "in use on average: held by requests waiting on the tools below, not computing",
        width,
    )
    columns = [
        Column("TOOL", 0, left=True),
        Column("GPU IDLE BLAMED", 0),
        Column("CACHE HELD", 0),
        Column("CACHE-SECONDS", 1),
    ]
    rows = [
        [
            _name(t.tool, width),
            _sec(t.gpu_idle_blocked_s),
            "-" if t.kv_cache_held_share is None else percent(t.kv_cache_held_share),
            _sec(t.kv_cache_held_s),
        ]
        for t in kv.tools
    ]
    return lines + (_table(columns, rows, width, paint) if rows else [])


def _cost(cost: Cost, width: Optional[int], paint: _Painter) -> list[str]:
    money = money_text
    lines = _wrap(
        f"  idle {money(cost.idle_cost)}: blocked by tools {money(cost.idle_blocked_cost)}, "
        f"the model server {money(cost.idle_model_cost)}, "
        f"with no call in flight {money(cost.idle_unattributed_cost)}; at this load, per day: "
        f"{money(cost.idle_cost * cost.per_day_scale)} (prices: {visible(cost.source)})",
        width,
    )
    if cost.unpriced_gpus:
        lines += _wrap(f"  no price for GPU {', '.join(map(visible, cost.unpriced_gpus))}: not counted", width)
    columns = [
        Column("TOOL", 0, left=True),
        Column("GPU-HOURS", 0),
        Column("COST", 0),
        Column("GPU-HOURS/DAY", 1),
        Column("COST/DAY", 0),
    ]
    rows = [
        [
            _name(t.tool, width),
            f"{t.gpu_idle_blocked_gpu_hours:.3g}",
            money(t.gpu_idle_blocked_cost),
            f"{t.gpu_hours_per_day:.3g}",
            money(t.cost_per_day),
        ]
        for t in cost.tools
    ]
    return lines + (_table(columns, rows, width, paint) if rows else [])


def _table(columns: list[Column], rows: list[list[str]], width: Optional[int], paint: _Painter) -> list[str]:
    if not rows:
        return ["  none"]
    keep = list(range(len(columns)))

    def line_width(indexes: list[int]) -> int:
        return sum(max(len(columns[i].header), *(paint.visible_len(row[i]) for row in rows)) for i in indexes) + 2 * (
            len(indexes) - 1
        )

    while width and line_width(keep) > width - 1 and len(keep) > 1:
        drop = max(keep[1:], key=lambda i: (columns[i].priority, i))
        keep.remove(drop)
    sizes = {i: max(len(columns[i].header), *(paint.visible_len(row[i]) for row in rows)) for i in keep}

    def fmt(cells: list[str]) -> str:
        parts = []
        for i in keep:
            pad = " " * (sizes[i] - paint.visible_len(cells[i]))
            parts.append(cells[i] + pad if columns[i].left else pad + cells[i])
        return "  ".join(parts).rstrip()

    header = fmt([c.header for c in columns])
    return [paint(DIM, header)] + [fmt(row) for row in rows]


def _name(name: str, width: Optional[int]) -> str:
    name = visible(name)
    if width and len(name) > MAX_NAME:
        return name[: MAX_NAME - 1] + "…"
    return name


def visible(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (escape
    sequences that retitle or clear the screen, newlines, tabs), Unicode
    direction overrides and lone surrogates are shown as escapes
    (``\\x1b``, ``\\u202e``), never sent as they are."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _opt(seconds: Optional[float]) -> str:
    """Seconds known only with utilization samples: ``-`` without them."""
    return "-" if seconds is None else _sec(seconds)


def _sec(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:.0f}"
    if seconds >= 10:
        return f"{seconds:.1f}"
    return f"{seconds:.3f}"


class _Painter:
    """Wraps text in ANSI colour codes, or leaves it alone."""

    def __init__(self, colour: bool):
        self.colour = colour

    def __call__(self, code: str, text: str) -> str:
        return f"{code}{text}{RESET}" if self.colour else text

    def visible_len(self, text: str) -> int:
        if not self.colour:
            return len(text)
        for code in (BOLD, DIM, RED, YELLOW, CYAN, RESET):
            text = text.replace(code, "")
        return len(text)
