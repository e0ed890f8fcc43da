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


# Two clock reads this far apart (the thread was preempted between them) are
# read again.
TIGHT_NS = 100_000


def wall_offset_ns() -> tuple[int, int]:
    """``(wall, offset)``: the wall clock now, and what to add to
    ``perf_counter_ns`` to be on it.

    The wall clock is read between two readings of the monotonic clock; a
    thread preempted between them (half a millisecond is enough to move a
    millisecond's rounding) reads again, up to three times, and keeps the
    tightest pair.
    """
    gap = wall = offset = 0
    for attempt in range(3):
        before = perf_counter_ns()
        wall_now = time.time_ns()
        after = perf_counter_ns()
        if attempt == 0 or after - before < gap:
            gap, wall, offset = after - before, wall_now, wall_now - (before + after) // 2
        if gap < TIGHT_NS:
            break
    return wall, offset


def follow_wall_clock() -> int:
    """Move the timeline onto the wall clock if they are more than
    ``FOLLOW_NS`` apart; the nanoseconds it moved (0: it did not)."""
    global OFFSET_NS
    _, offset = wall_offset_ns()
    moved = offset - OFFSET_NS
    if -FOLLOW_NS <= moved <= FOLLOW_NS:
        return 0
    OFFSET_NS = offset  # set, not moved by: another thread may have set it meanwhile
    return moved
