"""LangChain and LangGraph tools traced with no change beyond ``instrument()``."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from frameworks.framework_support import (
    ASYNCIO_DEFAULT_WORKERS,
    assert_one_turn_as_engineered,
    assert_queued_one_after_another,
    by_exec_start,
    framework_fixture,
    least_wait_s,
    report_json,
    require_framework,
    run_with_one_worker,
    timing,
)

import agent_otel

framework = framework_fixture("langchain", "langchain_core")


def test_sync_tool_call_is_one_span_with_the_model_call_id(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, tool_call

    hooked("langchain")

    message = fetch_page.invoke(tool_call("fetch_page", {"url": "a.example"}, "call_7"))

    assert message.content == "<html>a.example</html>"
    (span,) = spans.tools()
    assert span.name == "execute_tool fetch_page"
    assert span.attributes["gen_ai.tool.call.id"] == "call_7"
    assert span.attributes["gen_ai.tool.description"] == "Download a page (slowly)."
    assert span.attributes["agent.tool.executor"] == "direct"
    assert span.attributes["agent.tool.outcome"] == "ok"
    queue_s, exec_s = timing(span)
    assert queue_s == 0.0
    assert SLEEP_S * 0.95 <= exec_s < SLEEP_S + 2.0


def test_sync_tools_invoked_from_async_code_wait_for_the_executor(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, tool_call

    hooked("langchain")

    async def agent_turn():
        return await asyncio.gather(
            *[fetch_page.ainvoke(tool_call("fetch_page", {"url": f"{i}.example"}, f"c{i}")) for i in range(3)]
        )

    messages = run_with_one_worker(agent_turn)

    assert [m.content for m in messages] == [f"<html>{i}.example</html>" for i in range(3)]
    found = spans.tools("fetch_page")
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in found) == ["c0", "c1", "c2"]
    assert_queued_one_after_another(found, SLEEP_S)


def test_tool_subclass_run_async_is_queued_on_the_default_executor(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, Resize

    hooked("langchain")
    resize = Resize()

    async def agent_turn():
        return await asyncio.gather(resize.arun({"size": 1}, tool_call_id="r1"), resize.ainvoke({"size": 2}))

    message, text = run_with_one_worker(agent_turn)
    assert (message.content, text) == ("resized to 1", "resized to 2")
    found = spans.tools("resize")
    assert len(found) == 2
    assert {s.attributes.get("gen_ai.tool.call.id") for s in found} == {"r1", None}
    assert_queued_one_after_another(found, SLEEP_S)


def test_async_tool_runs_on_the_loop_with_no_queue(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, ask_database

    hooked("langchain")

    result = asyncio.run(ask_database.ainvoke({"query": "orders"}))

    assert result == "rows for orders"
    (span,) = spans.tools("ask_database")
    queue_s, exec_s = timing(span)
    assert queue_s == 0.0 and exec_s >= SLEEP_S * 0.95
    assert span.attributes["agent.tool.executor"] == "direct"


def test_a_failing_tool_records_the_error_and_raises_it_unchanged(hooked, spans):
    from langchain_core.tools import StructuredTool

    hooked("langchain")
    failure = ConnectionError("upstream down")

    def flaky(url: str) -> str:
        raise failure

    flaky_tool = StructuredTool.from_function(flaky, name="flaky", description="Fails.")
    with pytest.raises(ConnectionError) as raised:
        flaky_tool.invoke({"url": "x"})

    assert raised.value is failure
    (span,) = spans.tools("flaky")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "ConnectionError"
    assert not span.status.is_ok
    assert [e.name for e in span.events] == ["exception"]  # a direct call: no exec.start


def test_an_error_the_tool_handles_itself_is_still_an_error(hooked, spans):
    from frameworks.langchain_scripted import tool_call
    from langchain_core.tools import StructuredTool, ToolException

    hooked("langchain")

    def lookup(key: str) -> str:
        raise ToolException(f"no such key {key}")

    lookup_tool = StructuredTool.from_function(lookup, name="lookup", description="Look up.", handle_tool_error=True)
    message = lookup_tool.invoke(tool_call("lookup", {"key": "k"}, "c9"))

    assert message.status == "error" and message.content == "no such key k"
    (span,) = spans.tools("lookup")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "tool_error"
    assert span.status.description == "no such key k"


def test_a_tool_also_decorated_with_agent_otel_tool_has_one_span(hooked, spans):
    from frameworks.langchain_scripted import tool_call
    from langchain_core.tools import tool

    hooked("langchain")

    @tool
    @agent_otel.tool
    def convert(amount: int) -> int:
        """Convert a currency."""
        return amount * 2

    assert convert.invoke(tool_call("convert", {"amount": 21}, "c1")).content == "42"
    (span,) = spans.tools("convert")
    assert span.attributes["gen_ai.tool.call.id"] == "c1"


def test_langgraph_tool_node_queues_tool_calls_beyond_max_concurrency(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, react_graph, three_page_turns
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    hooked("langchain")
    graph = react_graph([fetch_page], three_page_turns())

    state = graph.invoke({"messages": [HumanMessage("fetch three pages")]}, config={"max_concurrency": 1})

    assert state["messages"][-1].content == "all fetched"
    found = spans.tools("fetch_page")
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in found) == ["t0", "t1", "t2"]
    ordered = by_exec_start(found)
    for position, span in enumerate(ordered):
        queue_s, exec_s = timing(span)
        assert exec_s >= SLEEP_S * 0.95
        assert queue_s >= least_wait_s(ordered, span, position, SLEEP_S)
        assert span.attributes["agent.tool.executor"].startswith("ThreadPoolExecutor")


@pytest.mark.parametrize("calls", [2, 8])
def test_the_default_react_agent_queues_each_tool_call_for_the_runners_workers(hooked, spans, calls):
    """create_react_agent (v2) sends each tool call as a task of its own, which
    LangGraph's runner runs on its pool of max_concurrency workers (then the
    ToolNode in it on a pool of its own): the wait for the runner's worker is
    the call's queue time."""
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, react_agent, tool_call
    from langchain_core.messages import AIMessage, HumanMessage

    require_framework("langchain", "langgraph")
    hooked("langchain")
    turns = [
        AIMessage("", tool_calls=[tool_call("fetch_page", {"url": f"{i}.example"}, f"t{i}") for i in range(calls)]),
        AIMessage("all fetched"),
    ]
    workers = calls - 1  # one call waits for a worker (with 2: one worker, the second waits for the first)

    invoked = time.time_ns()
    state = react_agent([fetch_page], turns).invoke(
        {"messages": [HumanMessage("fetch the pages")]}, config={"max_concurrency": workers}
    )

    assert state["messages"][-1].content == "all fetched"
    found = spans.tools("fetch_page")
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in found) == sorted(f"t{i}" for i in range(calls))
    ordered = by_exec_start(found)

    def exec_start(span) -> float:
        return span.start_time + timing(span)[0] * 1e9

    # The runner ran at most max_concurrency calls at once, so the last call
    # to run got a worker only when one of the others ended, and had waited
    # for it since the runner submitted it: the tool's 150 ms, less however
    # much later than the first it was submitted (a call whose queue time
    # began at the ToolNode's own hand-off, inside the task, shows ~0 here).
    # Which call that is, and whether a worker thread slow to start on a
    # loaded machine made a second one wait too, is the scheduler's choice.
    last = ordered[-1]
    first_end = min(s.end_time for s in ordered[:-1])
    assert sum(exec_start(s) < first_end for s in ordered) <= workers
    assert exec_start(last) >= first_end
    assert timing(last)[0] >= least_wait_s(ordered, last, 1, SLEEP_S)
    for span in ordered:  # each span begins at the runner's submission, within this run
        assert span.start_time >= invoked
        assert span.attributes["agent.executor.max_workers"] == workers


def test_the_default_react_agent_run_async_queues_sync_tools_for_the_loops_executor(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, react_agent, three_page_turns
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    hooked("langchain")
    agent = react_agent([fetch_page], three_page_turns())

    state = run_with_one_worker(lambda: agent.ainvoke({"messages": [HumanMessage("fetch")]}))

    assert state["messages"][-1].content == "all fetched"
    assert_queued_one_after_another(spans.tools("fetch_page"), SLEEP_S)


def test_langgraph_async_graph_runs_sync_tools_on_the_default_executor(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, react_graph, three_page_turns
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    hooked("langchain")
    graph = react_graph([fetch_page], three_page_turns(), asynchronous=True)

    state = run_with_one_worker(lambda: graph.ainvoke({"messages": [HumanMessage("fetch")]}))

    assert state["messages"][-1].content == "all fetched"
    assert_queued_one_after_another(spans.tools("fetch_page"), SLEEP_S)


def test_the_report_knows_the_size_of_the_pool_asyncio_made_for_the_tools(hooked, spans, tmp_path, capsys):
    from frameworks.langchain_scripted import fetch_page, react_graph, three_page_turns
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    from agent_otel.commands.cli import main

    traces = tmp_path / "traces.jsonl"
    hooked("langchain", traces_file=str(traces))
    graph = react_graph([fetch_page], three_page_turns(), asynchronous=True)

    # A plain asyncio.run: the loop creates its default executor when
    # LangChain hands it the first sync tool.
    state = asyncio.run(graph.ainvoke({"messages": [HumanMessage("fetch")]}))
    agent_otel.uninstrument()  # flushes the traces file

    assert state["messages"][-1].content == "all fetched"
    for span in spans.tools("fetch_page"):
        assert span.attributes["agent.tool.executor"] == "asyncio-default"
        assert span.attributes["agent.executor.max_workers"] == ASYNCIO_DEFAULT_WORKERS
    assert main(["report", str(traces), "--format", "json"]) == 0
    (executor,) = json.loads(capsys.readouterr().out)["executors"]
    assert (executor["executor"], executor["max_workers"]) == ("asyncio-default", ASYNCIO_DEFAULT_WORKERS)


def test_uninstrument_restores_langchain_exactly(spans):
    from frameworks.langchain_scripted import fetch_page
    from langchain_core.tools import BaseTool, StructuredTool, Tool
    from langchain_core.tracers import context

    from langgraph.pregel import Pregel

    hooked_points = [
        (BaseTool, "run"),
        (BaseTool, "arun"),
        (StructuredTool, "ainvoke"),
        (Tool, "ainvoke"),
        (Pregel, "stream"),
        (Pregel, "astream"),
    ]
    before = [vars(owner)[name] for owner, name in hooked_points]
    configure_hooks_before = list(context._configure_hooks)
    run_in_executor_before = vars(asyncio.BaseEventLoop)["run_in_executor"]
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["langchain"])
    assert vars(BaseTool)["run"] is not before[0]
    agent_otel.uninstrument()

    assert all(vars(owner)[name] is original for (owner, name), original in zip(hooked_points, before))
    assert vars(asyncio.BaseEventLoop)["run_in_executor"] is run_in_executor_before
    from langgraph.pregel import _executor
    from langgraph.prebuilt import tool_node
    from langchain_core.runnables.config import get_executor_for_config

    assert _executor.get_executor_for_config is get_executor_for_config
    assert tool_node.get_executor_for_config is get_executor_for_config
    assert context._configure_hooks == configure_hooks_before  # the model-call handler is gone
    fetch_page.invoke({"url": "z"})
    assert spans.tools() == []


def test_each_model_call_of_a_langgraph_agent_is_a_model_span(hooked, spans):
    from frameworks.langchain_scripted import fetch_page, react_graph, three_page_turns
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    hooked("langchain")
    graph = react_graph([fetch_page], three_page_turns())

    graph.invoke({"messages": [HumanMessage("fetch three pages")]})

    calls = spans.models("FakeMessagesListChatModel")
    assert len(calls) == 2  # asked for the tools, then answered
    for span in calls:
        assert span.name == "chat FakeMessagesListChatModel"
        assert span.attributes["gen_ai.operation.name"] == "chat"
    first_answer_end = min(s.end_time for s in calls)
    assert all(first_answer_end <= tool.start_time for tool in spans.tools("fetch_page"))


def test_a_streamed_chat_model_call_has_usage_and_time_to_first_chunk(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, AIMessageChunk
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

    class SlowModel(BaseChatModel):
        """Answers in three chunks after a first-token delay, reporting its usage like providers do."""

        @property
        def _llm_type(self) -> str:
            return "slow"

        def _get_ls_params(self, stop=None, **kwargs):
            return {"ls_provider": "acme", "ls_model_name": "acme-large", "ls_model_type": "chat"}

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            message = AIMessage("a b c", usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10})
            return ChatResult(generations=[ChatGeneration(message=message)])

        def _stream(self, messages, stop=None, run_manager=None, **kwargs):
            time.sleep(SLEEP_S)
            for i, word in enumerate(["a ", "b ", "c"]):
                usage = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10} if i == 2 else None
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=word, usage_metadata=usage))
                if run_manager:
                    run_manager.on_llm_new_token(word, chunk=chunk)
                yield chunk
                time.sleep(0.05)

    hooked("langchain")
    model = SlowModel()

    assert "".join(chunk.content for chunk in model.stream("hi")) == "a b c"
    assert model.invoke("hi").content == "a b c"

    streamed, invoked = sorted(spans.models("acme-large"), key=lambda s: s.start_time)
    for span in (streamed, invoked):
        assert span.name == "chat acme-large"
        assert span.attributes["gen_ai.provider.name"] == "acme"
        assert span.attributes["gen_ai.usage.input_tokens"] == 7
        assert span.attributes["gen_ai.usage.output_tokens"] == 3
    assert SLEEP_S * 0.95 <= streamed.attributes["gen_ai.response.time_to_first_chunk"] < SLEEP_S + 2.0
    assert "gen_ai.response.time_to_first_chunk" not in invoked.attributes


def test_with_model_spans_off_no_model_call_is_recorded(hooked, spans):
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    hooked("langchain", model_spans="off")

    assert FakeMessagesListChatModel(responses=[AIMessage("ok")]).invoke("hi").content == "ok"
    assert spans.models() == []


def test_only_model_runs_carry_the_model_call_handler(hooked, spans):
    """Tool and chain runs pay nothing for model spans: their callback managers never hold the handler."""
    from frameworks.langchain_scripted import handler_probe
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda

    class Probe(FakeMessagesListChatModel):
        """Notes the handlers of each model run it serves."""

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            seen.append(("model", _handler_names(run_manager.handlers)))
            return super()._generate(messages, stop, run_manager, **kwargs)

    def _handler_names(handlers) -> list[str]:
        return [type(handler).__name__ for handler in handlers]

    def chain_step(x: int, config) -> int:
        seen.append(("chain", _handler_names(config["callbacks"].handlers)))
        return x

    seen: list[tuple[str, list[str]]] = []
    probe = handler_probe(seen)
    hooked("langchain")
    model = Probe(responses=[AIMessage("one"), AIMessage("two")])

    assert probe.invoke({"x": 1}) == 1
    assert RunnableLambda(chain_step).invoke(2) == 2
    assert model.invoke("hi").content == "one"
    assert asyncio.run(model.ainvoke("hi")).content == "two"

    assert seen == [("tool", []), ("chain", []), ("model", ["ModelCalls"]), ("model", ["ModelCalls"])]
    assert len(spans.models("Probe")) == 2
    assert len(spans.tools("probe")) == 1


def test_an_async_stream_is_one_model_span_and_the_consumer_runs_without_the_handler(hooked, spans):
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tracers import context

    hooked("langchain")
    model = GenericFakeChatModel(messages=iter([AIMessage("a b c")]))
    hook_vars = [hook[0] for hook in context._configure_hooks]

    async def consume() -> list[str]:
        chunks = []
        async for chunk in model.astream("hi"):
            # Between chunks, the consumer's code: a run it started here would not get the handler.
            assert all(var.get() is None for var in hook_vars)
            chunks.append(chunk.content)
        return chunks

    assert "".join(asyncio.run(consume())) == "a b c"
    (span,) = spans.models("GenericFakeChatModel")
    assert span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.response.time_to_first_chunk"] >= 0


def test_a_tool_run_inside_a_sync_tool_handed_to_the_executor_has_its_own_span(hooked, spans):
    from frameworks.langchain_scripted import SLEEP_S, fetch_page, tool_call
    from langchain_core.tools import tool

    @tool
    def summarize(url: str) -> str:
        """Fetch a page and summarize it."""
        return fetch_page.invoke({"url": url})[:6]

    hooked("langchain")

    assert asyncio.run(summarize.ainvoke(tool_call("summarize", {"url": "a"}, "s1"))).content == "<html>"

    (outer,) = spans.tools("summarize")
    (inner,) = spans.tools("fetch_page")
    assert outer.attributes["agent.tool.executor"] == "asyncio-default"
    assert inner.parent.span_id == outer.context.span_id
    assert timing(inner)[1] >= SLEEP_S * 0.95


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_langgraph_agent_records_arguments_and_results_through_redact(hooked, spans, asynchronous):
    from frameworks.langchain_scripted import react_graph, tool_call
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    require_framework("langchain", "langgraph")

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    def redact(attribute: str, text: str) -> str:
        return text.replace("sk-7f3a", "[redacted]")

    hooked("langchain", record_arguments=True, record_results=True, redact=redact)
    turns = [AIMessage("", tool_calls=[tool_call("lookup", {"key": "sk-7f3a"}, "k1")]), AIMessage("done")]
    graph = react_graph([lookup], turns, asynchronous=asynchronous)
    request = {"messages": [HumanMessage("look it up")]}

    state = asyncio.run(graph.ainvoke(request)) if asynchronous else graph.invoke(request)

    assert state["messages"][-1].content == "done"
    assert state["messages"][-2].content == "value of sk-7f3a"  # the agent's data is untouched
    (span,) = spans.tools("lookup")
    assert span.attributes["gen_ai.tool.call.id"] == "k1"
    assert span.attributes["gen_ai.tool.call.arguments"] == "{'key': '[redacted]'}"  # the call's args, not the ToolCall
    assert span.attributes["gen_ai.tool.call.result"] == "value of [redacted]"  # the ToolMessage's content


def test_short_sync_tools_handed_to_the_executor_are_sampled_as_any_tool(hooked, spans):
    # The worker's CPU clock is read on the calls the sampling rule picks
    # (docs/telemetry.md, agent.tool.exec.cpu_time): every call while calls
    # are long, one in 16 of short ones, the next after an unmeasured long one.
    from frameworks.langchain_scripted import tool_call
    from langchain_core.tools import tool

    @tool
    def quick(seconds: float) -> int:
        """Return at once, or after sleeping."""
        if seconds:
            time.sleep(seconds)
        return 1

    hooked("langchain")

    def short_calls():
        return sum(span.attributes["agent.tool.exec.duration"] < 1e-3 for span in spans.tools("quick"))

    async def run():
        # On a busy machine a call that returns at once can still take over a
        # millisecond on the worker: call until 16 were short (at most 400).
        made = 0
        while made < 40 or (short_calls() < 16 and made < 400):
            await quick.ainvoke(tool_call("quick", {"seconds": 0.0}, f"q{made}"))
            made += 1
        for index, seconds in enumerate((0.005, 0.0, 0.005, 0.005, 0.005)):
            await quick.ainvoke(tool_call("quick", {"seconds": seconds}, f"l{index}"))
        return made

    made = asyncio.run(run())
    order = [f"q{index}" for index in range(made)] + [f"l{index}" for index in range(5)]
    calls = sorted(
        (dict(span.attributes) for span in spans.tools("quick")),
        key=lambda attributes: order.index(attributes["gen_ai.tool.call.id"]),
    )
    assert all(attributes["agent.tool.executor"] == "asyncio-default" for attributes in calls)
    expected, skip = [], 0
    for attributes in calls:
        expected.append(skip == 0)
        short = attributes["agent.tool.exec.duration"] < 1e-3
        if skip == 0:
            skip = 15 if short else 0
        else:
            skip = skip - 1 if short else 0
    assert ["agent.tool.exec.cpu_time" in attributes for attributes in calls] == expected
    assert 3 <= sum(expected[:made]) < made  # the short ones were sampled
    assert expected[-2:] == [True, True]  # long ones after a long one: all measured


def test_sync_tools_handed_to_the_executor_record_the_workers_cpu_time(hooked, spans):
    from frameworks.langchain_scripted import fetch_page, tool_call
    from langchain_core.tools import tool

    @tool
    def crunch(n: int) -> int:
        """Spin on the CPU for 0.1 s of CPU time."""
        start = time.thread_time()
        while time.thread_time() - start < 0.1:
            pass
        return n

    hooked("langchain")

    async def run():
        await crunch.ainvoke(tool_call("crunch", {"n": 1}, "c1"))  # StructuredTool.ainvoke with no coroutine
        await fetch_page.arun({"url": "a"})  # BaseTool.arun: _run on the default executor

    asyncio.run(run())

    (crunched,) = spans.tools("crunch")
    (fetched,) = spans.tools("fetch_page")
    for span in (crunched, fetched):
        assert span.attributes["agent.tool.executor"] == "asyncio-default"
        assert span.attributes["agent.tool.exec.cpu_time"] <= timing(span)[1] + 1e-3
    assert crunched.attributes["agent.tool.exec.cpu_time"] >= 0.1
    assert fetched.attributes["agent.tool.exec.cpu_time"] < 0.05  # it sleeps


MODEL_S = 0.1  # what each call of the scripted model takes


def _one_fetch(graph_name="support"):
    from frameworks.langchain_scripted import fetch_page, react_agent, tool_call
    from langchain_core.messages import AIMessage

    turns = [AIMessage("", tool_calls=[tool_call("fetch_page", {"url": "a.example"}, "t1")]), AIMessage("fetched")]
    return react_agent([fetch_page], turns, model_sleep_s=MODEL_S, name=graph_name)


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "stream", "astream"])
def test_one_run_of_a_graph_is_one_turn_with_instrument_alone(hooked, spans, tmp_path, how):
    from frameworks.langchain_scripted import SLEEP_S
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    traces = tmp_path / "traces.jsonl"
    hooked("langchain", traces_file=str(traces))
    graph = _one_fetch()
    question = {"messages": [HumanMessage("fetch a page")]}

    async def consume():
        return [chunk async for chunk in graph.astream(question, stream_mode="values")][-1]

    if how == "invoke":
        state = graph.invoke(question)
    elif how == "ainvoke":
        state = asyncio.run(graph.ainvoke(question))
    elif how == "stream":
        state = list(graph.stream(question, stream_mode="values"))[-1]
    else:
        state = asyncio.run(consume())
    agent_otel.uninstrument()  # flushes the traces file

    assert state["messages"][-1].content == "fetched"
    report = report_json(traces)
    assert_one_turn_as_engineered(report, spans, "support", model_calls=2, tool_calls=1)
    (turn,) = report["turns"]["slowest"]
    assert turn["model_s"] >= 2 * MODEL_S * 0.95
    assert turn["tool_exec_s"] >= SLEEP_S * 0.95


def test_the_applications_own_agent_span_is_the_turn(hooked, spans):
    from langchain_core.messages import HumanMessage

    require_framework("langchain", "langgraph")
    hooked("langchain")
    with agent_otel.agent_span("my-agent"):
        _one_fetch().invoke({"messages": [HumanMessage("fetch a page")]})

    (run,) = spans.runs()
    assert run.name == "invoke_agent my-agent"
    for span in spans.models() + spans.tools():
        assert span.parent.span_id == run.context.span_id


def test_a_graph_run_inside_a_tool_call_nests_in_it(hooked, spans, tmp_path):
    from frameworks.langchain_scripted import react_agent, tool_call
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    require_framework("langchain", "langgraph")
    traces = tmp_path / "traces.jsonl"
    hooked("langchain", traces_file=str(traces))
    researcher = _one_fetch("researcher")

    @tool
    def research(topic: str) -> str:
        """Ask the research agent."""
        return researcher.invoke({"messages": [HumanMessage(topic)]})["messages"][-1].content

    turns = [AIMessage("", tool_calls=[tool_call("research", {"topic": "x"}, "r1")]), AIMessage("done")]
    react_agent([research], turns, name="lead").invoke({"messages": [HumanMessage("go")]})
    agent_otel.uninstrument()

    runs = {span.attributes["gen_ai.agent.name"]: span for span in spans.runs()}
    assert sorted(runs) == ["lead", "researcher"]
    (research_span,) = spans.tools("research")
    assert research_span.parent.span_id == runs["lead"].context.span_id
    assert runs["researcher"].parent.span_id == research_span.context.span_id
    turns_found = report_json(traces)["turns"]
    assert (turns_found["count"], turns_found["slowest"][0]["name"]) == (1, "lead")  # the sub-agent is part of it


@pytest.mark.parametrize("answer", ["text", "tool call"])
@pytest.mark.parametrize("api", ["chat completions", "responses"])
def test_time_to_first_token_of_a_streamed_chat_model_call_is_its_first_output(hooked, spans, api, answer):
    """ChatOpenAI against a local OpenAI-compatible server that sends the
    chunks without output at once (the role, an empty content; the Responses
    API's events before the output, the function call's item naming the
    tool) and the first token (text, or the call's arguments) 150 ms in."""
    from frameworks.fake_openai import FIRST_TOKEN_S, MODEL, serve
    from frameworks.langchain_scripted import fetch_page

    require_framework("langchain", "langchain_openai")
    from langchain_openai import ChatOpenAI

    hooked("langchain")
    tool_call = ("fetch_page", '{"url": "a.example"}') if answer == "tool call" else None
    with serve(tool_call=tool_call) as url:
        model = ChatOpenAI(
            model=MODEL, base_url=url, api_key="test", max_retries=0, use_responses_api=api == "responses"
        )
        if tool_call:
            model = model.bind_tools([fetch_page])
        chunks = list(model.stream("fetch a page"))

    reply = chunks[0]
    for chunk in chunks[1:]:
        reply = reply + chunk
    if tool_call:
        assert reply.tool_calls[0]["name"] == "fetch_page"
    else:
        assert reply.text == "Hello there"
    (span,) = spans.models(MODEL)
    first_token_s = span.attributes["gen_ai.response.time_to_first_chunk"]
    duration_s = (span.end_time - span.start_time) / 1e9
    assert first_token_s >= FIRST_TOKEN_S * 0.95  # not the chunks before it
    assert first_token_s < duration_s
