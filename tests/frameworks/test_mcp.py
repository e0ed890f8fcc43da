"""MCP client tool calls traced with no change beyond ``instrument()``.

The server is an in-process ``MCPServer`` (the SDK's own test transport):
no network, the real client and server code on both ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

from frameworks.framework_support import agent_otel_spans, require_framework, timing

require_framework("mcp", "mcp")

from mcp import Client  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402

SLEEP_S = 0.15

server = MCPServer("inventory")


@server.tool()
def count_stock(sku: str) -> int:
    """Count the items in stock (slowly)."""
    time.sleep(SLEEP_S)
    return 7


@server.tool()
async def reserve(sku: str) -> str:
    """Reserve one item."""
    await asyncio.sleep(SLEEP_S)
    return f"reserved {sku}"


@server.tool()
def discontinue(sku: str) -> str:
    """Always fails."""
    raise ValueError(f"{sku} is locked")


def call_tools(*calls, through_session: bool = False):
    async def session():
        async with Client(server) as client:
            caller = client.session if through_session else client
            return [await caller.call_tool(name, arguments) for name, arguments in calls]

    return asyncio.run(session())


def test_each_remote_tool_call_is_one_client_span(hooked, spans):
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
    hooked("mcp")

    (result,) = call_tools(("count_stock", {"sku": "B2"}), through_session=True)

    assert result.is_error is False
    (span,) = agent_otel_spans(spans, "count_stock")
    assert timing(span)[1] >= SLEEP_S * 0.95


def test_a_result_with_is_error_makes_an_error_span(hooked, spans, caplog):
    hooked("mcp")

    with caplog.at_level(logging.CRITICAL):  # the server logs the tool's traceback
        (result,) = call_tools(("discontinue", {"sku": "C3"}))

    assert result.is_error is True
    (span,) = agent_otel_spans(spans, "discontinue")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "tool_error"
    assert span.status.description == result.content[0].text
