"""One timeline: durations from a monotonic clock, anchored to the wall clock once.

Every timestamp that leaves the process is wall-clock nanoseconds since the
Unix epoch (what OpenTelemetry spans use). Reading ``time.perf_counter_ns``
is cheaper than ``time.time_ns`` and never jumps backwards, so the hot path
reads it and converts with a fixed offset taken at import.
"""

from __future__ import annotations

import time

perf_counter_ns = time.perf_counter_ns

# Wall-clock epoch ns minus perf_counter ns, measured once.
OFFSET_NS: int = time.time_ns() - perf_counter_ns()


def now_ns() -> int:
    """Wall-clock epoch nanoseconds on the monotonic timeline."""
    return perf_counter_ns() + OFFSET_NS
