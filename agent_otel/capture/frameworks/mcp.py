"""MCP (``mcp``): remote tool calls as spans, on the client and on the server.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["mcp"]), in the client, the server, or both

Hooked on the client side: ``mcp.client.session.ClientSession.call_tool``,
the one request every MCP client call goes through, and, where it exists
(mcp 2), ``mcp.client.client.Client.call_tool``, which may send several
requests for one call (input rounds, a re-list and resend); the nested
session requests of one ``Client.call_tool`` then share its single span.
The span covers the round trip: sending the request, the server running the
tool, the response. It has no queue phase of its own (``agent.tool.executor``
is ``direct``); the server's own queueing is inside exec time.
``gen_ai.tool.type`` is ``extension`` (the tool runs outside the agent).

Hooked on the server side: ``mcp.server.lowlevel.Server.get_request_handler``
for ``tools/call``, the handler every server (``MCPServer`` or a low-level
``Server``) runs a tool call through. The span is the server's view of the
call, a child of the client's span (the MCP SDK carries the trace context
in the request's ``_meta``). ``MCPServer`` runs a sync tool on anyio's worker
threads (``anyio.to_thread.run_sync``): the span then starts when the
request arrives and exec starts when a worker picks the tool up, so queue
time is the wait for one of anyio's threads (``agent.tool.executor``
``anyio``, ``agent.executor.max_workers`` its capacity limiter's tokens).

A client and a server in one process (``Client(server)``, an in-process
``MCPServer``) see one call from both sides: the server records nothing of
its own, and makes the client's span current while the tool runs, so an
``@agent_otel.tool`` function it serves adds no second span. One call, one
span, counted once.

A result with ``isError`` set gives outcome ``error`` with ``error.type``
``tool_error``, the value the OpenTelemetry MCP conventions use; on the
server side, where ``MCPServer`` turned a tool's exception into such a
result, the span records that exception (outcome ``error``, ``error.type``
its class). A protocol error raised by the session is recorded as the
exception it is.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from typing import Any, Optional

import anyio.to_thread
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks.calls import anyio_run_sync_hook, async_call, meta
from agent_otel.capture.patching import Patches, importable
from agent_otel.semconv import TOOL_TYPE_EXTENSION

FRAMEWORK = "mcp"
_patches = Patches()

# (trace id, tool) -> [the client's span, calls in flight]: this process's
# client calls, which an in-process server must not record again.
_client_calls: dict[tuple[int, str], list] = {}


def instrument() -> None:
    from mcp.client.session import ClientSession
    from mcp.server.lowlevel.server import Server

    _patches.wrap(ClientSession, "call_tool", _wrap_call_tool)
    if importable("mcp.client.client"):
        from mcp.client.client import Client

        if "call_tool" in vars(Client):
            _patches.wrap(Client, "call_tool", _wrap_call_tool)
    _patches.wrap(Server, "get_request_handler", _wrap_get_request_handler)
    if importable("mcp.server.mcpserver"):
        from mcp.server.mcpserver import MCPServer

        _patches.wrap(MCPServer, "call_tool", _wrap_server_call_tool)
    _patches.wrap(anyio.to_thread, "run_sync", anyio_run_sync_hook)


def uninstrument() -> None:
    _patches.restore()
    _served_entries.clear()


def _error_text(result: Any) -> Optional[str]:
    """The error text of a result with isError set."""
    is_error = getattr(result, "is_error", None)
    if is_error is None:
        is_error = getattr(result, "isError", None)
    if not is_error:
        return None
    texts = [getattr(block, "text", "") for block in getattr(result, "content", None) or ()]
    return " ".join(text for text in texts if text)[:200] or "tool returned isError"


def _result_content(result):
    """What the tool returned: a result's structured content, else its text blocks, else the result."""
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if structured is not None:
        return structured
    content = getattr(result, "content", None)
    if content is None:
        return result
    return [getattr(block, "text", block) for block in content]


# ---- client ----------------------------------------------------------------


def _wrap_call_tool(original):
    @functools.wraps(original)
    async def call_tool(self, name, *args, **kwargs):
        async def round_trip(*call_args, **call_kwargs):
            # Runs inside the call's span: known to an in-process server.
            key = (trace_api.get_current_span().get_span_context().trace_id, name)
            entry = _client_calls.get(key)
            if entry is None:
                entry = _client_calls[key] = [trace_api.get_current_span(), 0]
            entry[1] += 1
            try:
                return await original(*call_args, **call_kwargs)
            finally:
                entry[1] -= 1
                if entry[1] == 0 and _client_calls.get(key) is entry:
                    del _client_calls[key]

        if current_recorder() is None:
            return await original(self, name, *args, **kwargs)
        return await async_call(
            FRAMEWORK,
            round_trip,
            (self, name, *args),
            kwargs,
            lambda: (meta(name, None, TOOL_TYPE_EXTENSION), None),
            _error_text,
            arguments=lambda: kwargs.get("arguments", args[0] if args else None),
            result_of=_result_content,
        )

    return call_tool


# ---- server ----------------------------------------------------------------


def _wrap_get_request_handler(original):
    @functools.wraps(original)
    def get_request_handler(self, method):
        entry = original(self, method)
        if method != "tools/call" or entry is None or current_recorder() is None:
            return entry
        served = _served_entries.get(id(entry))
        if served is not None and served[0] is entry:
            return served[1]
        try:
            wrapped = dataclasses.replace(entry, handler=functools.partial(_serve_tool_call, entry.handler))
        except Exception:
            return entry  # a version whose entry we do not know: served untraced
        if len(_served_entries) >= 1024:
            _served_entries.clear()
        _served_entries[id(entry)] = (entry, wrapped)
        return wrapped

    return get_request_handler


# id(a server's tools/call entry) -> (that entry, the same serving through _serve_tool_call): made
# once per entry, not per request (the entry is kept alongside, so its id is not reused meanwhile).
_served_entries: dict[int, tuple] = {}


class _ToolFailure:
    """The exception ``MCPServer`` turned into an ``isError`` result during one call."""

    __slots__ = ("error",)

    def __init__(self):
        self.error: Optional[BaseException] = None


_failure: contextvars.ContextVar[Optional[_ToolFailure]] = contextvars.ContextVar(
    "agent_otel_mcp_tool_failure", default=None
)


async def _serve_tool_call(handler, ctx, params, *args, **kwargs):
    name = getattr(params, "name", None)
    if not isinstance(name, str):
        return await handler(ctx, params, *args, **kwargs)
    client_span = _in_process_client_span(name)
    if client_span is not None:
        # The client in this process records this call already.
        token = context_api.attach(trace_api.set_span_in_context(client_span))
        try:
            return await handler(ctx, params, *args, **kwargs)
        finally:
            context_api.detach(token)
    failure = _ToolFailure()
    failure_token = _failure.set(failure)
    try:
        return await async_call(
            FRAMEWORK,
            handler,
            (ctx, params, *args),
            kwargs,
            lambda: (meta(name), None),
            lambda result: _server_error(result, failure),
            thread_owner=None,
            thread_optional=True,
            arguments=lambda: getattr(params, "arguments", None),
            result_of=_result_content,
        )
    finally:
        _failure.reset(failure_token)


def _in_process_client_span(name: str):
    if not _client_calls:
        return None
    trace_id = trace_api.get_current_span().get_span_context().trace_id
    entry = _client_calls.get((trace_id, name))
    return entry[0] if entry is not None else None


def _server_error(result: Any, failure: _ToolFailure):
    text = _error_text(result)
    if text is None:
        return None
    return failure.error if failure.error is not None else text


def _wrap_server_call_tool(original):
    @functools.wraps(original)
    async def call_tool(self, *args, **kwargs):
        try:
            return await original(self, *args, **kwargs)
        except Exception as exc:
            failure = _failure.get()
            if failure is not None and failure.error is None:
                # MCPServer wraps the tool's exception in a ToolError; the cause is the tool's own.
                failure.error = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
            raise

    return call_tool
