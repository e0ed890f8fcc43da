"""Dashboard "Agent tools vs GPU": which tool calls leave the GPU idle.

Utilization and idle windows per GPU on top, then the idle time each
tool (and phase: queued for a worker, or executing) is blamed for, the
model server's share beside the tools', the idle time nobody is blamed for, the GPU capacity left unused (idle or
partly busy) and who is blamed for it, the calls in flight, and a ranking.
"""

from __future__ import annotations

from agent_otel.config import DEFAULTS
from agent_otel.semconv import (
    LABEL_KIND,
    METRIC_GPU_IDLE,
    METRIC_GPU_HOUR_PRICE,
    METRIC_GPU_IDLE_BLOCKED,
    METRIC_GPU_IDLE_MODEL,
    METRIC_GPU_IDLE_KV_CACHE_HELD,
    METRIC_GPU_IDLE_UNATTRIBUTED,
    METRIC_GPU_UNDERUSED,
    METRIC_GPU_UNDERUSED_BLOCKED,
    METRIC_GPU_UNDERUSED_UNATTRIBUTED,
    METRIC_GPU_UTILIZATION,
    METRIC_LOOP_BLOCKED,
    METRIC_LOOP_LAG,
    METRIC_SERVER_KV_CACHE,
    METRIC_SERVER_RUNNING,
    METRIC_SERVER_WAITING,
    METRIC_SPANS_DROPPED,
    METRIC_TOOL_CALLS,
    METRIC_TOOL_INFLIGHT,
    PHASE_EXEC,
    PHASE_QUEUE,
)
from dashboards.panels import (
    BAD,
    GOOD,
    RANGE,
    RATE,
    WARN,
    common,
    datasource_variables,
    jaeger_search_link,
    label_variable,
    new_dashboard,
    query,
    selector,
    stat_panel,
    state_timeline_panel,
    table_panel,
    target_variables,
    thresholds,
    timeseries_panel,
)
from dashboards.slo import format_percent

UID = "agent-otel-tools-gpu"
# Utilization at or below this shades the utilization panel (the toolkit's
# default idle threshold).
IDLE_SHADE = DEFAULTS.gpu_idle_threshold

GPU = selector('gpu=~"$gpu"')
TOOL = selector('tool=~"$tool"')
GPU_TOOL = selector('gpu=~"$gpu"', 'tool=~"$tool"')
# Idle seconds over the range; "> 0" leaves the shares empty, not 0/0,
# when no GPU idled at all.
IDLE_TOTAL = f"(sum(increase({METRIC_GPU_IDLE}{GPU}[{RANGE}])) > 0)"


def blamed(phase: str | None = None) -> str:
    matchers = GPU_TOOL if phase is None else selector('gpu=~"$gpu"', 'tool=~"$tool"', f'phase="{phase}"')
    return f"sum by (tool) (increase({METRIC_GPU_IDLE_BLOCKED}{matchers}[{RANGE}]))"


# Each GPU's blamed idle seconds priced at its own agent_gpu_hour_price (the
# gpu_hour_price setting, exported by the process that blames it): without a
# price there is no such series, and the cost panels stay empty.
PRICED = f"* on (job, instance, gpu) group_left () {METRIC_GPU_HOUR_PRICE}"


def cost(window: str) -> str:
    """Money per tool: over the range (``increase``), or per hour (``rate``) with ``RATE``."""
    if window == RANGE:
        return f"sum by (tool) (increase({METRIC_GPU_IDLE_BLOCKED}{GPU_TOOL}[{RANGE}]) {PRICED}) / 3600"
    return f"sum by (tool) (rate({METRIC_GPU_IDLE_BLOCKED}{GPU_TOOL}[{window}]) {PRICED})"


def unused(phase: str | None = None) -> str:
    matchers = GPU_TOOL if phase is None else selector('gpu=~"$gpu"', 'tool=~"$tool"', f'phase="{phase}"')
    return f"sum by (tool) (increase({METRIC_GPU_UNDERUSED_BLOCKED}{matchers}[{RANGE}]))"


def build():
    overview = [
        stat_panel(
            "GPU utilization",
            "Mean utilization of the selected GPUs right now (share of time a kernel ran).",
            "percentunit",
            query(f"avg({METRIC_GPU_UTILIZATION}{GPU})", "utilization", "A"),
            thresholds(BAD, (0.3, WARN), (0.6, GOOD)),
        ),
        stat_panel(
            "Idle time blocked by tools",
            "Share of the GPUs' idle time over the dashboard range during which at least one tool call was in flight.",
            "percentunit",
            query(
                f"sum(increase({METRIC_GPU_IDLE_BLOCKED}{GPU}[{RANGE}])) / {IDLE_TOTAL}",
                "blocked",
                "A",
            ),
            thresholds(GOOD, (0.2, WARN), (0.5, BAD)),
        ),
        stat_panel(
            "Idle time with no tool in flight",
            "Share of the GPUs' idle time over the dashboard range with neither a tool call nor a model call in flight "
            "(the agent itself, or calls agent-otel does not see).",
            "percentunit",
            query(
                f"sum(increase({METRIC_GPU_IDLE_UNATTRIBUTED}{GPU}[{RANGE}])) / {IDLE_TOTAL}",
                "unattributed",
                "A",
            ),
            thresholds(GOOD, (0.2, WARN), (0.5, BAD)),
        ),
        stat_panel(
            "Tool calls in flight",
            "Tool calls queued or executing right now.",
            "short",
            # The gauge has no series while nothing is in flight: show 0, not "No data".
            query(f"sum({METRIC_TOOL_INFLIGHT}{TOOL}) or vector(0)", "in flight", "A"),
            thresholds(GOOD),
        ),
    ]
    panels = [
        *overview,
        timeseries_panel(
            "GPU utilization per GPU",
            f"Utilization per GPU (0-100%). The red band marks utilization at or below {format_percent(IDLE_SHADE)}: the idle windows.",
            "percentunit",
            [query(f"avg by (gpu) ({METRIC_GPU_UTILIZATION}{GPU})", "GPU {{gpu}}", "A")],
            steps=thresholds("red", (IDLE_SHADE, "transparent")),
            threshold_style=common.GraphThresholdsStyleMode.AREA,
            min_value=0,
            max_value=1,
        ),
        state_timeline_panel(
            "GPU idle windows",
            f"Per GPU: red while most of the time was idle (from {METRIC_GPU_IDLE}).",
            query(f"sum by (gpu) (rate({METRIC_GPU_IDLE}{GPU}[{RATE}]))", "GPU {{gpu}}", "A"),
            thresholds(GOOD, (0.5, BAD)),
            width=12,
            height=8,
        ),
        timeseries_panel(
            "GPU idle blamed per tool and phase",
            "Idle GPU time attributed to each tool call in flight, split by phase: queue (waiting for an executor worker) "
            "or exec (running). 100% = one GPU fully idle because of that tool.",
            "percentunit",
            [
                query(
                    f"sum by (tool, phase) (rate({METRIC_GPU_IDLE_BLOCKED}{GPU_TOOL}[{RATE}]))",
                    "{{tool}} ({{phase}})",
                    "A",
                )
            ],
            stacked=True,
        ),
        timeseries_panel(
            "GPU idle: the model server vs the tools",
            "Idle GPU time while model calls of the GPU's pool were in flight (the model server's share, by model and "
            "phase: queued before the first token, decode while streaming) beside the idle time blamed on tool calls. "
            "A model call in flight takes the instant from the tools (docs/attribution.md): a growing model-server "
            "series means the server stalls (queued requests, preemption, tokenizing, the network), a growing tools "
            "series that tools block the GPU. 100% = one GPU fully idle.",
            "percentunit",
            [
                query(
                    f"sum by (model, phase) (rate({METRIC_GPU_IDLE_MODEL}{GPU}[{RATE}]))",
                    "model server: {{model}} ({{phase}})",
                    "A",
                ),
                query(f"sum(rate({METRIC_GPU_IDLE_BLOCKED}{GPU}[{RATE}]))", "tools", "B"),
            ],
            stacked=True,
        ),
        timeseries_panel(
            "Unattributed GPU idle",
            "Idle GPU time with neither a model call nor a tool call in flight, per GPU.",
            "percentunit",
            [
                query(
                    f"sum by (gpu) (rate({METRIC_GPU_IDLE_UNATTRIBUTED}{GPU}[{RATE}]))",
                    "GPU {{gpu}}",
                    "A",
                )
            ],
        ),
        timeseries_panel(
            "Unused GPU capacity blamed per tool and phase",
            "GPU capacity left unused, (1 - utilization) x time, while each tool's calls were in flight, split by "
            "phase. Unlike idle time it counts partial dips too: a GPU at 30% while a tool runs leaves 70% unused. "
            "Grows while a stall lasts. 100% = one GPU's whole capacity.",
            "percentunit",
            [
                query(
                    f"sum by (tool, phase) (rate({METRIC_GPU_UNDERUSED_BLOCKED}{GPU_TOOL}[{RATE}]))",
                    "{{tool}} ({{phase}})",
                    "A",
                )
            ],
            stacked=True,
        ),
        timeseries_panel(
            "Unused GPU capacity per GPU",
            "Per GPU: capacity left unused, (1 - utilization) x time, and the part of it with no tool call in flight. "
            "The gap between the two is what tools are blamed for.",
            "percentunit",
            [
                query(f"sum by (gpu) (rate({METRIC_GPU_UNDERUSED}{GPU}[{RATE}]))", "GPU {{gpu}} unused", "A"),
                query(
                    f"sum by (gpu) (rate({METRIC_GPU_UNDERUSED_UNATTRIBUTED}{GPU}[{RATE}]))",
                    "GPU {{gpu}} unused, no tool in flight",
                    "B",
                ),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Event loop blocked, by tool",
            "Share of the time the agent's asyncio event loop was blocked, by the tool call that held it (unknown: "
            "code that is no tool). While it is blocked no coroutine runs: no tool result is read, no model call "
            "is sent, and the GPU idle time goes to the blocking call. 100% = a loop blocked all the time.",
            "percentunit",
            [query(f"sum by (tool) (rate({METRIC_LOOP_BLOCKED}{TOOL}[{RATE}]))", "{{tool}}", "A")],
            stacked=True,
            min_value=0,
        ),
        timeseries_panel(
            "Event loop lag",
            "Per event loop (by its thread): how late its heartbeat ran, and while it is blocked, for how long so "
            f"far. Above the line ({DEFAULTS.loop_block_threshold:g} s, the default block threshold) the loop is "
            "recorded as blocked.",
            "s",
            [query(f"max by (thread) ({METRIC_LOOP_LAG}{selector()})", "{{thread}}", "A")],
            steps=thresholds("transparent", (DEFAULTS.loop_block_threshold, "red")),
            threshold_style=common.GraphThresholdsStyleMode.LINE,
            min_value=0,
        ),
        timeseries_panel(
            "Tool calls in flight",
            "Tool calls waiting for a worker (queue) or running (exec), per tool.",
            "short",
            [query(f"sum by (tool, phase) ({METRIC_TOOL_INFLIGHT}{TOOL})", "{{tool}} ({{phase}})", "A")],
            stacked=True,
            width=24,
        ),
        table_panel(
            "Tools ranked by GPU capacity left unused",
            "Over the dashboard range: GPU-seconds of capacity left unused while each tool's calls were in flight "
            "(idle or partly busy; the report ranks tools the same way), the GPU idle seconds blamed on it, split "
            "by phase, and its call count. The top rows are where a faster tool, a bigger pool or overlapping "
            "work pays off most.",
            [
                query(unused(), "", "E", table_format=True),
                query(blamed(), "", "A", table_format=True),
                query(blamed(PHASE_QUEUE), "", "B", table_format=True),
                query(blamed(PHASE_EXEC), "", "C", table_format=True),
                query(f"sum by (tool) (increase({METRIC_TOOL_CALLS}{TOOL}[{RANGE}]))", "", "D", table_format=True),
            ],
            columns={
                "tool": "Tool",
                "Value #E": "GPU capacity unused",
                "Value #A": "GPU idle blamed",
                "Value #B": "while queued",
                "Value #C": "while executing",
                "Value #D": "Calls",
            },
            sort_by="GPU capacity unused",
            units={
                "GPU capacity unused": "s",
                "GPU idle blamed": "s",
                "while queued": "s",
                "while executing": "s",
                "Calls": "short",
            },
            # GPU-seconds over the range: a minute is worth a look, five minutes a fix.
            steps=thresholds(GOOD, (60, WARN), (300, BAD)),
        ),
        timeseries_panel(
            "Model server: requests running and queued",
            "Where a model server's metrics are read (model_server_metrics, docs/model-servers.md): the requests "
            "it runs and the requests queued at it, at each scrape. An idle GPU with requests queued is the server "
            "stalling, not a tool.",
            "short",
            [
                query(f"sum by (server) ({METRIC_SERVER_RUNNING}{selector()})", "{{server}} running", "A"),
                query(f"sum by (server) ({METRIC_SERVER_WAITING}{selector()})", "{{server}} queued", "B"),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "KV cache held while tools block the GPU",
            "Per tool: the share of the model server's KV cache (GPU memory) in use while the GPU idled with the "
            "tool's calls in flight, weighted by the idle time blamed on it: memory held by requests waiting on "
            "that tool, which limits how many requests the server can run. 100% = the whole cache, all the time. "
            "Next to it, the share of the cache in use.",
            "percentunit",
            [
                query(f"sum by (tool) (rate({METRIC_GPU_IDLE_KV_CACHE_HELD}{GPU_TOOL}[{RATE}]))", "{{tool}}", "A"),
                query(f"max by (server) ({METRIC_SERVER_KV_CACHE}{selector()})", "{{server}} in use", "B"),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Cost of GPU idle blamed per tool",
            "What the GPU idle time blamed on each tool costs, per hour of wall time, at each GPU's price per "
            "GPU-hour (gpu_hour_price, docs/report.md). Empty when no price is set.",
            "currencyUSD",
            [query(cost(RATE), "{{tool}}", "A")],
            stacked=True,
            min_value=0,
        ),
        table_panel(
            "Cost of GPU idle per tool over the range",
            "Over the dashboard range: the GPU idle time blamed on each tool, priced at each GPU's price per "
            "GPU-hour (gpu_hour_price). Empty when no price is set.",
            [query(cost(RANGE), "", "A", table_format=True)],
            columns={"tool": "Tool", "Value #A": "Cost of GPU idle"},
            sort_by="Cost of GPU idle",
            units={"Cost of GPU idle": "currencyUSD"},
            steps=thresholds(GOOD, (10, WARN), (100, BAD)),
            width=12,
        ),
        stat_panel(
            "Spans dropped by the toolkit",
            "Spans no sink could take over the dashboard range (export queue full or exporter down), by kind: "
            "tool (execute_tool spans: calls missing from the traces), derived (per-call gpu.idle children, "
            "dropped first when the queue is full), other.",
            "short",
            query(
                f"sum by ({LABEL_KIND}) (increase({METRIC_SPANS_DROPPED}{selector()}[{RANGE}]))",
                f"{{{{{LABEL_KIND}}}}}",
                "A",
            ),
            thresholds(GOOD, (1, BAD)),
            width=24,
            height=3,
        ),
    ]
    dashboard = new_dashboard(
        "Agent tools vs GPU",
        UID,
        "Which tool calls leave the GPU idle: utilization, idle windows and the idle time blamed on each tool.",
        ["gpu", "tools"],
        [
            *datasource_variables(with_traces=True),
            *target_variables(METRIC_GPU_UTILIZATION),
            label_variable("gpu", "GPU", METRIC_GPU_UTILIZATION, '{job=~"$job",instance=~"$instance"}'),
            label_variable("tool", "Tool", METRIC_TOOL_CALLS, '{job=~"$job",instance=~"$instance"}'),
        ],
        panels,
    )
    return dashboard.link(jaeger_search_link())
