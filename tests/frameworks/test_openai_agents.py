"""OpenAI Agents SDK function tools traced with no change beyond ``instrument()``.

The agent runs against a scripted ``Model`` (no network): its first turn
asks for four tool calls at once, its second answers.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from frameworks.framework_support import (
    ASYNCIO_DEFAULT_WORKERS,
    assert_one_turn_as_engineered,
    assert_queued_one_after_another,
    framework_fixture,
    report_json,
    timing,
)

import agent_otel

framework = framework_fixture("openai_agents", "agents")


def test_agent_tool_calls_become_spans_with_call_ids_and_queue_time(hooked, spans):
    from frameworks.openai_agents_scripted import SLEEP_S, answer, call, run_agent

    hooked("openai_agents")

    result = run_agent(
        [
            [
                call("fetch_page", {"url": "a"}, "call_a"),
                call("fetch_page", {"url": "b"}, "call_b"),
                call("ask_database", {"query": "orders"}, "call_q"),
            ],
            [answer("done")],
        ]
    )

    assert result.final_output == "done"
    pages = spans.tools("fetch_page")
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in pages) == ["call_a", "call_b"]
    assert pages[0].attributes["gen_ai.tool.description"] == "Download a page (slowly)."
    # The SDK runs sync function tools with asyncio.to_thread: one worker, so one waits.
    assert_queued_one_after_another(pages, SLEEP_S)
    (query,) = spans.tools("ask_database")
    queue_s, exec_s = timing(query)
    assert query.attributes["gen_ai.tool.call.id"] == "call_q"
    assert query.attributes["agent.tool.executor"] == "direct"
    assert queue_s == 0.0 and exec_s >= SLEEP_S * 0.95


def test_sync_tools_on_the_loops_own_default_executor_carry_its_size(hooked, spans):
    from frameworks.openai_agents_scripted import SLEEP_S, Agent, Runner, ScriptedModel, answer, call, fetch_page

    hooked("openai_agents")
    agent = Agent(
        name="support",
        tools=[fetch_page],
        model=ScriptedModel(
            [[call("fetch_page", {"url": "a"}, "call_a"), call("fetch_page", {"url": "b"}, "call_b")], [answer("ok")]]
        ),
    )

    assert asyncio.run(Runner.run(agent, "help me")).final_output == "ok"  # the SDK's asyncio.to_thread

    pages = spans.tools("fetch_page")
    assert len(pages) == 2
    for span in pages:
        assert span.attributes["agent.tool.executor"] == "asyncio-default"
        assert span.attributes["agent.executor.max_workers"] == ASYNCIO_DEFAULT_WORKERS
        assert timing(span)[1] >= SLEEP_S * 0.95


def test_an_error_the_sdk_reports_to_the_model_is_recorded_on_the_span(hooked, spans):
    from frameworks.openai_agents_scripted import answer, call, run_agent

    hooked("openai_agents")

    result = run_agent([[call("charge_card", {"amount": 5}, "call_c")], [answer("sorry")]])

    assert result.final_output == "sorry"
    tool_output = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert "error occurred" in str(tool_output[0].output)  # the model saw the SDK's message
    (span,) = spans.tools("charge_card")
    assert span.attributes["gen_ai.tool.call.id"] == "call_c"
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "PermissionError"
    assert span.events[-1].name == "exception"


def test_a_function_tool_also_decorated_with_agent_otel_tool_has_one_span(hooked, spans):
    from frameworks.openai_agents_scripted import Agent, Runner, ScriptedModel, answer, call, function_tool

    hooked("openai_agents")

    @function_tool
    @agent_otel.tool
    def convert(amount: int) -> int:
        """Convert a currency."""
        return amount * 2

    agent = Agent(
        name="fx", tools=[convert], model=ScriptedModel([[call("convert", {"amount": 21}, "call_x")], [answer("42")]])
    )
    assert asyncio.run(Runner.run(agent, "convert")).final_output == "42"
    (span,) = spans.tools("convert")
    assert span.attributes["gen_ai.tool.call.id"] == "call_x"
    assert span.attributes["agent.tool.executor"] == "asyncio-default"


def test_each_model_call_of_the_run_is_a_model_span_with_its_usage(hooked, spans):
    from frameworks.openai_agents_scripted import Agent, Runner, ScriptedModel, Usage, answer, ask_database, call

    hooked("openai_agents")

    class MeteredModel(ScriptedModel):
        async def get_response(self, *args, **kwargs):
            await asyncio.sleep(0.05)
            response = await super().get_response(*args, **kwargs)
            response.usage = Usage(requests=1, input_tokens=40, output_tokens=5, total_tokens=45)
            return response

    agent = Agent(
        name="support",
        tools=[ask_database],
        model=MeteredModel([[call("ask_database", {"query": "orders"}, "call_q")], [answer("done")]]),
    )

    assert asyncio.run(Runner.run(agent, "help me")).final_output == "done"

    calls = sorted(spans.models("MeteredModel"), key=lambda s: s.start_time)
    assert len(calls) == 2
    for span in calls:
        assert span.name == "chat MeteredModel"
        assert span.attributes["gen_ai.usage.input_tokens"] == 40
        assert span.attributes["gen_ai.usage.output_tokens"] == 5
        assert (span.end_time - span.start_time) / 1e9 >= 0.05 * 0.95
    (tool,) = spans.tools("ask_database")
    assert calls[0].end_time <= tool.start_time and tool.end_time <= calls[1].start_time


def test_a_model_that_reports_no_usage_gets_none_recorded(hooked, spans):
    from frameworks.openai_agents_scripted import Agent, Runner, ScriptedModel, answer

    hooked("openai_agents")
    agent = Agent(name="support", tools=[], model=ScriptedModel([[answer("hi")]]))

    assert asyncio.run(Runner.run(agent, "hello")).final_output == "hi"

    (span,) = spans.models("ScriptedModel")
    assert "gen_ai.usage.input_tokens" not in span.attributes


def test_a_streamed_model_call_has_time_to_first_chunk_and_the_completed_responses_usage(hooked, spans):
    from openai.types.responses import Response, ResponseCompletedEvent, ResponseTextDeltaEvent
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails, ResponseUsage
    from frameworks.openai_agents_scripted import SLEEP_S, Agent, Runner, ScriptedModel, answer

    class StreamingModel(ScriptedModel):
        """Streams one text delta after a first-token delay, then the completed response with its usage."""

        async def stream_response(self, *args, **kwargs):
            await asyncio.sleep(SLEEP_S)
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta",
                content_index=0,
                delta="done",
                item_id="msg",
                output_index=0,
                sequence_number=1,
                logprobs=[],
            )
            await asyncio.sleep(0.05)
            usage = ResponseUsage.model_construct(
                input_tokens=40,
                output_tokens=5,
                total_tokens=45,
                input_tokens_details=InputTokensDetails.model_construct(cached_tokens=0),
                output_tokens_details=OutputTokensDetails.model_construct(reasoning_tokens=0),
            )
            response = Response.model_construct(
                id="resp_1",
                created_at=0.0,
                model="scripted-4o-2026",
                object="response",
                output=self.turns.pop(0),
                parallel_tool_calls=False,
                tool_choice="auto",
                tools=[],
                usage=usage,
            )
            yield ResponseCompletedEvent(type="response.completed", response=response, sequence_number=2)

    hooked("openai_agents")
    agent = Agent(name="support", tools=[], model=StreamingModel([[answer("done")]]))

    async def run() -> str:
        result = Runner.run_streamed(agent, "help me")
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run()) == "done"

    (span,) = spans.models("StreamingModel")
    assert span.name == "chat StreamingModel"
    assert span.attributes["gen_ai.usage.input_tokens"] == 40
    assert span.attributes["gen_ai.usage.output_tokens"] == 5
    assert span.attributes["gen_ai.response.model"] == "scripted-4o-2026"
    assert SLEEP_S * 0.95 <= span.attributes["gen_ai.response.time_to_first_chunk"] < SLEEP_S + 2.0
    assert (span.end_time - span.start_time) / 1e9 >= SLEEP_S + 0.05 * 0.95


MODEL_S = 0.1  # what each call of the scripted model takes


def test_one_run_of_the_runner_is_one_turn_with_instrument_alone(hooked, spans, tmp_path):
    from frameworks.openai_agents_scripted import SLEEP_S, Agent, Runner, ScriptedModel, answer, call, fetch_page

    traces = tmp_path / "traces.jsonl"
    hooked("openai_agents", traces_file=str(traces))
    model = ScriptedModel([[call("fetch_page", {"url": "a"}, "call_a")], [answer("done")]], delay_s=MODEL_S)
    agent = Agent(name="support", tools=[fetch_page], model=model)

    result = Runner.run_sync(agent, "help me")
    agent_otel.uninstrument()  # flushes the traces file

    assert result.final_output == "done"
    report = report_json(traces)
    assert_one_turn_as_engineered(report, spans, "support", model_calls=2, tool_calls=1)
    (turn,) = report["turns"]["slowest"]
    assert turn["model_s"] >= 2 * MODEL_S * 0.95
    assert turn["tool_exec_s"] >= SLEEP_S * 0.95


def test_a_run_in_the_applications_agent_span_is_that_span_and_a_sub_agent_run_nests(hooked, spans):
    from frameworks.openai_agents_scripted import Agent, Runner, ScriptedModel, answer, call

    hooked("openai_agents")
    researcher = Agent(name="researcher", model=ScriptedModel([[answer("found it")]]))
    lead = Agent(
        name="lead",
        tools=[researcher.as_tool(tool_name="research", tool_description="Ask the researcher.")],
        model=ScriptedModel([[call("research", {"input": "x"}, "call_r")], [answer("done")]]),
    )

    async def main():
        with agent_otel.agent_span("my-app"):
            return await Runner.run(lead, "go")

    assert asyncio.run(main()).final_output == "done"

    runs = {span.name: span for span in spans.runs()}
    assert sorted(runs) == ["invoke_agent my-app", "invoke_agent researcher"]  # the app's span is the lead's run
    (research,) = spans.tools("research")
    assert research.parent.span_id == runs["invoke_agent my-app"].context.span_id
    assert runs["invoke_agent researcher"].parent.span_id == research.context.span_id


@pytest.mark.parametrize("answer", ["text", "tool call"])
@pytest.mark.parametrize("api", ["responses", "chat completions"])
def test_time_to_first_token_of_a_streamed_model_call_is_its_first_output(hooked, spans, api, answer):
    """The SDK's OpenAI models against a local OpenAI-compatible server that
    sends the events without output at once and the first token 150 ms in."""
    import frameworks.openai_agents_scripted  # noqa: F401  # turns the SDK's own tracing off
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner
    from frameworks.fake_openai import FIRST_TOKEN_S, MODEL, USAGE, serve
    from frameworks.openai_agents_scripted import ask_database
    from openai import AsyncOpenAI

    hooked("openai_agents")
    tool_call = ("ask_database", '{"query": "orders"}') if answer == "tool call" else None
    with serve(tool_call=tool_call) as url:
        client = AsyncOpenAI(base_url=url, api_key="test", max_retries=0)
        model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(
            name="support",
            model=model_class(model=MODEL, openai_client=client),
            tools=[ask_database],
            tool_use_behavior="stop_on_first_tool",
        )

        async def main():
            result = Runner.run_streamed(agent, "help me")
            async for _event in result.stream_events():
                pass
            return result.final_output

        output = asyncio.run(main())

    assert output == ("rows for orders" if tool_call else "Hello there")
    (span,) = spans.models(MODEL)
    first_token_s = span.attributes["gen_ai.response.time_to_first_chunk"]
    duration_s = (span.end_time - span.start_time) / 1e9
    assert first_token_s >= FIRST_TOKEN_S * 0.95  # not the events before it
    assert first_token_s < duration_s
    if api == "responses":  # the SDK reads usage from response.completed
        assert span.attributes["gen_ai.usage.input_tokens"] == USAGE["input_tokens"]
    (run,) = spans.runs()  # run_streamed is a run too, until its loop ends
    assert run.name == "invoke_agent support" and run.end_time >= span.end_time


def test_a_model_call_that_blocks_the_event_loop_shows_that_time_as_client_cpu(hooked, spans, tmp_path):
    """A model whose client holds the event loop for 300 ms (as the openai
    client building its schemas on a process's first call does) before the
    answer's 200 ms: the turn shows the 300 ms as client CPU, not model time."""
    from frameworks.openai_agents_scripted import Agent, Runner, ScriptedModel, answer

    class ColdModel(ScriptedModel):
        async def get_response(self, *args, **kwargs):
            time.sleep(0.3)  # the client's own work, on the loop's thread
            return await super().get_response(*args, **kwargs)

    traces = tmp_path / "traces.jsonl"
    hooked("openai_agents", traces_file=str(traces), loop_monitor=True, loop_block_threshold=0.1)
    agent = Agent(name="support", model=ColdModel([[answer("done")]], delay_s=0.2))

    assert Runner.run_sync(agent, "help me").final_output == "done"
    agent_otel.uninstrument()  # flushes the traces file

    (model,) = spans.models()
    model_call_s = (model.end_time - model.start_time) / 1e9
    blocks = [
        s
        for s in spans.all()
        if s.name == "asyncio.loop.blocked" and model.context.span_id in [link.context.span_id for link in s.links]
    ]
    assert blocks  # the call waited on the blocked loop
    blocked_s = sum((s.end_time - s.start_time) / 1e9 for s in blocks)
    (turn,) = report_json(traces)["turns"]["slowest"]
    # the block is seen from the heartbeat it missed: up to threshold / 2 after it began
    assert 0.3 - 0.05 - 0.02 <= turn["client_cpu_s"] <= blocked_s + 1e-5
    assert turn["client_cpu_s"] + turn["model_s"] == pytest.approx(model_call_s, abs=1e-5)
