"""Dashboard "Tool latency and SLOs": how long each tool takes, and why.

Duration is split into queue time (waiting for an executor worker) and
exec time, each as p50/p95/p99. Duration and exec panels carry exemplars:
a dot on the graph opens that call's trace in Jaeger (through the
Prometheus data source's ``exemplarTraceIdDestinations``). The SLO panels
use the same SLO as the alert rules.
"""

from __future__ import annotations

from agent_otel.semconv import METRIC_TOOL_CALLS, METRIC_TOOL_DURATION, METRIC_TOOL_EXEC, METRIC_TOOL_QUEUE, OUTCOME_OK
from dashboards.panels import (
    BAD,
    GOOD,
    RANGE,
    RATE,
    WARN,
    common,
    datasource_variables,
    label_variable,
    new_dashboard,
    per_series_stat,
    query,
    quantile_queries,
    selector,
    target_variables,
    thresholds,
    timeseries_panel,
)
from dashboards.rules import FAST_BURN, SLOW_BURN
from dashboards.slo import LatencySLO, format_bound, format_percent

UID = "agent-otel-tool-latency"
TOOL = selector('tool=~"$tool"')
TOOL_NOT_OK = selector('tool=~"$tool"', f'outcome!="{OUTCOME_OK}"')


def compliance_expr(slo: LatencySLO, window: str) -> str:
    """Share of calls per tool that finished within the SLO threshold."""
    within = selector('tool=~"$tool"', slo.le_matcher())
    good = f"sum by (tool) (increase({METRIC_TOOL_DURATION}_bucket{within}[{window}]))"
    total = f"sum by (tool) (increase({METRIC_TOOL_DURATION}_count{TOOL}[{window}]))"
    return f"{good} / {total}"


def burn_rate_expr(slo: LatencySLO, window: str) -> str:
    """How many times faster than allowed the error budget is being spent."""
    return f"(1 - ({compliance_expr(slo, window)})) / {slo.error_budget:g}"


def build(slo: LatencySLO):
    threshold = format_bound(slo.threshold_s)
    objective = format_percent(slo.objective)
    latency_steps = thresholds(GOOD, (slo.threshold_s, BAD))
    panels = [
        per_series_stat(
            f"SLO compliance (calls within {threshold} s)",
            f"Per tool, over the dashboard range: share of calls that finished within {threshold} s. "
            f"Objective: {objective}; red below it.",
            "percentunit",
            query(compliance_expr(slo, RANGE), "{{tool}}", "A"),
            thresholds(BAD, (slo.objective, GOOD)),
        ),
        per_series_stat(
            "Error budget left",
            f"Per tool, over the dashboard range: the share of the error budget ({format_percent(slo.error_budget)} of calls "
            f"slower than {threshold} s) not yet spent. Below 0 the SLO is missed.",
            "percentunit",
            query(f"1 - ({burn_rate_expr(slo, RANGE)})", "{{tool}}", "A"),
            thresholds(BAD, (0, WARN), (0.5, GOOD)),
        ),
        timeseries_panel(
            "Tool duration p50 / p95 / p99",
            "Whole tool call, from request to result (queue + exec). The red line is the SLO threshold. "
            "Dots are exemplars: click one to open that call's trace in Jaeger.",
            "s",
            quantile_queries(METRIC_TOOL_DURATION, "tool", TOOL, "{{tool}}", exemplar=True),
            steps=latency_steps,
            threshold_style=common.GraphThresholdsStyleMode.DASHED,
            width=24,
        ),
        timeseries_panel(
            "Queue time p50 / p95 / p99",
            "Time a call waited for an executor worker before it started. High queue time with low exec time "
            "means the pool is too small or shared with slower tools.",
            "s",
            quantile_queries(METRIC_TOOL_QUEUE, "tool", TOOL, "{{tool}}"),
        ),
        timeseries_panel(
            "Exec time p50 / p95 / p99",
            "Time the tool itself ran. Dots are exemplars linking to traces.",
            "s",
            quantile_queries(METRIC_TOOL_EXEC, "tool", TOOL, "{{tool}}", exemplar=True),
            steps=latency_steps,
            threshold_style=common.GraphThresholdsStyleMode.DASHED,
        ),
        timeseries_panel(
            "Calls per second by outcome",
            "Tool calls finished per second, by outcome (ok, error, timeout, cancelled).",
            "ops",
            [
                query(
                    f"sum by (tool, outcome) (rate({METRIC_TOOL_CALLS}{TOOL}[{RATE}]))",
                    "{{tool}} {{outcome}}",
                    "A",
                )
            ],
            stacked=True,
        ),
        timeseries_panel(
            "Error ratio",
            "Share of calls per tool that did not end ok (error, timeout or cancelled).",
            "percentunit",
            [
                query(
                    f"(sum by (tool) (rate({METRIC_TOOL_CALLS}{TOOL_NOT_OK}[{RATE}]))"
                    f" or 0 * sum by (tool) (rate({METRIC_TOOL_CALLS}{TOOL}[{RATE}])))"
                    f" / sum by (tool) (rate({METRIC_TOOL_CALLS}{TOOL}[{RATE}]))",
                    "{{tool}}",
                    "A",
                )
            ],
            steps=thresholds(GOOD, (0.01, WARN), (0.05, BAD)),
            threshold_style=common.GraphThresholdsStyleMode.DASHED,
            min_value=0,
        ),
        timeseries_panel(
            "Error budget burn rate",
            f"How fast each tool spends its latency error budget (1 = exactly on budget for a {objective} objective). "
            f"The fast-burn alert pages above {FAST_BURN.factor:g}x over both 1h and 5m; "
            f"the slow-burn alert opens a ticket above {SLOW_BURN.factor:g}x over both 6h and 30m.",
            "suffix:x",
            [
                query(burn_rate_expr(slo, "1h"), "{{tool}} 1h", "A"),
                query(burn_rate_expr(slo, "5m"), "{{tool}} 5m", "B"),
            ],
            steps=thresholds(GOOD, (SLOW_BURN.factor, WARN), (FAST_BURN.factor, BAD)),
            threshold_style=common.GraphThresholdsStyleMode.DASHED,
            min_value=0,
            width=24,
        ),
    ]
    return new_dashboard(
        "Tool latency and SLOs",
        UID,
        f"Per-tool latency (queue vs exec), call and error rates, and the latency SLO "
        f"({objective} of calls within {threshold} s).",
        ["latency", "slo", "tools"],
        [
            *datasource_variables(),
            *target_variables(METRIC_TOOL_CALLS),
            label_variable("tool", "Tool", METRIC_TOOL_CALLS, '{job=~"$job",instance=~"$instance"}'),
        ],
        panels,
    )
