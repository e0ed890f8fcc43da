"""The in-process MCP server and its tools for test_mcp.py.

Imported by the tests when they run, not when pytest collects them (see
``framework_fixture``): the MCP SDK takes about a second to import.
"""

from __future__ import annotations

import asyncio
import time

from mcp import Client
from mcp.server.mcpserver import MCPServer

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
