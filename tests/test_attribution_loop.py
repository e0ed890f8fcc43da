"""Attribution while an asyncio event loop is blocked.

The rule (docs/attribution.md): while a loop is blocked, the tool calls
only waiting for it are not in flight, and the call that blocks it is, in
its exec phase, for the whole block.
"""

import math
import random

import pytest

from agent_otel.attribution import BlameTotals, attribute
from agent_otel.records import NS_PER_S, IdleWindow, LoopBlock, ToolCall

T0 = 1_700_000_000 * NS_PER_S


def at(seconds: float) -> int:
    return T0 + round(seconds * NS_PER_S)


_ids = iter(range(1, 1 << 30))


def call(tool: str, submit: float, start: float, end, executor: str = "direct") -> ToolCall:
    return ToolCall(
        tool, executor, at(submit), at(start), at(end) if end is not None else 0, trace_id=7, span_id=next(_ids)
    )


def key(c: ToolCall) -> tuple[int, int]:
    return (c.trace_id, c.span_id)


def block(start: float, end, blocker=None, waiting=(), tool=None, thread="MainThread") -> LoopBlock:
    return LoopBlock(
        thread,
        at(start),
        at(end) if end is not None else 0,
        tool=tool or (blocker.tool if blocker is not None else None),
        blocker=key(blocker) if blocker is not None else None,
        waiting=tuple(key(c) for c in waiting),
    )


def window(start: float, end: float, gpu: str = "0") -> IdleWindow:
    return IdleWindow(gpu, at(start), at(end), utilization_avg=0.0)


def shares(result) -> dict[str, tuple[float, float]]:
    return {share.call.tool: (share.queue_s, share.exec_s) for share in result.shares}


def test_the_blocking_call_takes_the_block_and_the_waiting_coroutines_nothing():
    # The article's case: two 50 ms async tools are "in flight" for 3 s
    # because a sync tool called from a coroutine froze the loop 1.0-2.5 s.
    a = call("async_a", 0.0, 0.0, 3.0)
    b = call("async_b", 0.0, 0.0, 3.0)
    blocking = call("sync_lookup", 1.0, 1.0, 2.45)  # the loop ran again 50 ms after it returned
    loop = block(1.0, 2.5, blocker=blocking, waiting=[a, b])
    [result] = attribute([window(0.0, 3.0)], [a, b, blocking], [loop])

    got = shares(result)
    # 0-1 s and 2.5-3 s: a and b split as usual; 1-2.5 s: all of it to the blocker's exec.
    assert got["async_a"] == (0.0, pytest.approx(0.5 + 0.25))
    assert got["async_b"] == (0.0, pytest.approx(0.5 + 0.25))
    assert got["sync_lookup"] == (0.0, pytest.approx(1.5))
    assert result.unattributed_s == pytest.approx(0.0, abs=1e-9)
    assert result.blocked_by == "sync_lookup"
    # The shares still point at the calls themselves, and the blocker's covers its block.
    by_call = {share.call.tool: share for share in result.shares}
    assert by_call["sync_lookup"].call is blocking
    assert (by_call["sync_lookup"].start_ns, by_call["sync_lookup"].end_ns) == (at(1.0), at(2.5))
    assert by_call["async_a"].call is a
    assert [share.call.tool for share in result.shares] == ["async_a", "async_b", "sync_lookup"]


def test_without_the_block_the_waiting_coroutines_would_have_taken_most_of_it():
    # The same calls with no block recorded: the plain rule splits 1-2.45 s three ways.
    a = call("async_a", 0.0, 0.0, 3.0)
    b = call("async_b", 0.0, 0.0, 3.0)
    blocking = call("sync_lookup", 1.0, 1.0, 2.45)
    [result] = attribute([window(0.0, 3.0)], [a, b, blocking])
    assert shares(result)["sync_lookup"][1] == pytest.approx(1.45 / 3)


def test_a_call_running_on_another_thread_keeps_its_share_during_the_block():
    pooled = call("pooled", 0.0, 0.5, 3.0, executor="io")  # queued 0-0.5 s, then running on a worker
    waiting = call("async_a", 0.0, 0.0, 3.0)
    blocking = call("sync_lookup", 1.0, 1.0, 2.0)
    [result] = attribute(
        [window(0.0, 3.0)], [pooled, waiting, blocking], [block(1.0, 2.0, blocker=blocking, waiting=[waiting])]
    )
    got = shares(result)
    # 0-0.5: pooled queued and a split; 0.5-1: both exec; 1-2: pooled and the blocker; 2-3: pooled and a.
    assert got["pooled"] == (pytest.approx(0.25), pytest.approx(0.25 + 0.5 + 0.5))
    assert got["async_a"] == (0.0, pytest.approx(0.25 + 0.25 + 0.5))
    assert got["sync_lookup"] == (0.0, pytest.approx(0.5))


def test_a_block_with_no_tool_running_is_unattributed_not_blamed_on_the_waiting():
    waiting = call("async_a", 0.0, 0.0, 3.0)
    [result] = attribute([window(0.0, 3.0)], [waiting], [block(1.0, 2.0, waiting=[waiting])])
    assert shares(result)["async_a"] == (0.0, pytest.approx(2.0))
    assert result.unattributed_s == pytest.approx(1.0)


def test_a_blocker_not_among_the_calls_is_still_blamed_by_name():
    # The live path may no longer hold the blocking call (the horizon dropped it).
    gone = call("sync_lookup", 0.5, 0.5, 1.9)
    waiting = call("async_a", 0.0, 0.0, 3.0)
    [result] = attribute([window(1.0, 3.0)], [waiting], [block(0.5, 2.0, blocker=gone, waiting=[waiting])])
    got = shares(result)
    assert got["sync_lookup"] == (0.0, pytest.approx(1.0))
    assert got["async_a"] == (0.0, pytest.approx(1.0))
    stand_in = next(share.call for share in result.shares if share.call.tool == "sync_lookup")
    assert key(stand_in) == key(gone)


def test_a_block_still_going_on_reaches_the_end_of_the_window():
    waiting = call("async_a", 0.0, 0.0, None)
    blocking = call("sync_lookup", 1.0, 1.0, None)
    [result] = attribute(
        [window(0.0, 4.0)], [waiting, blocking], [block(1.0, None, blocker=blocking, waiting=[waiting])]
    )
    assert shares(result) == {"async_a": (0.0, pytest.approx(1.0)), "sync_lookup": (0.0, pytest.approx(3.0))}


def test_a_queued_call_cut_by_a_block_stays_queued_after_it():
    queued = ToolCall("embed", "io", at(0.0), 0, trace_id=7, span_id=next(_ids))  # never started
    blocking = call("sync_lookup", 1.0, 1.0, 2.0)
    [result] = attribute([window(0.0, 3.0)], [queued, blocking], [block(1.0, 2.0, blocker=blocking, waiting=[queued])])
    assert shares(result)["embed"] == (pytest.approx(2.0), 0.0)


def test_without_blocks_the_calls_pass_through_untouched():
    a = call("a", 0.0, 0.0, 2.0)
    [result] = attribute([window(0.0, 1.0)], [a], [])
    assert result.shares[0].call is a


def brute_force(window: IdleWindow, calls: list[ToolCall], blocks: list[LoopBlock]):
    """The rule applied literally between boundaries: who is in flight at each instant."""
    cuts = {window.start_ns, window.end_ns}
    for c in calls:
        cuts.update(t for t in (c.submit_ns, c.start_ns, c.end_ns) if window.start_ns < t < window.end_ns)
    for b in blocks:
        cuts.update(t for t in (b.start_ns, b.end_ns) if window.start_ns < t < window.end_ns)
    cuts = sorted(cuts)
    by_key = {key(c): i for i, c in enumerate(calls)}
    got: dict[object, list[float]] = {}
    unattributed = 0.0
    for a, b in zip(cuts, cuts[1:]):
        active = [blk for blk in blocks if blk.start_ns <= a and (blk.end_ns == 0 or blk.end_ns >= b)]
        named = {k for blk in active for k in (*blk.waiting, *((blk.blocker,) if blk.blocker else ()))}
        in_flight = [
            (i, 1 if 0 < c.start_ns <= a else 0)
            for i, c in enumerate(calls)
            if c.submit_ns <= a and (c.end_ns == 0 or c.end_ns >= b) and key(c) not in named
        ]
        for blk in active:
            if blk.blocker is not None:
                in_flight.append((by_key.get(blk.blocker, blk.blocker), 1))
        seconds = (b - a) / NS_PER_S
        if not in_flight:
            unattributed += seconds
        for who, phase in in_flight:
            got.setdefault(who, [0.0, 0.0])[phase] += seconds / len(in_flight)
    return got, unattributed


def random_scenario(rng: random.Random):
    calls = []
    for _ in range(rng.randint(0, 10)):
        submit = rng.uniform(0, 20)
        start = submit + rng.choice([0.0, rng.uniform(0, 3)])
        end = start + rng.uniform(0.001, 4)
        calls.append(
            call(
                rng.choice("abcd"),
                submit,
                start,
                None if rng.random() < 0.1 else end,
                executor=rng.choice(["direct", "io"]),
            )
        )
        if rng.random() < 0.05:
            calls[-1].start_ns = 0  # still queued
            calls[-1].end_ns = 0
    blocks = []
    for thread in ("MainThread", "loop-2"):
        t = rng.uniform(0, 5)
        while t < 22:
            length = rng.uniform(0.01, 3)
            blocker = rng.choice(calls + [None, "gone"]) if calls else None
            if blocker == "gone":
                blocker = call("gone", t, t, t + length)  # not in the input
            waiting = rng.sample(calls, rng.randint(0, len(calls)))
            if blocker is not None:
                waiting = [c for c in waiting if c is not blocker]
            end = None if rng.random() < 0.05 else t + length
            blocks.append(block(t, end, blocker=blocker, waiting=waiting, thread=thread))
            if end is None:
                break
            t += length + rng.uniform(0.01, 4)
    windows = []
    t = rng.uniform(0, 3)
    while t < 25:
        length = rng.uniform(0.01, 5)
        windows.append(window(t, t + length))
        t += length + rng.uniform(0.01, 3)
    return windows, calls, blocks


def test_matches_the_rule_applied_instant_by_instant_and_adds_up_to_the_window():
    rng = random.Random(20260511)
    for _ in range(300):
        windows, calls, blocks = random_scenario(rng)
        # A call blocking two loops at once cannot happen; the reference counts each block's blocker.
        for result in attribute(windows, calls, blocks):
            expected, unattributed = brute_force(result.window, calls, blocks)
            got = {}
            for share in result.shares:
                who = calls.index(share.call) if share.call in calls else key(share.call)
                assert who not in got, "one share per call"
                got[who] = (share.queue_s, share.exec_s)
            expected = {who: v for who, v in expected.items() if v[0] + v[1] > 1e-12}
            got = {who: v for who, v in got.items() if v[0] + v[1] > 1e-12}
            assert got.keys() == expected.keys()
            for who, (queue, execute) in expected.items():
                assert got[who] == (pytest.approx(queue, abs=1e-9), pytest.approx(execute, abs=1e-9))
            assert result.unattributed_s == pytest.approx(unattributed, abs=1e-9)
            total = sum(s.blocked_s for s in result.shares) + result.unattributed_s
            assert math.isclose(total, result.window.seconds, rel_tol=1e-12, abs_tol=1e-9)


def test_blame_totals_put_the_block_on_the_blockers_exec():
    waiting = call("async_a", 0.0, 0.0, 2.0)
    blocking = call("sync_lookup", 0.5, 0.5, 1.5)
    totals = BlameTotals()
    for result in attribute(
        [window(0.0, 2.0)], [waiting, blocking], [block(0.5, 1.5, blocker=blocking, waiting=[waiting])]
    ):
        totals.add(result)
    assert totals.blocked_s == {
        ("0", "async_a", "exec"): pytest.approx(1.0),
        ("0", "sync_lookup", "exec"): pytest.approx(1.0),
    }


def test_unused_capacity_during_a_block_goes_to_the_blocker_too():
    from agent_otel.attribution import attribute_underuse
    from agent_otel.records import UtilizationSegment

    waiting = call("async_a", 0.0, 0.0, 2.0)
    blocking = call("sync_lookup", 1.0, 1.0, 2.0)
    segments = [UtilizationSegment("0", at(0.0), at(1.0), 0.5), UtilizationSegment("0", at(1.0), at(2.0), 0.4)]
    totals = attribute_underuse(segments, [waiting, blocking], [block(1.0, 2.0, blocker=blocking, waiting=[waiting])])
    assert totals.blocked_s == {
        ("0", "async_a", "exec"): pytest.approx(0.5),
        ("0", "sync_lookup", "exec"): pytest.approx(0.6),
    }
