"""The timeline follows the wall clock, and a call's times stay in order when it does."""

from __future__ import annotations

import time

import pytest

import agent_otel
from agent_otel.support import clock


@pytest.fixture
def wall_clock(monkeypatch):
    """``move(seconds)``: the wall clock (``time.time_ns``) jumps by ``seconds``
    against the monotonic clock, as when NTP steps it or a VM resumes."""
    jumped = [0]
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + jumped[0])
    monkeypatch.setattr(clock, "OFFSET_NS", clock.OFFSET_NS)  # restored after the test

    def move(seconds: float) -> None:
        jumped[0] += round(seconds * 1e9)

    return move


def test_the_timeline_follows_a_step_and_not_the_microseconds_between_two_reads(wall_clock):
    clock.follow_wall_clock()
    assert clock.follow_wall_clock() == 0  # within FOLLOW_NS: left as it is
    wall_clock(3.5)
    assert abs(clock.now_ns() - time.time_ns() + 3_500_000_000) < 50_000_000  # anchored before the step
    moved = clock.follow_wall_clock()
    assert abs(moved - 3_500_000_000) < 50_000_000
    assert abs(clock.now_ns() - time.time_ns()) <= clock.FOLLOW_NS
    wall_clock(-10)
    assert abs(clock.follow_wall_clock() + 10_000_000_000) < 50_000_000


def test_tool_spans_follow_the_wall_clock_that_other_spans_read(wall_clock, spans):
    # Spans of other instrumentations take their times from the wall clock
    # (the SDK's default); agent-otel's are on the same clock after a step.
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:

        @agent_otel.tool
        def search(query):
            return query

        wall_clock(3.5)
        deadline = time.monotonic() + 10
        while abs(clock.now_ns() - time.time_ns()) > clock.FOLLOW_NS:  # the pipeline thread follows it
            assert time.monotonic() < deadline, "the timeline never followed the wall clock"
            time.sleep(0.05)
        before = time.time_ns()
        search("gpu")
        after = time.time_ns()
    finally:
        handle.shutdown()
    [span] = spans.tools("search")
    assert before - clock.FOLLOW_NS <= span.start_time <= span.end_time <= after + clock.FOLLOW_NS


def test_a_call_during_which_the_wall_clock_goes_back_keeps_its_times_in_order(wall_clock, spans):
    from concurrent.futures import ThreadPoolExecutor

    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:

        @agent_otel.tool
        def lookup(key):
            wall_clock(-10)  # stepped back 10 s while the call runs
            clock.follow_wall_clock()  # as the pipeline thread would
            return key

        @agent_otel.tool
        def queued(key):
            return key

        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(lookup, "a")
            second = pool.submit(queued, "b")  # waits for lookup: the step falls in its queue time
            assert (first.result(), second.result()) == ("a", "b")
    finally:
        agent_otel.uninstrument()
    for span in spans.tools():
        queue = span.attributes["agent.tool.queue.duration"]
        exec_ = span.attributes["agent.tool.exec.duration"]
        assert queue >= 0 and exec_ >= 0, span.name
        assert span.end_time >= span.start_time, span.name
        assert abs((span.end_time - span.start_time) / 1e9 - (queue + exec_)) < 1e-6, span.name
