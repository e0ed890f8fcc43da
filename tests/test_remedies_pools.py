"""Tool pools (bulkheads): isolation, queue limits, rejection, defaults, metrics."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import agent_otel
from helpers.waiting import eventually
from agent_otel.remedies import pools


pytestmark = pytest.mark.usefixtures("fresh_pools")


def slow_report(quarter):
    time.sleep(0.6)
    return f"report {quarter}"


def fast_lookup(key):
    return key.upper()


def latency_of_fast_call_while_two_slow_calls_run(slow, fast, both_running):
    with ThreadPoolExecutor(2) as agents:
        slow_calls = [agents.submit(slow, quarter) for quarter in ("q1", "q2")]
        assert eventually(both_running)
        started = time.monotonic()
        assert fast("sku-1") == "SKU-1"
        latency = time.monotonic() - started
        assert [call.result() for call in slow_calls] == ["report q1", "report q2"]
    return latency


def test_a_slow_tool_in_its_own_pool_no_longer_delays_a_fast_tool(agent, spans, metric):
    agent_otel.pool("shared", workers=2)
    shared_slow = agent_otel.tool(name="slow_report", pool="shared")(slow_report)
    shared_fast = agent_otel.tool(name="fast_lookup", pool="shared")(fast_lookup)
    # Before: the fast tool waits for a worker the slow tool holds.
    shared_latency = latency_of_fast_call_while_two_slow_calls_run(
        shared_slow, shared_fast, lambda: metric("agent_executor_active_workers", {"executor": "shared"}) == 2
    )
    assert shared_latency >= 0.35

    agent_otel.pool("reports", workers=2)
    agent_otel.pool("lookups", workers=2)
    isolated_slow = agent_otel.tool(name="slow_report", pool="reports")(slow_report)
    isolated_fast = agent_otel.tool(name="fast_lookup", pool="lookups")(fast_lookup)
    isolated_latency = latency_of_fast_call_while_two_slow_calls_run(
        isolated_slow, isolated_fast, lambda: metric("agent_executor_active_workers", {"executor": "reports"}) == 2
    )
    assert isolated_latency < 0.25

    # The spans say why: queue time in the shared pool, none in its own.
    fast_spans = {span.attributes["agent.tool.executor"]: span for span in spans.tools("fast_lookup")}
    assert fast_spans["shared"].attributes["agent.tool.queue.duration"] >= 0.35
    assert fast_spans["lookups"].attributes["agent.tool.queue.duration"] < 0.25
    assert metric("agent_tool_queue_seconds_count", {"tool": "fast_lookup", "executor": "lookups"}) == 1
    assert metric("agent_executor_max_workers", {"executor": "reports"}) == 2


def test_a_full_pool_raises_an_error_naming_the_pool_and_its_limits(agent, spans, metric):
    agent_otel.pool("scraper", workers=1, queue_limit=1)
    release = threading.Event()

    @agent_otel.tool(pool="scraper")
    def scrape(url):
        release.wait(5)
        return url

    with ThreadPoolExecutor(2) as agents:
        running = agents.submit(scrape, "a")
        assert eventually(lambda: metric("agent_executor_active_workers", {"executor": "scraper"}) == 1)
        queued = agents.submit(scrape, "b")
        assert eventually(lambda: metric("agent_executor_queue_depth", {"executor": "scraper"}) == 1)

        with pytest.raises(agent_otel.PoolFullError) as rejected:
            scrape("c")
        release.set()
        assert (running.result(), queued.result()) == ("a", "b")

    message = str(rejected.value)
    assert "pool 'scraper' is full" in message
    assert "workers=1, queue_limit=1" in message
    assert "tool 'scrape'" in message
    assert metric("agent_tool_rejections_total", {"tool": "scrape", "executor": "scraper"}) == 1
    [rejected_span] = [s for s in spans.tools("scrape") if s.attributes["agent.tool.outcome"] == "error"]
    assert rejected_span.attributes["error.type"] == "agent_otel.remedies.pools.PoolFullError"
    assert rejected_span.attributes["agent.tool.executor"] == "scraper"


def test_a_full_caller_runs_pool_runs_the_call_in_the_callers_thread(agent, spans, metric):
    agent_otel.pool("renderer", workers=1, queue_limit=0, rejection="caller_runs")
    release = threading.Event()

    @agent_otel.tool(pool="renderer")
    def render(page):
        if page == "slow":
            release.wait(5)
        return threading.current_thread().name

    with ThreadPoolExecutor(1) as agents:
        busy = agents.submit(render, "slow")
        assert eventually(lambda: metric("agent_executor_active_workers", {"executor": "renderer"}) == 1)
        assert render("fast") == threading.current_thread().name
        release.set()
        assert busy.result().startswith("renderer")

    assert metric("agent_tool_rejections_total", {"tool": "render", "executor": "renderer"}) == 1
    [in_caller] = [s for s in spans.tools("render") if any(e.name == "pool.rejected" for e in s.events)]
    assert in_caller.attributes["agent.tool.outcome"] == "ok"


def test_pools_get_defaults_from_the_cores_and_their_kind(agent, spans, metric):
    io = agent_otel.pool("defaults-io")
    cpu = agent_otel.pool("defaults-cpu", kind="cpu")

    assert io.workers == min(32, pools.cores() + 4)
    assert cpu.workers == pools.cores()
    assert (io.queue_limit, cpu.queue_limit) == (4 * io.workers, 4 * cpu.workers)
    assert (io.rejection, io.processes) == ("raise", False)
    assert agent_otel.pools.get("defaults-io") is io
    assert agent_otel.pool("defaults-io") is io  # the same declaration again: the same pool
    with pytest.raises(agent_otel.ConfigError, match="already has"):
        agent_otel.pool("defaults-io", workers=io.workers + 1)


def test_a_pool_named_by_a_tool_but_never_declared_is_made_with_defaults_on_first_use(agent, spans, metric):
    @agent_otel.tool(pool="made-on-first-use")
    def geocode(address):
        return threading.current_thread().name

    with pytest.raises(agent_otel.ConfigError, match="made-on-first-use"):
        agent_otel.pools.get("made-on-first-use")
    assert geocode("1 Main St").startswith("made-on-first-use")
    made = agent_otel.pools.get("made-on-first-use")
    assert (made.kind, made.workers) == ("io", pools.default_workers("io"))
    assert metric("agent_executor_max_workers", {"executor": "made-on-first-use"}) == made.workers
    [span] = spans.tools("geocode")
    assert span.attributes["agent.tool.executor"] == "made-on-first-use"


@pytest.mark.parametrize(
    "options, setting",
    [
        ({"workers": 0}, "workers"),
        ({"queue_limit": -1}, "queue_limit"),
        ({"kind": "gpu"}, "kind"),
        ({"rejection": "drop"}, "rejection"),
    ],
)
def test_invalid_pool_settings_name_the_setting(options, setting):
    with pytest.raises(agent_otel.ConfigError, match=f"pool 'bad' {setting}"):
        agent_otel.pool("bad", **options)
    with pytest.raises(agent_otel.ConfigError):
        agent_otel.pools.get("bad")


@agent_otel.tool(pool="crunch-processes")
def crunch(n):
    """Pure-Python CPU work: it needs a process of its own to run beside the agent."""
    return os.getpid(), sum(i * i for i in range(n))


def test_a_process_pool_runs_cpu_tools_in_worker_processes_with_the_pools_metrics(agent, spans, metric):
    agent_otel.pool("crunch-processes", kind="cpu", workers=1, processes=True)

    pid, total = crunch(1000)

    assert total == sum(i * i for i in range(1000))
    assert pid != os.getpid()
    [span] = spans.tools("crunch")
    assert span.attributes["agent.tool.executor"] == "crunch-processes"
    assert span.attributes["agent.tool.outcome"] == "ok"
    assert metric("agent_executor_max_workers", {"executor": "crunch-processes"}) == 1
