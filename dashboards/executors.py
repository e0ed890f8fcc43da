"""Dashboard "Executors": are the worker pools behind the tools big enough?

A saturated executor (every worker busy, calls queued) turns into queue
time on every tool that shares it; this dashboard shows when and where.
"""

from __future__ import annotations

from agent_otel.semconv import (
    METRIC_EXECUTOR_ACTIVE_WORKERS,
    METRIC_EXECUTOR_MAX_WORKERS,
    METRIC_EXECUTOR_QUEUE_DEPTH,
    METRIC_EXECUTOR_WAIT,
    METRIC_TOOL_QUEUE,
)
from dashboards.panels import (
    BAD,
    GOOD,
    RATE,
    WARN,
    common,
    dashboard_model,
    datasource_variables,
    label_variable,
    new_dashboard,
    per_series_stat,
    query,
    quantile_queries,
    selector,
    state_timeline_panel,
    target_variables,
    thresholds,
    timeseries_panel,
)

UID = "agent-otel-executors"
EXECUTOR = selector('executor=~"$executor"')


def build():
    active = f"max by (executor) ({METRIC_EXECUTOR_ACTIVE_WORKERS}{EXECUTOR})"
    maximum = f"max by (executor) ({METRIC_EXECUTOR_MAX_WORKERS}{EXECUTOR})"
    panels = [
        per_series_stat(
            "Saturation now (active / max workers)",
            "Busy workers as a share of the pool, per executor. Red: every worker busy.",
            "percentunit",
            query(f"{active} / {maximum}", "{{executor}}", "A"),
            thresholds(GOOD, (0.8, WARN), (1, BAD)),
            width=24,
            height=4,
        ),
        state_timeline_panel(
            "Saturated (all workers busy and calls queued)",
            "Red while an executor had every worker busy and calls waiting: the condition behind the "
            "AgentExecutorSaturated alert (which waits 5 minutes).",
            query(
                f"max by (executor) (({METRIC_EXECUTOR_ACTIVE_WORKERS}{EXECUTOR} >= bool {METRIC_EXECUTOR_MAX_WORKERS}{EXECUTOR})"
                f" * ({METRIC_EXECUTOR_QUEUE_DEPTH}{EXECUTOR} > bool 0))",
                "{{executor}}",
                "A",
            ),
            thresholds(GOOD, (1, BAD)),
            {"0": ("ok", GOOD), "1": ("saturated", BAD)},
        ),
        timeseries_panel(
            "Queue depth",
            "Calls submitted and waiting for a worker, per executor.",
            "short",
            [query(f"sum by (executor) ({METRIC_EXECUTOR_QUEUE_DEPTH}{EXECUTOR})", "{{executor}}", "A")],
            steps=thresholds(GOOD, (1, WARN)),
            threshold_style=common.GraphThresholdsStyleMode.AREA,
            min_value=0,
        ),
        timeseries_panel(
            "Active vs max workers",
            "Busy workers (solid) against the pool size (dashed), per executor. Where the lines meet, the pool is full.",
            "short",
            [
                query(active, "{{executor}} active", "A"),
                query(maximum, "{{executor}} max", "B"),
            ],
            min_value=0,
        ).override_by_query(
            "B",
            [
                dashboard_model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
                dashboard_model.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            ],
        ),
        timeseries_panel(
            "Wait time p50 / p95 / p99",
            "Time from submit to a worker picking the call up, per executor.",
            "s",
            quantile_queries(METRIC_EXECUTOR_WAIT, "executor", EXECUTOR, "{{executor}}"),
        ),
        timeseries_panel(
            "Tool queue time p95 by executor",
            "Which tools pay for a busy executor: p95 of each tool's queue time, per executor.",
            "s",
            [
                query(
                    f"histogram_quantile(0.95, sum by (tool, executor, le) "
                    f"(rate({METRIC_TOOL_QUEUE}_bucket{EXECUTOR}[{RATE}])))",
                    "{{tool}} on {{executor}}",
                    "A",
                )
            ],
        ),
    ]
    return new_dashboard(
        "Executors",
        UID,
        "Worker pools behind the tools: queue depth, active vs max workers, wait time; saturation highlighted.",
        ["executors", "tools"],
        [
            *datasource_variables(),
            *target_variables(METRIC_EXECUTOR_MAX_WORKERS),
            label_variable("executor", "Executor", METRIC_EXECUTOR_MAX_WORKERS, '{job=~"$job",instance=~"$instance"}'),
        ],
        panels,
    )
