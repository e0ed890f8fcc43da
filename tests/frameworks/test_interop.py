"""agent-otel beside the GenAI instrumentations people already run.

OpenInference's and OpenLLMetry's LangChain instrumentations, installed
from the registry (the ``interop`` extra), active in the same process as
``instrument()``: a LangGraph agent's tool calls are counted once in the
metrics and in the report, and the report shows the model calls that
instrumentation recorded (agent-otel's own model spans stay off).
"""

from __future__ import annotations

import importlib
import io
import json
from contextlib import contextmanager, redirect_stdout

import pytest
from frameworks.framework_support import IN_CI, framework_fixture, report_json
from opentelemetry import trace

import agent_otel
from agent_otel.commands.cli import main

framework = framework_fixture("langchain", "langgraph")

# name -> (module, instrumentor class, the model name the report shows for a fake chat model)
PEERS = {
    "openinference": ("openinference.instrumentation.langchain", "LangChainInstrumentor", "FakeMessagesListChatModel"),
    "openllmetry": (
        "opentelemetry.instrumentation.langchain",
        "LangchainInstrumentor",
        "FakeMessagesListChatModel.chat",
    ),
}


@pytest.fixture(params=sorted(PEERS))
def peer(request):
    """The peer's LangChain instrumentation, on the test session's tracer provider."""
    with peers_active([request.param]):
        yield request.param, PEERS[request.param][2]


@pytest.fixture
def both_peers():
    """OpenInference's and OpenLLMetry's LangChain instrumentations at once."""
    with peers_active(sorted(PEERS)):
        yield


@contextmanager
def peers_active(names):
    instrumentors = []
    for name in names:
        module_name, class_name, _model = PEERS[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            message = f"{module_name} is not installed ({exc}): pip install -e '.[interop]'"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        instrumentors.append(getattr(module, class_name)())
    from langchain_core.callbacks import BaseCallbackManager
    from langgraph.pregel import Pregel

    init_before = vars(BaseCallbackManager)["__init__"]
    streams_before = vars(Pregel)["stream"], vars(Pregel)["astream"]
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=trace.get_tracer_provider())
    try:
        yield
    finally:
        for instrumentor in reversed(instrumentors):
            instrumentor.uninstrument()
        # opentelemetry-instrumentation-langchain 0.62.4's uninstrument() leaves its
        # wrapper on BaseCallbackManager.__init__ (still adding its handler to every
        # run), and on Pregel.stream / astream when agent-otel's hook went on top of
        # it (its unwrap finds ours there and does nothing): put the originals back
        # so the tests after this one see no peer.
        BaseCallbackManager.__init__ = init_before
        Pregel.stream, Pregel.astream = streams_before


def test_a_langgraph_run_counts_each_tool_call_once_beside_a_peer(peer, hooked, spans, tmp_path):
    from frameworks.langchain_scripted import fetch_page, react_graph, tool_call
    from langchain_core.messages import AIMessage, HumanMessage

    name, peer_model = peer
    traces = tmp_path / "traces.jsonl"
    handle = hooked("langchain", traces_file=str(traces))
    calls = [tool_call("fetch_page", {"url": f"{i}.example"}, f"t{i}") for i in range(3)]
    graph = react_graph([fetch_page], [AIMessage("", tool_calls=calls), AIMessage("all fetched")])

    state = graph.invoke({"messages": [HumanMessage("fetch three pages")]})

    assert state["messages"][-1].content == "all fetched"
    handle.pipeline.drain()
    assert (
        handle.metrics.registry.get_sample_value("agent_tool_calls_total", {"tool": "fetch_page", "outcome": "ok"})
        == 3.0
    )
    ours = [s for s in spans.all() if s.instrumentation_scope.name == "agent_otel"]
    assert len([s for s in ours if s.name == "execute_tool fetch_page"]) == 3
    assert [s for s in ours if s.attributes.get("gen_ai.operation.name") == "chat"] == []  # the peer records them
    peer_tool_spans = [
        s for s in spans.all() if s.instrumentation_scope.name != "agent_otel" and "fetch_page" in s.name
    ]
    assert len(peer_tool_spans) == 3  # the peer saw each call too
    agent_otel.uninstrument()  # flushes the traces file

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(traces), "--format", "json"]) == 0
    report = json.loads(out.getvalue())

    (tool,) = report["tools"]
    assert (tool["tool"], tool["calls"]) == ("fetch_page", 3)
    assert tool["executors"] == ["ThreadPoolExecutor"]  # agent-otel's spans, with the queue split, were kept
    assert report["inputs"]["peer_tool_spans"] == 3
    assert report["inputs"]["peer_tool_spans_merged"] == 3
    (model,) = report["models"]
    assert (model["model"], model["calls"]) == (peer_model, 2)
    turns = report["turns"]
    assert turns["count"] == 1  # the graph run: OpenInference's root chain, OpenLLMetry's invoke_agent
    assert (turns["slowest"][0]["tool_calls"], turns["slowest"][0]["model_calls"]) == (3, 2)
    assert turns["tool_exec_s"] > 0 and turns["model_s"] > 0


def test_beside_both_peers_at_once_each_tool_call_and_model_call_counts_once(both_peers, hooked, spans, tmp_path):
    """OpenInference and OpenLLMetry both see every tool call (beside
    agent-otel's span) and every model call: three spans of each tool call,
    two of each model call, side by side in one trace."""
    from frameworks.langchain_scripted import fetch_page, react_graph, tool_call
    from langchain_core.messages import AIMessage, HumanMessage

    traces = tmp_path / "traces.jsonl"
    hooked("langchain", traces_file=str(traces))
    usage = {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}
    calls = [tool_call("fetch_page", {"url": f"{i}.example"}, f"t{i}") for i in range(3)]
    turns = [AIMessage("", tool_calls=calls, usage_metadata=usage), AIMessage("all fetched", usage_metadata=usage)]
    graph = react_graph([fetch_page], turns)

    state = graph.invoke({"messages": [HumanMessage("fetch three pages")]})
    agent_otel.uninstrument()  # flushes the traces file

    assert state["messages"][-1].content == "all fetched"
    scopes = {}
    for span in spans.all():
        if "fetch_page" in span.name:
            scopes[span.instrumentation_scope.name] = scopes.get(span.instrumentation_scope.name, 0) + 1
    assert scopes == {  # each of the three calls seen by all three
        "agent_otel": 3,
        "openinference.instrumentation.langchain": 3,
        "opentelemetry.instrumentation.langchain": 3,
    }
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(traces), "--format", "json"]) == 0
    report = json.loads(out.getvalue())

    (tool,) = report["tools"]
    assert (tool["tool"], tool["calls"]) == ("fetch_page", 3)
    assert tool["executors"] == ["ThreadPoolExecutor"]  # agent-otel's spans, with the queue split, were kept
    assert (report["inputs"]["peer_tool_spans"], report["inputs"]["peer_tool_spans_merged"]) == (6, 6)
    (model,) = report["models"]  # one name for both of its calls, whichever span kept each
    assert model["calls"] == 2
    assert (model["input_tokens"], model["output_tokens"]) == (20, 6)  # not doubled
    turns_found = report["turns"]
    assert turns_found["count"] == 1
    assert (turns_found["slowest"][0]["tool_calls"], turns_found["slowest"][0]["model_calls"]) == (3, 2)


@pytest.mark.parametrize("model_spans", ["auto", "on"])
def test_client_cpu_beside_a_peer_needs_agent_otels_own_model_spans(peer, model_spans, hooked, spans, tmp_path):
    """A chat model whose client holds the event loop 300 ms before its
    200 ms answer (as a cold first call does). The loop monitor links only
    agent-otel's own model spans (docs/frameworks.md): with ``model_spans``
    at ``auto`` the peer's span alone records the call and the block reads
    as model time; ``on`` records ours beside it, one call in the report,
    and the block is the turn's client CPU."""
    import asyncio
    import time

    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    class ColdModel(FakeMessagesListChatModel):
        async def _agenerate(self, *args, **kwargs):
            time.sleep(0.3)  # the client's own work, on the loop's thread
            await asyncio.sleep(0.2)
            return await super()._agenerate(*args, **kwargs)

    traces = tmp_path / "traces.jsonl"
    hooked("langchain", traces_file=str(traces), loop_monitor=True, loop_block_threshold=0.1, model_spans=model_spans)
    model = ColdModel(responses=[AIMessage("done")])

    async def run():
        with agent_otel.agent_span("support"):
            return await model.ainvoke("help me")

    assert asyncio.run(run()).content == "done"
    agent_otel.uninstrument()  # flushes the traces file

    report = report_json(traces)
    (called,) = report["models"]
    assert called["calls"] == 1  # ours and the peer's, one call
    (turn,) = report["turns"]["slowest"]
    blocked_s = sum(loop["blocked_s"] for loop in report["event_loops"])
    assert blocked_s >= 0.3 - 0.05 - 0.02  # seen from the heartbeat it missed: up to threshold / 2 late
    if model_spans == "on":
        assert 0.3 - 0.05 - 0.02 <= turn["client_cpu_s"] <= blocked_s + 1e-5
        assert turn["model_s"] < 0.5 - 0.2
    else:
        assert turn["client_cpu_s"] == 0.0
        assert turn["model_s"] >= 0.5 - 0.02


def test_a_simulated_gpu_is_busy_while_a_chat_model_the_peer_records_generates(peer, spans, tmp_path):
    """The peer's LangChain model spans start with no attributes, so the
    peers' watcher cannot tell them at start: agent-otel's LangChain hook,
    which records no model span beside a peer, follows the call through
    LangChain's callbacks, and the simulated GPU is busy while it generates
    and idle before and after (docs/gpu.md)."""
    import time

    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    from agent_otel.capture.models import model_calls
    from agent_otel.support.clock import now_ns
    from agent_otel.gpu.logs import read_gpu_log

    generating = []

    class SlowModel(FakeMessagesListChatModel):
        def _generate(self, *args, **kwargs):
            start = now_ns()
            time.sleep(0.7)
            generating.append((start, now_ns(), model_calls.in_flight_count()))
            return super()._generate(*args, **kwargs)

    log = tmp_path / "gpu.csv"
    handle = agent_otel.instrument(
        service_name="test-agent",
        traces_exporters="none",
        frameworks=["langchain"],
        gpu="simulated",
        gpu_poll_interval=0.05,
        gpu_log_file=str(log),
    )
    idle = []
    try:
        model = SlowModel(responses=[AIMessage("done")])
        start = now_ns()
        time.sleep(0.5)
        idle.append((start, now_ns()))
        assert model.invoke("help me").content == "done"
        start = now_ns()
        time.sleep(0.5)
        idle.append((start, now_ns()))
    finally:
        agent_otel.uninstrument()
    assert handle.gpu_timeline is not None
    (peer_span,) = [
        s for s in spans.all() if s.instrumentation_scope.name == PEERS[peer[0]][0] and "SlowModel" in s.name
    ]
    ours = [s for s in spans.all() if s.instrumentation_scope.name == "agent_otel"]
    assert [s for s in ours if s.attributes.get("gen_ai.operation.name") == "chat"] == []  # the peer records it
    (series,) = read_gpu_log(str(log)).series.values()
    period = round(1e9 / 6)

    def within(start: int, end: int) -> list[float]:
        return [
            u for t, u in zip(series.times, series.values) if t - period >= start + 2_000_000 and t <= end - 2_000_000
        ]

    ((busy_from, busy_to, in_flight),) = generating
    assert in_flight == 1  # the hook's, once (the peer's span is not kept beside it)
    assert len(within(busy_from, busy_to)) >= 2
    assert set(within(busy_from, busy_to)) == {1.0}  # busy while it generates
    for start, end in idle:
        assert len(within(start, end)) >= 1
        assert set(within(start, end)) == {0.0}  # idle before and after
    busy_s = sum(series.values) * period / 1e9
    peer_s = (peer_span.end_time - peer_span.start_time) / 1e9
    # The hook's callbacks and the peer's run in the same callback manager,
    # around the same generation: the GPU is busy for the model call's time.
    assert 0.7 - 0.01 <= busy_s <= peer_s + 0.1, (busy_s, peer_s)  # (the log's 2 decimals)
    assert model_calls.in_flight_count() == 0
