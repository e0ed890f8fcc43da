"""MCP (``mcp``): the client's view of a remote tool call as a span.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["mcp"])

Hooked: ``mcp.client.session.ClientSession.call_tool``, the one request
every MCP client call goes through, and, where it exists (mcp 2),
``mcp.client.client.Client.call_tool``, which may send several requests for
one call (input rounds, a re-list and resend); the nested session requests
of one ``Client.call_tool`` then share its single span.

The span covers the round trip: sending the request, the server running the
tool, the response. It has no queue phase of its own (``agent.tool.executor``
is ``direct``); the server's own queueing is inside exec time.
``gen_ai.tool.type`` is ``extension`` (the tool runs outside the agent). A
result with ``isError`` set gives outcome ``error`` with ``error.type``
``tool_error``; a protocol error raised by the session is recorded as the
exception it is.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from agent_otel.capture.frameworks.calls import async_call, meta
from agent_otel.capture.frameworks.instrumentor import FrameworkInstrumentor
from agent_otel.capture.patching import Patches, importable
from agent_otel.semconv import TOOL_TYPE_EXTENSION

FRAMEWORK = "mcp"
_patches = Patches()


def instrument() -> None:
    from mcp.client.session import ClientSession

    _patches.wrap(ClientSession, "call_tool", _wrap_call_tool)
    if importable("mcp.client.client"):
        from mcp.client.client import Client

        if "call_tool" in vars(Client):
            _patches.wrap(Client, "call_tool", _wrap_call_tool)


def uninstrument() -> None:
    _patches.restore()


def _failed(result: Any) -> Optional[str]:
    """The error text of a result with isError set."""
    is_error = getattr(result, "is_error", None)
    if is_error is None:
        is_error = getattr(result, "isError", None)
    if not is_error:
        return None
    texts = [getattr(block, "text", "") for block in getattr(result, "content", None) or ()]
    return " ".join(text for text in texts if text)[:200] or "tool returned isError"


def _wrap_call_tool(original):
    @functools.wraps(original)
    async def call_tool(self, name, *args, **kwargs):
        return await async_call(FRAMEWORK, original, (self, name, *args), kwargs,
                                lambda: (meta(name, None, TOOL_TYPE_EXTENSION), None), _failed)

    return call_tool


class McpInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_mcp``."""

    framework = FRAMEWORK
    requirement = "mcp >= 2.3, < 3"
    module = "mcp"
