"""MCP client tool calls traced with no change beyond ``instrument()``.

The server is an in-process ``MCPServer`` (the SDK's own test transport):
no network, the real client and server code on both ends.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from frameworks.framework_support import agent_otel_spans, framework_fixture, timing

import agent_otel

framework = framework_fixture("mcp", "mcp")


def test_each_remote_tool_call_is_one_client_span(hooked, spans):
    from frameworks.mcp_scripted import SLEEP_S, call_tools

    hooked("mcp")

    stock, reservation = call_tools(("count_stock", {"sku": "A1"}), ("reserve", {"sku": "A1"}))

    assert stock.structured_content == {"result": 7}
    assert reservation.content[0].text == "reserved A1"
    for name in ("count_stock", "reserve"):
        (span,) = agent_otel_spans(spans, name)  # Client.call_tool and its session request: one span
        assert span.name == f"execute_tool {name}"
        assert span.attributes["gen_ai.tool.type"] == "extension"
        assert span.attributes["agent.tool.executor"] == "direct"
        assert span.attributes["agent.tool.outcome"] == "ok"
        queue_s, exec_s = timing(span)
        assert queue_s == 0.0
        assert SLEEP_S * 0.95 <= exec_s < SLEEP_S + 3.0  # the round trip includes the server's run


def test_session_call_tool_is_traced_too(hooked, spans):
    from frameworks.mcp_scripted import SLEEP_S, call_tools

    hooked("mcp")

    (result,) = call_tools(("count_stock", {"sku": "B2"}), through_session=True)

    assert result.is_error is False
    (span,) = agent_otel_spans(spans, "count_stock")
    assert timing(span)[1] >= SLEEP_S * 0.95


def test_a_result_with_is_error_makes_an_error_span(hooked, spans, caplog):
    from frameworks.mcp_scripted import call_tools

    hooked("mcp")

    with caplog.at_level(logging.CRITICAL):  # the server logs the tool's traceback
        (result,) = call_tools(("discontinue", {"sku": "C3"}))

    assert result.is_error is True
    (span,) = agent_otel_spans(spans, "discontinue")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "tool_error"
    assert span.status.description == result.content[0].text


def test_an_agent_otel_tool_served_in_process_is_one_span_counted_once(hooked, spans):
    from frameworks.mcp_scripted import SLEEP_S
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    handle = hooked("mcp")
    in_process = MCPServer("pricing")

    @in_process.tool()
    @agent_otel.tool
    def quote(symbol: str) -> float:
        """Quote a price."""
        time.sleep(SLEEP_S)
        return 101.5

    async def session():
        async with Client(in_process) as client:
            return await client.call_tool("quote", {"symbol": "ACME"})

    assert asyncio.run(session()).structured_content == {"result": 101.5}
    (span,) = agent_otel_spans(spans, "quote")  # the client's span; the server side adds none
    assert span.attributes["gen_ai.tool.type"] == "extension"
    assert timing(span)[1] >= SLEEP_S * 0.95
    handle.pipeline.drain()
    assert handle.metrics.registry.get_sample_value("agent_tool_calls_total", {"tool": "quote", "outcome": "ok"}) == 1.0


def _spans_in(path):
    from agent_otel.spans.otlp_json import iter_spans

    return list(iter_spans(str(path)))


def test_a_server_process_records_its_side_of_each_call_in_the_clients_trace(hooked, spans, tmp_path):
    from mcp.client.stdio import StdioServerParameters

    from frameworks import mcp_stdio_server
    from mcp import Client

    client_traces = tmp_path / "client.jsonl"
    hooked("mcp", traces_file=str(client_traces))
    server_traces = tmp_path / "server.jsonl"
    process = StdioServerParameters(command=sys.executable, args=[mcp_stdio_server.__file__, str(server_traces)])

    async def session():
        async with Client(process) as client:
            counts = await asyncio.gather(*[client.call_tool("count_stock", {"sku": f"S{i}"}) for i in range(3)])
            return counts, await client.call_tool("discontinue", {"sku": "D1"})

    counts, failure = asyncio.run(session())  # the server process exits and flushes its traces

    assert [c.structured_content for c in counts] == [{"result": 7}] * 3
    assert failure.is_error is True
    client_spans = {s.context.trace_id: s for s in agent_otel_spans(spans, "count_stock")}
    assert len(client_spans) == 3
    served = [s for s in _spans_in(server_traces) if s.name == "execute_tool count_stock"]
    assert len(served) == 3
    by_id = {(s.trace_id, s.span_id): s for s in _spans_in(server_traces)}
    server_sleep_s = mcp_stdio_server.SLEEP_S
    for span in served:
        assert span.trace_id in client_spans  # joined to the client's trace
        # under the MCP SDK's server span, whose parent is the client's request
        sdk_span = by_id[(span.trace_id, span.parent_span_id)]
        assert sdk_span.name == "tools/call count_stock"
        attributes = span.attributes
        assert attributes["agent.tool.executor"] == "anyio"
        assert attributes["agent.executor.max_workers"] == 2
        queue_s, exec_s = attributes["agent.tool.queue.duration"], attributes["agent.tool.exec.duration"]
        assert exec_s >= server_sleep_s * 0.95
        assert abs((span.end_ns - span.start_ns) / 1e9 - (queue_s + exec_s)) < 0.005
        # the client's span covers the server's
        client_span = client_spans[span.trace_id]
        assert client_span.start_time <= span.start_ns and span.end_ns <= client_span.end_time
    # Three calls at once, one free worker thread: the last waited for one of the others.
    assert max(s.attributes["agent.tool.queue.duration"] for s in served) >= server_sleep_s * 0.5
    (failed,) = [s for s in _spans_in(server_traces) if s.name == "execute_tool discontinue"]
    assert failed.attributes["agent.tool.outcome"] == "error"
    assert failed.attributes["error.type"] == "LookupError"  # the tool's exception, not MCP's wrapper

    # Each call is seen three times (the client's span, the MCP SDK's server
    # span, the server's own): the report counts it once, with the client's timing.
    agent_otel.uninstrument()  # flushes the client's traces file
    report = _report(client_traces, server_traces)
    tools = {t["tool"]: t for t in report["tools"]}
    assert (tools["count_stock"]["calls"], tools["discontinue"]["calls"]) == (3, 1)
    assert tools["count_stock"]["executors"] == ["direct"]  # the client's span was kept
    assert tools["discontinue"]["errors"] == 1


def _report(*paths) -> dict:
    import io
    import json
    from contextlib import redirect_stdout

    from agent_otel.commands.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", *map(str, paths), "--format", "json"]) == 0
    return json.loads(out.getvalue())
