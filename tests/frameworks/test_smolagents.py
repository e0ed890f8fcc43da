"""smolagents tools traced with no change beyond ``instrument()``.

The ``ToolCallingAgent`` runs against a scripted model (no network,
smolagents_scripted.py): its
first step asks for three page fetches at once, its second for the final
answer.
"""

from __future__ import annotations

import logging
import time

import pytest
from frameworks.framework_support import by_exec_start, framework_fixture, least_wait_s, timing

import agent_otel

framework = framework_fixture("smolagents", "smolagents")


def test_parallel_tool_calls_queue_for_the_agents_tool_threads(hooked, spans):
    from frameworks.smolagents_scripted import SLEEP_S, ScriptedModel, call, fetch_page
    from smolagents import ToolCallingAgent

    hooked("smolagents")
    model = ScriptedModel(
        [
            [call("fetch_page", {"url": str(i)}, f"c{i}") for i in range(3)],
            [call("final_answer", {"answer": "fetched"}, "c3")],
        ]
    )
    agent = ToolCallingAgent(tools=[fetch_page], model=model, max_tool_threads=1, verbosity_level=0)

    assert agent.run("fetch three pages") == "fetched"

    pages = by_exec_start(spans.tools("fetch_page"))
    assert len(pages) == 3
    for position, span in enumerate(pages):
        queue_s, exec_s = timing(span)
        assert exec_s >= SLEEP_S * 0.95
        assert queue_s >= least_wait_s(pages, span, position, SLEEP_S)
        assert span.attributes["agent.tool.executor"].startswith("ThreadPoolExecutor")
        assert span.attributes["gen_ai.tool.description"].startswith("Download a page (slowly).")
    (final,) = spans.tools("final_answer")
    assert final.attributes["agent.tool.executor"] == "direct"


def test_a_failing_tool_records_the_error_and_raises_it_unchanged(hooked, spans):
    from smolagents.tools import Tool

    hooked("smolagents")
    failure = PermissionError("robots.txt forbids it")

    class Crawl(Tool):
        name = "crawl"
        description = "Crawl a site."
        inputs = {"url": {"type": "string", "description": "the site"}}
        output_type = "string"

        def forward(self, url: str) -> str:
            raise failure

    with pytest.raises(PermissionError) as raised:
        Crawl()(url="x")

    assert raised.value is failure
    (span,) = spans.tools("crawl")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert span.attributes["error.type"] == "PermissionError"


def test_a_version_the_hook_does_not_understand_is_skipped_with_one_warning(spans, monkeypatch, caplog):
    from frameworks.smolagents_scripted import fetch_page
    from smolagents import agents as smolagents_agents
    from smolagents.tools import Tool

    original_call = vars(Tool)["__call__"]
    monkeypatch.delattr(smolagents_agents, "ThreadPoolExecutor")  # as if a release had renamed it

    with caplog.at_level(logging.WARNING, logger="agent_otel.capture.frameworks"):
        agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["smolagents"])
        try:
            hooked_now = agent_otel.capture.frameworks.hooked()
            assert fetch_page(url="a") == "<html>a</html>"
        finally:
            agent_otel.uninstrument()

    assert hooked_now == []
    assert vars(Tool)["__call__"] is original_call  # the part hooked before the failure was undone
    assert spans.tools() == []
    assert len([r for r in caplog.records if "smolagents" in r.getMessage()]) == 1


def test_each_model_call_of_the_agent_is_a_model_span(hooked, spans):
    from frameworks.smolagents_scripted import ScriptedModel, call, fetch_page
    from smolagents import ToolCallingAgent
    from smolagents.monitoring import TokenUsage

    class MeteredModel(ScriptedModel):
        def generate(self, *args, **kwargs):
            time.sleep(0.05)
            message = super().generate(*args, **kwargs)  # one call, though two generate methods run
            message.token_usage = TokenUsage(input_tokens=30, output_tokens=4)
            return message

    hooked("smolagents")
    model = MeteredModel([[call("fetch_page", {"url": "a"}, "c0")], [call("final_answer", {"answer": "ok"}, "c1")]])
    agent = ToolCallingAgent(tools=[fetch_page], model=model, verbosity_level=0)

    assert agent.run("fetch a page") == "ok"

    calls = sorted(spans.models("scripted"), key=lambda s: s.start_time)
    assert len(calls) == 2
    for span in calls:
        assert span.name == "chat scripted"
        assert span.attributes["gen_ai.usage.input_tokens"] == 30
        assert span.attributes["gen_ai.usage.output_tokens"] == 4
        assert (span.end_time - span.start_time) / 1e9 >= 0.05 * 0.95
    (tool,) = spans.tools("fetch_page")
    assert calls[0].end_time <= tool.start_time and tool.end_time <= calls[1].start_time


def test_uninstrument_restores_every_model_class(spans):
    from frameworks.smolagents_scripted import ScriptedModel, call
    from smolagents.models import Model

    generate_before = vars(ScriptedModel)["generate"]
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["smolagents"])

    class LaterModel(ScriptedModel):  # defined while hooked
        def generate(self, *args, **kwargs):
            return super().generate(*args, **kwargs)

    later_generate = vars(LaterModel)["generate"]
    assert vars(ScriptedModel)["generate"] is not generate_before
    agent_otel.uninstrument()

    assert vars(ScriptedModel)["generate"] is generate_before
    assert "__init_subclass__" not in vars(Model)
    assert vars(LaterModel)["generate"] is not later_generate  # unwrapped too
    LaterModel([[call("final_answer", {"answer": "ok"}, "c0")]]).generate([])
    assert spans.models() == []


def test_a_streamed_model_call_has_time_to_first_chunk_and_the_summed_usage(hooked, spans):
    from frameworks.smolagents_scripted import SLEEP_S
    from smolagents.models import ChatMessageStreamDelta, Model
    from smolagents.monitoring import TokenUsage

    class StreamingModel(Model):
        """Streams two deltas after a first-token delay; each reports its share of the usage."""

        def __init__(self):
            super().__init__(model_id="streamer")

        def generate(self, messages, **kwargs):
            raise NotImplementedError

        def generate_stream(self, messages, **kwargs):
            time.sleep(SLEEP_S)
            for i, word in enumerate(["a ", "b"]):
                yield ChatMessageStreamDelta(
                    content=word, token_usage=TokenUsage(input_tokens=7 - 7 * i, output_tokens=1)
                )
                time.sleep(0.05)

    hooked("smolagents")

    assert "".join(delta.content for delta in StreamingModel().generate_stream([])) == "a b"

    (span,) = spans.models("streamer")
    assert span.name == "chat streamer"
    assert span.attributes["gen_ai.usage.input_tokens"] == 7
    assert span.attributes["gen_ai.usage.output_tokens"] == 2
    assert SLEEP_S * 0.95 <= span.attributes["gen_ai.response.time_to_first_chunk"] < SLEEP_S + 2.0
    assert (span.end_time - span.start_time) / 1e9 >= SLEEP_S + 0.1 * 0.95  # until the last delta was consumed


MODEL_S = 0.1  # what each call of the scripted model takes


@pytest.mark.parametrize("stream", [False, True])
def test_one_run_of_an_agent_is_one_turn_with_instrument_alone(hooked, spans, tmp_path, stream):
    from frameworks.framework_support import assert_one_turn_as_engineered, report_json
    from frameworks.smolagents_scripted import SLEEP_S, ScriptedModel, call, fetch_page
    from smolagents import ToolCallingAgent

    class SlowModel(ScriptedModel):
        def generate(self, *args, **kwargs):
            time.sleep(MODEL_S)
            return super().generate(*args, **kwargs)

    traces = tmp_path / "traces.jsonl"
    hooked("smolagents", traces_file=str(traces))
    model = SlowModel([[call("fetch_page", {"url": "a"}, "c0")], [call("final_answer", {"answer": "ok"}, "c1")]])
    agent = ToolCallingAgent(tools=[fetch_page], model=model, verbosity_level=0, name="support")

    if stream:
        steps = list(agent.run("fetch a page", stream=True))
        assert steps[-1].output == "ok"
    else:
        assert agent.run("fetch a page") == "ok"
    agent_otel.uninstrument()  # flushes the traces file

    report = report_json(traces)
    # final_answer is a tool too: two tool calls
    assert_one_turn_as_engineered(report, spans, "support", model_calls=2, tool_calls=2)
    (turn,) = report["turns"]["slowest"]
    assert turn["model_s"] >= 2 * MODEL_S * 0.95
    assert turn["tool_exec_s"] >= SLEEP_S * 0.95


def test_a_managed_agents_run_nests_in_its_managers(hooked, spans):
    from frameworks.smolagents_scripted import ScriptedModel, call
    from smolagents import ToolCallingAgent

    hooked("smolagents")
    helper = ToolCallingAgent(
        tools=[],
        model=ScriptedModel([[call("final_answer", {"answer": "found"}, "h1")]]),
        name="helper",
        description="Finds things.",
        verbosity_level=0,
    )
    manager = ToolCallingAgent(
        tools=[],
        model=ScriptedModel([[call("helper", {"task": "find"}, "m1")], [call("final_answer", {"answer": "ok"}, "m2")]]),
        managed_agents=[helper],
        name="manager",
        verbosity_level=0,
    )
    with agent_otel.agent_span("my-app"):
        assert manager.run("go") == "ok"

    runs = {span.name: span for span in spans.runs()}
    assert sorted(runs) == ["invoke_agent helper", "invoke_agent my-app"]
    assert runs["invoke_agent helper"].parent.span_id == runs["invoke_agent my-app"].context.span_id


@pytest.mark.parametrize("answer", ["text", "tool call"])
def test_time_to_first_token_of_a_streamed_model_call_is_its_first_output(hooked, spans, answer):
    """smolagents' OpenAIModel against a local OpenAI-compatible server that
    sends the chunks without output at once and the first token 150 ms in."""
    from frameworks.fake_openai import FIRST_TOKEN_S, MODEL, serve
    from smolagents import OpenAIModel

    hooked("smolagents")
    tool_call = ("fetch_page", '{"url": "a.example"}') if answer == "tool call" else None
    with serve(tool_call=tool_call) as url:
        model = OpenAIModel(model_id=MODEL, api_base=url, api_key="test")
        deltas = list(model.generate_stream([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]))

    assert deltas
    (span,) = spans.models(MODEL)
    first_token_s = span.attributes["gen_ai.response.time_to_first_chunk"]
    assert FIRST_TOKEN_S * 0.95 <= first_token_s < (span.end_time - span.start_time) / 1e9
