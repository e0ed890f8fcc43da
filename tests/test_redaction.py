"""Redaction everywhere: one secret fed through every way a tool call is recorded.

Every path makes two calls: one that gets the secret as its argument and
returns it in its result, one that fails with the secret in its exception
message. With ``redact`` set and arguments and results recorded, no text of
any span may hold the secret, and each kind of text (arguments, result,
exception message, stack trace, status description) must show the
redaction, which proves it was recorded and went through the hook.
"""

from __future__ import annotations

import asyncio
import importlib
import json

import pytest

import agent_otel

SECRET = "sk-live-7f3a9c"
MASK = "[redacted]"


def redact(attribute: str, text: str) -> str:
    return text.replace(SECRET, MASK)


class Missing(Exception):
    pass


def lookup_value(key: str) -> str:
    if key.startswith("fail"):
        raise Missing(f"no value for {key}")
    return f"value for {key}"


def texts(span) -> list[str]:
    """Every text a span carries."""
    found = [span.name, span.status.description or ""]
    found += [v for v in span.attributes.values() if isinstance(v, str)]
    for event in span.events:
        found += [v for v in event.attributes.values() if isinstance(v, str)]
    for link in span.links:
        found += [v for v in (link.attributes or {}).values() if isinstance(v, str)]
    return found


def framework(name: str, module: str):
    from frameworks.framework_support import require_framework

    require_framework(name, module)


# ---------------------------------------------------------------- the paths: each makes the two calls


def decorated_sync():
    tool = agent_otel.tool(lookup_value, name="lookup")
    tool(SECRET)
    with pytest.raises(Missing):
        tool("fail-" + SECRET)


def decorated_async():
    async def lookup(key):
        return lookup_value(key)

    tool = agent_otel.tool(lookup)
    asyncio.run(tool(SECRET))
    with pytest.raises(Missing):
        asyncio.run(tool("fail-" + SECRET))


def decorated_generator():
    def lookup(key):
        yield lookup_value(key)

    tool = agent_otel.tool(lookup)
    list(tool(SECRET))
    with pytest.raises(Missing):
        list(tool("fail-" + SECRET))


def decorated_async_generator():
    async def lookup(key):
        yield lookup_value(key)

    tool = agent_otel.tool(lookup)

    async def drain(key):
        return [item async for item in tool(key)]

    asyncio.run(drain(SECRET))
    with pytest.raises(Missing):
        asyncio.run(drain("fail-" + SECRET))


def tool_span():
    # tool_span records no arguments (it never sees them): the exception only.
    with agent_otel.tool_span("lookup") as span:
        span.set_attribute("note", "ok")
    with pytest.raises(Missing), agent_otel.tool_span("lookup"):
        lookup_value("fail-" + SECRET)


def remedy_timeout():
    tool = agent_otel.tool(timeout=5.0)(lookup_value)
    tool(SECRET)
    with pytest.raises(Missing):
        tool("fail-" + SECRET)


def remedy_retries_and_fallback():
    tool = agent_otel.tool(retries=1, retry_interval=0.0)(lookup_value)
    tool(SECRET)
    with pytest.raises(Missing):
        tool("fail-" + SECRET)
    rescued = agent_otel.tool(name="rescued", fallback=lambda key: f"fallback for {key}")(lookup_value)
    assert rescued("fail-" + SECRET) == f"fallback for fail-{SECRET}"


def remedy_cache():
    tool = agent_otel.tool(cache=True)(lookup_value)
    tool(SECRET)
    tool(SECRET)  # answered from the cache: still recorded, still redacted
    with pytest.raises(Missing):
        tool("fail-" + SECRET)


def remedy_async():
    async def lookup(key):
        return lookup_value(key)

    tool = agent_otel.tool(timeout=5.0)(lookup)
    asyncio.run(tool(SECRET))
    with pytest.raises(Missing):
        asyncio.run(tool("fail-" + SECRET))
    sync_tool = agent_otel.tool(name="lookup_aio", timeout=5.0)(lookup_value)
    asyncio.run(sync_tool.aio(SECRET))


def batched():
    @agent_otel.batch(window_ms=1)
    def lookup(keys):
        return [Missing(f"no value for {k}") if k.startswith("fail") else f"value for {k}" for k in keys]

    @agent_otel.batch(window_ms=1)
    def broken(keys):
        raise Missing(f"backend refused {keys}")

    lookup(SECRET)
    with pytest.raises(Missing):
        lookup("fail-" + SECRET)
    with pytest.raises(Missing):
        broken(SECRET)


def langchain():
    framework("langchain", "langchain_core")
    from langchain_core.tools import StructuredTool

    tool = StructuredTool.from_function(lookup_value, name="lookup", description="Look a key up.")
    tool.invoke({"key": SECRET})
    with pytest.raises(Missing):
        tool.invoke({"key": "fail-" + SECRET})


def llamaindex():
    framework("llamaindex", "llama_index.core")
    from llama_index.core.tools import FunctionTool

    tool = FunctionTool.from_defaults(fn=lookup_value, name="lookup")
    tool.call(key=SECRET)
    try:
        tool.call(key="fail-" + SECRET)
    except Missing:
        pass


def smolagents():
    framework("smolagents", "smolagents")
    from smolagents import tool as smol_tool

    @smol_tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return lookup_value(key)

    lookup(key=SECRET)
    with pytest.raises(Missing):
        lookup(key="fail-" + SECRET)


def openai_agents():
    framework("openai_agents", "agents")
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    set_tracing_disabled(True)

    @function_tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return lookup_value(key)

    def call(key, call_id):
        return ResponseFunctionToolCall(
            type="function_call",
            name="lookup",
            arguments=json.dumps({"key": key}),
            call_id=call_id,
            id=f"fc_{call_id}",
            status="completed",
        )

    done = ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text="ok", annotations=[])],
    )

    class Scripted(Model):
        turns = [[call(SECRET, "c1"), call("fail-" + SECRET, "c2")], [done]]

        async def get_response(self, *args, **kwargs):
            return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    agent = Agent(name="support", tools=[lookup], model=Scripted())
    assert asyncio.run(Runner.run(agent, "help")).final_output == "ok"


def mcp():
    framework("mcp", "mcp")
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("vault")

    @server.tool()
    def lookup(key: str) -> str:
        """Look a key up."""
        return lookup_value(key)

    async def session():
        async with Client(server) as client:
            await client.call_tool("lookup", {"key": SECRET})
            await client.call_tool("lookup", {"key": "fail-" + SECRET})  # an isError result, not raised

    asyncio.run(session())


def crewai():
    framework("crewai", "crewai")
    from crewai.tools import tool as crew_tool

    @crew_tool("lookup")
    def lookup(key: str) -> str:
        """Look a key up."""
        return lookup_value(key)

    lookup.run(key=SECRET)
    with pytest.raises(Missing):
        lookup.run(key="fail-" + SECRET)


PATHS = {
    "decorated sync": (decorated_sync, ()),
    "decorated async": (decorated_async, ()),
    "decorated generator": (decorated_generator, ()),
    "decorated async generator": (decorated_async_generator, ()),
    "tool_span": (tool_span, ()),
    "remedy: timeout on a pool": (remedy_timeout, ()),
    "remedy: retries, fallback": (remedy_retries_and_fallback, ()),
    "remedy: cache": (remedy_cache, ()),
    "remedy: coroutine, aio": (remedy_async, ()),
    "batched": (batched, ()),
    "framework: langchain": (langchain, ("langchain",)),
    "framework: llamaindex": (llamaindex, ("llamaindex",)),
    "framework: smolagents": (smolagents, ("smolagents",)),
    "framework: openai_agents": (openai_agents, ("openai_agents",)),
    "framework: mcp": (mcp, ("mcp",)),
    "framework: crewai": (crewai, ("crewai",)),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_a_secret_never_leaves_the_process(path, spans, fresh_pools):
    run, frameworks = PATHS[path]
    agent_otel.instrument(
        traces_exporters="none",
        gpu="off",
        frameworks=frameworks,
        record_arguments=True,
        record_results=True,
        redact=redact,
    )
    try:
        run()
    finally:
        agent_otel.uninstrument()
    recorded = spans.all()
    assert recorded, "the path recorded nothing"
    for span in recorded:
        for text in texts(span):
            assert SECRET not in text, (path, span.name, text)

    tool_spans = [s for s in spans.tools() if s.instrumentation_scope.name == "agent_otel"]  # not MCP's own
    failed = [s for s in recorded if s.status.description]
    assert failed, "no failed call was recorded"
    for span in failed:
        if path != "framework: mcp":  # the server tells the client "Error executing tool lookup", no more
            assert MASK in span.status.description, (span.name, span.status.description)
        exceptions = [e for e in span.events if e.name == "exception"]
        if exceptions:  # an MCP error result has a description only
            (event,) = exceptions
            assert MASK in event.attributes["exception.message"]
            assert MASK in event.attributes["exception.stacktrace"]
            assert event.attributes["exception.type"] == "Missing"
    if path != "tool_span":
        with_arguments = [s for s in tool_spans if "gen_ai.tool.call.arguments" in s.attributes]
        with_results = [s for s in tool_spans if "gen_ai.tool.call.result" in s.attributes]
        assert with_arguments and all(MASK in s.attributes["gen_ai.tool.call.arguments"] for s in with_arguments)
        if "generator" not in path:  # a generator's items are streamed to the caller, not recorded
            assert with_results and any(MASK in s.attributes["gen_ai.tool.call.result"] for s in with_results)
        # Every call has its arguments, however it was made.
        assert len(with_arguments) == len(tool_spans), [s.name for s in tool_spans]


def test_exception_messages_can_be_left_out(spans):
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), record_exception_messages=False)
    tool = agent_otel.tool(lookup_value, name="lookup")
    try:
        try:
            try:
                tool("fail-" + SECRET)
            except Missing as exc:
                raise RuntimeError(f"wrapped {SECRET}") from exc
        except RuntimeError:
            pass
        with pytest.raises(Missing) as raised:
            tool("fail-" + SECRET)
    finally:
        agent_otel.uninstrument()
    assert str(raised.value) == f"no value for fail-{SECRET}"  # the agent's exception is untouched
    for span in spans.tools():
        assert all(SECRET not in text for text in texts(span))
        (event,) = [e for e in span.events if e.name == "exception"]
        assert "exception.message" not in event.attributes
        stack = event.attributes["exception.stacktrace"]
        assert stack.startswith("Traceback (most recent call last):") and "lookup_value" in stack
        assert stack.rstrip().endswith("test_redaction.Missing")
        assert span.status.description == "Missing"


def test_a_redact_hook_that_fails_records_no_text(spans):
    def broken(attribute, text):
        raise RuntimeError("hook bug")

    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), record_arguments=True, redact=broken)
    tool = agent_otel.tool(lookup_value, name="lookup")
    try:
        with pytest.raises(Missing):
            tool("fail-" + SECRET)
    finally:
        agent_otel.uninstrument()
    (span,) = spans.tools()
    assert all(SECRET not in text for text in texts(span))
    assert span.attributes["gen_ai.tool.call.arguments"] == "<redaction failed>"
    assert span.status.description == "<redaction failed>"


def test_the_framework_modules_exist():
    # The parametrized paths name these hook modules; a rename must not make them skip silently.
    for name in ("langchain", "llamaindex", "smolagents", "openai_agents", "mcp", "crewai"):
        importlib.import_module(f"agent_otel.capture.frameworks.{name}")
