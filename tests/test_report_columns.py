"""The report's numpy columns give the numbers the plain Python did.

report/columns.py, stats.peak_depth, analysis._in_windows, the reader's id
joins and the turns folded into their totals as found: each against the
plain computation it replaced, on random data with the edge cases in it
(times past 2**53 and 2**63, calls still in flight, ties).
"""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from agent_otel.records import NS_PER_S, AgentRun, IdleWindow, ToolCall
from agent_otel.report import analysis as analysis_module
from agent_otel.spans.calls import U64, CallTable, TraceIds
from agent_otel.report.columns import CallColumns, Names, seconds_sorted, total
from agent_otel.spans.ids import distinct, rows_among
from agent_otel.report.stats import max_overlap, peak_depth
from agent_otel.report.turns import find_turns
from tests.helpers.windows import in_windows_by_bisect


def test_seconds_are_the_doubles_python_divides_to_even_past_2_to_the_53():
    rng = random.Random(1)
    for top in (10**12, 1 << 53, 1 << 60, (1 << 64) - 1):
        values = [rng.randrange(top) for _ in range(500)] + [top - 1]
        got = seconds_sorted(np.array(values, dtype=np.uint64))
        assert isinstance(got, array) and got.typecode == "d"
        assert list(got) == [v / NS_PER_S for v in sorted(values)]


def test_total_is_exact_where_a_uint64_sum_would_wrap():
    values = [(1 << 64) - 1, (1 << 64) - 2, 5]
    assert total(np.array(values, dtype=np.uint64)) == sum(values)
    assert total(np.array([1, 2, 3], dtype=np.uint64)) == 6
    assert total(np.array([], dtype=np.uint64)) == 0


def test_peak_depth_of_numpy_columns_and_of_ints_past_int64():
    rng = random.Random(2)
    for base in (0, 1 << 63):
        for _ in range(100):
            pairs = [(base + a, base + a + rng.choice((0, 1, 2, 5))) for a in (rng.randrange(12) for _ in range(9))]
            expected = max_overlap(pairs)
            starts, ends = [a for a, _ in pairs], [b for _, b in pairs]
            assert peak_depth(starts, ends) == expected
            assert peak_depth(np.array(starts, dtype=np.uint64), np.array(ends, dtype=np.uint64)) == expected


def test_names_group_rows_in_order_of_first_appearance():
    names = Names(iter(["b", "a", "b", "c", "a", "b"]), 6)
    assert [(name, rows.tolist()) for name, rows in names.groups()] == [
        ("b", [0, 2, 5]),
        ("a", [1, 4]),
        ("c", [3]),
    ]
    assert names.names(np.array([3, 0, 2])) == ["b", "c"]
    assert list(Names(iter([]), 0).groups()) == []


def _calls(rng: random.Random, count: int) -> list[ToolCall]:
    calls = []
    t = 10**18
    for i in range(count):
        t += rng.randrange(0, 10**9)
        start = t + rng.choice((0, rng.randrange(10**8)))
        end = 0 if rng.random() < 0.02 else start + rng.randrange(10**7, 3 * 10**9)
        calls.append(ToolCall(f"t{i % 5}", rng.choice(("io", "direct", "cpu")), t, start, end))
    return calls


def test_the_calls_in_idle_windows_are_the_ones_a_bisect_finds():
    rng = random.Random(3)
    for _ in range(30):
        calls = _calls(rng, rng.randrange(1, 300))
        windows = []
        for _ in range(rng.randrange(0, 40)):
            a = calls[0].submit_ns + rng.randrange(-(10**9), 300 * 10**9)
            windows.append(IdleWindow("0", a, a + rng.randrange(1, 5 * 10**9), 0.0))
        rows = analysis_module._in_windows(CallColumns(CallTable.of(calls)), windows)
        assert [id(calls[i]) for i in rows.tolist()] == [
            id(c) for c in in_windows_by_bisect(calls, windows, "submit_ns")
        ]


def test_the_statistics_from_columns_match_the_calls():
    rng = random.Random(4)
    calls = [call for call in _calls(rng, 2000) if call.end_ns]
    columns = CallColumns(CallTable.of(calls))
    for tool, rows in columns.tool.groups():
        mine = [calls[i] for i in rows.tolist()]
        assert all(call.tool == tool for call in mine) and len(mine) == sum(c.tool == tool for c in calls)
        durations = seconds_sorted(columns.end[rows] - columns.submit[rows])
        assert list(durations) == sorted((c.end_ns - c.submit_ns) / NS_PER_S for c in mine)
        assert columns.executor.names(rows) == sorted({c.executor for c in mine})
    executors = analysis_module._executor_stats(columns)
    for stats in executors:
        mine = [c for c in calls if c.executor == stats.executor]
        assert stats.submissions == len(mine)
        assert stats.exec_total_s == sum(c.end_ns - c.start_ns for c in mine) / NS_PER_S
        assert stats.peak_in_flight == max_overlap([(c.submit_ns, c.end_ns) for c in mine])
        assert stats.max_queue_depth == max_overlap([(c.submit_ns, c.start_ns) for c in mine])


@pytest.mark.parametrize("rows", [0, 1, 1000, 20000])
def test_the_reader_joins_find_the_rows_a_set_finds(rows):
    """``rows_among`` against a set: ids random, small, 0, the largest, and
    spread so that many share a slot of its bitmap (multiples of 2**40)."""
    rng = random.Random(rows)
    kinds = (0, rng.randrange(50), rng.randrange(1 << 64), rng.randrange(1 << 20) << 40, (1 << 64) - 1)
    column = array("Q", (rng.choice(kinds) for _ in range(rows)))
    for wanted in (
        [rng.randrange(50) for _ in range(20)] + [0, (1 << 64) - 1],
        [rng.randrange(1 << 20) << 40 for _ in range(rows)] + [value for value in column if rng.random() < 0.3],
        [rng.randrange(1 << 64) for _ in range(3 * rows)],
        [],
    ):
        ids = set(wanted) - {0}
        with_seven = ids | {7}
        assert rows_among(column, wanted) == [i for i, value in enumerate(column) if value in ids]
        assert rows_among(column, wanted, array("Q", [7, 7, 0])) == [
            i for i, value in enumerate(column) if value in with_seven
        ]
    assert rows_among(array("Q"), [1, 2]) == [] and rows_among(column) == []


def test_turn_totals_are_the_same_whether_the_turns_are_kept_or_not():
    rng = random.Random(6)
    runs, calls, roots = [], [], {}
    t = 10**18
    for trace in range(1, 400):
        begin = t
        for _ in range(rng.randrange(0, 4)):
            submit = t + rng.randrange(10**6, 10**8)
            start = submit + rng.choice((0, rng.randrange(10**8)))
            end = start + rng.choice((10**8, rng.randrange(10**7, 10**9)))  # ties in seconds
            calls.append(ToolCall(f"t{rng.randrange(3)}", "io", submit, start, end, trace_id=trace, span_id=trace))
            t = end if rng.random() < 0.7 else t
        t += rng.choice((10**8, rng.randrange(10**9)))
        if rng.random() < 0.8:
            run = AgentRun("agent", begin, t, trace, 10**6 + trace)
            runs.append(run)
            roots[trace] = run
        else:
            roots[trace] = AgentRun("root", begin, t, trace, 2 * 10**6 + trace)
    calls.sort(key=lambda c: c.submit_ns)
    kept, totals = find_turns(CallTable.of(calls), [], runs, roots, keep=True)
    empty, folded = find_turns(CallTable.of(calls), [], runs, roots, keep=False)
    assert empty == [] and len(kept) == totals.count == folded.count > 200
    assert folded == totals
    # the totals as the turns in order give them, and the slowest as a stable sort does
    assert totals.end_to_end_s == sum_in_order(turn.seconds for turn in kept)
    assert totals.other_s == sum_in_order(turn.other_s for turn in kept)
    assert list(totals.durations_s) == sorted(turn.seconds for turn in kept)
    assert totals.slowest == sorted(kept, key=lambda turn: -turn.seconds)[:10]


def sum_in_order(values) -> float:
    result = 0.0
    for value in values:
        result += value
    return result


def test_the_call_table_gives_back_the_records_it_was_given():
    """spans/calls.py: the reader's columns make the same ToolCall records,
    however they are reached (index, slice, iteration, rows), before and
    after a selection, with sparse columns filled in when a value comes."""
    rng = random.Random(7)
    calls = _calls(rng, 10_000)
    for i, call in enumerate(calls):
        call.trace_id, call.span_id = rng.randrange(1 << 128), rng.randrange(1 << 64)
        call.pool = rng.choice(("", "a"))
        if i > 9000:  # the sparse columns fill in late
            call.call_id, call.thread, call.outcome = f"call_{i}", "worker-1", rng.choice(("ok", "error"))
            call.executor_workers, call.cpu_ns = rng.choice((None, 8)), rng.choice((None, 1 << 70))
    table = CallTable()
    for call in calls:
        table.append(call)
    assert table.call_id is not None and table.outcome is not None and table.pool is not None
    assert table.error_type is None and table.cpu_ns is not None  # error_type: always None, so no column
    assert list(table.column("error_type")) == [None] * len(calls) and table.column("error_type")[-1] is None
    assert len(table) == len(calls) and list(table) == calls
    assert [table[i] for i in (0, 4097, -1)] == [calls[0], calls[4097], calls[-1]]
    assert table[5:9000:7] == calls[5:9000:7]
    rows = rng.sample(range(len(calls)), 500)
    assert table.records(rows) == [calls[i] for i in rows] and table.records(rows[:1]) == [calls[rows[0]]]
    assert table[3] is not table[3]  # made on demand
    table.select(rows)
    assert list(table) == [calls[i] for i in rows]
    assert table.keep() == [calls[i] for i in rows] and table[3] is table[3]  # kept: the same record
    table.select([2])
    assert list(table) == [calls[rows[2]]]
    kept = CallTable.of(calls)
    assert kept[10] is calls[10] and kept.records([4, 2])[1] is calls[2]
    # a selection of 4,096 rows or more moves the 64-bit columns in numpy: the same calls
    calls[1].span_id, calls[2].submit_ns = (1 << 64) - 1, (1 << 64) - 2
    large = CallTable()
    for call in calls:
        large.append(call)
    rows = [1, 2, *rng.sample(range(3, len(calls)), 6000), 2]
    large.select(rows)
    assert type(large.submit_ns) is array and large.submit_ns.typecode == U64 and large.submit_ns.itemsize == 8
    assert list(large) == [calls[i] for i in rows] and large[0].span_id == (1 << 64) - 1


def test_the_trace_id_column_gives_back_the_128_bit_ids_it_was_given():
    """spans/calls.py: ``TraceIds`` keeps each id as two 64-bit halves and
    gives back the same ints (0, 2**128 - 1, either half 0 or full) by
    index, iteration, slice and ``take``; numpy reads the halves."""
    rng = random.Random(11)
    top = (1 << 128) - 1
    ids = [0, top, 1 << 64, (1 << 64) - 1, top ^ ((1 << 64) - 1), 1 << 127]
    ids += [rng.randrange(1 << 128) for _ in range(5000)]
    column = TraceIds()
    for trace_id in ids:
        column.append(trace_id)
    assert len(column) == len(ids) and list(column) == ids
    assert [column[i] for i in (0, 1, 2, 3, 4, 5, -1)] == [*ids[:6], ids[-1]]
    assert list(column[3:4000:7]) == ids[3:4000:7] and isinstance(column[1:3], TraceIds)
    rows = rng.sample(range(len(ids)), 700)
    assert list(column.take(rows)) == [ids[i] for i in rows]
    assert list(column.take(rows[:1])) == [ids[rows[0]]] and list(column.take([])) == []
    high, low = np.frombuffer(column.high, np.uint64), np.frombuffer(column.low, np.uint64)
    assert [int(h) << 64 | int(lo) for h, lo in zip(high, low)] == ids
    with pytest.raises(IndexError):
        column[len(ids)]
    with pytest.raises(OverflowError):
        column.append(1 << 128)  # (the reader's trace ids are 32 hex digits)
    # the table's column, selected and read back as records
    table = CallTable()
    for i, trace_id in enumerate(ids):
        table.append(ToolCall("t", "io", i, i, i + 1, trace_id=trace_id, span_id=i))
    assert [call.trace_id for call in table.records(rows)] == [ids[i] for i in rows]
    table.select(rows)
    assert isinstance(table.trace_id, TraceIds) and list(table.trace_id) == [ids[i] for i in rows]
    assert [call.trace_id for call in table] == [ids[i] for i in rows] and table[-1].trace_id == ids[rows[-1]]
    # kept records share one int per trace, as the reader's records did
    table = CallTable()
    for i in range(100):
        table.append(ToolCall("t", "io", i, i, i + 1, trace_id=ids[1 + i // 10] + 0, span_id=i))
    kept = table.keep()
    assert [call.trace_id for call in kept] == [ids[1 + i // 10] for i in range(100)]
    assert len({id(call.trace_id) for call in kept}) == 10


@pytest.mark.parametrize("size", [0, 1, 2, 1000])
def test_distinct_is_numpys_unique_without_its_hash_table(size):
    rng = np.random.default_rng(size)
    for values in (rng.integers(0, 50, size, dtype=np.uint64), rng.integers(0, 2**63, size, dtype=np.uint64)):
        assert distinct(values).tolist() == np.unique(values).tolist()


@pytest.mark.parametrize("size", [0, 1, 2, 1000])
def test_grouped_puts_each_groups_rows_together_in_row_order(size):
    """``grouped`` as a lexsort groups: the same groups, each's rows in row
    order; with random 64-bit ids, with few values (many rows a group), and
    with columns made to mix to one value for two groups (the fallback)."""
    from agent_otel.spans.ids import _MIXERS, grouped

    rng = np.random.default_rng(size)
    high = rng.integers(0, 2**63, size, dtype=np.uint64)
    cases = [
        (high, rng.integers(0, 2**63, size, dtype=np.uint64), rng.integers(0, 3, size).astype(np.int32)),
        (rng.integers(0, 3, size, dtype=np.uint64), rng.integers(0, 3, size, dtype=np.uint64)),
    ]
    if size >= 2:
        # (a, 0) and (0, b) mix to one value where a * m0 == b * m1 (mod 2**64)
        m0, m1 = _MIXERS[0], _MIXERS[1]
        a = 12345
        b = a * m0 * pow(m1, -1, 1 << 64) % (1 << 64)
        first = np.array([a if i % 2 else 0 for i in range(size)], dtype=np.uint64)
        second = np.array([0 if i % 2 else b for i in range(size)], dtype=np.uint64)
        cases.append((first, second))
    for columns in cases:
        order, starts = grouped(*columns)
        ends = np.append(starts[1:], size).tolist()
        groups = [order[s:e].tolist() for s, e in zip(starts.tolist(), ends)]
        expected: dict[tuple, list[int]] = {}
        for row in range(size):
            expected.setdefault(tuple(int(c[row]) for c in columns), []).append(row)
        assert sorted(groups) == sorted(expected.values())
