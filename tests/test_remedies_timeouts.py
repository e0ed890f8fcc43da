"""Timeouts, retries at a fixed interval, and fallbacks, for sync and async tools."""

import asyncio
import threading
import time

import pytest

import agent_otel
from helpers.waiting import eventually


pytestmark = pytest.mark.usefixtures("fresh_pools")


def attempt_outcomes(span):
    return [event.attributes["agent.tool.outcome"] for event in span.events if event.name == "tool.attempt"]


def test_a_hung_tool_times_out_and_falls_back_and_its_workers_show_as_abandoned(agent, spans, metric):
    agent_otel.pool("quotes", workers=2)
    market_closed = threading.Event()

    def last_known_quote(symbol):
        return 99.5

    @agent_otel.tool(pool="quotes", timeout=0.3, retries=1, retry_interval=0.1, fallback=last_known_quote)
    def finance_quote(symbol):
        market_closed.wait(10)  # hangs until the test lets it go
        return 1.0

    started = time.monotonic()
    assert finance_quote("NVDA") == 99.5
    elapsed = time.monotonic() - started

    # Two attempts of 0.3 s, 0.1 s apart; slack for a busy machine.
    assert 0.7 <= elapsed < 1.5
    # Both hung attempts still hold their workers, and the pool's metrics say so.
    assert metric("agent_executor_abandoned_workers", {"executor": "quotes"}) == 2
    assert metric("agent_executor_active_workers", {"executor": "quotes"}) == 2
    market_closed.set()
    assert eventually(lambda: metric("agent_executor_abandoned_workers", {"executor": "quotes"}) == 0)
    assert eventually(lambda: metric("agent_executor_active_workers", {"executor": "quotes"}) == 0)

    [span] = spans.tools("finance_quote")
    assert span.attributes["agent.tool.outcome"] == "fallback"
    assert span.attributes["agent.tool.retries"] == 1
    assert span.attributes["agent.tool.timeout"] == 0.3
    assert span.attributes["agent.tool.executor"] == "quotes"
    assert attempt_outcomes(span) == ["timeout", "timeout"]
    assert metric("agent_tool_fallbacks_total", {"tool": "finance_quote"}) == 1
    assert metric("agent_tool_retries_total", {"tool": "finance_quote"}) == 1
    assert metric("agent_tool_calls_total", {"tool": "finance_quote", "outcome": "fallback"}) == 1


def test_a_timeout_without_fallback_raises_timeout_error_in_time(agent, spans, metric):
    release = threading.Event()

    @agent_otel.tool(timeout=0.2)
    def fetch_page(url):
        release.wait(10)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="'fetch_page' did not answer within its timeout of 0.2 s"):
        fetch_page("https://example.com")
    assert 0.2 <= time.monotonic() - started < 0.8
    release.set()

    [span] = spans.tools("fetch_page")
    assert span.attributes["agent.tool.outcome"] == "timeout"
    assert span.attributes["agent.tool.executor"] == "default"  # a sync tool with a timeout needs a thread
    assert span.attributes["error.type"] == "TimeoutError"
    assert not span.status.is_ok
    assert metric("agent_tool_calls_total", {"tool": "fetch_page", "outcome": "timeout"}) == 1


def test_a_flaky_tool_is_retried_after_a_fixed_interval(agent, spans, metric):
    attempts = []

    @agent_otel.tool(retries=2, retry_interval=0.15)
    def lookup_order(order_id):
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise ConnectionError("reset by peer")
        return {"id": order_id, "status": "shipped"}

    assert lookup_order(42) == {"id": 42, "status": "shipped"}

    assert len(attempts) == 2
    assert 0.15 <= attempts[1] - attempts[0] < 0.5
    [span] = spans.tools("lookup_order")
    assert span.attributes["agent.tool.outcome"] == "ok"
    assert span.attributes["agent.tool.retries"] == 1
    assert span.attributes["agent.tool.executor"] == "direct"
    assert attempt_outcomes(span) == ["error", "ok"]
    failed = [event for event in span.events if event.name == "tool.attempt"][0]
    assert failed.attributes["error.type"] == "ConnectionError"
    assert metric("agent_tool_retries_total", {"tool": "lookup_order"}) == 1
    assert metric("agent_tool_fallbacks_total", {"tool": "lookup_order"}) == 0


def test_the_last_error_propagates_unchanged_when_there_is_no_fallback(agent, spans):
    raised = []

    @agent_otel.tool(retries=1, retry_interval=0.01)
    def charge_card(amount):
        raised.append(ValueError(f"declined: {amount}"))
        raise raised[-1]

    with pytest.raises(ValueError) as caught:
        charge_card(10)
    assert caught.value is raised[-1] and len(raised) == 2
    [span] = spans.tools("charge_card")
    assert span.attributes["agent.tool.outcome"] == "error"
    assert attempt_outcomes(span) == ["error", "error"]


def test_a_hung_coroutine_tool_is_cancelled_at_its_timeout_and_falls_back(agent, spans):
    cancelled = []

    async def cached_forecast(city):
        return "sunny (cached)"

    @agent_otel.tool(timeout=0.2, fallback=cached_forecast)
    async def weather(city):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(city)
            raise

    async def agent_turn():
        started = time.monotonic()
        answer = await weather("Oslo")
        await asyncio.sleep(0.05)  # the cancelled task unwinds
        return answer, time.monotonic() - started

    answer, elapsed = asyncio.run(agent_turn())
    assert answer == "sunny (cached)"
    assert elapsed < 0.7
    assert cancelled == ["Oslo"]
    [span] = spans.tools("weather")
    assert span.attributes["agent.tool.outcome"] == "fallback"
    assert span.attributes["agent.tool.timeout"] == 0.2


def test_aio_runs_a_sync_pool_tool_without_blocking_the_event_loop(agent, spans):
    agent_otel.pool("crm", workers=2)

    @agent_otel.tool(pool="crm", timeout=2.0)
    def customer_record(customer_id):
        time.sleep(0.3)
        return {"id": customer_id, "thread": threading.current_thread().name}

    async def agent_turn():
        ticks = 0

        async def heartbeat():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        beating = asyncio.create_task(heartbeat())
        record = await customer_record.aio(7)
        beating.cancel()
        return record, ticks

    record, ticks = asyncio.run(agent_turn())
    assert record["id"] == 7 and record["thread"].startswith("crm")
    assert ticks >= 5  # the loop kept running while the tool did
    [span] = spans.tools("customer_record")
    assert span.attributes["agent.tool.executor"] == "crm"
    assert span.attributes["agent.tool.exec.duration"] >= 0.3


def test_a_framework_span_of_the_same_tool_stays_the_only_span(agent, spans):
    # A framework hook that already traces the tool (here its context-manager
    # form) wraps the remedy: the remedy adds its notes to that span.
    @agent_otel.tool(retries=1, retry_interval=0.01, fallback=lambda query: ["cached"])
    def search(query):
        raise ConnectionError("search backend down")

    with agent_otel.tool_span("search"):
        assert search("gpu") == ["cached"]

    [span] = spans.tools("search")
    assert span.attributes["agent.tool.retries"] == 1
    assert attempt_outcomes(span) == ["error", "error"]
    assert agent.recorder.inflight == {}


def test_timeouts_and_fallbacks_work_without_instrumentation():
    agent_otel.uninstrument()
    release = threading.Event()

    @agent_otel.tool(timeout=0.1, fallback=lambda query: [])
    def search(query):
        release.wait(10)
        return [query]

    started = time.monotonic()
    assert search("gpu") == []
    assert time.monotonic() - started < 0.5
    release.set()


@pytest.mark.parametrize(
    "options, setting",
    [
        ({"timeout": 0}, "timeout"),
        ({"retries": -1}, "retries"),
        ({"retry_interval": -0.5, "retries": 1}, "retry_interval"),
        ({"fallback": "cached"}, "fallback"),
        ({"cache": "yes"}, "cache"),
    ],
)
def test_invalid_remedy_options_name_the_option(options, setting):
    with pytest.raises(agent_otel.ConfigError, match=f"@tool 'search' {setting}"):

        @agent_otel.tool(**options)
        def search(query):
            return query


def test_a_coroutine_tool_cannot_have_a_pool():
    with pytest.raises(agent_otel.ConfigError, match="runs on the event loop"):

        @agent_otel.tool(pool="io")
        async def search(query):
            return query
