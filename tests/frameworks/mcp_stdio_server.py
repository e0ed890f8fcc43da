"""An instrumented MCP server process, served over stdio, for test_mcp.py.

Usage: ``python mcp_stdio_server.py TRACES_FILE``. Its sync tool runs on
anyio's worker threads, limited to two, one of which the stdio transport
keeps reading stdin: concurrent tool calls queue for the other.
"""

from __future__ import annotations

import logging
import sys
import time

import anyio
import anyio.to_thread
from mcp.server.mcpserver import MCPServer

import agent_otel

SLEEP_S = 0.5

server = MCPServer("inventory")


@server.tool()
def count_stock(sku: str) -> int:
    """Count the items in stock (slowly)."""
    time.sleep(SLEEP_S)
    return 7


@server.tool()
def discontinue(sku: str) -> str:
    """Always fails."""
    raise LookupError(f"{sku} is locked")


async def main() -> None:
    logging.getLogger("mcp").setLevel(logging.CRITICAL)  # no traceback of the failing tool on stderr
    anyio.to_thread.current_default_thread_limiter().total_tokens = 2
    await server.run_stdio_async()


if __name__ == "__main__":
    agent_otel.instrument(
        service_name="inventory-server", traces_exporters="none", traces_file=sys.argv[1], gpu="off", frameworks=["mcp"]
    )
    try:
        anyio.run(main)
    finally:
        agent_otel.uninstrument()  # flushes the traces file
