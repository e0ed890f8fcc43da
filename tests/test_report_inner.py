"""What the reader keeps about the inside of tool calls: the failures a
call went on after (its own ``exception`` events, failed child spans) and
the tools called from inside another tool's call."""

from __future__ import annotations

from agent_otel.report.reader import read_traces
from helpers.traces import RecordedRun, ns


def test_failures_a_call_went_on_after_are_kept_by_call(tmp_path):
    run = RecordedRun(tmp_path / "t.jsonl")
    # quote: two attempts of its HTTP client timed out (status ERROR), the third answered
    quote = run.tool_call("quote", 0.0, 0.0, 4.5, executor="direct")
    run.child_span(quote, "GET /quote", 0.0, 2.0, error=True)
    run.child_span(quote, "GET /quote", 2.1, 4.1, exception=True)
    run.child_span(quote, "GET /quote", 4.2, 4.5)
    # search recorded an exception itself, then went on; its own failure at the end is not one it went on after
    run.tool_call("search", 5.0, 5.0, 7.0, executor="direct", exceptions=(5.5, 7.0), outcome="error")
    # lookup failed at the very end only: nothing inside
    run.tool_call("lookup", 8.0, 8.0, 8.5, executor="direct", exceptions=(8.5,), outcome="error")
    # a tool with the toolkit's own retries: its attempts are its policy's, not hidden retries
    guarded = run.tool_call("guarded", 9.0, 9.0, 11.0, executor="default", retries=1)
    run.child_span(guarded, "GET /guarded", 9.0, 10.0, error=True)
    run.close()

    data = read_traces([str(tmp_path / "t.jsonl")])
    by_tool = {call.tool: call for call in data.calls}
    assert set(data.inner_failures) == {call_key(by_tool["quote"]), call_key(by_tool["search"])}
    inner = data.inner_failures[call_key(by_tool["quote"])]
    assert inner.exceptions == []
    assert inner.children == [("GET /quote", ns(0.0), ns(2.0)), ("GET /quote", ns(2.1), ns(4.1))]
    assert data.inner_failures[call_key(by_tool["search"])].exceptions == [ns(5.5)]
    assert data.nested_tools == set()


def test_a_tool_called_from_inside_another_tool_is_nested(tmp_path):
    run = RecordedRun(tmp_path / "t.jsonl")
    outer = run.tool_call("plan", 0.0, 0.0, 3.0, executor="direct")
    run.tool_call("search", 0.5, 0.5, 1.5, executor="io", parent=outer)
    run.tool_call("search", 4.0, 4.0, 5.0, executor="io")
    run.tool_call("plan", 6.0, 6.0, 7.0, executor="direct")
    run.close()
    data = read_traces([str(tmp_path / "t.jsonl")])
    assert data.nested_tools == {"search"}
    assert len(data.calls) == 4


def call_key(call) -> int:
    return call.trace_id << 64 | call.span_id
