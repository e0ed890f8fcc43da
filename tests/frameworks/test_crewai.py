"""CrewAI tools traced with no change beyond ``instrument()``.

CrewAI is not in the ``frameworks`` extra (it needs openai<3, openai-agents
needs openai>=3), so these tests skip unless CrewAI is installed, in CI
too. They ran in a separate environment with crewai 1.15.30 (see
docs/frameworks.md).
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from frameworks.framework_support import (assert_queued_one_after_another, require_framework, run_with_one_worker,
                                          timing)

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # no usage reports from a test run
require_framework("crewai", "crewai")

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
