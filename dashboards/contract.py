"""The toolkit's Prometheus metrics, as the dashboards and rules see them.

Dashboards and rules may query only these names (plus the ``_bucket``,
``_count`` and ``_sum`` series of the histograms); tests hold every query
to that, and tests/test_semconv.py holds them to what a live instrumented
process exports. Everything here comes from ``agent_otel.semconv``, the
contract as code; importing it loads nothing of the toolkit's runtime.
"""

from __future__ import annotations

from agent_otel import semconv

# Upper bounds (seconds) of the tool and executor histograms; 0.8 is the default SLO bucket.
BUCKETS: tuple[float, ...] = semconv.DURATION_BUCKETS


def series_names() -> set[str]:
    """Every series name a query may use: counters, gauges, histogram parts."""
    return semconv.series_names()
