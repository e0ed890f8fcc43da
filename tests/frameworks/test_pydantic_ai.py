"""Pydantic AI agents traced with no change beyond ``instrument()``.

The agent's real loop runs against a ``FunctionModel`` (no network) that
asks for two calls of a sync tool at once, then answers; the tool runs on
anyio's worker threads, limited to one so the second call waits for it.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from frameworks.framework_support import (
    assert_one_turn_as_engineered,
    framework_fixture,
    least_wait_s,
    report_json,
    timing,
)

import agent_otel

framework = framework_fixture("pydantic_ai", "pydantic_ai")

SLEEP_S = 0.15  # what the tool takes
MODEL_S = 0.1  # what each model call takes


def scripted_agent(name: str = "support"):
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    async def respond(messages, info):
        await asyncio.sleep(MODEL_S)
        if any(isinstance(part, ToolReturnPart) for message in messages for part in getattr(message, "parts", ())):
            return ModelResponse(parts=[TextPart("all fetched")])
        return ModelResponse(
            parts=[
                ToolCallPart("fetch_page", {"url": "a.example"}, tool_call_id="c1"),
                ToolCallPart("fetch_page", {"url": "b.example"}, tool_call_id="c2"),
            ]
        )

    agent = Agent(FunctionModel(respond), name=name)

    @agent.tool_plain
    def fetch_page(url: str) -> str:
        """Download a page (slowly)."""
        time.sleep(SLEEP_S)
        return f"<html>{url}</html>"

    return agent


def run_on_one_thread(agent):
    import anyio.to_thread

    async def main():
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1  # this loop's
        return await agent.run("fetch two pages")

    return asyncio.run(main()).output


@pytest.fixture
def pydantic_ai_instrumented():
    """Pydantic AI's own OpenTelemetry spans on, as ``Agent.instrument_all()`` turns them on."""
    from pydantic_ai import Agent

    Agent.instrument_all()
    yield
    Agent.instrument_all(False)


def test_beside_its_own_spans_each_tool_call_counts_once_with_its_wait_for_a_thread(
    pydantic_ai_instrumented, hooked, spans, tmp_path
):
    traces = tmp_path / "traces.jsonl"
    hooked("pydantic_ai", traces_file=str(traces))

    assert run_on_one_thread(scripted_agent()) == "all fetched"
    agent_otel.uninstrument()  # flushes the traces file

    ours = [s for s in spans.tools("fetch_page") if s.instrumentation_scope.name == "agent_otel"]
    theirs = [s for s in spans.tools("fetch_page") if s.instrumentation_scope.name != "agent_otel"]
    assert len(theirs) == 2  # Pydantic AI's own span of each call
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in ours) == ["c1", "c2"]
    ordered = sorted(ours, key=lambda s: s.start_time + timing(s)[0] * 1e9)
    for position, span in enumerate(ordered):
        queue_s, exec_s = timing(span)
        assert span.attributes["agent.tool.executor"] == "anyio"
        assert span.attributes["agent.executor.max_workers"] == 1
        assert span.attributes["gen_ai.tool.description"] == "Download a page (slowly)."
        assert exec_s >= SLEEP_S * 0.95
        assert queue_s >= least_wait_s(ordered, span, position, SLEEP_S)  # the second waited for the thread
    report = report_json(traces)
    (tool,) = report["tools"]
    assert (tool["tool"], tool["calls"], tool["executors"]) == ("fetch_page", 2, ["anyio"])  # ours kept, once
    (model,) = report["models"]  # its model calls, from its own chat spans
    assert model["calls"] == 2
    turns = report["turns"]
    assert turns["count"] == 1
    (turn,) = turns["slowest"]
    assert (turn["tool_calls"], turn["model_calls"]) == (2, 2)
    assert turn["model_s"] >= 2 * MODEL_S * 0.95
    # side by side: the first executing while the second waits, then the second (report.md)
    assert turn["tool_queue_s"] >= SLEEP_S * 0.8 and turn["tool_exec_s"] >= SLEEP_S * 0.95


def test_one_run_of_an_agent_is_one_turn_with_instrument_alone(hooked, spans, tmp_path):
    traces = tmp_path / "traces.jsonl"
    hooked("pydantic_ai", traces_file=str(traces))

    assert run_on_one_thread(scripted_agent()) == "all fetched"
    agent_otel.uninstrument()

    # no model spans: Pydantic AI records its model calls itself, once instrumented
    assert_one_turn_as_engineered(report_json(traces), spans, "support", model_calls=0, tool_calls=2)


def test_uninstrument_restores_pydantic_ai_exactly(spans):
    from pydantic_ai import _utils
    from pydantic_ai.agent.abstract import AbstractAgent
    from pydantic_ai.toolsets.function import FunctionToolset

    points = [(FunctionToolset, "call_tool"), (_utils, "run_sync"), (AbstractAgent, "run")]
    before = [vars(owner)[name] for owner, name in points]
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["pydantic_ai"])
    assert vars(FunctionToolset)["call_tool"] is not before[0]
    agent_otel.uninstrument()

    assert all(vars(owner)[name] is original for (owner, name), original in zip(points, before))
    run_on_one_thread(scripted_agent())
    assert spans.tools() == [] and spans.runs() == []
