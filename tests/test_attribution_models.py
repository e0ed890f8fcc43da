"""The rule's second explanation: the model server (docs/attribution.md).

While a model call of a window's pool is in flight, the window's time is
the model calls' (queued before the first token, decode after), not the
tool calls'. Checked against the rule applied literally, instant by
instant, over random mixes of model calls, tool calls and pools.
"""

import dataclasses
import math
import random

import pytest

from agent_otel.attribution import BlameTotals, attribute, attribute_underuse
from agent_otel.records import NS_PER_S, IdleWindow, ModelCall, ToolCall, UtilizationSegment
from test_attribution import brute_force

T0 = 1_700_000_000 * NS_PER_S


def at(seconds: float) -> int:
    return T0 + round(seconds * NS_PER_S)


def call(tool: str, submit: float, start: float, end: float | None, pool: str = "") -> ToolCall:
    return ToolCall(tool, "pool", at(submit), at(start), at(end) if end is not None else 0, pool=pool)


def model(name: str, start: float, end: float | None, first: float | None = None, pool: str = "") -> ModelCall:
    return ModelCall(
        name,
        at(start),
        at(end) if end is not None else 0,
        first_chunk_s=None if first is None else first - start,
        pool=pool,
    )


def window(start: float, end: float, gpu: str = "0", pool: str = "") -> IdleWindow:
    return IdleWindow(gpu, at(start), at(end), utilization_avg=0.0, pool=pool)


def test_the_worked_example_of_the_docs():
    # docs/attribution.md, "The model server": the GPU idles 0-6 s; a tool
    # runs 0-5 s; a model call is in flight 1-4 s, first token at 3 s.
    tool = call("web_search", 0.0, 0.0, 5.0)
    chat = model("llama", 1.0, 4.0, first=3.0)
    [result] = attribute([window(0.0, 6.0)], [tool], models=[chat])
    [share] = result.shares
    assert share.call is tool
    assert share.exec_s == pytest.approx(2.0)  # 0-1 s and 4-5 s
    [model_share] = result.models
    assert model_share.call is chat
    assert (model_share.queued_s, model_share.decode_s) == (pytest.approx(2.0), pytest.approx(1.0))
    assert (model_share.start_ns, model_share.end_ns) == (at(1.0), at(4.0))
    assert result.unattributed_s == pytest.approx(1.0)  # 5-6 s
    totals = BlameTotals()
    totals.add(result)
    assert totals.model_s == {
        ("0", "llama", "queued"): pytest.approx(2.0),
        ("0", "llama", "decode"): pytest.approx(1.0),
    }
    assert totals.blocked_s == {("0", "web_search", "exec"): pytest.approx(2.0)}


def test_a_model_call_without_a_first_token_is_queued_throughout_and_one_in_flight_reaches_the_window_end():
    [result] = attribute([window(0.0, 4.0)], [], models=[model("m", 1.0, 2.0), model("m", 3.0, None)])
    assert [(s.queued_s, s.decode_s) for s in result.models] == [(pytest.approx(1.0), 0.0), (pytest.approx(1.0), 0.0)]
    assert result.unattributed_s == pytest.approx(2.0)


def test_a_model_call_of_another_pool_does_not_take_the_time():
    tool = call("sql", 0.0, 0.0, 4.0, pool="a")
    [result] = attribute([window(0.0, 4.0, pool="a")], [tool], models=[model("m", 0.0, 4.0, pool="b")])
    assert result.models == []
    assert result.shares[0].exec_s == pytest.approx(4.0)


def test_unused_capacity_while_a_model_streams_is_the_model_servers():
    segment = UtilizationSegment("0", at(0.0), at(2.0), 0.75)
    totals = attribute_underuse([segment], [call("parse", 0.0, 0.0, 2.0)], models=[model("m", 1.0, 2.0, first=1.0)])
    assert totals.model_s == {("0", "m", "decode"): pytest.approx(0.25)}
    assert totals.blocked_s == {("0", "parse", "exec"): pytest.approx(0.25)}
    assert totals.underused_s["0"] == pytest.approx(0.5)


def oracle(window: IdleWindow, calls: list[ToolCall], models: list[ModelCall]):
    """The tests' independent oracle (``test_attribution.brute_force``), over the window's pool."""
    calls = [c for c in calls if c.pool == window.pool]
    models = [m for m in models if m.pool == window.pool]
    served: dict[int, list[float]] = {}
    tools, unattributed = brute_force(window, calls, models, served)
    return calls, models, tools, served, unattributed


def random_mix(rng: random.Random):
    pools = ("", "vllm-a", "vllm-b")
    calls = []
    for _ in range(rng.randint(0, 12)):
        submit = rng.uniform(0, 20)
        start = submit + rng.choice([0.0, rng.uniform(0, 3)])
        end = start + rng.uniform(0.001, 4)
        calls.append(call(rng.choice("abcd"), submit, start, None if rng.random() < 0.1 else end, rng.choice(pools)))
    models = []
    for _ in range(rng.randint(0, 8)):
        start = rng.uniform(0, 22)
        end = start + rng.uniform(0.001, 3)
        first = rng.choice([None, rng.uniform(start, end)])
        models.append(
            model(rng.choice(("m1", "m2")), start, None if rng.random() < 0.1 else end, first, rng.choice(pools))
        )
    windows = []
    for pool in pools:
        for gpu in ("0", "1"):
            t = rng.uniform(0, 3)
            while t < 25:
                length = rng.uniform(0.01, 5)
                windows.append(window(t, t + length, gpu, pool))
                t += length + rng.uniform(0.01, 3)
    return windows, calls, models


@pytest.mark.parametrize("shares_from", [0.0, 0.05])
def test_matches_the_rule_applied_instant_by_instant_within_a_millisecond(shares_from):
    rng = random.Random(2026)
    checked_models = 0
    for _ in range(300):
        windows, calls, models = random_mix(rng)
        for result in attribute(windows, calls, shares_from=shares_from, models=models):
            own_calls, own_models, tools, served, unattributed = oracle(result.window, calls, models)
            got_models = {own_models.index(s.call): (s.queued_s, s.decode_s) for s in result.models}
            assert got_models.keys() == {i for i, (q, d) in served.items() if q + d > 0}
            for i, (queued, decode) in served.items():
                if i in got_models:
                    assert got_models[i] == (pytest.approx(queued, abs=1e-3), pytest.approx(decode, abs=1e-3))
            checked_models += len(got_models)
            tool_sums: dict[tuple[str, int], float] = {}
            for i, (queue, execute) in tools.items():
                for phase, seconds in ((0, queue), (1, execute)):
                    key = (own_calls[i].tool, phase)
                    tool_sums[key] = tool_sums.get(key, 0.0) + seconds
            got_sums: dict[tuple[str, int], float] = {}
            for (tool, phase), seconds in result.blocked_by_tool_phase().items():
                got_sums[(tool, 0 if phase == "queue" else 1)] = seconds
            for key in tool_sums.keys() | got_sums.keys():
                assert got_sums.get(key, 0.0) == pytest.approx(tool_sums.get(key, 0.0), abs=1e-3)
            assert result.unattributed_s == pytest.approx(unattributed, abs=1e-3)
            total = sum(got_sums.values()) + result.model_s + result.unattributed_s
            assert math.isclose(total, result.window.seconds, abs_tol=1e-6)
    assert checked_models > 100


def test_event_loop_blocks_and_model_calls_together():
    from agent_otel.records import LoopBlock

    a = dataclasses.replace(call("a", 0.0, 0.0, 3.0), trace_id=1, span_id=1)
    lookup = dataclasses.replace(call("lookup", 1.0, 1.0, 2.5), trace_id=1, span_id=2)
    block = LoopBlock("main", at(1.0), at(2.5), "lookup", blocker=(1, 2), waiting=((1, 1),))
    [result] = attribute([window(0.0, 3.0)], [a, lookup], [block], models=[model("m", 2.0, 3.0)])
    by_tool = {s.call.tool: s.blocked_s for s in result.shares}
    assert by_tool == {"a": pytest.approx(1.0), "lookup": pytest.approx(1.0)}
    assert result.model_s == pytest.approx(1.0)
    assert result.unattributed_s == pytest.approx(0.0, abs=1e-9)


def test_the_report_attributing_in_groups_gives_the_same_model_and_tool_blame(monkeypatch):
    import numpy as np

    from agent_otel.report import analysis as analysis_module
    from agent_otel.spans.calls import CallTable

    rng = random.Random(7)
    calls, windows, models = [], [], []
    t = 10**18
    for i in range(3000):
        t += rng.randrange(10**7, 10**9)
        queue = rng.choice((0, rng.randrange(10**8)))
        end = t + queue + rng.randrange(10**7, 2 * 10**9)
        calls.append(ToolCall(f"t{i % 7}", "io", t, t + queue, end))
        if rng.random() < 0.4:
            windows.append(IdleWindow(str(i % 2), t + 5, end, 0.01))
        if rng.random() < 0.3:
            start = t + rng.randrange(-(10**9), 10**9)
            length = rng.randrange(10**7, 3 * 10**9)
            first = rng.choice((None, rng.uniform(0, length / NS_PER_S)))
            models.append(ModelCall(f"m{i % 2}", start, start + length, span_id=i, first_chunk_s=first))
    monkeypatch.setattr(analysis_module, "ATTRIBUTION_GROUP", 200)
    table = CallTable.of(calls)
    grouped = list(analysis_module._attribute(windows, table, np.arange(len(calls)), (), models))
    whole = attribute(windows, calls, models=models)
    assert sum(len(result.models) for result in whole) > 100
    for a, b in zip(grouped, whole):
        assert a.window == b.window
        assert a.unattributed_s == pytest.approx(b.unattributed_s, abs=1e-9)
        assert a.blocked_by_tool_phase() == pytest.approx(b.blocked_by_tool_phase(), abs=1e-9)
        assert [(m.call.span_id, m.queued_s, m.decode_s) for m in a.models] == [
            (m.call.span_id, pytest.approx(m.queued_s, abs=1e-9), pytest.approx(m.decode_s, abs=1e-9)) for m in b.models
        ]
