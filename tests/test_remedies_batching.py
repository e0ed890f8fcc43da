"""Micro-batching: concurrent calls of one tool become batches, each caller gets its own answer."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import agent_otel


pytestmark = pytest.mark.usefixtures("fresh_pools")


def call_together(tool, items):
    """Call ``tool`` once per item, all at the same moment, from as many threads."""
    start = threading.Barrier(len(items))

    def one(item):
        start.wait()
        try:
            return tool(item)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(items)) as agents:
        return list(agents.map(one, items))


def test_concurrent_callers_each_get_their_own_result_from_fewer_batches(agent, spans, metric):
    batches = []

    @agent_otel.batch(max_size=8, window_ms=20)
    def embed(texts):
        batches.append(list(texts))
        return [f"vector({text})" for text in texts]

    texts = [f"doc-{i}" for i in range(24)]
    assert call_together(embed, texts) == [f"vector({text})" for text in texts]

    assert sorted(text for batch in batches for text in batch) == sorted(texts)
    assert all(1 <= len(batch) <= 8 for batch in batches)
    assert len(batches) < len(texts)
    assert metric("agent_tool_batch_size_count", {"tool": "embed"}) == len(batches)
    assert metric("agent_tool_batch_size_sum", {"tool": "embed"}) == len(texts)
    assert metric("agent_tool_batch_wait_seconds_count", {"tool": "embed"}) == len(texts)
    assert metric("agent_tool_calls_total", {"tool": "embed", "outcome": "ok"}) == len(texts)


def test_the_batch_span_links_to_every_callers_tool_span(agent, spans):
    @agent_otel.batch(max_size=4, window_ms=1000)
    def rerank(passages):
        return [len(passage) for passage in passages]

    assert call_together(rerank, ["a", "bb", "ccc", "dddd"]) == [1, 2, 3, 4]

    callers = spans.tools("rerank")
    [batch_span] = [span for span in spans.all() if span.name == "batch rerank"]
    assert len(callers) == 4
    assert {link.context.span_id for link in batch_span.links} == {span.context.span_id for span in callers}
    assert batch_span.attributes["agent.tool.batch.size"] == 4
    assert batch_span.parent.span_id in {span.context.span_id for span in callers}
    for span in callers:
        assert span.attributes["agent.tool.batch.size"] == 4
        assert span.attributes["agent.tool.executor"] == "rerank-batch"
        # The wait for the batch is the call's queue time; the batch closed when full, well before 1 s.
        assert 0 <= span.attributes["agent.tool.queue.duration"] < 0.5


def test_a_full_batch_runs_without_waiting_for_its_window(agent):
    @agent_otel.batch(max_size=4, window_ms=5000)
    def translate(sentences):
        return [sentence[::-1] for sentence in sentences]

    started = time.monotonic()
    assert call_together(translate, ["abc", "def", "ghi", "jkl"]) == ["cba", "fed", "ihg", "lkj"]
    assert time.monotonic() - started < 2.0


def test_an_exception_in_the_batch_function_reaches_every_caller(agent, spans):
    @agent_otel.batch(max_size=6, window_ms=50)
    def geocode(addresses):
        raise ConnectionError("geocoder unreachable")

    answers = call_together(geocode, [f"{n} Main St" for n in range(6)])

    assert all(isinstance(answer, ConnectionError) for answer in answers)
    assert {str(answer) for answer in answers} == {"geocoder unreachable"}
    callers = spans.tools("geocode")
    assert len(callers) == 6
    assert {span.attributes["error.type"] for span in callers} == {"ConnectionError"}
    assert all(not span.status.is_ok for span in spans.all() if span.name == "batch geocode")


def test_an_exception_as_one_items_result_reaches_only_that_caller(agent):
    @agent_otel.batch(max_size=3, window_ms=50)
    def fetch_prices(skus):
        return [KeyError(sku) if sku == "missing" else 10.0 for sku in skus]

    answers = call_together(fetch_prices, ["a", "missing", "b"])

    assert answers[0] == 10.0 and answers[2] == 10.0
    assert isinstance(answers[1], KeyError)


def test_a_batch_function_returning_the_wrong_number_of_results_fails_every_caller(agent):
    @agent_otel.batch(max_size=2, window_ms=50)
    def summarize(texts):
        return ["one summary"]

    answers = call_together(summarize, ["first", "second"])

    assert [type(answer) for answer in answers] == [ValueError, ValueError]
    assert "returned 1 results for 2 calls" in str(answers[0])


def test_a_batch_its_full_pool_rejects_fails_with_pool_full(agent, metric):
    agent_otel.pool("tiny-batch", workers=1, queue_limit=0)
    release = threading.Event()

    @agent_otel.batch(max_size=1, window_ms=0, pool="tiny-batch")
    def slow_lookup(keys):
        release.wait(5)
        return keys

    with ThreadPoolExecutor(1) as agents:
        first = agents.submit(slow_lookup, "a")  # its batch holds the only worker
        assert first_holds_worker(metric)
        with pytest.raises(agent_otel.PoolFullError, match="pool 'tiny-batch' is full"):
            slow_lookup("b")
        release.set()
        assert first.result() == "a"
    assert metric("agent_tool_rejections_total", {"tool": "slow_lookup", "executor": "tiny-batch"}) == 1


def first_holds_worker(metric, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric("agent_executor_active_workers", {"executor": "tiny-batch"}) == 1:
            return True
        time.sleep(0.01)
    return False


def test_async_callers_share_batches(agent):
    calls = []

    @agent_otel.batch(max_size=16, window_ms=20)
    def score(items):
        calls.append(len(items))
        return [item * 10 for item in items]

    async def agent_turn():
        return await asyncio.gather(*(score.aio(n) for n in range(10)))

    assert asyncio.run(agent_turn()) == [n * 10 for n in range(10)]
    assert sum(calls) == 10 and len(calls) < 10


def test_invalid_batch_options_name_the_option():
    with pytest.raises(agent_otel.ConfigError, match="@batch 'embed' max_size"):
        agent_otel.batch(lambda items: items, name="embed", max_size=0)
    with pytest.raises(agent_otel.ConfigError, match="@batch 'embed' window_ms"):
        agent_otel.batch(lambda items: items, name="embed", window_ms=-1)
