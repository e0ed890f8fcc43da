"""One timeline: durations from a monotonic clock, kept on the wall clock.

Every timestamp that leaves the process is wall-clock nanoseconds since the
Unix epoch (what OpenTelemetry spans use). Reading ``time.perf_counter_ns``
never jumps backwards, so the hot path reads it and converts with an offset
to the wall clock, ``OFFSET_NS``, taken at import.

The wall clock moves against the monotonic one: NTP slews it (at most
0.5 ms a second), a virtual machine's is set after a pause, a person sets
it. Spans that other instrumentations make read the wall clock itself, and
so do other processes; a timeline anchored once would drift away from
theirs. ``follow_wall_clock`` (the pipeline thread calls it a few times a
second, ``instrument()`` once) moves the offset to the wall clock when the
two are more than ``FOLLOW_NS`` apart. Code that converts several readings
at once reads ``OFFSET_NS`` once, and no timestamp of a call is earlier than
the one before it (the recorder, the model spans and the loop monitor hold
them there when the offset moved back meanwhile).
"""

from __future__ import annotations

import time

perf_counter_ns = time.perf_counter_ns

# Wall-clock epoch ns minus perf_counter ns: read it as clock.OFFSET_NS
# (follow_wall_clock replaces it), not copied at import.
OFFSET_NS: int = time.time_ns() - perf_counter_ns()

# How far the wall clock may move from the timeline before the offset follows it.
FOLLOW_NS = 1_000_000


def now_ns() -> int:
    """Wall-clock epoch nanoseconds on the monotonic timeline."""
    return perf_counter_ns() + OFFSET_NS


def follow_wall_clock() -> int:
    """Move the timeline onto the wall clock if they are more than
    ``FOLLOW_NS`` apart; the nanoseconds it moved (0: it did not)."""
    global OFFSET_NS
    offset = time.time_ns() - perf_counter_ns()
    moved = offset - OFFSET_NS
    if -FOLLOW_NS <= moved <= FOLLOW_NS:
        return 0
    OFFSET_NS = offset  # set, not moved by: another thread may have set it meanwhile
    return moved
