"""What a framework hook adds to one tool call, next to the framework's own call.

Usage::

    .venv/bin/python bench/frameworks.py            # about a minute on 2 cores
    .venv/bin/python bench/frameworks.py --quick    # a smoke run (seconds)

For every installed framework, one trivial tool (it returns its argument) is
called the way the framework's agents call it, in rounds that alternate:
the plain framework (not instrumented), then the same calls with agent-otel
instrumented and only that framework hooked. Printed per call: the plain
framework's time, the hooked time, the difference (the hook's cost: one
span, its timestamps and record) and the ratio hooked / plain. Each number
is the best round's mean, in CPU microseconds of this process
(``time.process_time``), so other load on the machine disturbs it less.
For reference the first row is a bare ``@agent_otel.tool`` function, whose
"plain" time is the undecorated function's.

Spans go to an SDK provider with a batch processor and an exporter that
drops them, as an application that exports would pay for.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import time
from typing import Callable, Optional

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import agent_otel


class DropSpans(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def _installed(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


def bare_tool() -> Callable[[], None]:
    def lookup(x: int) -> int:
        return x

    traced = agent_otel.tool(lookup)
    return lambda: traced(1)


def bare_function() -> Callable[[], None]:
    def lookup(x: int) -> int:
        return x

    return lambda: lookup(1)


def langchain_invoke() -> Callable[[], None]:
    from langchain_core.tools import tool

    @tool
    def lookup(x: int) -> int:
        """Return x."""
        return x

    call = {"type": "tool_call", "name": "lookup", "args": {"x": 1}, "id": "call_1"}
    return lambda: lookup.invoke(call)


def langchain_ainvoke_sync_tool() -> Callable[[], None]:
    """A sync tool from async code: LangChain hands it to the default executor."""
    from langchain_core.tools import tool

    @tool
    def lookup(x: int) -> int:
        """Return x."""
        return x

    call = {"type": "tool_call", "name": "lookup", "args": {"x": 1}, "id": "call_1"}
    loop = asyncio.new_event_loop()
    return lambda: loop.run_until_complete(lookup.ainvoke(call))


def openai_agents_async_tool() -> Callable[[], None]:
    from agents import function_tool
    from agents.tool import invoke_function_tool
    from agents.tool_context import ToolContext

    @function_tool
    async def lookup(x: int) -> int:
        """Return x."""
        return x

    loop = asyncio.new_event_loop()

    def call():
        context = ToolContext(context=None, tool_name="lookup", tool_call_id="call_1", tool_arguments='{"x": 1}')
        loop.run_until_complete(invoke_function_tool(function_tool=lookup, context=context, arguments='{"x": 1}'))

    return call


def llamaindex_call() -> Callable[[], None]:
    from llama_index.core.tools import FunctionTool

    def lookup(x: int) -> int:
        """Return x."""
        return x

    tool = FunctionTool.from_defaults(fn=lookup)
    return lambda: tool.call(x=1)


def mcp_call_tool() -> Callable[[], None]:
    """A round trip to an in-process MCPServer through one open session."""
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool()
    def lookup(x: int) -> int:
        """Return x."""
        return x

    loop = asyncio.new_event_loop()
    client = Client(server)
    loop.run_until_complete(client.__aenter__())
    return lambda: loop.run_until_complete(client.session.call_tool("lookup", {"x": 1}))


def smolagents_call() -> Callable[[], None]:
    from smolagents import tool

    @tool
    def lookup(x: int) -> int:
        """Return x.

        Args:
            x: the value
        """
        return x

    return lambda: lookup(x=1)


def crewai_run() -> Callable[[], None]:
    from crewai.tools import tool

    @tool("lookup")
    def lookup(x: int) -> int:
        """Return x."""
        return x

    return lambda: lookup.run(x=1)


# (label, framework to hook or None for the bare function, module that must
# be installed, make the call, calls per round)
CASES = [
    ("@agent_otel.tool function", None, "agent_otel", None, 2000),
    ("langchain tool.invoke", "langchain", "langchain_core", langchain_invoke, 500),
    ("langchain sync tool ainvoke", "langchain", "langchain_core", langchain_ainvoke_sync_tool, 200),
    ("openai_agents async tool", "openai_agents", "agents", openai_agents_async_tool, 300),
    ("llamaindex FunctionTool.call", "llamaindex", "llama_index.core", llamaindex_call, 1000),
    ("mcp ClientSession.call_tool", "mcp", "mcp", mcp_call_tool, 50),
    ("smolagents Tool.__call__", "smolagents", "smolagents", smolagents_call, 1000),
    ("crewai BaseTool.run", "crewai", "crewai", crewai_run, 1000),
]


def _mean_us(call: Callable[[], None], count: int) -> float:
    start = time.process_time()
    for _ in range(count):
        call()
    return (time.process_time() - start) / count * 1e6


def measure(framework: Optional[str], make: Optional[Callable], count: int, rounds: int) -> tuple[float, float]:
    """Best-round mean microseconds (plain, hooked), measured in alternating rounds."""
    plain_us, hooked_us = [], []
    plain_call = bare_function() if make is None else make()
    for _ in range(rounds):
        plain_us.append(_mean_us(plain_call, count))
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=[framework] if framework else [])
        hooked_call = bare_tool() if make is None else plain_call
        try:
            hooked_us.append(_mean_us(hooked_call, count))
            handle.force_flush()
        finally:
            agent_otel.uninstrument()
    return min(plain_us), min(hooked_us)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few calls and rounds: a smoke run")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 5

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropSpans()))
    trace.set_tracer_provider(provider)

    rows = []
    print(f"{'call':32} {'plain us':>10} {'hooked us':>10} {'hook us':>9} {'ratio':>7}")
    for label, framework, module, make, count in CASES:
        if not _installed(module):
            print(f"{label:32} {'(not installed)':>10}")
            continue
        if args.quick:
            count = max(10, count // 20)
        try:
            plain, hooked = measure(framework, make, count, rounds)
        except Exception as exc:  # an installed version whose API this bench does not know
            print(f"{label:32} (cannot run: {type(exc).__name__}: {exc})")
            continue
        rows.append(
            {
                "call": label,
                "plain_us": round(plain, 2),
                "hooked_us": round(hooked, 2),
                "hook_us": round(hooked - plain, 2),
                "ratio": round(hooked / plain, 3),
            }
        )
        print(f"{label:32} {plain:10.1f} {hooked:10.1f} {hooked - plain:9.1f} {hooked / plain:7.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
