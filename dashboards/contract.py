"""The toolkit's Prometheus metrics, as the telemetry contract names them.

Dashboards and rules may query only these names (plus the ``_bucket``,
``_count`` and ``_sum`` series of the histograms); tests hold every query
to that. Copied from the contract so this package stands alone: change a
name here only together with the toolkit, the docs and the tests.
"""

from __future__ import annotations

# metric name -> (type, labels the toolkit sets; Prometheus adds job and instance)
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "agent_tool_calls_total": ("counter", ("tool", "outcome")),
    "agent_tool_duration_seconds": ("histogram", ("tool",)),
    "agent_tool_queue_seconds": ("histogram", ("tool", "executor")),
    "agent_tool_exec_seconds": ("histogram", ("tool",)),
    "agent_tool_inflight": ("gauge", ("tool", "phase")),
    "agent_executor_queue_depth": ("gauge", ("executor",)),
    "agent_executor_active_workers": ("gauge", ("executor",)),
    "agent_executor_max_workers": ("gauge", ("executor",)),
    "agent_executor_wait_seconds": ("histogram", ("executor",)),
    "agent_gpu_utilization_ratio": ("gauge", ("gpu",)),
    "agent_gpu_idle_seconds_total": ("counter", ("gpu",)),
    "agent_gpu_idle_blocked_seconds_total": ("counter", ("gpu", "tool", "phase")),
    "agent_gpu_idle_unattributed_seconds_total": ("counter", ("gpu",)),
    "agent_otel_spans_dropped_total": ("counter", ()),
}

# Upper bounds (seconds) of every toolkit histogram; 0.8 is the default SLO bucket.
BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1, 2.5, 5, 10, 30, 60,
)

# Labels every scraped series carries besides its own.
TARGET_LABELS = ("job", "instance")


def series_names() -> set[str]:
    """Every series name a query may use: counters, gauges, histogram parts."""
    names: set[str] = set()
    for name, (kind, _labels) in METRICS.items():
        if kind == "histogram":
            names.update(f"{name}_{part}" for part in ("bucket", "count", "sum"))
        else:
            names.add(name)
    return names
