"""What a framework hook adds to one tool call, against one bare span on the same provider.

Usage::

    .venv/bin/python bench/frameworks.py            # 3-7 minutes on a busy 2-core machine
    .venv/bin/python bench/frameworks.py --quick    # a smoke run
    .venv-crewai/bin/python bench/frameworks.py     # CrewAI (its own venv: docs/frameworks.md)
    .venv/bin/python bench/frameworks.py --deferred # with deferred_spans on: the hot path's costs

For every installed framework, one trivial tool (it returns its argument) is
called the way the framework's agents call it, with agent-otel instrumented
(its executor hook and event-loop monitor on, as for any agent), in four
ways:

- **instrumented**: the framework's call, the framework not hooked;
- **bare span**: that call inside ``tracer.start_as_current_span(...)`` on
  the same provider: one span made current around this very call;
- **@tool**: that call inside an ``@agent_otel.tool`` function: what
  agent-otel's own recording of one tool call costs here, the least a hook
  that keeps the contract can cost;
- **hooked**: the framework hooked (``instrument_frameworks``), as a user
  runs it.

Time is CPU time of this process (``time.process_time``, which other load
on the machine disturbs less than wall-clock time), per call, over blocks
of calls. The four blocks of one alternation run back to back (their order
rotating), and a cost is a block's time less the *instrumented* block of
the same alternation, so slow drifts of the machine's load cancel and each
cost is measured around the framework's own code with the caches that code
leaves (a span entered in a tight loop costs a third of what it costs
around a LangChain tool run). A round's figure is the median over its
alternations; the table gives the median over rounds with their min and
max. *plain*, the call with agent-otel not instrumented, is measured once
per round, for scale.

**hook / span** is the hook's cost in bare spans, the goal printed beside
it: the hook adds no more than one bare span's cost (<= 1.0); a call whose bare
span measured at or below zero in some round is "not resolved": its own
noise exceeds a span's cost on this machine. **(hook - @tool) /
span** is what the framework glue adds on top of agent-otel's own recording
of the call. The first row is an ``@agent_otel.tool`` function against the
undecorated function: there, the hook is the decorator.

Spans go to an SDK provider with a batch processor and an exporter that
drops them, as an application that exports would pay for.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import time
from typing import Callable, Optional

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import agent_otel
from agent_otel.capture.frameworks import instrument_frameworks, uninstrument_frameworks


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
# be installed, make the call, calls per block)
CASES = [
    ("@agent_otel.tool function", None, "agent_otel", None, 200),
    ("langchain tool.invoke", "langchain", "langchain_core", langchain_invoke, 20),
    ("langchain sync tool ainvoke", "langchain", "langchain_core", langchain_ainvoke_sync_tool, 10),
    ("openai_agents async tool", "openai_agents", "agents", openai_agents_async_tool, 40),
    ("llamaindex FunctionTool.call", "llamaindex", "llama_index.core", llamaindex_call, 100),
    ("mcp ClientSession.call_tool", "mcp", "mcp", mcp_call_tool, 8),
    ("smolagents Tool.__call__", "smolagents", "smolagents", smolagents_call, 200),
    ("crewai BaseTool.run", "crewai", "crewai", crewai_run, 100),
]


GOAL_RATIO = 1.0  # the hook adds no more than one bare span's cost


def _mean_us(call: Callable[[], None], count: int) -> float:
    """CPU microseconds per call over ``count`` calls."""
    start = time.process_time()
    for _ in range(count):
        call()
    return (time.process_time() - start) / count * 1e6


def measure(
    framework: Optional[str],
    make: Optional[Callable],
    count: int,
    rounds: int,
    alternations: int,
    tracer,
    deferred: bool = False,
) -> dict[str, list[float]]:
    """Per round: plain, and the costs of a bare span, an @agent_otel.tool and the hook, microseconds per call.

    With ``deferred`` (``deferred_spans`` on), the costs are the hot path's:
    the pipeline's thread is stopped and the spans it builds are built
    between blocks, outside the timing (``bench/instructions.py --deferred``
    counts that work).
    """
    pipeline: list = []
    plain_call = bare_function() if make is None else make()
    hooked_call = bare_tool() if make is None else plain_call

    def in_span() -> None:
        with tracer.start_as_current_span("bare"):
            plain_call()

    @agent_otel.tool
    def in_tool() -> None:
        plain_call()

    def block(name: str, call: Callable[[], None]) -> float:
        hook = name == "hook" and framework is not None
        if hook:
            instrument_frameworks((framework,))
        try:
            call()  # a first call outside the timing: the hook's lazy imports and caches
            return _mean_us(call, count)
        finally:
            for still in pipeline:
                still.drain(spans=True)  # the deferred spans built, outside the timing
            if hook:
                uninstrument_frameworks((framework,))

    variants = [("instrumented", plain_call), ("span", in_span), ("tool", in_tool), ("hook", hooked_call)]
    results: dict[str, list[float]] = {"plain_us": [], "span_us": [], "tool_us": [], "hook_us": []}
    plain_call()
    for _ in range(rounds):
        results["plain_us"].append(_mean_us(plain_call, count))
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=[], deferred_spans=deferred)
        if deferred and handle.pipeline is not None:
            handle.pipeline.shutdown(5.0)  # its thread stopped; drain() still builds
            pipeline[:] = [handle.pipeline]
        costs: dict[str, list[float]] = {"span": [], "tool": [], "hook": []}
        try:
            for alternation in range(alternations):
                shift = alternation % len(variants)
                times = {name: block(name, call) for name, call in variants[shift:] + variants[:shift]}
                for name in costs:
                    costs[name].append(times[name] - times["instrumented"])
        finally:
            handle.force_flush()
            agent_otel.uninstrument()
        for name, values in costs.items():
            results[f"{name}_us"].append(statistics.median(values))
    results["ratio"] = [hook / span for hook, span in zip(results["hook_us"], results["span_us"])]
    results["glue_ratio"] = [
        (hook - tool) / span for hook, tool, span in zip(results["hook_us"], results["tool_us"], results["span_us"])
    ]
    return results


def spread(values: list[float], digits: int = 1) -> str:
    """median [min-max]"""
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few calls and rounds: a smoke run")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--only", metavar="TEXT", help="only the calls whose label contains TEXT")
    parser.add_argument(
        "--deferred", action="store_true", help="with deferred_spans on (the hot path's costs; see measure())"
    )
    args = parser.parse_args(argv)
    rounds, alternations = (3, 4) if args.quick else (7, 24)

    provider = TracerProvider()
    # A queue that holds every span of a block: on a loaded machine the export
    # thread can fall behind, and a full queue would drop spans (cheaper than
    # exporting them) and say so on stderr.
    provider.add_span_processor(BatchSpanProcessor(DropSpans(), max_queue_size=1 << 16))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("bench")

    rows = []
    print(
        f"CPU microseconds per tool call; median [min-max] over {rounds} rounds "
        f"of {alternations} interleaved alternations"
        + ("; deferred_spans on: the hot path (the spans built between blocks)" if args.deferred else "")
    )
    print(
        f"{'call':30} {'plain':>22} {'hook':>18} {'bare span':>18} {'@tool':>18} "
        f"{'hook / span':>18} {'goal':>6} {'':22} {'(hook-@tool) / span':>20}"
    )
    for label, framework, module, make, count in CASES:
        if args.only and args.only not in label:
            continue
        if not _installed(module):
            print(f"{label:30} (not installed)")
            continue
        if args.quick:
            count = max(2, count // 4)
        try:
            results = measure(framework, make, count, rounds, alternations, tracer, args.deferred)
        except Exception as exc:  # an installed version whose API this bench does not know
            print(f"{label:30} (cannot run: {type(exc).__name__}: {exc})")
            continue
        ratio = statistics.median(results["ratio"])
        # A span costs more than nothing: a round that measured it at or below
        # zero means the call's own noise exceeds a span's cost here, and no
        # ratio to it means anything.
        resolved = min(results["span_us"]) > 0
        verdict = ("met" if ratio <= GOAL_RATIO else "NOT MET") if resolved else "not resolved (noise)"
        rows.append(
            {
                "call": label,
                "deferred_spans": args.deferred,
                **{key: [round(v, 3) for v in values] for key, values in results.items()},
                "ratio_median": round(ratio, 3),
                "goal": verdict,
            }
        )
        print(
            f"{label:30} {spread(results['plain_us']):>22} {spread(results['hook_us']):>18} "
            f"{spread(results['span_us']):>18} {spread(results['tool_us']):>18} "
            f"{spread(results['ratio'], 2):>18} {'<= ' + format(GOAL_RATIO, '.1f'):>6} {verdict:22} "
            f"{spread(results['glue_ratio'], 2):>20}"
        )
    if rows:
        missed = [row["call"] for row in rows if row["goal"] == "NOT MET"]
        unresolved = [row["call"] for row in rows if row["goal"] == "not resolved (noise)"]
        print(
            f"goal: the hook adds no more than one bare span's cost (hook / span <= {GOAL_RATIO:g}): "
            + ("NOT MET for " + ", ".join(missed) if missed else "met for every call resolved")
            + ("; not resolved (a bare span's cost below the noise) for " + ", ".join(unresolved) if unresolved else "")
        )
    else:
        print("nothing to measure")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
