"""The report reads the whole turn: model calls, agent runs, other instrumentations' spans.

Each run below states its timeline in seconds; the report reads it back
from the OTLP/JSON file the real SDK wrote.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from agent_otel.records import NS_PER_S

from agent_otel.commands.cli import main
from helpers.traces import RecordedRun, write_gpu_csv


def report_of(capsys, *argv) -> dict:
    assert main(["report", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def one_turn(tmp_path):
    """One agent turn of 10 s on a GPU that is busy only while the model runs.

    model 0-2 s; search requested at 2, queued until 3, executing until 6;
    model 6-8 s; 8-10 s the agent's own code. The GPU idles 2-6 (search in
    flight: blamed on it, 1 s queued and 3 s executing) and 8-10 (nobody).
    """
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("support", 0.0, 10.0)
    run.model_call("llama-3-70b", 0.0, 2.0, parent=turn, input_tokens=800, output_tokens=40, first_chunk=0.3)
    run.tool_call("search", 2.0, 3.0, 6.0, parent=turn, call_id="c1")
    run.model_call("llama-3-70b", 6.0, 8.0, parent=turn, input_tokens=900, output_tokens=60)
    run.close()
    # each sample covers the 0.1 s before it: busy through 2 s and from 6 to 8 s
    samples = [(t / 10, 0, 100 if t <= 20 or 60 < t <= 80 else 0) for t in range(1, 101)]
    write_gpu_csv(tmp_path / "gpu.csv", samples)
    return tmp_path


def test_a_turn_splits_into_model_queue_exec_and_other(one_turn, capsys):
    report = report_of(capsys, one_turn / "traces.jsonl", "--gpu-log", one_turn / "gpu.csv", "--tz", "UTC")

    turns = report["turns"]
    assert (turns["count"], turns["from_agent_spans"]) == (1, 1)
    assert turns["end_to_end_s"] == pytest.approx(10.0)
    assert turns["model_s"] == pytest.approx(4.0)
    assert turns["tool_queue_s"] == pytest.approx(1.0)
    assert turns["tool_exec_s"] == pytest.approx(3.0)
    assert turns["other_s"] == pytest.approx(2.0)
    (slowest,) = turns["slowest"]
    assert slowest["name"] == "support"
    assert (slowest["tool_calls"], slowest["model_calls"]) == (1, 2)
    (search,) = report["tools"]
    assert search["gpu_idle_blocked_s"] == pytest.approx(4.0)
    assert search["gpu_idle_blocked_per_call_s"] == pytest.approx(4.0)
    assert search["latency_share"] == pytest.approx(0.4)
    (model,) = report["models"]
    assert model == {
        "model": "llama-3-70b",
        "calls": 2,
        "errors": 0,
        "seconds": pytest.approx(4.0),
        "duration_p50_s": pytest.approx(2.0),
        "duration_p95_s": pytest.approx(2.0),
        "time_to_first_chunk_p50_s": pytest.approx(0.3),
        "input_tokens": 1700,
        "output_tokens": 100,
        # the GPU was busy whenever a model call was in flight: nothing is the model server's
        "gpu_idle_blocked_s": 0.0,
        "gpu_idle_blocked_queued_s": 0.0,
        "gpu_idle_blocked_decode_s": 0.0,
        "gpu_underused_blocked_s": pytest.approx(0.0, abs=1e-6),
    }
    assert report["inputs"]["model_calls"] == 2
    assert report["inputs"]["agent_runs"] == 1


def test_the_table_says_it_as_a_sentence(one_turn, capsys):
    assert main(["report", str(one_turn / "traces.jsonl"), "--gpu-log", str(one_turn / "gpu.csv"), "--tz", "UTC"]) == 0
    text = capsys.readouterr().out

    assert (
        "search idles the GPU 4.0 s per call (4.0 s blamed over 1 call), in flight for 40 % of the turns' time" in text
    )
    assert (
        "1 turn (invoke_agent spans): 10.0 s end to end = model 4.0 s (40 %) + tool queue 1.0 s (10 %)"
        " + tool exec 3.0 s (30 %) + other 2.0 s (20 %)" in text
    )
    assert "llama-3-70b" in text


def test_parallel_tools_and_a_model_overlapping_count_each_instant_once(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("research", 0.0, 6.0)
    # a speculative model call 0-3 while two tools run side by side
    run.model_call("gpt-4o", 0.0, 3.0, parent=turn)
    run.tool_call("search", 1.0, 1.0, 4.0, parent=turn)
    run.tool_call("fetch", 1.0, 2.0, 5.0, parent=turn)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    turns = report["turns"]
    # 0-3 model; 3-5 exec (search to 4, fetch to 5); fetch's queue 1-2 is under the model; 5-6 other
    assert (turns["model_s"], turns["tool_queue_s"], turns["tool_exec_s"], turns["other_s"]) == pytest.approx(
        (3.0, 0.0, 2.0, 1.0)
    )
    shares = {t["tool"]: t["latency_share"] for t in report["tools"]}
    assert shares == {"search": pytest.approx(0.5), "fetch": pytest.approx(4 / 6, abs=1e-4)}  # JSON: 4 decimals


def test_without_agent_spans_each_trace_is_a_turn(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    for number in range(2):
        start = number * 10.0
        request = run.span("POST /chat", start, start + 5.0)  # a web framework's server span
        run.model_call("gpt-4o", start + 0.5, start + 1.5, parent=request)
        run.tool_call("lookup", start + 1.5, start + 1.5, start + 4.0, parent=request)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    turns = report["turns"]
    assert (turns["count"], turns["from_agent_spans"]) == (2, 0)
    assert turns["end_to_end_s"] == pytest.approx(10.0)
    assert turns["model_s"] == pytest.approx(2.0)
    assert turns["tool_exec_s"] == pytest.approx(5.0)
    assert turns["other_s"] == pytest.approx(3.0)
    assert {t["name"] for t in turns["slowest"]} == {"POST /chat"}


def test_a_sub_agent_is_part_of_its_parents_turn(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    outer = run.invoke_agent("planner", 0.0, 8.0)
    inner = run.invoke_agent("researcher", 2.0, 6.0, parent=outer)
    run.tool_call("search", 3.0, 3.0, 5.0, parent=inner)
    run.model_call("gpt-4o", 0.0, 2.0, parent=outer)
    run.close()

    turns = report_of(capsys, tmp_path / "traces.jsonl")["turns"]

    assert (turns["count"], turns["end_to_end_s"]) == (1, pytest.approx(8.0))
    assert turns["slowest"][0]["name"] == "planner"


def test_openinference_and_openllmetry_spans_are_read(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    # OpenInference: a chain root, an LLM span, a TOOL span beside agent-otel's span of the same call
    root = run.span("LangGraph", 0.0, 6.0, {"openinference.span.kind": "CHAIN"})
    run.span(
        "ChatOpenAI",
        0.0,
        1.0,
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o",
            "llm.token_count.prompt": 120,
            "llm.token_count.completion": 8,
        },
        parent=root,
    )
    tools_node = run.span("tools", 1.0, 4.0, {"openinference.span.kind": "CHAIN"}, parent=root)
    run.tool_call("search", 1.0, 1.5, 4.0, parent=tools_node)
    run.span("search", 1.5, 4.0, {"openinference.span.kind": "TOOL", "tool.name": "search"}, parent=tools_node)
    # a tool agent-otel did not see: counted from OpenInference's span alone
    run.span("calculator", 4.0, 4.5, {"openinference.span.kind": "TOOL", "tool.name": "calculator"}, parent=root)
    # OpenLLMetry, another trace: invoke_agent root, a chat span naming no model, an execute_tool span
    agent = run.span(
        "invoke_agent LangGraph",
        10.0,
        14.0,
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "LangGraph", "traceloop.span.kind": "workflow"},
    )
    run.span(
        "ChatModel.chat", 10.0, 11.0, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "unknown"}, parent=agent
    )
    run.tool_call("search", 11.0, 11.0, 13.0, parent=agent)
    run.span(
        "execute_tool search",
        11.001,
        12.999,
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "traceloop.span.kind": "tool"},
        parent=agent,
    )
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    tools = {t["tool"]: t for t in report["tools"]}
    assert tools["search"]["calls"] == 2  # one per trace: each peer span is agent-otel's call
    assert tools["search"]["executors"] == ["io"]
    assert tools["calculator"]["calls"] == 1
    assert tools["calculator"]["executors"] == ["unknown"]
    assert report["inputs"]["peer_tool_spans"] == 3
    assert report["inputs"]["peer_tool_spans_merged"] == 2
    models = {m["model"]: m for m in report["models"]}
    assert models["gpt-4o"]["input_tokens"] == 120 and models["gpt-4o"]["output_tokens"] == 8
    assert models["ChatModel.chat"]["calls"] == 1  # "unknown" is no name: the span's
    turns = report["turns"]
    assert turns["count"] == 2
    assert turns["model_s"] == pytest.approx(2.0)
    assert {t["name"] for t in turns["slowest"]} == {"LangGraph"}


def test_a_model_span_under_a_model_span_is_one_call(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    outer = run.model_call("gpt-4o", 0.0, 2.0)  # a framework's model call
    run.model_call("gpt-4o-2024-08-06", 0.1, 1.9, parent=outer, input_tokens=10)  # the client library's
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    assert [(m["model"], m["calls"]) for m in report["models"]] == [("gpt-4o", 1)]
    assert report["inputs"]["duplicate_spans"] == 1


def test_a_trace_that_is_only_a_tool_call_is_no_turn(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.tool_call("search", 0.0, 0.0, 1.0)  # a script's tool call, no agent span or request around it
    run.model_call("gpt-4o", 2.0, 3.0)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    assert report["turns"]["count"] == 0
    assert report["tools"][0]["latency_share"] is None
    assert report["models"][0]["calls"] == 1


def test_the_turn_waits_on_the_call_that_finishes_last(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("round", 0.0, 4.0)
    # one worker: fetch runs 0-2 while search waits for it, then search runs 2-4
    run.tool_call("fetch", 0.0, 0.0, 2.0, parent=turn)
    run.tool_call("search", 0.0, 2.0, 4.0, parent=turn)
    run.close()

    turns = report_of(capsys, tmp_path / "traces.jsonl")["turns"]

    # 0-2 the turn waits on search, which is queued; 2-4 on search executing
    assert (turns["tool_queue_s"], turns["tool_exec_s"], turns["other_s"]) == pytest.approx((2.0, 2.0, 0.0))


def test_every_kind_of_model_and_agent_span_is_read(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    # the GenAI operations besides chat, in an OpenInference AGENT span
    agent = run.span("support", 0.0, 5.0, {"openinference.span.kind": "AGENT"})
    run.model_call("llama-3-70b", 0.0, 1.0, parent=agent, operation="text_completion", input_tokens=5)
    run.model_call("gemini-2.0-flash", 1.0, 3.0, parent=agent, operation="generate_content", first_chunk=0.4)
    # an OpenLLMetry LLM span in an OpenLLMetry agent span, with only traceloop's kind to say what it is
    crew = run.span("research.agent", 10.0, 14.0, {"traceloop.span.kind": "agent"})
    run.span("openai.chat", 10.0, 12.0, {"traceloop.span.kind": "llm", "gen_ai.request.model": "gpt-4o"}, parent=crew)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    models = {m["model"]: m for m in report["models"]}
    assert set(models) == {"llama-3-70b", "gemini-2.0-flash", "gpt-4o"}
    assert models["llama-3-70b"]["input_tokens"] == 5
    assert models["gemini-2.0-flash"]["time_to_first_chunk_p50_s"] == pytest.approx(0.4)
    assert all(m["calls"] == 1 for m in models.values())
    turns = report["turns"]
    assert (turns["count"], turns["from_agent_spans"]) == (2, 2)
    assert turns["model_s"] == pytest.approx(5.0)
    assert turns["end_to_end_s"] == pytest.approx(9.0)


def test_a_session_of_many_turns_in_one_trace_splits_each_turn(tmp_path, capsys):
    # One trace for a whole session: 40 turns under one root span, each a
    # model call (1 s), a tool call (0.5 s queued, 1.5 s executing) and 2 s
    # of the agent's own code; every fifth turn also a call that runs to its end.
    run = RecordedRun(tmp_path / "traces.jsonl")
    session = run.span("session", 0.0, 400.0)
    for k in range(40):
        at = 10.0 * k
        turn = run.invoke_agent("research", at, at + 5.0, parent=session)
        run.model_call("llama-3-70b", at, at + 1.0, parent=turn)
        run.tool_call("search", at + 1.0, at + 1.5, at + 3.0, parent=turn)
        if k % 5 == 0:
            run.tool_call("fetch", at + 3.0, at + 3.0, at + 5.0, executor="direct", parent=turn)
    run.close()
    turns = report_of(capsys, tmp_path / "traces.jsonl")["turns"]
    assert turns["count"] == 40 and turns["from_agent_spans"] == 40
    assert turns["model_s"] == pytest.approx(40.0)
    assert turns["tool_queue_s"] == pytest.approx(20.0)
    assert turns["tool_exec_s"] == pytest.approx(60.0 + 8 * 2.0)
    assert turns["other_s"] == pytest.approx(40 * 5.0 - 40.0 - 20.0 - 76.0)
    slowest = turns["slowest"][0]
    assert (slowest["tool_calls"], slowest["model_calls"]) == (2, 1)  # each turn its own calls, not the trace's


def test_the_client_blocking_its_loop_during_a_call_is_client_cpu_not_model_time(tmp_path, capsys):
    """A model call 0-3 s during which the process's own code held its event
    loop 0.5-2.0 s (the loop monitor's block, with no tool call holding it,
    linked to the model call waiting): 1.5 s of client CPU, 1.5 s of model.
    A block a tool call held is that tool's own time (exec)."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("support", 0.0, 8.0)
    model = run.model_call("gpt-4o", 0.0, 3.0, parent=turn)
    tool = run.tool_call("parse", 3.0, 3.0, 6.0, parent=turn)
    other = run.invoke_agent("elsewhere", 0.0, 8.0)  # another turn, on another loop: not blocked
    run.model_call("gpt-4o", 0.0, 3.0, parent=other)
    run.loop_block(0.5, 2.0, waiting=[model], stack='  File "openai/_models.py", line 1, in construct\n')
    run.loop_block(4.0, 5.0, blocker=tool)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    slowest = {turn["name"]: turn for turn in report["turns"]["slowest"]}
    support = slowest["support"]
    assert support["client_cpu_s"] == pytest.approx(1.5)
    assert support["model_s"] == pytest.approx(1.5)
    assert support["tool_exec_s"] == pytest.approx(3.0)
    assert support["other_s"] == pytest.approx(2.0)
    assert (slowest["elsewhere"]["client_cpu_s"], slowest["elsewhere"]["model_s"]) == (0.0, pytest.approx(3.0))
    assert report["turns"]["client_cpu_s"] == pytest.approx(1.5)
    assert main(["report", str(tmp_path / "traces.jsonl")]) == 0
    assert "client CPU 1.5 s" in capsys.readouterr().out


# ---------------------------------------------------------------- the split in numpy against a sweep


def swept(a, b, calls, models, blocks):
    """The reference split of [a, b): (client CPU, model, tool queue, tool
    exec) nanoseconds, by a sweep over every instant between two bounds
    with a heap of the calls in flight, as the module's docstring states it.
    ``calls``: (submit, start, end) by submit; ``models`` and ``blocks``: (start, end)."""
    import heapq

    points = sorted(
        t
        for t in {a, b, *(t for c in calls for t in c), *(t for m in models for t in m)}
        | {t for k in blocks for t in k}
        if a <= t <= b
    )
    client = model = queue = execution = 0
    in_flight: list[tuple[int, int, int]] = []  # (-end, request order, start) of the calls requested so far
    next_call = 0
    for t0, t1 in zip(points, points[1:]):
        if any(start <= t0 < end for start, end in blocks):
            client += t1 - t0
            continue
        if any(start <= t0 < end for start, end in models):
            model += t1 - t0
            continue
        while next_call < len(calls) and calls[next_call][0] <= t0:
            submit, start, end = calls[next_call]
            heapq.heappush(in_flight, (-end, next_call, start))
            next_call += 1
        while in_flight and -in_flight[0][0] <= t0:
            heapq.heappop(in_flight)
        if in_flight:
            if t0 < in_flight[0][2]:
                queue += t1 - t0
            else:
                execution += t1 - t0
    return client, model, queue, execution


def union_ns(a, b, spans):
    """Nanoseconds of [a, b) that the spans (sorted by start) cover."""
    total, reach = 0, a
    for start, end in spans:
        start, end = max(start, reach), min(end, b)
        if start < end:
            total += end - start
            reach = end
    return total


def random_turns(rng, count, table, scale=1):
    """``count`` random turns of calls in ``table``: [(a, b, rows, models, blocks)].

    Times on a grid of 25 (many equal requests, starts and ends); calls
    overlapping, before, across and past the turn by up to the slack,
    zero-length; model calls and client blocks reaching past the turn;
    turns of no time (a == b) and turns of no call; up to 9 tools."""
    from agent_otel.records import ModelCall

    def fit(t):  # a time of the reader's: within 64 bits
        return min(max(t, 0), (1 << 64) - 1)

    turns = []
    at = rng.randrange(0, 10**6)
    for _ in range(count):
        a = fit(at + rng.randrange(0, 3) * 25 * scale)
        b = fit(a + rng.choice([0, 25, rng.randrange(0, 5_000, 25), rng.randrange(0, 20_000, 25)]) * scale)
        slack = rng.choice([0, 100, 500]) * scale
        rows = []
        for _ in range(rng.choice([0, 1, 2, rng.randrange(1, 12), rng.randrange(1, 150)])):
            submit = rng.randrange(a - slack, b + slack + 1, 25) if b > a or slack else a
            start = submit + rng.choice([0, 0, rng.randrange(0, 400, 25)]) * scale
            end = start + rng.choice([0, 25, rng.randrange(25, 2_000, 25)]) * scale
            tool = f"tool{rng.randrange(rng.choice([1, 3, 9]))}"
            rows.append(len(table))
            table.add(tool, "pool", fit(submit), fit(start), fit(end), "ok", None, 1, 1, None, None, None, "", None)
        rows.sort(key=table.submit_ns.__getitem__)
        models = [
            ModelCall("m", fit(s), fit(s + rng.randrange(0, 800 * scale)))
            for s in (rng.randrange(a - 200 * scale, b + 100 * scale) for _ in range(rng.choice([0, 0, 1, 3])))
        ]
        blocks = sorted(
            (fit(s), fit(s + rng.randrange(1, 300 * scale)))
            for s in (rng.randrange(a - 100, b + 1) for _ in range(rng.choice([0, 0, 0, 2])))
        )
        turns.append((a, b, rows, models, blocks))
        at = rng.choice([b, a, at + 1]) if scale == 1 else rng.randrange(1 << 63)  # after, beside, inside
    return turns


def expected_of(table, a, b, rows, models, blocks):
    calls = [(table.submit_ns[r], table.start_ns[r], table.end_ns[r]) for r in rows]
    parts = swept(a, b, calls, [(m.start_ns, m.end_ns) for m in models], blocks)
    by_tool: dict = {}
    for r in rows:
        by_tool.setdefault(table.tool[r], []).append((table.submit_ns[r], table.end_ns[r]))
    return parts, {tool: union_ns(a, b, spans) for tool, spans in by_tool.items()}


@pytest.mark.parametrize("seed", range(4))
def test_turns_split_in_numpy_a_batch_at_a_time_as_a_sweep_splits_each(monkeypatch, seed):
    """The turns are split in numpy many at a time, batches ending in the
    middle of the turns; on random turns each turn's four parts and each
    tool's time in flight are the sweep's, exactly."""
    import random

    from agent_otel.report import turns as module
    from agent_otel.spans.calls import CallTable

    rng = random.Random(seed)
    table = CallTable()
    cases = random_turns(rng, 300, table)
    monkeypatch.setattr(module, "BATCH_TURNS", rng.choice([1, 7, 64]))
    monkeypatch.setattr(module, "BATCH_CALLS", rng.choice([1, 50, 400]))
    monkeypatch.setattr(module, "_PIECES", rng.choice([3, 64, 1 << 16]))
    kept = module._Turns(keep=True)
    in_flight: dict = defaultdict(int)
    batch = module._Batch(table, kept, in_flight)
    found = []
    for k, (a, b, rows, models, blocks) in enumerate(cases):
        turn = module.Turn("t", k, a, b, module.FROM_AGENT)
        found.append(turn)
        batch.add(turn, rows, models, True, blocks)
    batch.flush()
    assert kept.kept == found  # every turn, in the order found (the sequential ones too)
    assert all(x is y for x, y in zip(kept.kept, found))
    expected_in_flight: dict = defaultdict(int)
    split = 0
    for turn, (a, b, rows, models, blocks) in zip(found, cases):
        (client, model, queue, execution), tools = expected_of(table, a, b, rows, models, blocks)
        got = (turn.client_cpu_s, turn.model_s, turn.tool_queue_s, turn.tool_exec_s)
        assert got == (client / NS_PER_S, model / NS_PER_S, queue / NS_PER_S, execution / NS_PER_S), (turn, a, b)
        assert turn.other_s == max(0.0, turn.seconds - sum(got[:1]) - got[1] - got[2] - got[3])
        assert (turn.tool_calls, turn.model_calls) == (len(rows), len(models))
        for tool, ns in tools.items():
            expected_in_flight[tool] += ns
        split += bool(models or blocks or client or model or queue)
    assert dict(in_flight) == dict(expected_in_flight)
    assert split > 100 and any(v for v in in_flight.values())


def test_turns_of_any_length_split_in_numpy_as_a_sweep_splits_each():
    """Turns whose times span most of the 64 bits (their segments do not
    all fit on one axis: split a run of them at a time) and, beside them,
    short ones: the parts and the times in flight are the sweep's."""
    import random

    import numpy as np

    from agent_otel.report import turns as module
    from agent_otel.spans.calls import CallTable

    rng = random.Random(5)
    table = CallTable()
    cases = random_turns(rng, 40, table) + random_turns(rng, 20, table, scale=1 << 49)
    cases += [(1, (1 << 64) - 2, [], [], [])]
    # and turns that end before they start (none of their time is split)
    cases += [(b, a, rows, models, blocks) for a, b, rows, models, blocks in cases[:5] if a < b]
    rng.shuffle(cases)
    for a, b, rows, *_ in cases:
        assert 0 <= min(a, b) and max(a, b) < 1 << 64 and all(0 <= table.end_ns[r] < 1 << 64 for r in rows)
    u64 = np.uint64
    rows = [r for case in cases for r in case[2]]
    call_turn = np.repeat(np.arange(len(cases)), [len(case[2]) for case in cases])
    model_turn = np.repeat(np.arange(len(cases)), [len(case[3]) for case in cases])
    block_turn = np.repeat(np.arange(len(cases)), [len(case[4]) for case in cases])
    columns = {name: np.array(getattr(table, name), u64)[rows] for name in ("submit_ns", "start_ns", "end_ns")}
    bounds = np.array([(a, b) for a, b, *_ in cases], u64).reshape(-1, 2)
    parts = module._split_turns(
        bounds,
        call_turn,
        columns["submit_ns"],
        columns["start_ns"],
        columns["end_ns"],
        model_turn,
        np.array([(m.start_ns, m.end_ns) for case in cases for m in case[3]], u64).reshape(-1, 2),
        block_turn,
        np.array([k for case in cases for k in case[4]], u64).reshape(-1, 2),
    )
    code_of: dict = {}
    codes = np.array([code_of.setdefault(table.tool[r], len(code_of)) for r in rows], np.intp)
    in_flight = module._in_flight_turns(bounds, call_turn, columns["submit_ns"], columns["end_ns"], codes)
    expected_in_flight: dict = defaultdict(int)
    for got, (a, b, rows, models, blocks) in zip(parts.tolist(), cases):
        expected, tools = expected_of(table, a, b, rows, models, blocks)
        assert tuple(got) == expected, (a, b)
        for tool, ns in tools.items():
            expected_in_flight[code_of[tool]] += ns
    assert in_flight == dict(expected_in_flight)
    assert sum(b - a for a, b, *_ in cases) > 1 << 64  # more than one axis' worth


def test_a_call_requested_after_its_turn_ended_takes_none_of_the_turns_time():
    """A call of the turn's trace requested just after its agent span ended
    (within the 1 ms the turn's calls may reach past it) is part of the turn
    but none of its time: no negative queue time, no negative time in flight."""
    from agent_otel.records import AgentRun, ToolCall
    from agent_otel.report.turns import find_turns
    from agent_otel.spans.calls import CallTable

    s = NS_PER_S
    run = AgentRun("agent", 10 * s, 20 * s, trace_id=1, span_id=9)
    calls = [
        ToolCall("search", "io", 11 * s, 12 * s, 13 * s, trace_id=1, span_id=2),
        ToolCall("notify", "io", 20 * s + 500_000, 20 * s + 600_000, 20 * s + 800_000, trace_id=1, span_id=3),
    ]
    (turn,), totals = find_turns(CallTable.of(calls), [], [run], {1: run})
    assert (turn.tool_calls, turn.tool_queue_s, turn.tool_exec_s) == (2, 1.0, 1.0)
    assert turn.other_s == 8.0
    assert totals.tool_in_flight_s == {"search": 2.0, "notify": 0.0}


def test_a_sessions_calls_lie_within_its_runs_where_each_lies_within_one():
    """A trace of many runs is split run by run only where each of its calls
    and model calls lies within one run (give or take the slack); checked
    in numpy for the calls, on random sessions against the plain rule."""
    import random

    from agent_otel.records import AgentRun, ModelCall
    from agent_otel.report import turns as module
    from agent_otel.spans.calls import CallTable

    rng = random.Random(3)
    slack = module.SLACK_NS
    top = (1 << 64) - 1
    outcomes = set()
    for case in range(1000):
        at = rng.choice([0, slack // 2, 10**18, top - 10**9])
        runs = []
        for _ in range(rng.randrange(2, 8)):
            start = min(at + rng.randrange(0, 3 * slack), top)
            runs.append(AgentRun("a", start, min(start + rng.randrange(0, 4 * slack), top), 1, len(runs)))
            at = runs[-1].end_ns + rng.choice([0, 1, slack, 3 * slack]) - slack
        runs = module._outermost(runs)
        low, high = max(runs[0].start_ns - 2 * slack, 0), min(runs[-1].end_ns + 2 * slack, top)
        table = CallTable()
        edges = [t for r in runs for t in (r.start_ns - slack, r.end_ns + slack) if 0 <= t <= top]
        for _ in range(rng.choice([0, 1, 2, 5, 30])):  # (few: one outside hides the others)
            # on a run's edges, a nanosecond either side, or anywhere; at times 0 and 2**64 - 1
            near = [min(max(t + rng.choice((-1, 0, 1)), 0), top) for t in edges]
            submit = rng.choice([rng.randrange(low, high + 1), 0, *near])
            end = rng.choice(
                [submit, min(submit + rng.randrange(0, slack), top), top, *(t for t in near if t >= submit)]
            )
            table.add("t", "pool", submit, submit, end, "ok", None, 1, 1, None, None, None, "", None)
        rows = sorted(range(len(table)), key=table.submit_ns.__getitem__)
        models = [
            ModelCall("m", s, min(s + rng.randrange(0, slack), top))
            for s in [rng.randrange(low, high)] * rng.randrange(2)
        ]

        def within(start, end, runs=runs):
            return any(r.start_ns - slack <= start and end <= r.end_ns + slack for r in runs)

        expected = all(within(table.submit_ns[r], table.end_ns[r]) for r in rows) and all(
            within(m.start_ns, m.end_ns) for m in models
        )
        times = (min(table.submit_ns), max(table.end_ns)) if rows else None
        assert module._all_covered(table, rows, times, models, runs) == expected, case
        outcomes.add(expected)
    assert outcomes == {True, False}
