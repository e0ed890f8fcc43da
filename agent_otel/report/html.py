"""The report as one self-contained HTML page: a zoomable timeline of GPU
utilization and tool calls, beside the ranked tools and the recommendations.

Everything is inline (no network, no CDN): the data is embedded as JSON
and drawn on a <canvas> by a small script, so the page stays responsive
with 100,000 calls. The timeline shows, on one time axis, each GPU's
utilization with its idle windows shaded, then the agent turns (one lane),
one lane per model with its calls (a tick marks the first chunk of a
streamed answer), one lane per event loop with the stretches it was
blocked, then one lane per tool (ranked as in the table) with
every call drawn as its queue part (pale) and its exec part (solid), and
the idle time blamed on the call as a red strip under it. Wheel zooms
around the pointer, drag pans, double-click resets; hovering a call shows
its tool, call id, queue, exec, blamed idle and trace id, a model call its
duration, time to first chunk and tokens, a turn its parts. The side
panel breaks the turns down (client CPU where there is any, model, tool
queue, tool exec, other: the text report's parts) and says
per tool what it costs the GPU per call and what share of the end-to-end
latency it holds, then the recommendations; under the timeline, every
table of the text report with all its columns.

The page records how long it took to draw: ``data-first-render-ms`` on
<html> (since navigation start) and, when opened with ``#bench``,
``data-frame-ms-avg``/``-max`` over 30 redraws at different zooms.
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from typing import Iterable

from agent_otel.attribution import gpu_key
from agent_otel.records import GpuSample
from agent_otel.report.cost import money_text
from agent_otel.report.analysis import GPU_FROM_LOGS, GPU_FROM_TRACES, Analysis
from agent_otel.report.parts import Report, report_parts
from agent_otel.report.stats import assign_rows
from agent_otel.report.table import amount, percent
from agent_otel.report.turns import PARTS
from agent_otel.semconv import OUTCOMES

# Calls overlapping beyond this many rows share the last row of their lane.
MAX_ROWS = 12


def render(analysis: Analysis) -> str:
    """The page as a string."""
    report = report_parts(analysis)
    data = _timeline_data(analysis, report)
    script = resources.files("agent_otel.report").joinpath("timeline.js").read_text(encoding="utf-8")
    style = resources.files("agent_otel.report").joinpath("timeline.css").read_text(encoding="utf-8")
    what, when = report.run_name()
    title = f"agent-otel report: {what}" if what else "agent-otel report"
    simulated = report.simulated_gpus
    badge = (
        '<span class="badge simulated" title="the GPU data came from agent-otel\'s simulated GPU, '
        'not a real one">simulated GPU</span> '
        if simulated
        else ""
    )
    summary = (
        f"{badge}{html.escape(when)} &middot; {report.inputs.tool_calls} tool calls &middot; "
        f"{html.escape(_gpu_source(report, simulated))}"
    )
    warnings = "".join(f'<p class="warning">{html.escape(w)}</p>' for w in report.inputs.warnings)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{html.escape(title)} &middot; {html.escape(when)}</title>
<style>{style}</style>
</head>
<body>
<header>
<h1>{html.escape(title)}</h1>
<p class="summary">{summary}</p>
{warnings}
</header>
<main>
<section id="timeline-panel" aria-label="timeline">
<div class="legend" id="legend">
{_legend(report)}
<span class="help">wheel: zoom &middot; drag: pan &middot; double-click: reset</span>
</div>
<div id="timeline-wrap">
<div id="lane-labels"></div>
<canvas id="timeline"></canvas>
</div>
</section>
<aside id="side-panel">
{_turns_view(report)}
{_recommendations(report)}
</aside>
</main>
<div id="tables">
{_tools_table(report)}
{_loops_table(report)}
{_slos_table(report)}
{_models_table(report)}
{_model_server_table(report)}
{_gpus_table(report)}
{_kv_cache_table(report)}
{_cost_table(report)}
{_executors_table(report)}
</div>
<div id="tip" role="tooltip" hidden></div>
<script type="application/json" id="report-data">{_embed(data)}</script>
<script>{script}</script>
</body>
</html>
"""


# Every colour the timeline draws with, as the legend names it: (CSS class of
# the swatch, text). The colours themselves are CSS variables (--c-*) in
# timeline.css, which timeline.js reads: the legend and the canvas cannot drift.
LEGEND = (
    ("util", "GPU utilization (axis 0-100% on the GPU lane)"),
    ("unused", "GPU capacity unused while tool calls ran"),
    ("idle", "GPU idle window"),
    ("turn", "agent turn"),
    ("loop", "event loop blocked (by the tool named on hover)"),
    ("model", "model call"),
    ("model-failed", "model call failed"),
    ("first-chunk", "first chunk of a streamed answer"),
    ("queue", "tool call queued"),
    ("exec", "tool call executing"),
    ("blamed", "GPU idle blamed on the call"),
    ("error", "tool call ended in error or timeout"),
)
# The entries shown only when the page has the lanes that draw them.
_NEEDS = {
    "util": "gpus",
    "unused": "gpus",
    "idle": "gpus",
    "turn": "turns",
    "loop": "loops",
    "model": "models",
    "model-failed": "models",
    "first-chunk": "models",
}


def _legend(report: Report) -> str:
    present = {
        "gpus": bool(report.gpus),
        "turns": bool(report.turns.count),
        "models": bool(report.models),
        "loops": bool(report.event_loops),
    }
    return "\n".join(
        f'<span><i class="sw {name}"></i>{html.escape(text)}</span>'
        for name, text in LEGEND
        if present.get(_NEEDS.get(name, ""), True)
    )


def _gpu_source(report: Report, simulated: list) -> str:
    """Where the GPU data came from, for the header."""
    source = report.inputs.gpu_source
    if source == GPU_FROM_LOGS:
        text = "GPU utilization from " + ", ".join(
            os.path.basename(log.path) or log.path for log in report.inputs.gpu_logs
        )
    elif source == GPU_FROM_TRACES:
        text = "GPU idle windows from gpu.idle spans (no utilization curve)"
    else:
        text = "no GPU data"
    if simulated:
        text += f" (simulated GPU {', '.join(simulated)}: not a real GPU)"
    return text


def _embed(data: dict) -> str:
    # "<" escaped so no string in the data can close the <script> element.
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _timeline_data(analysis: Analysis, report: Report) -> dict:
    """Every record drawn (from the analysis), in the lanes of the report's parts."""
    origin = analysis.start_ns

    def ms(ns: int) -> float:
        return round((ns - origin) / 1e6, 3)

    blocked = analysis.blocked_by_call()
    lane_of = {tool.tool: index for index, tool in enumerate(report.tools)}
    calls = sorted(analysis.calls, key=lambda c: (lane_of[c.tool], c.submit_ns, c.start_ns))
    columns: dict[str, list] = {
        k: [] for k in ("lane", "row", "submit", "start", "end", "blocked", "id", "trace", "outcome")
    }
    traces: dict[int, int] = {}
    lanes = []
    position: dict[int, int] = {}
    first = 0
    for tool in report.tools:
        lane_calls = calls[first : first + tool.calls]
        rows = assign_rows([(c.submit_ns, c.end_ns) for c in lane_calls])
        for call, row in zip(lane_calls, rows):
            position[id(call)] = len(columns["lane"])
            columns["lane"].append(lane_of[tool.tool])
            columns["row"].append(min(row, MAX_ROWS - 1))
            columns["submit"].append(ms(call.submit_ns))
            columns["start"].append(ms(call.start_ns))
            columns["end"].append(ms(call.end_ns))
            columns["blocked"].append(round(blocked[id(call)], 6))
            columns["id"].append(call.call_id)
            columns["trace"].append(traces.setdefault(call.trace_id, len(traces)))
            columns["outcome"].append(OUTCOMES.index(call.outcome))
        lanes.append(
            {
                "tool": tool.tool,
                "rows": min(max(rows, default=0) + 1, MAX_ROWS),
                "first": first,
                "count": tool.calls,
                "blocked_s": tool.gpu_idle_blocked_s,
            }
        )
        first += tool.calls
    shares: dict[str, list] = {"call": [], "start": [], "end": []}
    for share in sorted(
        (s for a in analysis.attributions for s in a.shares if s.blocked_s > 0), key=lambda s: s.start_ns
    ):
        shares["call"].append(position[id(share.call)])
        shares["start"].append(ms(share.start_ns))
        shares["end"].append(ms(share.end_ns))
    gpus = []
    for gpu in report.gpus:
        samples: Iterable[GpuSample] = analysis.samples.get(gpu.gpu) or ()
        windows = [a for a in analysis.attributions if gpu_key(a.window) == gpu.gpu]
        curve = analysis.underuse.blocked_curve.get(gpu.gpu) if analysis.underuse is not None else None
        starts, ends, ratios = curve if curve is not None else ((), (), ())
        gpus.append(
            {
                "gpu": gpu.gpu,
                "simulated": gpu.simulated,
                "t": [ms(s.timestamp_ns) for s in samples],
                "u": [round(s.utilization, 4) for s in samples],
                # Per stretch: the share of capacity unused while tool calls were in flight.
                "unused": {"start": [ms(t) for t in starts], "end": [ms(t) for t in ends], "blamed": list(ratios)},
                "idle": {
                    "start": [ms(a.window.start_ns) for a in windows],
                    "end": [ms(a.window.end_ns) for a in windows],
                    "blocked_by": [a.blocked_by for a in windows],
                    "unattributed": [round(a.unattributed_s, 6) for a in windows],
                },
            }
        )
    return {
        "seconds": analysis.seconds,
        "outcomes": list(OUTCOMES),
        "turns": _turn_data(analysis, ms),
        "models": _model_data(analysis, report, ms),
        "loops": _loop_data(analysis, report, ms),
        "lanes": lanes,
        "calls": columns,
        "traces": [f"{trace_id:032x}" for trace_id in traces],
        "shares": shares,
        "gpus": gpus,
    }


def _turn_data(analysis: Analysis, ms) -> dict:
    """The turns, in one lane, by start; rows keep overlapping turns apart."""
    turns = sorted(analysis.turns, key=lambda t: t.start_ns)
    rows = assign_rows([(t.start_ns, t.end_ns) for t in turns])
    return {
        "rows": min(max(rows, default=0) + 1, MAX_ROWS),
        "start": [ms(t.start_ns) for t in turns],
        "end": [ms(t.end_ns) for t in turns],
        "row": [min(row, MAX_ROWS - 1) for row in rows],
        "name": [t.name for t in turns],
        "parts": [[round(getattr(t, f"{part}_s"), 6) for part in PARTS] for t in turns],  # timeline.js: in this order
        "trace": [f"{t.trace_id:032x}" for t in turns],
    }


def _loop_data(analysis: Analysis, report: Report, ms) -> list[dict]:
    """One lane per event loop (by its thread, most blocked first, as the
    event-loop table), its blocks by start: the tool that held the loop
    (None: code that is no tool) and how many calls waited for it."""
    blocks: dict[str, list] = {}
    for block in analysis.loop_blocks:
        blocks.setdefault(block.thread, []).append(block)
    lanes = []
    for loop in report.event_loops:
        mine = sorted(blocks.get(loop.thread, ()), key=lambda b: b.start_ns)
        lanes.append(
            {
                "thread": loop.thread,
                "blocked_s": loop.blocked_s,
                "start": [ms(b.start_ns) for b in mine],
                # a loop still blocked at the end of the traces: to the end of the window
                "end": [ms(b.end_ns or analysis.end_ns) for b in mine],
                "tool": [b.tool for b in mine],
                "waiting": [len(b.waiting) for b in mine],
            }
        )
    return lanes


def _model_data(analysis: Analysis, report: Report, ms) -> dict:
    """One lane per model (in the order of the models table), the calls as columns."""
    lane_of = {stats.model: index for index, stats in enumerate(report.models)}
    calls = sorted(analysis.model_calls, key=lambda c: (lane_of[c.model], c.start_ns))
    columns: dict[str, list] = {k: [] for k in ("row", "start", "end", "first", "input", "output", "failed")}
    lanes = []
    first = 0
    for stats in report.models:
        lane_calls = calls[first : first + stats.calls]
        rows = assign_rows([(c.start_ns, c.end_ns) for c in lane_calls])
        for call, row in zip(lane_calls, rows):
            columns["row"].append(min(row, MAX_ROWS - 1))
            columns["start"].append(ms(call.start_ns))
            columns["end"].append(ms(call.end_ns))
            columns["first"].append(None if call.first_chunk_s is None else round(call.first_chunk_s * 1000, 3))
            columns["input"].append(call.input_tokens)
            columns["output"].append(call.output_tokens)
            columns["failed"].append(call.failed)
        lanes.append(
            {
                "model": stats.model,
                "rows": min(max(rows, default=0) + 1, MAX_ROWS),
                "first": first,
                "count": stats.calls,
                "seconds": stats.seconds,
            }
        )
        first += stats.calls
    return {"lanes": lanes, "calls": columns}


def _cell(value: object, digits: int | None = None) -> str:
    """A right-aligned number cell; ``digits`` is at most the decimals of a
    float (fewer for large values, so a million calls' seconds still fit)."""
    text = _number(value, digits) if digits is not None else str(value)  # type: ignore[arg-type]
    return f'<td class="num">{html.escape(text)}</td>'


def _number(value: float, digits: int) -> str:
    """``digits`` decimals below 10, one below 1000, none above: 4 significant figures or so."""
    if abs(value) >= 1000:
        digits = 0
    elif abs(value) >= 10:
        digits = min(digits, 1)
    return f"{value:.{digits}f}"


def _known_cell(value: float | None, digits: int) -> str:
    """A number known only with utilization samples: ``-`` without them."""
    return _cell("-") if value is None else _cell(value, digits)


def _tools_table(report: Report) -> str:
    """Every column of the text table's tools section, ranked as it is."""
    rows = []
    tools = report.tools
    known = report.underuse_known
    loops = any(t.loop_blocks for t in tools)
    cpu = any(t.exec_cpu_share is not None for t in tools)
    total = max((t.gpu_idle_blocked_s for t in tools), default=0.0) or 1.0
    for rank, t in enumerate(tools, start=1):
        queue_pc = 100 * t.gpu_idle_blocked_queue_s / total
        exec_pc = 100 * t.gpu_idle_blocked_exec_s / total
        bar = (
            f'<span class="bar"><span class="q" style="width:{queue_pc:.1f}%"></span>'
            f'<span class="e" style="width:{exec_pc:.1f}%"></span></span>'
        )
        unused = t.gpu_underused_blocked_s
        share, kind = t.exec_cpu_share, t.wait_kind
        rows.append(
            f'<tr data-tool="{html.escape(t.tool, quote=True)}">'
            f'{_cell(rank)}<td class="name">{html.escape(t.tool)}</td>'
            f"{_known_cell(unused, 3)}"
            f"{_cell(t.gpu_idle_blocked_s, 3)}"
            f'<td class="split">{bar}<span class="split-text">{_number(t.gpu_idle_blocked_queue_s, 3)} / '
            f"{_number(t.gpu_idle_blocked_exec_s, 3)}</span></td>"
            f"{_cell(t.calls)}{_cell(t.errors)}{_cell(t.duration_p50_s, 3)}{_cell(t.duration_p95_s, 3)}"
            f"{_cell(t.duration_p99_s, 3)}{_cell(t.queue_p95_s, 3)}{_cell(t.exec_p95_s, 3)}"
            + (_cell(t.loop_blocked_s if t.loop_blocks else 0.0, 3) if loops else "")
            + (_cell("-" if share is None else f"{share:.0%}" + (f" {kind}" if kind else "")) if cpu else "")
            + "</tr>"
        )
    columns = 13 + loops + cpu
    body = "".join(rows) or f'<tr><td colspan="{columns}">no tool calls</td></tr>'
    title = "Tools, by GPU capacity they left unused" if known else "Tools, by GPU idle time they blocked"
    return (
        f'<section id="tools"><h2>{title}</h2><table id="tools-table"><thead><tr>'
        '<th>#</th><th>tool</th><th title="GPU-seconds of capacity unused while its calls were in flight, by the '
        'attribution rule (needs a GPU log)">unused s</th><th title="GPU-seconds">blocked idle s</th>'
        "<th>queue / exec s</th><th>calls</th><th>errors</th><th>p50 s</th><th>p95 s</th><th>p99 s</th>"
        "<th>queue p95 s</th><th>exec p95 s</th>"
        + (
            '<th title="seconds its calls blocked an asyncio event loop (asyncio.loop.blocked spans)">'
            "loop blocked s</th>"
            if loops
            else ""
        )
        + ('<th title="share of its exec time on the CPU, and its kind of wait">CPU</th>' if cpu else "")
        + f"</tr></thead><tbody>{body}</tbody></table></section>"
    )


def _loops_table(report: Report) -> str:
    """The event loops, most blocked first, and what blocked them (the text table's)."""
    if not report.event_loops:
        return ""
    rows = "".join(
        f'<tr data-loop="{html.escape(loop.thread, quote=True)}"><td class="name">{html.escape(loop.thread)}</td>'
        f"{_cell(loop.blocks)}{_cell(loop.blocked_s, 3)}{_cell(loop.longest_s, 3)}"
        f'<td class="by">'
        + ", ".join(f"{html.escape(by.tool)} {_number(by.blocked_s, 3)}" for by in loop.by_tool)
        + "</td></tr>"
        for loop in report.event_loops
    )
    return (
        '<section id="loops"><h2>Event loops, by time blocked (asyncio.loop.blocked spans)</h2>'
        '<table id="loops-table"><thead><tr><th>thread</th><th>blocks</th><th>blocked s</th><th>longest s</th>'
        f"<th>blocked by (s)</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _slos_table(report: Report) -> str:
    """Each tool's latency SLO compliance, the tools that break it first."""
    if not report.slos:
        return ""
    rows = []
    for s in report.slos:
        slo = f"{s.objective * 100:.6g}% within {s.threshold_s:g} s" + ("" if s.on_bucket_bound else " *")
        verdict = '<td class="ok">met</td>' if s.met else '<td class="breaks">breaks</td>'
        row_class = "" if s.met else ' class="breaks"'
        compliance, spent = f"{s.compliance:.1%}", f"{s.budget_spent:.0%}"
        rows.append(
            f'<tr data-slo-tool="{html.escape(s.tool, quote=True)}"{row_class}>'
            f'<td class="name">{html.escape(s.tool)}</td><td>{slo}</td>'
            f"{_cell(compliance)}{verdict}{_cell(s.calls)}{_cell(s.over)}{_cell(spent)}</tr>"
        )
    note = (
        '<p class="note">* not a bound of the duration histograms: measured exactly here, but the alert rules '
        "cannot alert on it (docs/dashboards.md#latency-slos)</p>"
        if not all(s.on_bucket_bound for s in report.slos)
        else ""
    )
    return (
        '<section id="slos"><h2>Latency SLOs, breaking first</h2><table id="slo-table"><thead><tr>'
        '<th>tool</th><th title="objective of its calls within the threshold (request to result)">SLO</th>'
        '<th title="share of its calls within the threshold">compliance</th><th></th><th>calls</th>'
        '<th title="calls over the threshold">over</th>'
        '<th title="calls over the threshold against the error budget (1 - objective)">budget spent</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>{note}</section>"
    )


def _turns_view(report: Report) -> str:
    turns = report.turns
    if not turns.count:
        return '<section id="turns"><h2>Turns</h2><p>no tool or model calls in the traces</p></section>'
    total = turns.end_to_end_s or 1.0
    parts = [
        ("client CPU", turns.client_cpu_s, "cpu"),
        ("model", turns.model_s, "model"),
        ("tool queue", turns.tool_queue_s, "q"),
        ("tool exec", turns.tool_exec_s, "e"),
        ("other", turns.other_s, "other"),
    ]
    # as the text report: client CPU only where the client blocked its loop at all
    parts = [part for part in parts if part[1] or part[2] != "cpu"]
    bar = "".join(
        f'<span class="{css}" style="width:{100 * seconds / total:.1f}%" title="{label}: {seconds:.3f} s"></span>'
        for label, seconds, css in parts
    )
    legend = "".join(
        f'<tr data-part="{css}"><td><span class="sw {css}"></span>{label}</td>{_cell(seconds, 3)}'
        f"{_cell(f'{100 * seconds / total:.0f} %')}</tr>"
        for label, seconds, css in parts
    )
    source = f"{turns.from_agent_spans} from invoke_agent spans" if turns.from_agent_spans else "from traces"
    # the text report's sentences, word for word
    sentences = "".join(
        f'<li data-tool="{html.escape(t.tool, quote=True)}"><b>{html.escape(t.tool)}</b> idles the GPU '
        f"{amount(t.gpu_idle_blocked_per_call_s)} s per call ({amount(t.gpu_idle_blocked_s)} s blamed over "
        f"{t.calls} call{'s' if t.calls != 1 else ''}), in flight for {percent(t.latency_share)} of the "
        "turns' time</li>"
        for t in report.tools
        if t.latency_share is not None and (t.latency_share or t.gpu_idle_blocked_s)
    )
    return (
        f'<section id="turns"><h2>Turns: where the end-to-end time went</h2>'
        f"<p>{turns.count} turn{'s' if turns.count != 1 else ''} ({source}), {turns.end_to_end_s:.1f} s end "
        f"to end; per turn p50 {turns.end_to_end_p50_s:.3f} s, p95 {turns.end_to_end_p95_s:.3f} s</p>"
        f'<div class="bar turn-bar">{bar}</div>'
        f'<table id="turns-table"><tbody>{legend}</tbody></table>'
        f'<ul id="tool-costs">{sentences}</ul></section>'
    )


def _models_table(report: Report) -> str:
    if not report.models:
        return ""
    rows = "".join(
        f'<tr data-model="{html.escape(m.model, quote=True)}"><td class="name">{html.escape(m.model)}</td>'
        f"{_cell(m.calls)}{_cell(m.seconds, 3)}{_cell(m.duration_p50_s, 3)}{_cell(m.duration_p95_s, 3)}"
        + (_cell(m.time_to_first_chunk_p50_s, 3) if m.time_to_first_chunk_p50_s is not None else _cell("-"))
        + _cell("-" if m.input_tokens is None else m.input_tokens)
        + _cell("-" if m.output_tokens is None else m.output_tokens)
        + _cell(m.errors)
        + _cell(m.gpu_idle_blocked_s, 3)
        + "</tr>"
        for m in report.models
    )
    return (
        '<section id="models"><h2>Models</h2><table id="models-table"><thead><tr><th>model</th><th>calls</th>'
        "<th>s</th><th>p50 s</th><th>p95 s</th><th>first chunk p50 s</th><th>in tokens</th><th>out tokens</th>"
        '<th>errors</th><th title="GPU idle while its calls were in flight: the model server\'s share">GPU idle s</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>{_model_server(report)}</section>"
    )


def _model_server(report: Report) -> str:
    """The text report's sentence per model the GPU idled on, word for word."""
    items = "".join(
        f'<li data-model="{html.escape(m.model, quote=True)}">the model server idles the GPU '
        f"{amount(m.gpu_idle_blocked_s)} s while <b>{html.escape(m.model)}</b> calls are in flight "
        f"({amount(m.gpu_idle_blocked_queued_s)} s before their first token, "
        f"{amount(m.gpu_idle_blocked_decode_s)} s streaming)</li>"
        for m in report.models
        if m.gpu_idle_blocked_s
    )
    return f'<ul id="model-server">{items}</ul>' if items else ""


def _recommendations(report: Report) -> str:
    items = "".join(
        f'<li data-kind="{html.escape(r.kind, quote=True)}"><span class="kind">{html.escape(r.kind)}</span> '
        f"{html.escape(r.message)}"
        + (f'<pre class="remedy">{html.escape(r.remedy)}</pre>' if r.remedy else "")
        + "</li>"
        for r in report.recommendations
    )
    body = (
        f'<ul id="recommendations">{items}</ul>'
        if items
        else '<p id="recommendations">none: the data shows nothing to change</p>'
    )
    return f"<section><h2>Recommendations</h2>{body}</section>"


def _gpus_table(report: Report) -> str:
    if not report.gpus:
        return (
            "<section><h2>GPUs</h2><p>no gpu.idle spans in the traces and no GPU log: "
            "the GPU was never idle, or was not sampled</p></section>"
        )
    rows = "".join(
        f'<tr><td class="name">{html.escape(g.gpu)}'
        + (' <span class="badge simulated">simulated</span>' if g.simulated else "")
        + f"</td>{_cell(g.busy_s, 1)}{_cell(g.idle_s, 1)}"
        f"{_cell(g.idle_blocked_s, 1)}{_cell(g.idle_model_s, 1)}{_cell(g.idle_unattributed_s, 1)}"
        + _cell("-" if g.utilization_avg is None else f"{g.utilization_avg:.0%}")
        + f"{_known_cell(g.underused_s, 1)}{_known_cell(g.underused_blocked_s, 1)}"
        f"{_known_cell(g.missing_s, 1)}</tr>"
        for g in report.gpus
    )
    return (
        '<section id="gpus"><h2>GPUs</h2><table id="gpus-table"><thead><tr><th>gpu</th><th>busy s</th><th>idle s</th>'
        '<th>blocked s</th><th title="idle while a model call was in flight: the model server\'s share">'
        "model server s</th><th>unattributed s</th>"
        '<th>util avg</th><th title="(1 - utilization) x time">unused s</th>'
        '<th>unused by tools s</th><th title="samples lost: neither idle nor busy">missing s</th>'
        f"</tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _model_server_table(report: Report) -> str:
    """The model calls split by the model servers' own spans; nothing without them."""
    server = report.model_server
    if server is None:
        return ""
    rows = "".join(
        f'<tr><td class="name">{html.escape(m.model)}</td>{_cell(m.split.model_calls)}{_cell(m.split.seconds, 3)}'
        f"{_cell(m.split.client_network_s, 3)}{_cell(m.split.server_queue_s, 3)}{_cell(m.split.prefill_s, 3)}"
        f"{_cell(m.split.decode_s, 3)}{_cell(m.split.server_other_s, 3)}</tr>"
        for m in server.models
    )
    return (
        "<section><h2>Model calls at the server</h2>"
        f"<p>{server.totals.model_calls} model calls joined to {server.requests} server spans "
        f"(by parent {server.joined_by_parent}, by trace and time {server.joined_by_time}; "
        f"{server.unjoined} unjoined)</p>"
        '<table id="model-server-table"><thead><tr><th>model</th><th>calls</th><th>s</th>'
        '<th title="the call less the server\'s time">client + network s</th><th>server queue s</th>'
        "<th>prefill s</th><th>decode s</th><th>server other s</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _kv_cache_table(report: Report) -> str:
    """The model server's KV cache held per tool while the GPU idled; nothing without the server's readings."""
    kv = report.kv_cache
    if kv is None:
        return ""
    rows = "".join(
        f'<tr><td class="name">{html.escape(t.tool)}</td>{_cell(t.gpu_idle_blocked_s, 3)}'
        + (_cell("-") if t.kv_cache_held_share is None else _cell(100 * t.kv_cache_held_share, 1))
        + f"{_cell(t.kv_cache_held_s, 3)}</tr>"
        for t in kv.tools
    )
    average = "-" if kv.kv_cache_usage_avg is None else f"{100 * kv.kv_cache_usage_avg:.0f}%"
    return (
        "<section><h2>KV cache held while tools ran</h2>"
        f"<p>over {kv.windows} idle windows the model server's KV cache was {average} in use on average: "
        "GPU memory held by requests waiting on the tools below</p>"
        '<table id="kv-cache-table"><thead><tr><th>tool</th><th>GPU idle blamed s</th>'
        '<th title="the share of the cache in use while it blocked the idle GPU">cache held %</th>'
        f"<th>cache-seconds</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _cost_table(report: Report) -> str:
    """The blamed idle time as money, with gpu_hour_price; nothing without it."""
    cost = report.cost
    if cost is None:
        return ""
    rows = "".join(
        f'<tr><td class="name">{html.escape(t.tool)}</td>{_cell(t.gpu_idle_blocked_gpu_hours, 3)}'
        f'<td class="num">{html.escape(money_text(t.gpu_idle_blocked_cost))}</td>'
        f'{_cell(t.gpu_hours_per_day, 2)}<td class="num">{html.escape(money_text(t.cost_per_day))}</td></tr>'
        for t in cost.tools
    )
    unpriced = (
        f"<p>no price for GPU {html.escape(', '.join(cost.unpriced_gpus))}: not counted</p>"
        if cost.unpriced_gpus
        else ""
    )
    return (
        '<section><h2>What the GPU idle time costs</h2><p class="cost">'
        f"idle {html.escape(money_text(cost.idle_cost))}: blocked by tools "
        f"{html.escape(money_text(cost.idle_blocked_cost))}, the model server "
        f"{html.escape(money_text(cost.idle_model_cost))}, with no call in flight "
        f"{html.escape(money_text(cost.idle_unattributed_cost))}; at this load, per day "
        f"{html.escape(money_text(cost.idle_cost * cost.per_day_scale))}</p>"
        f'<p class="source">prices: {html.escape(cost.source)}</p>{unpriced}'
        '<table id="cost-table"><thead><tr><th>tool</th><th>GPU-hours</th><th>cost</th>'
        "<th>GPU-hours a day</th><th>cost a day</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )


def _executors_table(report: Report) -> str:
    if not report.executors:
        return ""
    rows = "".join(
        f'<tr><td class="name">{html.escape(e.executor)}</td>{_cell(e.submissions)}'
        f"{_cell(e.wait_p95_s, 3)}{_cell(e.queued_calls)}{_cell(e.max_queue_depth)}"
        f"{_cell(e.max_concurrent_exec)}{_cell(e.peak_in_flight)}"
        f"{_cell('?' if e.max_workers is None else e.max_workers)}</tr>"
        for e in report.executors
    )
    return (
        '<section id="executors"><h2>Executors</h2><table id="executors-table"><thead><tr><th>executor</th>'
        '<th>calls</th><th>wait p95 s</th><th title="calls that waited 10 ms or more for a worker">queued</th>'
        "<th>max queued</th><th>max running</th><th>peak in flight</th><th>max workers</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></section>"
    )
