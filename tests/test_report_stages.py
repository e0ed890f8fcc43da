"""The report's stages after the read give the numbers the plain Python did.

Each fast path of the analysis and the recommendations (numpy over the
call table's columns, no record per call) against the plain computation
it replaced, on random data with the edge cases in it: ties, empty
inputs, one call, many tools, calls still in flight, times past 2**53.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from agent_otel.attribution import attribute
from agent_otel.records import NS_PER_S, IdleWindow, ModelCall, ToolCall
from agent_otel.report import analysis as analysis_module
from agent_otel.report import recommendations as rec
from agent_otel.report.columns import CallColumns, Names, seconds_sorted
from agent_otel.report.stats import max_overlap, percentile
from agent_otel.spans.calls import CallTable
from tests.helpers.windows import in_windows_by_bisect


@pytest.mark.parametrize("kinds", [1, 3, 31, 32, 33, 200, 300])
def test_a_column_of_names_groups_its_rows_as_a_dict_of_lists_does(kinds):
    """A pass per name (few names) and the sort (many) give each name's rows, in order of first appearance."""
    rng = random.Random(kinds)
    for count in (0, 1, 2, 50, 3000):
        names = [f"n{rng.randrange(kinds)}" for _ in range(count)]
        expected: dict[str, list[int]] = {}
        for row, name in enumerate(names):
            expected.setdefault(name, []).append(row)
        column = Names(iter(names), count)
        assert [(name, rows.tolist()) for name, rows in column.groups()] == list(expected.items())
        assert column.codes.itemsize == (1 if len(expected) <= 256 else 2)  # a byte a row for few names


def test_seconds_between_columns_are_the_doubles_python_divides_to():
    rng = random.Random(1)
    for top, spread in ((10**18, 10**12), (1 << 63, 1 << 54), ((1 << 64) - 1, 1 << 60), (10**7, 10**6)):
        earlier = [rng.randrange(top - spread) for _ in range(300)]
        later = [max(0, e + rng.randrange(-spread // 10, spread)) for e in earlier]
        got = rec._seconds(np.array(later, np.uint64), np.array(earlier, np.uint64))
        assert got.tolist() == [(b - a) / NS_PER_S for b, a in zip(later, earlier)]
    assert rec._seconds(np.zeros(0, np.uint64), np.zeros(0, np.uint64)).tolist() == []


def _union_by_loop(spans: list[tuple[int, int]], start: int, end: int) -> int:
    """The model calls' time in flight as it was summed before numpy."""
    total, reach = 0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def test_the_union_of_spans_within_a_stretch_is_the_loop_s():
    rng = random.Random(2)
    for trial in range(300):
        base = rng.choice((0, 10**18, (1 << 63) + 5))
        spans = []
        for _ in range(rng.randrange(0, 30)):
            a = base + rng.randrange(0, 100)
            spans.append((a, a + rng.choice((0, 1, 3, rng.randrange(60)))))
        start = base + rng.randrange(-5 if base else 0, 60)
        end = start + rng.randrange(-3, 80)
        starts = np.array([a for a, _ in spans], np.uint64)
        ends = np.array([b for _, b in spans], np.uint64)
        assert analysis_module._union_within(starts, ends, start, end) == _union_by_loop(spans, start, end), trial


def _models(rng: random.Random, count: int, t0: int) -> list[ModelCall]:
    models = []
    for _ in range(count):
        start = t0 + rng.randrange(0, 200 * 10**9)
        end = rng.choice((0, start, start + rng.randrange(1, 8 * 10**9)))
        models.append(ModelCall("m", start, end, pool=rng.choice(("", "", "b"))))
    return models


def _windows(rng: random.Random, count: int, t0: int) -> list[IdleWindow]:
    windows = []
    for _ in range(count):
        a = t0 + rng.randrange(0, 200 * 10**9)
        windows.append(IdleWindow(rng.choice(("0", "1")), a, a + rng.randrange(1, 6 * 10**9), 0.0))
    return windows


def test_the_model_calls_in_idle_windows_are_the_ones_a_bisect_finds_and_the_blame_is_the_same():
    """Only the model calls that meet some window go to the attribution: the
    same shares, to the rounding of the running integrals, as with all."""
    rng = random.Random(3)
    t0 = 10**18
    for trial in range(40):
        models = _models(rng, rng.randrange(0, 60), t0)
        windows = sorted(_windows(rng, rng.randrange(0, 12), t0), key=lambda w: (w.start_ns, w.gpu))
        meeting = analysis_module._models_in_windows(models, windows)
        assert [id(m) for m in meeting] == [id(m) for m in in_windows_by_bisect(models, windows, "start_ns")], trial
        calls = []
        for i in range(rng.randrange(1, 40)):
            submit = t0 + rng.randrange(0, 200 * 10**9)
            start = submit + rng.randrange(0, 10**9)
            calls.append(ToolCall(f"t{i % 4}", "io", submit, start, start + rng.randrange(1, 5 * 10**9)))
        everything = attribute(windows, calls, models=models)
        filtered = attribute(windows, calls, models=meeting)
        for one, other in zip(everything, filtered, strict=True):
            assert [(id(s.call), s.start_ns, s.end_ns) for s in one.shares] == [
                (id(s.call), s.start_ns, s.end_ns) for s in other.shares
            ]
            for a, b in zip(one.shares, other.shares):
                assert a.queue_s == pytest.approx(b.queue_s, abs=1e-9) and a.exec_s == pytest.approx(b.exec_s, abs=1e-9)
            assert [(id(s.call), s.start_ns, s.end_ns) for s in one.models] == [
                (id(s.call), s.start_ns, s.end_ns) for s in other.models
            ]
            assert one.model_s == pytest.approx(other.model_s, abs=1e-9)
            assert one.unattributed_s == pytest.approx(other.unattributed_s, abs=1e-9)
    assert analysis_module._models_in_windows([], _windows(rng, 3, t0)) == []
    assert analysis_module._models_in_windows(_models(rng, 3, t0), []) == []


def _isolate_by_rows(calls: list[ToolCall]) -> list[tuple]:
    """isolate_tool's numbers as the rule computed them before numpy: a
    Python pass per row, per pool and tool (in order of first appearance)."""
    by_pool: dict[str, dict[str, list[int]]] = {}
    for row, call in enumerate(calls):
        if call.executor not in rec.NOT_POOLS:
            by_pool.setdefault(call.executor, {}).setdefault(call.tool, []).append(row)
    found = []
    for pool, by_tool in sorted(by_pool.items()):
        exec_of = {
            tool: [(calls[i].end_ns - calls[i].start_ns) / NS_PER_S for i in rows] for tool, rows in by_tool.items()
        }
        pool_exec = sum(seconds for tool_exec in exec_of.values() for seconds in tool_exec)
        if len(by_tool) < 2 or not pool_exec:
            continue
        for tool, mine in sorted(by_tool.items()):
            share = sum(exec_of[tool]) / pool_exec
            if len(mine) < rec.MIN_SLOW_CALLS or share < rec.SLOW_WORKER_SHARE:
                continue
            others = [i for name, rows in by_tool.items() if name != tool for i in rows]
            slow_p50 = percentile(sorted(exec_of[tool]), 50)
            other_exec = sorted((calls[i].end_ns - calls[i].start_ns) / NS_PER_S for i in others)
            fast_p50, fast_exec_p95 = percentile(other_exec, 50), percentile(other_exec, 95)
            fast_wait_p95 = percentile(sorted((calls[i].start_ns - calls[i].submit_ns) / NS_PER_S for i in others), 95)
            if not (
                slow_p50 >= rec.SLOW_FACTOR * fast_p50
                and fast_wait_p95 >= rec.MIN_WAIT_P95_S
                and fast_wait_p95 > fast_exec_p95
            ):
                continue
            concurrent = max_overlap([(calls[i].start_ns, calls[i].end_ns) for i in mine])
            found.append((tool, pool, share, slow_p50, fast_p50, fast_exec_p95, fast_wait_p95, concurrent))
    return found


def _analysis(calls: list[ToolCall]) -> analysis_module.Analysis:
    return analysis_module.Analysis(
        trace_paths=[],
        start_ns=0,
        end_ns=0,
        calls=CallTable.of(calls),
        windows=[],
        attributions=[],
        samples={},
        gpu_source=analysis_module.GPU_NONE,
        idle_threshold=0.1,
        min_idle_s=0.5,
    )


def _pool_calls(rng: random.Random, count: int, tools: int, base: int) -> list[ToolCall]:
    """Calls of a few pools by submit time, one tool slow: isolate_tool fires on some pools, not on others."""
    calls = []
    t = base
    for _ in range(count):
        t += rng.choice((0, rng.randrange(1, 10**8)))  # ties in submit time
        tool = f"t{rng.randrange(tools)}"
        slow = tool == "t0" and rng.random() < 0.9
        start = t + rng.choice((0, rng.randrange(1, 5 * 10**8)))
        end = start + (rng.randrange(10**9, 4 * 10**9) if slow else rng.choice((0, rng.randrange(1, 10**7))))
        calls.append(ToolCall(tool, rng.choice(("a", "b", "direct")), t, start, end))
    return calls


@pytest.mark.parametrize("tools", [1, 2, 5, 40])
def test_isolate_tool_from_the_columns_finds_what_a_pass_per_row_found(tools):
    rng = random.Random(tools)
    fired = 0
    for trial in range(25):
        base = rng.choice((10**18, 1 << 62, 0))
        calls = _pool_calls(rng, rng.choice((0, 1, 7, 60, 400)), tools, base)
        analysis = _analysis(calls)
        found = rec._isolate_tool(analysis, rec._Facts(analysis))
        expected = _isolate_by_rows(calls)
        assert [(r.subject, r.evidence["executor"]) for r in found] == [(e[0], e[1]) for e in expected], trial
        for recommendation, (_, _, share, slow_p50, fast_p50, fast_exec_p95, fast_wait_p95, concurrent) in zip(
            found, expected
        ):
            evidence = recommendation.evidence
            assert evidence["worker_time_share"] == round(share, 4)
            assert evidence["exec_p50_s"] == rec._s(slow_p50)
            assert evidence["other_tools_exec_p50_s"] == rec._s(fast_p50)
            assert evidence["other_tools_exec_p95_s"] == rec._s(fast_exec_p95)
            assert evidence["other_tools_wait_p95_s"] == rec._s(fast_wait_p95)
            assert evidence["max_concurrent_exec"] == concurrent
            assert f"it held {share:.0%} of" in recommendation.message
        fired += len(found)
    if tools > 1:
        assert fired  # the random pools make the rule fire, so its numbers are compared


@pytest.mark.parametrize("longest_ns", [10**9, 1 << 60])
def test_healthy_durations_are_each_tool_s_sorted_durations_less_the_timed_out(longest_ns):
    """A tool with no call left out reads its statistics' sorted durations
    (where they are the same doubles); the others are sorted anew."""
    rng = random.Random(5)
    calls = []
    for i in range(500):
        submit = 10**18 + i * 10**7
        tool = f"t{i % 7}"
        outcome = rng.choice(("ok", "ok", "error", "timeout", "cancelled")) if tool < "t4" else "ok"
        calls.append(ToolCall(tool, "a", submit, submit, submit + rng.randrange(0, longest_ns), outcome=outcome))
    analysis = _analysis(calls)
    columns = CallColumns(analysis.calls)
    analysis.tools = [
        analysis_module.ToolStats(
            tool, len(rows), 0, seconds_sorted(columns.end[rows] - columns.submit[rows]), [], [], []
        )
        for tool, rows in columns.tool.groups()
    ]
    healthy = rec._Facts(analysis)._healthy_durations()
    for stats in analysis.tools:
        mine = [c for c in calls if c.tool == stats.tool and c.outcome not in rec.UNHEALTHY_OUTCOMES]
        # (as numpy divides: past 2**53 ns the difference is rounded to a double first)
        assert list(healthy[stats.tool]) == sorted(float(c.end_ns - c.submit_ns) / NS_PER_S for c in mine)
        all_kept = len(mine) == stats.calls
        assert (healthy[stats.tool] is stats.duration_s) == (all_kept and longest_ns < 1 << 53)


def test_the_calls_are_ordered_by_submit_then_start_ties_as_read_whether_in_order_or_not():
    rng = random.Random(6)
    for count in (0, 1, 2, 30, 500):
        for shuffled in (False, True):
            calls = []
            for i in range(count):
                submit = 10**18 + rng.randrange(0, 20) * 10**6
                calls.append(ToolCall(f"t{i}", "io", submit, submit + rng.randrange(0, 3), submit + 10**7))
            if not shuffled:
                calls.sort(key=lambda c: (c.submit_ns, c.start_ns))
            table = CallTable()
            for call in calls:
                table.append(call)
            analysis_module._by_submit(table)
            assert [c.tool for c in table] == [c.tool for c in sorted(calls, key=lambda c: (c.submit_ns, c.start_ns))]
