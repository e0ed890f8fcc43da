"""LlamaIndex FunctionTools traced with no change beyond ``instrument()``.

LlamaIndex's workflow agents run every tool with ``await tool.acall(...)``;
these tests call the tools the same way, without an LLM.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from frameworks.framework_support import (
    ASYNCIO_DEFAULT_WORKERS,
    assert_queued_one_after_another,
    framework_fixture,
    run_with_one_worker,
    timing,
)

import agent_otel

framework = framework_fixture("llamaindex", "llama_index.core")

SLEEP_S = 0.15


def fetch_page(url: str) -> str:
    """Download a page (slowly)."""
    time.sleep(SLEEP_S)
    return f"<html>{url}</html>"


async def ask_database(query: str) -> str:
    """Query the database."""
    await asyncio.sleep(SLEEP_S)
    return f"rows for {query}"


def test_sync_call_is_one_direct_span(hooked, spans):
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    page_tool = FunctionTool.from_defaults(fn=fetch_page)

    output = page_tool.call(url="a")

    assert output.raw_output == "<html>a</html>"
    (span,) = spans.tools("fetch_page")
    assert span.attributes["gen_ai.tool.description"].endswith("Download a page (slowly).")
    assert span.attributes["agent.tool.executor"] == "direct"
    queue_s, exec_s = timing(span)
    assert queue_s == 0.0 and exec_s >= SLEEP_S * 0.95


def test_agent_style_async_calls_of_a_sync_tool_wait_for_the_executor(hooked, spans):
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    page_tool = FunctionTool.from_defaults(fn=fetch_page)

    async def agent_turn():
        return await asyncio.gather(*[page_tool.acall(url=str(i)) for i in range(3)])

    outputs = run_with_one_worker(agent_turn)

    assert [o.raw_output for o in outputs] == ["<html>0</html>", "<html>1</html>", "<html>2</html>"]
    assert_queued_one_after_another(spans.tools("fetch_page"), SLEEP_S)


def scripted_llm(tool_calls, delay_s=0.0):
    """A function-calling LLM that asks for ``tool_calls`` ((name, kwargs), ...) once, then answers;
    each call takes ``delay_s``."""
    from llama_index.core.base.llms.types import ToolCallBlock
    from llama_index.core.llms import ChatMessage, MessageRole
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    def respond(messages, **kwargs):
        time.sleep(delay_s)
        if any(message.role == MessageRole.TOOL for message in messages):
            return ChatMessage(role=MessageRole.ASSISTANT, content="all fetched")
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[
                ToolCallBlock(tool_call_id=f"call_{i}", tool_name=name, tool_kwargs=arguments)
                for i, (name, arguments) in enumerate(tool_calls)
            ],
        )

    return MockFunctionCallingLLM(response_generator=respond)


def test_a_function_agent_runs_sync_tools_on_the_default_executor_of_known_size(hooked, spans):
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=fetch_page)],
        llm=scripted_llm([("fetch_page", {"url": str(i)}) for i in range(3)]),
    )

    async def agent_turn():
        return await agent.run("fetch three pages")

    assert str(asyncio.run(agent_turn())) == "all fetched"

    pages = spans.tools("fetch_page")
    assert len(pages) == 3
    for span in pages:
        assert span.attributes["agent.tool.executor"] == "asyncio-default"
        assert span.attributes["agent.executor.max_workers"] == ASYNCIO_DEFAULT_WORKERS
        assert timing(span)[1] >= SLEEP_S * 0.95


def test_async_tool_has_no_queue(hooked, spans):
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    database_tool = FunctionTool.from_defaults(async_fn=ask_database)

    output = asyncio.run(database_tool.acall(query="orders"))

    assert output.raw_output == "rows for orders"
    (span,) = spans.tools("ask_database")
    queue_s, exec_s = timing(span)
    assert queue_s == 0.0 and exec_s >= SLEEP_S * 0.95


def test_a_failing_tool_records_the_error_and_raises_it_unchanged(hooked, spans):
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    failure = LookupError("no such page")

    def flaky(url: str) -> str:
        raise failure

    with pytest.raises(LookupError) as raised:
        asyncio.run(FunctionTool.from_defaults(fn=flaky).acall(url="x"))

    assert raised.value is failure
    (span,) = spans.tools("flaky")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "LookupError"


def test_a_hook_failure_runs_the_tool_untraced_with_one_warning(hooked, spans, caplog):
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    page_tool = FunctionTool.from_defaults(fn=fetch_page, name="fetch")

    class UnexpectedMetadata:
        """Metadata the tool itself still reads, but the hook cannot."""

        def get_name(self):
            return "fetch"

        @property
        def description(self):
            raise RuntimeError("metadata from a version the hook does not know")

    page_tool._metadata = UnexpectedMetadata()
    with caplog.at_level(logging.WARNING, logger="agent_otel.capture.frameworks"):
        assert page_tool.call(url="a").raw_output == "<html>a</html>"
        assert page_tool.call(url="b").raw_output == "<html>b</html>"

    assert spans.tools() == []
    warnings = [r for r in caplog.records if "llamaindex" in r.getMessage()]
    assert len(warnings) == 1
    assert "RuntimeError" in warnings[0].getMessage()


def test_uninstrument_restores_llamaindex_exactly(spans):
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.tools import FunctionTool

    handlers_before = list(get_dispatcher().event_handlers)
    before = (vars(FunctionTool)["call"], vars(FunctionTool)["acall"])
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["llamaindex"])
    assert vars(FunctionTool)["call"] is not before[0]
    agent_otel.uninstrument()

    assert (vars(FunctionTool)["call"], vars(FunctionTool)["acall"]) == before
    assert get_dispatcher().event_handlers == handlers_before
    FunctionTool.from_defaults(fn=fetch_page).call(url="z")
    assert spans.tools() == []


def test_each_llm_call_of_a_function_agent_is_a_streamed_model_span(hooked, spans):
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=fetch_page)], llm=scripted_llm([("fetch_page", {"url": "a"})])
    )

    async def agent_turn():
        return await agent.run("fetch a page")

    assert str(asyncio.run(agent_turn())) == "all fetched"

    calls = sorted(spans.models("MockFunctionCallingLLM"), key=lambda s: s.start_time)
    assert len(calls) == 2  # asked for the tool, then answered: achat_with_tools streams, one span each
    for span in calls:
        assert span.name == "chat MockFunctionCallingLLM"
        assert 0 <= span.attributes["gen_ai.response.time_to_first_chunk"] <= (span.end_time - span.start_time) / 1e9
    (tool,) = spans.tools("fetch_page")
    assert calls[0].end_time <= tool.start_time and tool.end_time <= calls[1].start_time


def test_a_completion_and_a_failing_llm_call(hooked, spans):
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.llms.mock import MockLLM

    class BrokenLLM(MockLLM):
        @llm_completion_callback()  # as every LLM integration's methods are
        def complete(self, prompt, formatted=False, **kwargs):
            raise TimeoutError("the model server timed out")

    hooked("llamaindex")
    assert MockLLM().complete("hello").text == "hello"
    with pytest.raises(TimeoutError):
        BrokenLLM().complete("hello")

    ok, failed = sorted(spans.models("MockLLM"), key=lambda s: s.start_time)  # LlamaIndex's class_name()
    assert ok.name == failed.name == "text_completion MockLLM"
    assert ok.status.status_code.name == "UNSET"
    assert failed.status.status_code.name == "ERROR"
    assert failed.status.description == "the model server timed out"
    assert failed.attributes["error.type"] == "_OTHER"  # LlamaIndex reports only the error's text


MODEL_S = 0.1  # what each call of the scripted LLM takes


def test_one_run_of_a_function_agent_is_one_turn_with_instrument_alone(hooked, spans, tmp_path):
    from frameworks.framework_support import assert_one_turn_as_engineered, report_json
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    traces = tmp_path / "traces.jsonl"
    hooked("llamaindex", traces_file=str(traces))
    agent = FunctionAgent(
        name="support",
        tools=[FunctionTool.from_defaults(fn=fetch_page)],
        llm=scripted_llm([("fetch_page", {"url": "a"})], delay_s=MODEL_S),
    )

    async def agent_turn():
        return await agent.run("fetch a page")

    assert str(asyncio.run(agent_turn())) == "all fetched"
    agent_otel.uninstrument()  # flushes the traces file

    report = report_json(traces)
    assert_one_turn_as_engineered(report, spans, "support", model_calls=2, tool_calls=1)
    (turn,) = report["turns"]["slowest"]
    # the scripted LLM sleeps on the loop's thread: on a busy machine past the
    # loop monitor's threshold, part of that is client CPU
    assert turn["model_s"] + turn["client_cpu_s"] >= 2 * MODEL_S * 0.95
    assert turn["tool_exec_s"] >= SLEEP_S * 0.95


def test_a_function_agent_run_in_the_applications_agent_span_is_that_span(hooked, spans):
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    hooked("llamaindex")
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(fn=fetch_page)], llm=scripted_llm([]))

    async def agent_turn():
        with agent_otel.agent_span("my-app"):
            return await agent.run("answer")

    asyncio.run(agent_turn())
    (run,) = spans.runs()
    assert run.name == "invoke_agent my-app"
