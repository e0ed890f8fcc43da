"""Dashboard "GPU pools": many agents, on many hosts, sharing GPU servers.

For each GPU pool (``agent.gpu.pool``, joined through each process's
``target_info``): its GPUs, the tool calls its agents have in flight, the
idle time blamed on tools live (the pool recording rules, which see calls
still running) next to the exact blame of the pool's blame service (after
its watermark), and the blame service's intake.
"""

from __future__ import annotations

from agent_otel.semconv import (
    LABEL_GPU_POOL,
    METRIC_BLAME_CALLS,
    METRIC_BLAME_LAG,
    METRIC_GPU_IDLE_BLOCKED,
    METRIC_GPU_UTILIZATION,
    METRIC_LATE_SPANS,
    METRIC_RECEIVED_SPANS,
    METRIC_REFUSED_SPANS,
    TARGET_INFO,
)
from dashboards.panels import (
    BAD,
    GOOD,
    RANGE,
    RATE,
    WARN,
    datasource_variables,
    label_variable,
    new_dashboard,
    query,
    stat_panel,
    thresholds,
    timeseries_panel,
)
from dashboards.rules import (
    IDLE_THRESHOLD,
    LIVE_STALL_FOR,
    POOL_BLOCKED_LIVE,
    POOL_GPU_BLOCKED,
    POOL_GPU_IDLE,
    POOL_INFLIGHT,
)
from dashboards.slo import format_percent

UID = "agent-otel-gpu-pools"

POOL = f'{{{LABEL_GPU_POOL}=~"${LABEL_GPU_POOL}"}}'
# A process's series, joined with the pool its target_info declares.
OF_POOL = f"* on (job, instance) group_left ({LABEL_GPU_POOL}) {TARGET_INFO}{POOL}"


def build():
    overview = [
        stat_panel(
            "GPUs idle now",
            f"GPUs of the selected pools whose last sample is at or below {format_percent(IDLE_THRESHOLD)} utilization "
            "(a GPU whose sampling fails, agent_otel_gpu_state not ok, is unknown: not counted).",
            "short",
            query(f"sum({POOL_GPU_IDLE}{POOL}) or vector(0)", "idle GPUs", "A"),
            thresholds(GOOD, (1, WARN)),
        ),
        stat_panel(
            "Tool calls in flight",
            "Tool calls the pools' agents have queued or running right now, on every host (agent_tool_inflight).",
            "short",
            query(f"sum({POOL_INFLIGHT}{POOL}) or vector(0)", "in flight", "A"),
            thresholds(GOOD),
        ),
        stat_panel(
            "Idle GPUs blocked by running calls",
            f"GPUs idle right now while calls of their pool are in flight; {LIVE_STALL_FOR} of that fires "
            "AgentGPUIdleBlockedByTools, though no span of those calls has ended.",
            "short",
            query(f"sum({POOL_GPU_BLOCKED}{POOL}) or vector(0)", "blocked", "A"),
            thresholds(GOOD, (1, BAD)),
        ),
        stat_panel(
            "Late spans",
            "Tool spans that reached the blame service after its watermark had passed part of their call, over "
            "the dashboard range: that part is not blamed. Raise the watermark (or shorten the export interval) "
            "if this grows.",
            "short",
            query(f"sum(increase({METRIC_LATE_SPANS}[{RANGE}]) {OF_POOL}) or vector(0)", "late", "A"),
            thresholds(GOOD, (1, WARN)),
        ),
    ]
    panels = [
        *overview,
        timeseries_panel(
            "Live: GPU idle blamed per tool and phase",
            "The attribution rule applied to what Prometheus sees at each evaluation: every idle GPU of a pool "
            "split equally among the pool's calls in flight, including calls still running (their spans have "
            "not ended). 100% = one GPU fully idle because of that tool. Sampled at the rule interval: see "
            "docs/attribution.md for how close it comes to the exact blame.",
            "percentunit",
            [query(f"sum by (tool, phase) ({POOL_BLOCKED_LIVE}{POOL})", "{{tool}} ({{phase}})", "A")],
            stacked=True,
        ),
        timeseries_panel(
            "Exact: GPU idle blamed per tool and phase",
            "The blame services' agent_gpu_idle_blocked_seconds_total: the exact rule over every agent's tool "
            "spans, counted once the watermark has passed (so this trails the live panel by the watermark).",
            "percentunit",
            [
                query(
                    f"sum by (tool, phase) (rate({METRIC_GPU_IDLE_BLOCKED}[{RATE}]) {OF_POOL})",
                    "{{tool}} ({{phase}})",
                    "A",
                )
            ],
            stacked=True,
        ),
        timeseries_panel(
            "GPU utilization per GPU",
            f"The pools' GPUs, as their blame services sample them. At or below {format_percent(IDLE_THRESHOLD)} "
            "a GPU is idle.",
            "percentunit",
            [
                query(
                    f"avg by ({LABEL_GPU_POOL}, instance, gpu) ({METRIC_GPU_UTILIZATION} {OF_POOL})",
                    "{{agent_gpu_pool}} {{instance}} GPU {{gpu}}",
                    "A",
                )
            ],
            min_value=0,
            max_value=1,
        ),
        timeseries_panel(
            "Tool calls in flight, by tool and phase",
            "Queued (waiting for an executor worker) or running, summed over every agent of the selected pools.",
            "short",
            [query(f"sum by (tool, phase) ({POOL_INFLIGHT}{POOL})", "{{tool}} ({{phase}})", "A")],
            stacked=True,
        ),
        timeseries_panel(
            "Blame service intake",
            "Spans per second the blame services received, refused (by reason: not tool spans, malformed, another "
            "pool, a clock too far ahead) and took late.",
            "ops",
            [
                query(
                    f"sum by (transport) (rate({METRIC_RECEIVED_SPANS}[{RATE}]) {OF_POOL})",
                    "received ({{transport}})",
                    "A",
                ),
                query(f"sum by (reason) (rate({METRIC_REFUSED_SPANS}[{RATE}]) {OF_POOL})", "refused: {{reason}}", "B"),
                query(f"sum by (tool) (rate({METRIC_LATE_SPANS}[{RATE}]) {OF_POOL})", "late: {{tool}}", "C"),
            ],
        ),
        timeseries_panel(
            "Blame lag",
            "How far behind now each blame service has counted the exact blame: its watermark plus the GPU "
            "sampling delay. A lag growing without bound means its GPU samples stopped.",
            "s",
            [query(f"max by (instance) ({METRIC_BLAME_LAG} {OF_POOL})", "{{instance}}", "A")],
        ),
        timeseries_panel(
            "Tool calls held for attribution",
            "Finished tool calls each blame service keeps until the GPU time they overlap has been blamed "
            "(its memory, bounded).",
            "short",
            [query(f"sum by (instance) ({METRIC_BLAME_CALLS} {OF_POOL})", "{{instance}}", "A")],
        ),
    ]
    return new_dashboard(
        "GPU pools",
        UID,
        "Agents on many hosts sharing GPU servers: live and exact blame per GPU pool.",
        ["gpu", "pools"],
        [*datasource_variables(), label_variable(LABEL_GPU_POOL, "GPU pool", TARGET_INFO)],
        panels,
    )
