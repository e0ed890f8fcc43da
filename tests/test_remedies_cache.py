"""The result cache for deterministic tools: hits, TTL, size bound, pluggable stores."""

import asyncio
import time
import types

import pytest

import agent_otel
from agent_otel.remedies import MISS, MemoryStore, cache


def test_a_repeated_call_is_answered_from_the_cache_and_still_traced(agent, spans, metric):
    runs = []

    @agent_otel.tool(cache=True)
    def exchange_rate(currency):
        runs.append(currency)
        time.sleep(0.1)
        return 1.08

    assert exchange_rate("EUR") == 1.08
    assert exchange_rate("EUR") == 1.08
    assert exchange_rate("GBP") == 1.08

    assert runs == ["EUR", "GBP"]
    first, hit, other = spans.tools("exchange_rate")
    assert [s.attributes["agent.tool.cache.hit"] for s in (first, hit, other)] == [False, True, False]
    assert first.attributes["agent.tool.exec.duration"] >= 0.1
    # A hit's exec time is the lookup (microseconds), not the call; half the call's
    # time is room for a busy machine.
    assert hit.attributes["agent.tool.exec.duration"] < 0.05
    assert hit.attributes["agent.tool.outcome"] == "ok"
    assert metric("agent_tool_cache_hits_total", {"tool": "exchange_rate"}) == 1
    assert metric("agent_tool_cache_misses_total", {"tool": "exchange_rate"}) == 2


def test_entries_expire_after_their_ttl(agent, monkeypatch):
    # The store's clock, moved by the test: a busy machine cannot make the second call late.
    now = [1000.0]
    monkeypatch.setattr(cache, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    runs = []

    @agent_otel.tool(cache=agent_otel.ResultCache(ttl=0.2))
    def stock_level(sku):
        runs.append(sku)
        return 7

    stock_level("sku-1")
    now[0] += 0.19
    stock_level("sku-1")  # 0.19 s old: still fresh
    assert runs == ["sku-1"]
    now[0] += 0.02
    stock_level("sku-1")  # 0.21 s old: expired
    assert runs == ["sku-1", "sku-1"]


def test_the_least_recently_used_entry_is_evicted_at_the_size_bound(agent, metric):
    runs = []

    @agent_otel.tool(cache=agent_otel.ResultCache(max_entries=2))
    def geocode(address):
        runs.append(address)
        return (0.0, 0.0)

    for address in ("a", "b", "a", "c", "a", "b"):  # c evicts b (a was used more recently); b comes back
        geocode(address)
    assert runs == ["a", "b", "c", "b"]
    assert metric("agent_tool_cache_evictions_total", {"tool": "geocode"}) == 2


def test_a_custom_store_receives_the_results(agent):
    class DictStore:
        """What an adapter to a shared store (Redis, memcached) looks like."""

        def __init__(self):
            self.entries = {}

        def get(self, key):
            return self.entries.get(key, MISS)

        def put(self, key, value, ttl_s):
            self.entries[key] = value
            return 0

    store = DictStore()
    runs = []

    @agent_otel.tool(cache=agent_otel.ResultCache(ttl=60, store=store))
    def company_profile(ticker, *, fields=("name",)):
        runs.append(ticker)
        return {"ticker": ticker}

    company_profile("NVDA", fields=("name",))
    company_profile("NVDA", fields=("name",))
    assert runs == ["NVDA"]
    assert list(store.entries.values()) == [{"ticker": "NVDA"}]


def test_a_failing_store_never_fails_the_call(agent, caplog):
    class DownStore:
        def get(self, key):
            raise ConnectionError("redis is down")

        def put(self, key, value, ttl_s):
            raise ConnectionError("redis is down")

    @agent_otel.tool(cache=agent_otel.ResultCache(store=DownStore()))
    def exchange_rate(currency):
        return 1.08

    for _ in range(3):
        assert exchange_rate("EUR") == 1.08
    assert "cache store get failed for tool 'exchange_rate'" in caplog.text
    assert caplog.text.count("cache store") == 1  # once, not once per call


def test_failures_are_not_cached(agent):
    runs = []

    @agent_otel.tool(cache=True)
    def flaky_rate(currency):
        runs.append(currency)
        if len(runs) == 1:
            raise ConnectionError("timeout talking to the bank")
        return 1.1

    with pytest.raises(ConnectionError):
        flaky_rate("EUR")
    assert flaky_rate("EUR") == 1.1
    assert flaky_rate("EUR") == 1.1
    assert runs == ["EUR", "EUR"]


def test_unhashable_arguments_bypass_the_cache_unless_a_key_function_is_given(agent):
    runs = []

    @agent_otel.tool(cache=True)
    def plain(filters):
        runs.append("plain")
        return len(filters)

    @agent_otel.tool(cache=agent_otel.ResultCache(key=lambda args, kwargs: tuple(sorted(args[0].items()))))
    def keyed(filters):
        runs.append("keyed")
        return len(filters)

    for _ in range(2):
        assert plain({"color": "red"}) == 1
        assert keyed({"color": "red"}) == 1
    assert runs == ["plain", "keyed", "plain"]


def test_async_tools_are_cached_too(agent, spans):
    runs = []

    @agent_otel.tool(cache=True)
    async def translate(text):
        runs.append(text)
        return text[::-1]

    async def agent_turn():
        return [await translate("hello"), await translate("hello")]

    assert asyncio.run(agent_turn()) == ["olleh", "olleh"]
    assert runs == ["hello"]
    assert [s.attributes["agent.tool.cache.hit"] for s in spans.tools("translate")] == [False, True]


def test_the_memory_store_is_bounded_and_counts_what_it_evicts():
    store = MemoryStore(max_entries=2)
    assert store.put("a", 1, 60) == 0
    assert store.put("b", 2, 60) == 0
    assert store.get("a") == 1
    assert store.put("c", 3, 60) == 1  # b: least recently used
    assert (store.get("a"), store.get("b"), store.get("c")) == (1, MISS, 3)
    assert len(store) == 2


@pytest.mark.parametrize(
    "options, setting", [({"ttl": 0}, "ttl"), ({"max_entries": 0}, "max_entries"), ({"key": "args"}, "key")]
)
def test_invalid_cache_settings_name_the_setting(options, setting):
    with pytest.raises(agent_otel.ConfigError, match=f"ResultCache {setting}"):
        agent_otel.ResultCache(**options)
