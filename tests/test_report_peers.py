"""One call, one record: the spans several instrumentations made of one call are merged (spans.peers).

Each run states its timeline in seconds; the report reads it back from the
OTLP/JSON file the real SDK wrote.
"""

from __future__ import annotations

import json
from array import array

import pytest

from agent_otel.commands.cli import main
from helpers.traces import RecordedRun

OI_TOOL = {"openinference.span.kind": "TOOL", "tool.name": "search"}
OL_TOOL = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "traceloop.span.kind": "tool"}


def report_of(capsys, path) -> dict:
    assert main(["report", str(path), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def oi_llm(model=None, prompt=None, completion=None) -> dict:
    attributes = {"openinference.span.kind": "LLM"}
    if model:
        attributes["llm.model_name"] = model
    if prompt is not None:
        attributes["llm.token_count.prompt"] = prompt
        attributes["llm.token_count.completion"] = completion
    return attributes


def ol_chat(model="unknown", prompt=None, completion=None) -> dict:
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "traceloop.workflow.name": "g"}
    if prompt is not None:
        attributes["gen_ai.usage.input_tokens"] = prompt
        attributes["gen_ai.usage.output_tokens"] = completion
    return attributes


def test_both_peers_beside_agent_otel_count_each_call_once(tmp_path, capsys):
    """Two search calls side by side, each seen by agent-otel, OpenInference and
    OpenLLMetry (siblings, not nested); two model calls each seen by both peers."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("support", 0.0, 10.0)
    run.span("ChatModel", 0.0, 2.0, oi_llm("gpt-4o", 100, 10), parent=turn)
    run.span("ChatOpenAI.chat", 0.01, 1.99, ol_chat("gpt-4o", 100, 10), parent=turn)
    for call_id, submit, start, end in (("c1", 2.0, 2.0, 5.0), ("c2", 2.0, 3.0, 6.0)):
        run.tool_call("search", submit, start, end, parent=turn, call_id=call_id)
        run.span("search", start + 0.001, end - 0.001, OI_TOOL, parent=turn)
        run.span("execute_tool search", start + 0.002, end - 0.002, OL_TOOL, parent=turn)
    run.span("ChatModel", 6.0, 8.0, oi_llm("gpt-4o-2024-08-06", 200, 20), parent=turn)
    run.span("ChatOpenAI.chat", 6.0, 8.0, ol_chat("gpt-4o", 200, 20), parent=turn)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    (tool,) = report["tools"]
    assert (tool["tool"], tool["calls"], tool["executors"]) == ("search", 2, ["io"])  # agent-otel's spans kept
    assert (report["inputs"]["peer_tool_spans"], report["inputs"]["peer_tool_spans_merged"]) == (4, 4)
    # one span's name, of each call: a dated snapshot and the name it was asked by are one model's
    assert sum(m["calls"] for m in report["models"]) == 2
    assert sum(m["input_tokens"] for m in report["models"]) == 300  # not doubled
    assert sum(m["output_tokens"] for m in report["models"]) == 30
    (turn_found,) = report["turns"]["slowest"]
    assert (turn_found["tool_calls"], turn_found["model_calls"]) == (2, 2)
    assert turn_found["model_s"] == pytest.approx(4.0)
    assert turn_found["tool_queue_s"] + turn_found["tool_exec_s"] == pytest.approx(4.0)


def test_peers_alone_merge_with_each_other(tmp_path, capsys):
    """No agent-otel span: OpenInference's and OpenLLMetry's spans of one call are one call,
    the widest kept; the model's name and tokens come from whichever has them."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    root = run.span("LangGraph", 0.0, 5.0, {"openinference.span.kind": "CHAIN"})
    run.span("ChatModel", 0.0, 1.0, oi_llm("llama-3-70b"), parent=root)  # names the model, no tokens
    run.span("Model.chat", 0.2, 0.6, ol_chat(prompt=50, completion=5), parent=root)  # tokens, no name
    run.span("search", 1.0, 3.0, OI_TOOL, parent=root)
    run.span("execute_tool search", 1.1, 2.9, OL_TOOL, parent=root)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    (tool,) = report["tools"]
    assert tool["calls"] == 1
    assert tool["duration_p50_s"] == pytest.approx(2.0)  # the widest span kept
    (model,) = report["models"]
    assert (model["model"], model["calls"], model["input_tokens"], model["output_tokens"]) == ("llama-3-70b", 1, 50, 5)
    assert model["seconds"] == pytest.approx(1.0)


def test_calls_the_rule_keeps_apart(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("support", 0.0, 10.0)
    # two calls side by side seen by one instrumentation: two calls
    run.span("ChatModel", 0.0, 2.0, oi_llm("gpt-4o"), parent=turn)
    run.span("ChatModel", 0.0, 2.0, oi_llm("gpt-4o"), parent=turn)
    # a peer's model span of another model at the same time: another call
    run.span("Other.chat", 0.5, 1.5, ol_chat("claude-3-5-sonnet"), parent=turn)
    # a peer's tool span whose call id is not agent-otel's: another call
    run.tool_call("search", 3.0, 3.0, 5.0, parent=turn, call_id="c1")
    run.span("execute_tool search", 3.1, 4.9, {**OL_TOOL, "gen_ai.tool.call.id": "c9"}, parent=turn)
    # a peer's tool span mostly outside agent-otel's call: another call
    run.tool_call("search", 6.0, 6.0, 7.0, parent=turn)
    run.span("search", 6.5, 8.0, OI_TOOL, parent=turn)
    run.close()

    report = report_of(capsys, tmp_path / "traces.jsonl")

    models = {m["model"]: m["calls"] for m in report["models"]}
    assert models == {"gpt-4o": 2, "claude-3-5-sonnet": 1}
    (tool,) = report["tools"]
    assert tool["calls"] == 4
    assert report["inputs"]["peer_tool_spans_merged"] == 0


def test_a_pair_of_agent_otels_span_and_a_peers_merges_as_in_any_group():
    """A (trace, tool) group of agent-otel's span and one other is merged
    inline; on random pairs (nested, overlapping, apart, ids equal, other,
    absent) it drops what the general rules drop: the same pair with a far
    agent-otel span added (a group of three, no candidate for the peer)."""
    import random

    from agent_otel.spans.peers import SLACK_NS, merge_tool_spans

    rng = random.Random(5)
    merged = 0
    for case in range(400):
        submits = [rng.randrange(0, 4) * SLACK_NS for _ in range(2)] + [10**12]
        ends = [s + rng.randrange(1, 5) * SLACK_NS for s in submits]
        ours = bytearray([1, 0, 1]) if case % 2 else bytearray([0, 1, 1])
        families = bytearray(0 if o else 1 for o in ours)
        ids = [rng.choice([0, 7, 9]), rng.choice([0, 7, 9]), 0]
        found: list[list[int]] = []
        for rows in ([0, 1], [0, 1, 2]):
            dropped: list[int] = []
            rows = sorted(rows, key=submits.__getitem__)
            count = merge_tool_spans(rows, ours, families, ids, submits, ends, dropped.append)
            assert count == len(dropped)
            found.append(dropped)
        assert found[0] == found[1], case
        merged += bool(found[0])
    assert 0 < merged < 400


def test_the_groups_merged_in_numpy_merge_as_one_by_one(monkeypatch):
    """``merge_tool_groups`` merges small groups in numpy, a rank at a time;
    on random columns (groups of 2 to 120 spans, peers' spans within several
    agent-otel spans, within one or within none, two families, ties in
    request time broken by the order read, spans set aside, call ids that
    agree or not, rows already dropped) it drops exactly what
    ``merge_tool_spans`` drops group by group, in request order; most small
    groups are decided in numpy."""
    import random

    from agent_otel.spans import peers
    from agent_otel.spans.calls import TraceIds
    from agent_otel.spans.peers import SLACK_NS, SMALL_GROUP, Aside, merge_tool_groups, merge_tool_spans

    one_by_one: list[int] = []

    def counted(rows, *args):
        one_by_one.append(len(rows))
        return merge_tool_spans(rows, *args)

    monkeypatch.setattr(peers, "merge_tool_spans", counted)
    rng = random.Random(17)
    small = 0
    for case in range(300):
        total = rng.randrange(2, 120)
        traces = [rng.getrandbits(128) for _ in range(rng.randrange(1, 4))]
        trace_of = [rng.choice(traces) for _ in range(total)]
        tool_of = [rng.choice(["search", "fetch", "sql"]) for _ in range(total)]
        if case % 3 == 0:  # a group past SMALL_GROUP: one trace, one tool
            trace_of, tool_of = [traces[0]] * total, ["search"] * total
        ours = bytearray(rng.random() < 0.5 for _ in range(total))
        families = bytearray(0 if o else rng.choice([1, 2]) for o in ours)
        ids = array("q", [rng.choice([0, 0, 0, 7, 9]) for _ in range(total)])
        submits = array("Q", [10**18 + rng.randrange(0, 12) * SLACK_NS for _ in range(total)])
        ends = array("Q", [s + rng.randrange(0, 6) * SLACK_NS for s in submits])
        keep = bytearray(rng.random() < 0.95 for _ in range(total))
        # the last rows are spans set aside, each read before some row of the table
        count = rng.randrange(0, total + 1)
        aside = Aside()
        aside.before = array("Q", sorted(rng.randrange(0, count + 1) for _ in range(total - count)))
        expected = bytearray(keep)
        groups: dict[tuple[int, str], list[int]] = {}
        for row in range(total):
            if keep[row]:
                groups.setdefault((trace_of[row], tool_of[row]), []).append(row)
        expected_count = 0
        for rows in groups.values():
            if len(rows) > 1 and not all(ours[row] for row in rows):
                rows.sort(key=lambda row: (submits[row], aside.place(row, count)))
                dropped: list[int] = []
                expected_count += merge_tool_spans(rows, ours, families, ids, submits, ends, dropped.append)
                for row in dropped:
                    expected[row] = 0
                small += len(rows) <= SMALL_GROUP
        trace_ids = [TraceIds(), TraceIds()]
        for row, trace_id in enumerate(trace_of):
            trace_ids[row >= count].append(trace_id)
        merged = merge_tool_groups(
            keep,
            ours,
            families,
            ids,
            submits,
            ends,
            (trace_ids[0], trace_ids[1]),
            (tool_of[:count], tool_of[count:]),
            aside,
            count,
        )
        assert (merged, keep) == (expected_count, expected), case
    fallen_back = sum(size <= SMALL_GROUP for size in one_by_one)
    assert small > 200 and fallen_back < small / 2, (small, fallen_back)  # (two peers alone: one by one)


def _otlp_line(spans: list[dict], pool: str) -> bytes:
    resource = {"attributes": [{"key": "agent.gpu.pool", "value": {"stringValue": pool}}]} if pool else {}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}).encode() + b"\n"


def _random_peer_spans(rng) -> list[dict]:
    """Tool spans of a few traces: agent-otel's, OpenInference's bare TOOL span beside
    (some with no twin, some at the same request time as another, some failed, some
    roots) and now and then one nested under a tool span or with a call id."""
    spans = []
    for _ in range(rng.randrange(1, 6)):
        trace_id = f"{rng.getrandbits(128) | 1:032x}"
        agent = f"{rng.getrandbits(64) | 1:016x}"
        ours: list[tuple[str, str]] = []  # (span id, tool) of agent-otel's spans
        for _ in range(rng.randrange(1, 12)):
            tool = rng.choice(["search", "fetch"])
            start = 10**18 + rng.randrange(0, 8) * 2_000_000  # ties, overlaps and spans apart
            end = start + rng.randrange(1, 8) * 2_000_000
            span_id = f"{rng.getrandbits(64) | 1:016x}"
            kind = rng.random()
            if kind < 0.45:
                attributes = [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                    {"key": "gen_ai.tool.name", "value": {"stringValue": tool}},
                    {"key": "agent.tool.exec.duration", "value": {"doubleValue": (end - start) / 1e9}},
                ]
                ours.append((span_id, tool))
            else:
                attributes = [
                    {"key": "openinference.span.kind", "value": {"stringValue": "TOOL"}},
                    {"key": "tool.name", "value": {"stringValue": tool}},
                ]
                if kind > 0.95:
                    attributes.append({"key": "gen_ai.tool.call.id", "value": {"stringValue": "c1"}})
            parent = agent if rng.random() < 0.8 else ""
            if ours and rng.random() < 0.05:
                parent = rng.choice(ours)[0]  # nested under agent-otel's span (of this tool or another)
            spans.append(
                {
                    "traceId": trace_id,
                    "spanId": span_id,
                    "parentSpanId": parent,
                    "name": f"execute_tool {tool}" if kind < 0.45 else tool,
                    "startTimeUnixNano": str(start),
                    "endTimeUnixNano": str(end),
                    "attributes": attributes,
                    "status": {"code": 2} if rng.random() < 0.1 else {},
                }
            )
    rng.shuffle(spans)
    return spans


def test_peers_spans_set_aside_make_the_records_every_span_as_a_row_makes(tmp_path, monkeypatch):
    """A peer's bare tool span is set aside while reading and becomes a row
    only if the merge leaves it (``peers.Aside``): on random traces (twins,
    spans with no twin, ties in request time, failed spans, roots, spans
    nested under a tool span, call ids, two pools) the calls, in their
    order, and the counts are the same as when every tool span is a row."""
    import random

    from agent_otel.report.reader import read_traces
    from agent_otel.semconv import OPENINFERENCE_SPAN_KIND
    from agent_otel.spans import decode

    rng = random.Random(11)
    for case in range(60):
        path = tmp_path / f"traces-{case}.jsonl"
        spans = _random_peer_spans(rng)
        with open(path, "wb") as out:
            for first in range(0, len(spans), 5):
                out.write(_otlp_line(spans[first : first + 5], rng.choice(["", "gpu-a"])))
        found = []
        for every_span_a_row in (False, True):
            if every_span_a_row:  # what the reader did before: every peer's span through _tool_call
                monkeypatch.setattr(decode, "_ROW_ATTRIBUTES", decode._ROW_ATTRIBUTES | {OPENINFERENCE_SPAN_KIND})
            data = read_traces([str(path)])
            found.append(
                (list(data.calls), data.duplicate_count, data.peer_tool_spans, data.peer_tool_spans_merged, data.roots)
            )
            monkeypatch.undo()
        assert found[0] == found[1], case
