"""Prometheus recording and alert rules for the toolkit's metrics.

The latency SLO ("``objective`` of each tool's calls finish within
``threshold`` seconds") is a parameter, one for every tool and any tool's
own (``ToolSLOs``): each distinct SLO gets its recording rules and alerts,
over its tools' series, under the same names; everything else follows the
multi-window burn-rate alerts of the SRE workbook: an alert fires only
when both a long window (the budget is really being spent) and a short
window (it is still being spent now) burn faster than the factor.

Recording rules keep each tool's SLI (share of calls within the
threshold) per burn-rate window, so alerts and ad-hoc queries read one
cheap series instead of re-aggregating histogram buckets.

GPU pools (docs/attribution.md#gpu-pools): the exact blame of a pool's GPUs
comes from its blame service, once a call's span has arrived and the
watermark has passed. A tool hung for minutes has no span yet, so the pool
rules apply the attribution rule to what Prometheus sees now: the agents'
``agent_tool_inflight`` gauges and the GPUs' last utilization samples,
joined by the ``agent_gpu_pool`` label of each process's ``target_info``.
At each evaluation, every idle GPU of a pool is split equally among the
pool's calls in flight (the rule, sampled), and the alert fires while a
GPU stays idle with calls of its pool in flight. docs/attribution.md says
how close the sampled rule comes to the exact one.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from agent_otel.config import DEFAULTS
from agent_otel.semconv import (
    LABEL_GPU_POOL,
    METRIC_EXECUTOR_ACTIVE_WORKERS,
    METRIC_EXECUTOR_MAX_WORKERS,
    METRIC_EXECUTOR_QUEUE_DEPTH,
    GPU_STATE_OK,
    LABEL_STATE,
    METRIC_GPU_IDLE_BLOCKED,
    METRIC_GPU_IDLE_MODEL,
    METRIC_GPU_STATE,
    METRIC_GPU_UTILIZATION,
    METRIC_LOOP_BLOCKED,
    METRIC_TOOL_DURATION,
    METRIC_TOOL_INFLIGHT,
    TARGET_INFO,
)
from dashboards.slo import LatencySLO, ToolSLOs, format_bound, format_percent

DEFAULT_RUNBOOK_BASE = "docs/runbook.md"

# Executor saturation must last this long before anyone is told.
EXECUTOR_SATURATED_FOR = "5m"
# GPU idle-while-blocked share over this window, above this ratio, alerts.
GPU_BLOCKED_WINDOW = "10m"
GPU_BLOCKED_RATIO = 0.3
# An agent's event loops blocked more than this share of this window alerts.
LOOP_BLOCKED_WINDOW = "10m"
LOOP_BLOCKED_RATIO = 0.1
# A GPU of a pool idle with calls of the pool in flight this long alerts
# (the live rule, for stalls whose spans have not ended).
LIVE_STALL_FOR = "30s"
# A GPU is idle now when its last sample is at or below the live path's threshold.
IDLE_THRESHOLD = DEFAULTS.gpu_idle_threshold

# The pool recording rules (see the module docstring).
POOL_INFLIGHT = "agent_gpu_pool:tool_inflight:sum"
POOL_GPU_IDLE = "agent_gpu_pool:gpu_idle:bool"
POOL_BLOCKED_LIVE = "agent_gpu_pool:gpu_idle_blocked_live:ratio"
POOL_GPU_BLOCKED = "agent_gpu_pool:gpu_blocked_live:bool"
# GPUs whose sampling is not ok now (failing, lost, stuck).
GPU_NOT_OK = f'{METRIC_GPU_STATE}{{{LABEL_STATE}!="{GPU_STATE_OK}"}} == 1'
# The processes of a pool: the pool joined onto their series.
IN_A_POOL = f'on (job, instance) group_left ({LABEL_GPU_POOL}) {TARGET_INFO}{{{LABEL_GPU_POOL}!=""}}'


@dataclass(frozen=True)
class BurnRateAlert:
    name: str
    factor: float
    long_window: str
    short_window: str
    severity: str
    for_duration: str
    speed: str


FAST_BURN = BurnRateAlert("AgentToolLatencySLOFastBurn", 14.4, "1h", "5m", "page", "2m", "fast")
SLOW_BURN = BurnRateAlert("AgentToolLatencySLOSlowBurn", 6, "6h", "30m", "ticket", "15m", "slowly but steadily")
BURN_RATE_ALERTS = (FAST_BURN, SLOW_BURN)


def sli_windows() -> list[str]:
    """Every window a burn-rate alert reads, shortest first."""
    windows = {w for alert in BURN_RATE_ALERTS for w in (alert.long_window, alert.short_window)}
    return sorted(windows, key=_window_seconds)


def sli_record_name(window: str) -> str:
    return f"agent_tool:latency_sli:ratio_rate{window}"


def runbook_url(base: str, alert: str) -> str:
    """``base`` plus the anchor GitHub gives the alert's heading in docs/runbook.md."""
    return f"{base}#{alert.lower()}"


def _tool_slos(slo: LatencySLO | ToolSLOs) -> ToolSLOs:
    return slo if isinstance(slo, ToolSLOs) else ToolSLOs(slo)


def recording_rules(slo: LatencySLO | ToolSLOs) -> list[dict]:
    """Per window, each tool's SLI: the share of its calls within its SLO's threshold."""
    rules = []
    for window in sli_windows():
        for group_slo, tools in _tool_slos(slo).groups():
            bucket = ", ".join(part for part in (tools, group_slo.le_matcher()) if part)
            count = f"{{{tools}}}" if tools else ""
            rules.append(
                {
                    "record": sli_record_name(window),
                    "expr": (
                        f"sum by (job, tool) (rate({METRIC_TOOL_DURATION}_bucket{{{bucket}}}[{window}]))\n"
                        f"/\n"
                        f"sum by (job, tool) (rate({METRIC_TOOL_DURATION}_count{count}[{window}]))"
                    ),
                    "labels": {"slo": "latency"},
                }
            )
    return rules


def burn_rate_rules(slo: LatencySLO | ToolSLOs, alert: BurnRateAlert, runbook_base: str) -> list[dict]:
    """The alert, once per distinct SLO (the same name, each over its tools)."""
    return [burn_rate_rule(group_slo, alert, runbook_base, tools) for group_slo, tools in _tool_slos(slo).groups()]


def burn_rate_rule(slo: LatencySLO, alert: BurnRateAlert, runbook_base: str, tools: str = "") -> dict:
    threshold = format_bound(slo.threshold_s)
    limit = f"({alert.factor:g} * {slo.error_budget:g})"
    only = f"{{{tools}}}" if tools else ""
    return {
        "alert": alert.name,
        "expr": (
            f"(1 - {sli_record_name(alert.long_window)}{only}) > {limit}\n"
            f"and\n"
            f"(1 - {sli_record_name(alert.short_window)}{only}) > {limit}"
        ),
        "for": alert.for_duration,
        "labels": {"severity": alert.severity, "slo": "latency"},
        "annotations": {
            "summary": f"Tool {{{{ $labels.tool }}}} is burning its latency error budget {alert.speed}",
            "description": (
                f"{{{{ $value | humanizePercentage }}}} of {{{{ $labels.tool }}}} calls in {{{{ $labels.job }}}} "
                f"took longer than {threshold} s over the last {alert.long_window} (and still over the last "
                f"{alert.short_window}): more than {alert.factor:g}x the {format_percent(slo.error_budget)} the SLO "
                f"({format_percent(slo.objective)} within {threshold} s) allows."
            ),
            "runbook_url": runbook_url(runbook_base, alert.name),
        },
    }


def executor_saturated_rule(runbook_base: str) -> dict:
    name = "AgentExecutorSaturated"
    return {
        "alert": name,
        "expr": (
            f"{METRIC_EXECUTOR_ACTIVE_WORKERS} >= {METRIC_EXECUTOR_MAX_WORKERS}\nand\n{METRIC_EXECUTOR_QUEUE_DEPTH} > 0"
        ),
        "for": EXECUTOR_SATURATED_FOR,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Executor {{ $labels.executor }} has every worker busy and calls waiting",
            "description": (
                "All {{ $value }} workers of executor {{ $labels.executor }} on {{ $labels.instance }} "
                f"have been busy with calls queued behind them for {EXECUTOR_SATURATED_FOR}: "
                "tool calls now wait for a worker before they start."
            ),
            "runbook_url": runbook_url(runbook_base, name),
        },
    }


def gpu_blocked_rule(runbook_base: str) -> dict:
    name = "AgentGPUIdleBlockedByTools"
    window = GPU_BLOCKED_WINDOW
    # Alertmanager shows the tool to look at first: the top of the ranking.
    top_tool = (
        '{{ with printf "topk(1, sum by (tool) (rate('
        + METRIC_GPU_IDLE_BLOCKED
        + "{instance=%q,gpu=%q}["
        + window
        + '])))" $labels.instance $labels.gpu | query }}'
        '{{ . | first | label "tool" }}{{ end }}'
    )
    return {
        "alert": name,
        "expr": (f"sum by (job, instance, gpu) (rate({METRIC_GPU_IDLE_BLOCKED}[{window}]))\n> {GPU_BLOCKED_RATIO:g}"),
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "GPU {{ $labels.gpu }} on {{ $labels.instance }} sits idle waiting for tool calls",
            "description": (
                f"GPU {{{{ $labels.gpu }}}} was idle {{{{ $value | humanizePercentage }}}} of the last {window} "
                f"while tool calls were in flight (alert above {format_percent(GPU_BLOCKED_RATIO)}). "
                f"The tool blamed most: {top_tool}."
            ),
            "runbook_url": runbook_url(runbook_base, name),
        },
    }


def model_server_rule(runbook_base: str) -> dict:
    """The model server is stalling: its GPU idle while model calls of its pool
    were in flight (not the tools: the rule gives them none of that time)."""
    name = "AgentModelServerStalling"
    window = GPU_BLOCKED_WINDOW
    top_model = (
        '{{ with printf "topk(1, sum by (model, phase) (rate('
        + METRIC_GPU_IDLE_MODEL
        + "{instance=%q,gpu=%q}["
        + window
        + '])))" $labels.instance $labels.gpu | query }}'
        '{{ . | first | label "model" }} ({{ . | first | label "phase" }}){{ end }}'
    )
    return {
        "alert": name,
        "expr": f"sum by (job, instance, gpu) (rate({METRIC_GPU_IDLE_MODEL}[{window}]))\n> {GPU_BLOCKED_RATIO:g}",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "GPU {{ $labels.gpu }} on {{ $labels.instance }} sits idle while the model server has requests",
            "description": (
                f"GPU {{{{ $labels.gpu }}}} was idle {{{{ $value | humanizePercentage }}}} of the last {window} "
                f"while model calls were in flight (alert above {format_percent(GPU_BLOCKED_RATIO)}): the model "
                "server stalls (requests queued behind a scheduler decision, preempted, tokenized on the CPU, "
                f"the network), not the tools. The model and phase most of it went to: {top_model}."
            ),
            "runbook_url": runbook_url(runbook_base, name),
        },
    }


def pool_recording_rules() -> list[dict]:
    """The live view of each GPU pool; evaluated in order, each from the ones before."""
    pool = LABEL_GPU_POOL
    return [
        {
            # Tool calls in flight (queued or running) over every process of the pool.
            "record": POOL_INFLIGHT,
            "expr": f"sum by ({pool}, tool, phase) (\n  {METRIC_TOOL_INFLIGHT}\n  * {IN_A_POOL}\n)",
        },
        {
            # 1 while a GPU of the pool is idle (its last sample), else 0; none
            # while its sampling is not ok (agent_otel_gpu_state: failing, lost,
            # stuck): its last sample is old, so the GPU is unknown, not idle.
            "record": POOL_GPU_IDLE,
            "expr": (
                f"(\n  ({METRIC_GPU_UTILIZATION} <= bool {IDLE_THRESHOLD:g})\n"
                f"  unless on (job, instance, gpu) {GPU_NOT_OK}\n)\n* {IN_A_POOL}"
            ),
        },
        {
            # The rule at this instant: the pool's idle GPUs, split equally
            # among its calls in flight; in GPU-seconds per second, by tool
            # and phase (the live counterpart of the blame service's
            # rate(agent_gpu_idle_blocked_seconds_total), summed over the pool).
            "record": POOL_BLOCKED_LIVE,
            "expr": (
                f"{POOL_INFLIGHT}\n"
                f"/ on ({pool}) group_left\n"
                f"sum by ({pool}) ({POOL_INFLIGHT})\n"
                f"* on ({pool}) group_left\n"
                f"sum by ({pool}) ({POOL_GPU_IDLE})"
            ),
        },
        {
            # 1 while a GPU is idle and calls of its pool are in flight.
            "record": POOL_GPU_BLOCKED,
            "expr": (
                f"{POOL_GPU_IDLE}\n"
                f"* on ({pool}) group_left ()\n"  # "()": the parenthesis below is not a label list
                f"(sum by ({pool}) ({POOL_INFLIGHT}) > bool 0)"
            ),
        },
    ]


def gpu_blocked_live_rule(runbook_base: str, stall_for: str = LIVE_STALL_FOR) -> dict:
    name = "AgentGPUIdleBlockedByTools"
    top_tool = (
        '{{ with printf "topk(1, sum by (tool) ('
        + POOL_INFLIGHT
        + "{"
        + LABEL_GPU_POOL
        + '=%q}))" $labels.'
        + LABEL_GPU_POOL
        + ' | query }}{{ . | first | label "tool" }}{{ end }}'
    )
    return {
        "alert": name,
        "expr": f"{POOL_GPU_BLOCKED} == 1",
        "for": stall_for,
        "labels": {"severity": "warning", "signal": "live"},
        "annotations": {
            "summary": (
                "GPU {{ $labels.gpu }} of pool {{ $labels." + LABEL_GPU_POOL + " }} sits idle while its agents' "
                "tool calls run"
            ),
            "description": (
                "GPU {{ $labels.gpu }} on {{ $labels.instance }} has been idle for " + stall_for + " while tool "
                "calls of its GPU pool {{ $labels." + LABEL_GPU_POOL + " }} were in flight (still running: their "
                "spans have not ended, so the blame service has not blamed them yet). The tool with the most "
                "calls in flight: " + top_tool + "."
            ),
            "runbook_url": runbook_url(runbook_base, name),
        },
    }


def loop_blocked_rule(runbook_base: str) -> dict:
    name = "AgentEventLoopBlocked"
    window = LOOP_BLOCKED_WINDOW
    top_tool = (
        '{{ with printf "topk(1, sum by (tool) (rate('
        + METRIC_LOOP_BLOCKED
        + "{instance=%q}["
        + window
        + '])))" $labels.instance | query }}'
        '{{ . | first | label "tool" }}{{ end }}'
    )
    return {
        "alert": name,
        "expr": (f"sum by (job, instance) (rate({METRIC_LOOP_BLOCKED}[{window}]))\n> {LOOP_BLOCKED_RATIO:g}"),
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "The asyncio event loop of {{ $labels.instance }} is blocked by sync code",
            "description": (
                f"The event loop of {{{{ $labels.instance }}}} was blocked {{{{ $value | humanizePercentage }}}} of "
                f"the last {window} (alert above {format_percent(LOOP_BLOCKED_RATIO)}): meanwhile no coroutine ran, "
                f"no tool result was read and no model call was sent. Blocked most by: {top_tool}."
            ),
            "runbook_url": runbook_url(runbook_base, name),
        },
    }


def rule_groups(
    slo: LatencySLO | ToolSLOs, runbook_base: str = DEFAULT_RUNBOOK_BASE, stall_for: str = LIVE_STALL_FOR
) -> dict:
    """The whole rules file as a Python structure."""
    return {
        "groups": [
            {"name": "agent-otel-slo-recording", "rules": recording_rules(slo)},
            {"name": "agent-otel-gpu-pools", "rules": pool_recording_rules()},
            {
                "name": "agent-otel-alerts",
                "rules": [
                    *(rule for alert in BURN_RATE_ALERTS for rule in burn_rate_rules(slo, alert, runbook_base)),
                    executor_saturated_rule(runbook_base),
                    gpu_blocked_rule(runbook_base),
                    model_server_rule(runbook_base),
                    gpu_blocked_live_rule(runbook_base, stall_for),
                    loop_blocked_rule(runbook_base),
                ],
            },
        ]
    }


def render(
    slo: LatencySLO | ToolSLOs, runbook_base: str = DEFAULT_RUNBOOK_BASE, stall_for: str = LIVE_STALL_FOR
) -> str:
    """The rules file's text, with a header naming its source and SLOs."""
    return header(slo) + dump(rule_groups(slo, runbook_base, stall_for))


def header(slo: LatencySLO | ToolSLOs) -> str:
    """Comment lines naming the generator and the SLOs, for a file of these rules."""
    slos = _tool_slos(slo)
    default = slos.default
    text = (
        "# Generated by `python -m dashboards` from dashboards/rules.py: do not edit by hand.\n"
        f"# Latency SLO: {format_percent(default.objective)} of each tool's calls within "
        f"{format_bound(default.threshold_s)} s.\n"
    )
    for tool, own in slos.tools:
        text += f"# {tool}: {format_percent(own.objective)} of its calls within {format_bound(own.threshold_s)} s.\n"
    return text


def dump(data: object) -> str:
    """YAML in the rules file's style: multi-line PromQL as literal blocks, keys in order."""
    return yaml.dump(data, Dumper=_RulesDumper, sort_keys=False, width=1000)


class _RulesDumper(yaml.SafeDumper):
    """Writes multi-line PromQL as literal blocks, so the file reads like PromQL."""


def _represent_str(dumper: yaml.SafeDumper, text: str):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_RulesDumper.add_representer(str, _represent_str)


def _window_seconds(window: str) -> int:
    units = {"m": 60, "h": 3600, "d": 86400}
    return int(window[:-1]) * units[window[-1]]
