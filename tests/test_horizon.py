"""The live path's bounded store of recently finished tool calls."""

import threading

import pytest

from agent_otel.attribution import attribute
from agent_otel.errors import ConfigError
from agent_otel.attribution.horizon import CallHorizon
from agent_otel.records import NS_PER_S, IdleWindow, ToolCall

T0 = 1_700_000_000 * NS_PER_S


def at(seconds: float) -> int:
    return T0 + round(seconds * NS_PER_S)


def finished(tool: str, submit: float, end: float) -> ToolCall:
    return ToolCall(tool, "pool", at(submit), at(submit), at(end))


def test_returns_the_calls_that_overlap_a_window():
    horizon = CallHorizon(horizon_s=60, max_calls=100)
    horizon.add_many([finished("a", 0, 1), finished("b", 2, 4), finished("c", 5, 6)])

    assert [c.tool for c in horizon.overlapping(at(1), at(5))] == ["b"]  # touching is not overlapping
    assert [c.tool for c in horizon.overlapping(at(0.5), at(5.5))] == ["a", "b", "c"]
    assert horizon.overlapping(at(7), at(8)) == []


def test_calls_added_out_of_order_are_still_found():
    horizon = CallHorizon(horizon_s=60, max_calls=100)
    horizon.add(finished("late", 3, 9))
    horizon.add(finished("early", 0, 2))
    horizon.add(finished("long", 1, 20))
    assert [c.tool for c in horizon.overlapping(at(1.5), at(2.5))] == ["early", "long"]


def test_prunes_calls_that_ended_more_than_the_horizon_before_the_newest():
    horizon = CallHorizon(horizon_s=10, max_calls=100)
    horizon.add_many([finished("old", 0, 1), finished("recent", 5, 6)])
    assert len(horizon) == 2

    horizon.add(finished("newest", 12, 15))  # cutoff 15 - 10 = 5 s: "old" ended at 1 s
    assert len(horizon) == 2
    assert [c.tool for c in horizon.overlapping(at(0), at(20))] == ["recent", "newest"]
    assert horizon.dropped == 0  # expiry is by design, not a loss


def test_never_holds_more_than_max_calls_and_counts_what_it_dropped():
    horizon = CallHorizon(horizon_s=3600, max_calls=3)
    horizon.add_many([finished(f"t{i}", i, i + 0.5) for i in range(5)])

    assert len(horizon) == 3
    assert horizon.dropped == 2
    assert [c.tool for c in horizon.overlapping(at(0), at(10))] == ["t2", "t3", "t4"]


def test_a_call_still_in_flight_is_refused():
    horizon = CallHorizon(horizon_s=60, max_calls=10)
    with pytest.raises(ValueError, match="in flight"):
        horizon.add(ToolCall("running", "pool", at(0), at(0)))


@pytest.mark.parametrize(("horizon_s", "max_calls", "setting"), [(0, 10, "horizon_s"), (30, 0, "max_calls")])
def test_invalid_bounds_name_the_setting(horizon_s, max_calls, setting):
    with pytest.raises(ConfigError, match=setting):
        CallHorizon(horizon_s=horizon_s, max_calls=max_calls)


def test_live_attribution_from_the_horizon_plus_calls_in_flight():
    horizon = CallHorizon(horizon_s=60, max_calls=100)
    horizon.add(finished("fetch", 0, 2))
    running = ToolCall("train_step", "pool", at(1), at(1))  # end_ns == 0
    idle = IdleWindow("0", at(1), at(3), utilization_avg=0.02)

    [result] = attribute([idle], horizon.overlapping(idle.start_ns, idle.end_ns) + [running])
    shares = {s.call.tool: s.blocked_s for s in result.shares}
    assert shares == {"fetch": pytest.approx(0.5), "train_step": pytest.approx(1.5)}


def test_a_writer_thread_and_readers_at_once():
    horizon = CallHorizon(horizon_s=5, max_calls=1000)
    batches = [[finished("w", b * 0.1 + i * 0.01, b * 0.1 + i * 0.01 + 0.05) for i in range(10)] for b in range(200)]
    errors = []

    def write():
        for batch in batches:
            horizon.add_many(batch)

    def read():
        try:
            for _ in range(300):
                ends = [c.end_ns for c in horizon.overlapping(at(0), at(100))]
                assert ends == sorted(ends)
                assert len(ends) <= 1000
        except AssertionError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # 2000 calls over 20 s of timeline; only those that ended in the last 5 s remain.
    every_call = [c for batch in batches for c in batch]
    newest = max(c.end_ns for c in every_call)
    expected = [c for c in every_call if c.end_ns >= newest - 5 * NS_PER_S]
    assert 450 < len(expected) < 550
    assert horizon.overlapping(at(0), at(100)) == expected
    assert horizon.dropped == 0


def test_calls_an_open_window_still_needs_are_kept_past_the_horizon():
    horizon = CallHorizon(horizon_s=1, max_calls=100)
    horizon.keep_from(at(2))  # the part of an open window not blamed yet starts at 2 s
    horizon.add_many([finished("needed", 0, 3), finished("done", 0, 1.5), finished("late", 9, 10)])

    # 10 - 1 = 9 s is the age cutoff; "needed" ends after 2 s and stays, "done" does not.
    assert [c.tool for c in horizon.overlapping(at(0), at(20))] == ["needed", "late"]
    horizon.keep_from(None)  # the window closed
    assert [c.tool for c in horizon.overlapping(at(0), at(20))] == ["late"]


def test_keeping_calls_never_lifts_the_count_bound():
    horizon = CallHorizon(horizon_s=1, max_calls=2)
    horizon.keep_from(at(0))
    horizon.add_many([finished(f"t{i}", i, i + 0.5) for i in range(4)])
    assert len(horizon) == 2 and horizon.dropped == 2


def test_calls_already_blamed_go_at_once_within_the_horizon_and_are_not_counted_as_dropped():
    horizon = CallHorizon(horizon_s=60, max_calls=2)
    horizon.add_many([finished("blamed", 0, 3), finished("blamed too", 1, 4)])
    horizon.keep_from(at(5))  # every stretch before 5 s is blamed: nothing before it will be asked for
    horizon.add_many([finished("open", 4, 6), finished("later", 5, 7)])

    assert [c.tool for c in horizon.overlapping(at(0), at(20))] == ["open", "later"]
    assert horizon.dropped == 0  # the two that left were blamed in full; none was lost
