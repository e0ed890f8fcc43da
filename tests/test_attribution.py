"""Attribution: which tool calls an idle GPU was waiting on, and in which phase."""

import dataclasses
import math
import random

import pytest

from agent_otel.attribution import BlameTotals, CallShare, attribute, attribute_underuse
from agent_otel.records import NS_PER_S, IdleWindow, ModelCall, ToolCall, UtilizationSegment

T0 = 1_700_000_000 * NS_PER_S  # an epoch-like origin, as real spans have


def at(seconds: float) -> int:
    return T0 + round(seconds * NS_PER_S)


def call(tool: str, submit: float, start: float, end: float | None, executor: str = "pool") -> ToolCall:
    return ToolCall(tool, executor, at(submit), at(start), at(end) if end is not None else 0)


def window(start: float, end: float, gpu: str = "0") -> IdleWindow:
    return IdleWindow(gpu, at(start), at(end), utilization_avg=0.0)


def by_tool(attribution) -> dict[str, CallShare]:
    return {share.call.tool: share for share in attribution.shares}


def test_window_exactly_covering_one_exec_phase_is_blamed_on_that_exec():
    search = call("web_search", submit=10.0, start=10.0, end=12.5)
    [result] = attribute([window(10.0, 12.5)], [search])

    [share] = result.shares
    assert share.call is search
    assert share.exec_s == pytest.approx(2.5)
    assert share.queue_s == 0.0
    assert share.phase == "exec"
    assert (share.start_ns, share.end_ns) == (at(10.0), at(12.5))
    assert result.unattributed_s == pytest.approx(0.0, abs=1e-12)
    assert result.blocked_by == "web_search"


def test_two_tools_in_flight_together_split_the_overlap_equally():
    # search runs 0-4 s, fetch 2-6 s; the GPU idles 1-5 s.
    search = call("web_search", 0.0, 0.0, 4.0)
    fetch = call("fetch_url", 2.0, 2.0, 6.0)
    [result] = attribute([window(1.0, 5.0)], [fetch, search])

    shares = by_tool(result)
    # 1-2 s: search alone (1 s); 2-4 s: both (1 s each); 4-5 s: fetch alone (1 s).
    assert shares["web_search"].exec_s == pytest.approx(2.0)
    assert shares["fetch_url"].exec_s == pytest.approx(2.0)
    assert [s.call.tool for s in result.shares] == ["web_search", "fetch_url"]  # submit order
    assert result.unattributed_s == pytest.approx(0.0, abs=1e-12)
    # An exact tie goes to the first name in sort order.
    assert result.blocked_by == "fetch_url"


def test_a_call_waiting_for_a_worker_is_blamed_on_queue():
    stuck = call("run_sql", submit=3.0, start=8.0, end=9.0)
    [result] = attribute([window(4.0, 7.0)], [stuck])

    [share] = result.shares
    assert share.queue_s == pytest.approx(3.0)
    assert share.exec_s == 0.0
    assert share.phase == "queue"


def test_a_call_that_starts_executing_inside_the_window_is_mixed():
    # Queued 0-2 s, executing 2-5 s; the GPU idles 1-4 s.
    slow = call("run_sql", submit=0.0, start=2.0, end=5.0)
    [result] = attribute([window(1.0, 4.0)], [slow])

    [share] = result.shares
    assert share.phase == "mixed"
    assert share.queue_s == pytest.approx(1.0)
    assert share.exec_s == pytest.approx(2.0)
    assert share.blocked_s == pytest.approx(3.0)


def test_idle_time_with_no_call_in_flight_is_unattributed():
    # Calls at 0-1 s and 3-4 s; the GPU idles 0.5-5 s.
    calls = [call("a", 0.0, 0.0, 1.0), call("b", 3.0, 3.0, 4.0)]
    [result] = attribute([window(0.5, 5.0)], calls)

    assert by_tool(result)["a"].exec_s == pytest.approx(0.5)
    assert by_tool(result)["b"].exec_s == pytest.approx(1.0)
    assert result.unattributed_s == pytest.approx(3.0)


def test_a_window_with_no_calls_at_all_is_wholly_unattributed():
    [result] = attribute([window(1.0, 3.5)], [])
    assert result.shares == []
    assert result.unattributed_s == pytest.approx(2.5)
    assert result.blocked_by is None


def test_calls_that_only_touch_the_window_are_not_in_it():
    before = call("before", 0.0, 0.0, 2.0)  # ends exactly when the window starts
    after = call("after", 5.0, 5.0, 6.0)  # starts exactly when it ends
    earlier, result = attribute([window(1.0, 1.5), window(2.0, 5.0)], [before, after])
    assert [s.call.tool for s in earlier.shares] == ["before"]
    assert result.shares == []
    assert result.unattributed_s == pytest.approx(3.0)


def test_calls_still_in_flight_are_open_ended():
    running = call("train_step", submit=1.0, start=1.5, end=None)
    queued = ToolCall("embed", "pool", at(2.0), 0)  # in flight, not started yet
    [result] = attribute([window(1.0, 4.0)], [running, queued])

    shares = by_tool(result)
    # 1-1.5 s: running alone, queued; 1.5-2 s: running alone, executing;
    # 2-4 s: both, running executing and embed queued.
    assert shares["train_step"].queue_s == pytest.approx(0.5)
    assert shares["train_step"].exec_s == pytest.approx(0.5 + 1.0)
    assert shares["train_step"].phase == "mixed"
    assert shares["train_step"].end_ns == at(4.0)
    assert shares["embed"].queue_s == pytest.approx(1.0)
    assert shares["embed"].exec_s == 0.0
    assert shares["embed"].phase == "queue"
    assert result.blocked_by == "train_step"


def test_every_gpu_is_blamed_on_the_same_calls():
    search = call("web_search", 0.0, 0.5, 3.0)
    windows = [window(1.0, 2.0, gpu="0"), window(0.0, 3.0, gpu="1"), window(2.5, 4.0, gpu="0")]
    results = attribute(windows, [search])

    assert [r.window for r in results] == windows  # input order is kept
    assert by_tool(results[0])["web_search"].exec_s == pytest.approx(1.0)
    gpu1 = by_tool(results[1])["web_search"]
    assert (gpu1.queue_s, gpu1.exec_s) == (pytest.approx(0.5), pytest.approx(2.5))
    assert by_tool(results[2])["web_search"].exec_s == pytest.approx(0.5)
    assert results[2].unattributed_s == pytest.approx(1.0)


def test_blocked_by_is_the_tool_with_the_largest_summed_share():
    # Two short "lookup" calls add up to more than one longer "fetch".
    calls = [
        call("fetch", 0.0, 0.0, 1.5),
        call("lookup", 2.0, 2.0, 3.0),
        call("lookup", 3.0, 3.0, 4.0),
    ]
    [result] = attribute([window(0.0, 4.0)], calls)
    assert [s.call.tool for s in result.shares] == ["fetch", "lookup", "lookup"]
    assert result.blocked_by == "lookup"


def test_blame_totals_sum_per_gpu_tool_and_phase():
    slow = call("run_sql", submit=0.0, start=2.0, end=5.0)
    results = attribute([window(1.0, 4.0, gpu="0"), window(4.0, 6.0, gpu="0"), window(0.0, 1.0, gpu="1")], [slow])
    totals = BlameTotals()
    for result in results:
        totals.add(result)

    assert totals.idle_s == {"0": pytest.approx(5.0), "1": pytest.approx(1.0)}
    assert totals.blocked_s == {
        ("0", "run_sql", "queue"): pytest.approx(1.0),
        ("0", "run_sql", "exec"): pytest.approx(2.0 + 1.0),
        ("1", "run_sql", "queue"): pytest.approx(1.0),
    }
    assert totals.unattributed_s == {"0": pytest.approx(1.0), "1": pytest.approx(0.0, abs=1e-12)}


def brute_force(
    window: IdleWindow,
    calls: list[ToolCall],
    models: list[ModelCall] = (),  # type: ignore[assignment]
    served: dict[int, list[float]] | None = None,
) -> tuple[dict[int, tuple[float, float]], float]:
    """The rule applied literally, instant by instant between boundaries:
    at an instant with model calls (``models``, all of the window's pool) in
    flight, the time is theirs, split equally, into ``served[i]`` as
    [queued, decode] (docs/attribution.md, the model server); else the tool
    calls', split equally, by phase; else unattributed."""
    cuts = {window.start_ns, window.end_ns}
    for c in calls:
        for t in (c.submit_ns, c.start_ns, c.end_ns):
            if window.start_ns < t < window.end_ns:
                cuts.add(t)
    for m in models:
        for t in (m.start_ns, m.end_ns, m.first_token_ns):
            if window.start_ns < t < window.end_ns:
                cuts.add(t)
    cuts = sorted(cuts)
    shares: dict[int, list[float]] = {}
    unattributed = 0.0
    for a, b in zip(cuts, cuts[1:]):
        seconds = (b - a) / NS_PER_S
        generating = [i for i, m in enumerate(models) if m.start_ns <= a and (m.end_ns == 0 or m.end_ns >= b)]
        if generating:
            assert served is not None
            for i in generating:
                first = models[i].first_token_ns
                served.setdefault(i, [0.0, 0.0])[1 if first and first <= a else 0] += seconds / len(generating)
            continue
        in_flight = [i for i, c in enumerate(calls) if c.submit_ns <= a and (c.end_ns == 0 or c.end_ns >= b)]
        if not in_flight:
            unattributed += seconds
        for i in in_flight:
            phase = 1 if calls[i].start_ns <= a else 0
            shares.setdefault(i, [0.0, 0.0])[phase] += seconds / len(in_flight)
    return {i: (q, e) for i, (q, e) in shares.items()}, unattributed


def random_scenario(rng: random.Random) -> tuple[list[IdleWindow], list[ToolCall]]:
    calls = []
    for _ in range(rng.randint(0, 12)):
        submit = rng.uniform(0, 20)
        start = submit + rng.choice([0.0, rng.uniform(0, 3)])
        end = start + rng.uniform(0.001, 4)
        calls.append(call(rng.choice("abcd"), submit, start, None if rng.random() < 0.1 else end))
    windows = []
    for gpu in ("0", "1"):
        t = rng.uniform(0, 3)
        while t < 25:
            length = rng.uniform(0.01, 5)
            windows.append(window(t, t + length, gpu))
            t += length + rng.uniform(0.01, 3)
    # Windows that overlap on one GPU are not what the timeline produces,
    # but the rule still applies to each of them.
    for _ in range(rng.randint(0, 3)):
        start = rng.uniform(0, 20)
        windows.append(window(start, start + rng.uniform(0.01, 8), "2"))
    return windows, calls


def test_matches_the_rule_applied_instant_by_instant_and_adds_up_to_the_window():
    rng = random.Random(20240611)
    for _ in range(300):
        windows, calls = random_scenario(rng)
        for result in attribute(windows, calls):
            expected, unattributed = brute_force(result.window, calls)
            got = {calls.index(s.call): (s.queue_s, s.exec_s) for s in result.shares}
            assert got.keys() == expected.keys()
            for i, (queue, execute) in expected.items():
                assert got[i] == (pytest.approx(queue, abs=1e-9), pytest.approx(execute, abs=1e-9))
            assert result.unattributed_s == pytest.approx(unattributed, abs=1e-9)
            total = sum(s.blocked_s for s in result.shares) + result.unattributed_s
            assert math.isclose(total, result.window.seconds, rel_tol=1e-12, abs_tol=1e-9)


def sequential_scenario(rng: random.Random) -> tuple[list[IdleWindow], list[ToolCall]]:
    """Calls one after another (never two in flight at once): some queued
    first, some of no length, some ending as the next is submitted, the
    last one perhaps still in flight (queued or executing)."""
    calls, t = [], rng.uniform(0, 1)
    tools = [f"tool{i}" for i in range(rng.choice([1, 3, 12]))]
    for _ in range(rng.randint(0, 40)):
        submit = t + rng.choice([0.0, rng.uniform(0, 0.5)])
        start = submit + rng.choice([0.0, 0.0, rng.uniform(0, 0.3)])
        end = start + rng.choice([0.0, rng.uniform(0.0001, 0.01), rng.uniform(0.01, 1.5)])
        calls.append(call(rng.choice(tools), submit, start, end))
        t = end
    if calls and rng.random() < 0.3:
        last = calls[-1]
        calls[-1] = dataclasses.replace(last, end_ns=0, start_ns=rng.choice([0, last.start_ns]))
    windows = []
    for gpu in ("0", "1"):
        at_s = rng.uniform(0, 2)
        while at_s < t + 2:
            length = rng.uniform(0.001, 3)
            windows.append(window(at_s, at_s + length, gpu))
            at_s += length + rng.choice([0.0, rng.uniform(0.01, 1)])
    return windows, calls


def test_shares_from_keeps_the_long_calls_shares_and_every_calls_time_in_the_sums():
    # The live path's form (attribute(..., shares_from=...)): a share of its
    # own only for a call whose life lasts shares_from, every call's share in
    # the sums by tool and phase. Overlapping calls go the usual way (the
    # sums are the shares' sums, to the bit); calls one after another go
    # per window (_Sequential: the same numbers, in integer nanoseconds).
    from agent_otel.attribution.rule import _Sequential, blocked_by_tool_phase

    rng = random.Random(20261130)
    checked = {"overlapping": 0, "sequential": 0}
    for case in range(600):
        kind = "sequential" if case % 2 else "overlapping"
        windows, calls = sequential_scenario(rng) if kind == "sequential" else random_scenario(rng)
        if kind == "sequential":
            assert _Sequential.of(calls, windows) is not None
        elif case % 4 == 2:
            calls = [dataclasses.replace(c, tool=f"tool{rng.randrange(12)}") for c in calls]
        shares_from = rng.choice([0.005, 0.5, 1.0])
        full = attribute(windows, calls)
        summed = attribute(windows, calls, shares_from=shares_from)
        per_window = _Sequential.of(calls, windows) is not None  # a few random calls never overlap
        for whole, part in zip(full, summed):
            assert part.window is whole.window
            expected = blocked_by_tool_phase(whole.shares)
            if not per_window:
                assert part.blocked == expected  # to the bit
                assert part.unattributed_s == whole.unattributed_s
            else:
                assert part.blocked.keys() == expected.keys()
                for key, seconds in expected.items():
                    assert part.blocked[key] == pytest.approx(seconds, rel=1e-12, abs=1e-12), key
                assert part.unattributed_s == pytest.approx(whole.unattributed_s, rel=1e-12, abs=1e-12)
            assert part.blocked_by == whole.blocked_by
            long_enough = [
                s for s in whole.shares if s.call.end_ns == 0 or s.call.end_ns - s.call.submit_ns >= shares_from * 1e9
            ]
            assert [(s.call, s.start_ns, s.end_ns) for s in part.shares] == [
                (s.call, s.start_ns, s.end_ns) for s in long_enough
            ]
            for got, want in zip(part.shares, long_enough):
                assert (got.queue_s, got.exec_s) == (
                    pytest.approx(want.queue_s, rel=1e-12, abs=1e-12),
                    pytest.approx(want.exec_s, rel=1e-12, abs=1e-12),
                )
            assert all(s.blocked_s < shares_from for s in whole.shares if s.call not in [w.call for w in long_enough])
            checked["sequential" if per_window else "overlapping"] += len(whole.shares)
    assert min(checked.values()) > 1000, checked


def test_calls_in_flight_together_or_of_another_pool_are_not_attributed_as_sequential():
    from agent_otel.attribution.rule import _Sequential

    one, two = call("a", 0.0, 0.0, 2.0), call("b", 1.0, 1.0, 3.0)
    assert _Sequential.of([one, two], [window(0.0, 4.0)]) is None
    assert _Sequential.of([one, call("b", 2.0, 2.0, 3.0)], [window(0.0, 4.0)]) is not None
    other_pool = dataclasses.replace(call("b", 2.0, 2.0, 3.0), pool="p")
    assert _Sequential.of([one, other_pool], [window(0.0, 4.0)]) is None
    assert _Sequential.of([one, call("b", 2.0, 1.5, 3.0)], [window(0.0, 4.0)]) is None  # start before submit
    assert _Sequential.of([call("a", 0.0, 0.0, None), call("b", 2.0, 2.0, 3.0)], [window(0.0, 4.0)]) is None


def test_a_window_only_needs_the_calls_that_overlap_it():
    """What the live path relies on: attributing against just the calls
    overlapping a window gives the same numbers as against all calls."""
    rng = random.Random(7)
    for _ in range(100):
        windows, calls = random_scenario(rng)
        for full in attribute(windows, calls):
            overlapping = [s.call for s in full.shares]
            [alone] = attribute([full.window], overlapping)
            assert [s.call for s in alone.shares] == overlapping
            for a, b in zip(alone.shares, full.shares):
                assert (a.queue_s, a.exec_s) == (pytest.approx(b.queue_s, abs=1e-9), pytest.approx(b.exec_s, abs=1e-9))


# ---------------------------------------------------------------- under-use


def segment(start: float, end: float, utilization: float, gpu: str = "0") -> UtilizationSegment:
    return UtilizationSegment(gpu, at(start), at(end), utilization)


def test_unused_capacity_is_blamed_by_the_same_rule_weighted_by_one_minus_utilization():
    # The GPU runs at 95% except 30% while web_search runs (2-4 s) and while
    # run_sql queues then runs (3-6 s, started at 4 s); a last 30% stretch
    # (6-7 s) has no call in flight.
    search = call("web_search", 2.0, 2.0, 4.0, executor="direct")
    sql = call("run_sql", 3.0, 4.0, 6.0)
    segments = [
        segment(0, 2, 0.95),
        segment(2, 3, 0.30),
        segment(3, 4, 0.30),
        segment(4, 6, 0.30),
        segment(6, 7, 0.30),
        segment(7, 8, 0.95),
    ]

    totals = attribute_underuse(segments, [search, sql])

    # 2-3: search alone, 0.7 s; 3-4: both, 0.35 s each (sql queued); 4-6: sql exec, 1.4 s.
    assert totals.blocked_s == {
        ("0", "web_search", "exec"): pytest.approx(0.7 + 0.35),
        ("0", "run_sql", "queue"): pytest.approx(0.35),
        ("0", "run_sql", "exec"): pytest.approx(1.4),
    }
    # 0-2 and 7-8 at 95% (0.1 + 0.05) plus 6-7 at 30% (0.7) with nobody in flight.
    assert totals.unattributed_s == {"0": pytest.approx(0.1 + 0.05 + 0.7)}
    assert totals.underused_s["0"] == pytest.approx(sum(s.unused_s for s in segments))
    assert totals.underused_s["0"] == pytest.approx(sum(totals.blocked_s.values()) + totals.unattributed_s["0"])


def test_unknown_utilization_is_neither_used_nor_unused():
    busy = call("a", 0.0, 0.0, 4.0)
    totals = attribute_underuse([segment(0, 1, 0.5), segment(1, 3, float("nan")), segment(3, 4, 0.0)], [busy])
    assert totals.underused_s == {"0": pytest.approx(0.5 + 1.0)}
    assert totals.blocked_s == {("0", "a", "exec"): pytest.approx(1.5)}


def test_under_use_matches_the_rule_applied_instant_by_instant():
    rng = random.Random(99)
    for _ in range(100):
        windows, calls = random_scenario(rng)
        segments = [UtilizationSegment(w.gpu, w.start_ns, w.end_ns, rng.random()) for w in windows if w.gpu != "2"]
        totals = attribute_underuse(segments, calls)
        expected: dict = {}
        unattributed: dict = {}
        for s in segments:
            shares, nobody = brute_force(IdleWindow(s.gpu, s.start_ns, s.end_ns, 0.0), calls)
            for i, (queue, execute) in shares.items():
                for phase, seconds in (("queue", queue), ("exec", execute)):
                    if seconds > 0:
                        key = (s.gpu, calls[i].tool, phase)
                        expected[key] = expected.get(key, 0.0) + (1 - s.utilization) * seconds
            unattributed[s.gpu] = unattributed.get(s.gpu, 0.0) + (1 - s.utilization) * nobody
        assert totals.blocked_s.keys() <= expected.keys()
        for key, seconds in expected.items():
            assert totals.blocked_s.get(key, 0.0) == pytest.approx(seconds, abs=1e-9)
        for gpu, seconds in unattributed.items():
            assert totals.unattributed_s[gpu] == pytest.approx(seconds, abs=1e-9)


def test_a_call_blocks_only_the_gpus_of_its_own_pool():
    # Two GPU hosts, each serving its own agents; GPU "0" exists in both.
    on_a = dataclasses.replace(call("search", 0.0, 0.0, 4.0), pool="vllm-a")
    on_b = dataclasses.replace(call("sql", 1.0, 1.0, 3.0), pool="vllm-b")
    undeclared = call("fetch", 0.0, 0.0, 4.0)  # a process that declared no pool
    idle_a = dataclasses.replace(window(0.0, 4.0), pool="vllm-a")
    idle_b = dataclasses.replace(window(0.0, 4.0), pool="vllm-b")
    own = window(0.0, 4.0)  # sampled by the undeclared process itself
    result_a, result_b, result_own = attribute([idle_a, idle_b, own], [on_b, undeclared, on_a])

    assert [s.call for s in result_a.shares] == [on_a]
    assert result_a.shares[0].exec_s == pytest.approx(4.0)
    assert [s.call for s in result_b.shares] == [on_b]
    assert result_b.unattributed_s == pytest.approx(2.0)
    assert [s.call for s in result_own.shares] == [undeclared]

    totals = BlameTotals()
    for result in (result_a, result_b, result_own):
        totals.add(result)
    # GPU 0 of each pool stays its own GPU.
    assert totals.idle_s == {"vllm-a/0": pytest.approx(4.0), "vllm-b/0": pytest.approx(4.0), "0": pytest.approx(4.0)}
    assert totals.blocked_s[("vllm-b/0", "sql", "exec")] == pytest.approx(2.0)


def test_pools_match_the_rule_applied_to_each_pool_alone():
    rng = random.Random(31)
    pools = ("", "vllm-a", "vllm-b")
    for _ in range(100):
        windows, calls = random_scenario(rng)
        calls = [dataclasses.replace(c, pool=rng.choice(pools)) for c in calls]
        windows = [dataclasses.replace(w, pool=rng.choice(pools)) for w in windows]
        for result in attribute(windows, calls):
            own = [c for c in calls if c.pool == result.window.pool]
            expected, unattributed = brute_force(result.window, own)
            got = {own.index(s.call): (s.queue_s, s.exec_s) for s in result.shares}
            assert got.keys() == expected.keys()
            for i, (queue, execute) in expected.items():
                assert got[i] == (pytest.approx(queue, abs=1e-9), pytest.approx(execute, abs=1e-9))
            assert result.unattributed_s == pytest.approx(unattributed, abs=1e-9)


def test_unused_capacity_is_blamed_within_the_pool_too():
    on_a = dataclasses.replace(call("search", 0.0, 0.0, 2.0), pool="vllm-a")
    on_b = dataclasses.replace(call("sql", 0.0, 0.0, 2.0), pool="vllm-b")
    totals = attribute_underuse([UtilizationSegment("0", at(0), at(2), 0.5, pool="vllm-a")], [on_a, on_b])
    assert totals.blocked_s == {("vllm-a/0", "search", "exec"): pytest.approx(1.0)}
