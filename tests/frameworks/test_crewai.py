"""CrewAI tools traced with no change beyond ``instrument()``.

CrewAI is not in the ``frameworks`` extra (it needs openai<3, openai-agents
needs openai>=3), so these tests skip unless CrewAI is installed. CI runs
them in a venv of their own (``.ci/run``: the ``crewai`` extra), where a
missing CrewAI fails them (AGENT_OTEL_REQUIRED_FRAMEWORKS=crewai).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import types

import pytest
from frameworks.framework_support import (
    assert_queued_one_after_another,
    by_exec_start,
    least_wait_s,
    require_framework,
    run_with_one_worker,
    timing,
)

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # no usage reports from a test run
require_framework("crewai", "crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import BaseTool, tool  # noqa: E402

SLEEP_S = 0.15


@tool("fetch_page")
def fetch_page(url: str) -> str:
    """Download a page (slowly)."""
    time.sleep(SLEEP_S)
    return f"<html>{url}</html>"


class Resize(BaseTool):
    name: str = "resize"
    description: str = "Resize an image."

    def _run(self, size: int) -> str:
        time.sleep(SLEEP_S)
        return f"resized to {size}"


def test_direct_tool_runs_are_spans(hooked, spans):
    hooked("crewai")

    assert fetch_page.run(url="a") == "<html>a</html>"
    assert Resize().run(size=3) == "resized to 3"

    for name in ("fetch_page", "resize"):
        (span,) = spans.tools(name)
        queue_s, exec_s = timing(span)
        assert queue_s == 0.0 and exec_s >= SLEEP_S * 0.95
        assert span.attributes["agent.tool.executor"] == "direct"
    assert "Resize an image." in spans.tools("resize")[0].attributes["gen_ai.tool.description"]


def test_agent_style_async_runs_of_a_sync_tool_wait_for_the_executor(hooked, spans):
    hooked("crewai")
    structured = Resize().to_structured_tool()  # what a crew's agent runs

    async def agent_turn():
        return await asyncio.gather(*[structured.ainvoke({"size": i}) for i in range(3)])

    assert run_with_one_worker(agent_turn) == ["resized to 0", "resized to 1", "resized to 2"]
    assert_queued_one_after_another(spans.tools("resize"), SLEEP_S)


class ScriptedLLM(BaseLLM):
    """A function-calling model that asks for ``tool_calls`` ((name, arguments), ...) once, then answers."""

    def __init__(self, tool_calls, **kwargs):
        super().__init__(model="scripted", **kwargs)
        self._tool_calls = tool_calls

    def supports_function_calling(self) -> bool:
        return True

    def call(
        self,
        messages,
        tools=None,
        callbacks=None,
        available_functions=None,
        from_task=None,
        from_agent=None,
        response_model=None,
    ):
        if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
            return "all fetched"
        return [
            types.SimpleNamespace(
                id=f"call_{i}", function=types.SimpleNamespace(name=name, arguments=json.dumps(arguments))
            )
            for i, (name, arguments) in enumerate(self._tool_calls)
        ]


def test_a_crews_parallel_native_tool_calls_wait_for_its_pool(hooked, spans):
    hooked("crewai")
    llm = ScriptedLLM([("fetch_page", {"url": str(i)}) for i in range(10)])
    agent = Agent(role="researcher", goal="read pages", backstory="careful", tools=[fetch_page], llm=llm)
    task = Task(description="fetch ten pages", expected_output="a summary", agent=agent)

    assert str(Crew(agents=[agent], tasks=[task]).kickoff()) == "all fetched"

    # CrewAI runs up to 8 native tool calls at once: of 10, two wait for a worker.
    pages = spans.tools("fetch_page")
    assert len(pages) == 10
    for span in pages:
        queue_s, exec_s = timing(span)
        assert span.attributes["agent.tool.executor"] == "ThreadPoolExecutor"
        assert span.attributes["agent.executor.max_workers"] == 8
        assert exec_s >= SLEEP_S * 0.95
        assert abs((span.end_time - span.start_time) / 1e9 - (queue_s + exec_s)) < 0.005
    # The last two to run waited for a worker, each for one call's exec time, less
    # however much later than the first they were requested (a loaded machine).
    for span in by_exec_start(pages)[-2:]:
        assert least_wait_s(pages, span, 1, SLEEP_S) <= timing(span)[0] < SLEEP_S + 3.0


def test_a_failing_tool_records_the_error_and_raises_it_unchanged(hooked, spans):
    hooked("crewai")
    failure = KeyError("missing")

    class Broken(BaseTool):
        name: str = "broken"
        description: str = "Fails."

        def _run(self, key: str) -> str:
            raise failure

    with pytest.raises(KeyError) as raised:
        Broken().run(key="k")

    assert raised.value is failure
    (span,) = spans.tools("broken")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "KeyError"


def test_one_kickoff_is_one_turn_with_instrument_alone(hooked, spans, tmp_path):
    from frameworks.framework_support import assert_one_turn_as_engineered, report_json

    import agent_otel

    traces = tmp_path / "traces.jsonl"
    hooked("crewai", traces_file=str(traces))
    llm = ScriptedLLM([("fetch_page", {"url": "a"})])
    agent = Agent(role="researcher", goal="read pages", backstory="careful", tools=[fetch_page], llm=llm)
    task = Task(description="fetch a page", expected_output="a summary", agent=agent)

    assert str(Crew(name="research", agents=[agent], tasks=[task]).kickoff()) == "all fetched"
    agent_otel.uninstrument()  # flushes the traces file

    # CrewAI's model calls are not hooked: the turn is the crew's tool call and the rest
    assert_one_turn_as_engineered(report_json(traces), spans, "research", model_calls=0, tool_calls=1)
    (turn,) = report_json(traces)["turns"]["slowest"]
    assert turn["tool_exec_s"] >= SLEEP_S * 0.95
