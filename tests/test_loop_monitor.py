"""The event-loop monitor: a loop blocked for a known time by a known tool.

Real loops, real threads, real time; tolerances hold on a busy 2-core
machine (the block is measured from the tool call's own start, so only its
end can run late, by however long the loop takes to run again).
"""

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

import agent_otel
from agent_otel.capture import loop_monitor
from conftest import IN_CI
from helpers.waiting import eventually

BLOCKED = "asyncio.loop.blocked"


@agent_otel.tool
def lookup(seconds: float) -> None:
    """A sync tool: called from a coroutine, it holds the loop's thread."""
    time.sleep(seconds)


@agent_otel.tool
async def fetch(seconds: float) -> None:
    await asyncio.sleep(seconds)


def blocked_spans(spans, count: int = 1, by: str = None, timeout_s: float = 5.0):
    """The blocked-loop spans (blocked by ``by``), once there are ``count``.

    On a machine this busy a loop's thread can wait for a core long enough
    to count as blocked (by "unknown"): tests pick the blocks they caused.
    """

    def found():
        return [
            s
            for s in spans.all()
            if s.name == BLOCKED and (by is None or s.attributes["asyncio.loop.blocked_by"] == by)
        ]

    assert eventually(lambda: len(found()) >= count, timeout_s)
    return found()


async def blocking_step(block_s: float) -> None:
    """Three 50 ms async tools in flight, then a sync tool that blocks the loop."""
    tasks = [asyncio.create_task(fetch(0.05)) for _ in range(3)]
    await asyncio.sleep(0.01)  # they start, and wait on their timers
    lookup(block_s)
    await asyncio.gather(*tasks)


def test_a_sync_tool_called_from_a_coroutine_is_recorded_as_blocking_the_loop(agent, spans):
    asyncio.run(blocking_step(0.4))
    (span,) = blocked_spans(spans, by="lookup")
    (tool,) = spans.tools("lookup")
    waiting = spans.tools("fetch")
    a = dict(span.attributes)
    assert a["asyncio.loop.blocked_by"] == "lookup"
    assert a["thread.name"] == "MainThread" and a["thread.id"] == threading.main_thread().ident
    # It starts with the sync call (which holds the thread from its first instant) and ends
    # when the loop runs again, just after the call returned.
    assert span.start_time == tool.start_time
    assert tool.end_time <= span.end_time <= tool.end_time + 200_000_000
    assert a["asyncio.loop.blocked.duration"] == pytest.approx((span.end_time - span.start_time) / 1e9)
    assert 0.4 <= a["asyncio.loop.blocked.duration"] < 0.4 + 0.2
    assert "code.stacktrace" not in a
    roles = {link.context.span_id: link.attributes["asyncio.loop.role"] for link in span.links}
    assert roles == {tool.context.span_id: "blocking", **{s.context.span_id: "waiting" for s in waiting}}
    assert a["asyncio.loop.waiting_calls"] == 3
    assert span.parent is None  # its own trace, like a GPU idle window

    agent.force_flush()
    value = agent.metrics.registry.get_sample_value
    assert value("agent_asyncio_loop_blocked_seconds_total", {"tool": "lookup"}) == pytest.approx(
        a["asyncio.loop.blocked.duration"]
    )
    assert value("agent_asyncio_loop_blocked_seconds_total", {"tool": "fetch"}) is None


def test_a_block_with_no_tool_running_names_the_top_of_the_stack(agent, spans):
    async def parse_everything():
        time.sleep(0.35)  # not a tool: the loop monitor can only show where it is

    asyncio.run(parse_everything())
    (span,) = [s for s in blocked_spans(spans, by="unknown") if "parse_everything" in s.attributes["code.stacktrace"]]
    a = dict(span.attributes)
    assert a["asyncio.loop.blocked_by"] == "unknown"
    assert list(span.links) == []
    stack = a["code.stacktrace"]
    assert "parse_everything" in stack and "time.sleep(0.35)" in stack
    assert len(stack) <= agent.settings.max_attribute_length
    # Seen from the heartbeat it missed: up to half the threshold after the block began.
    assert 0.35 - 0.05 - 0.005 <= a["asyncio.loop.blocked.duration"] < 0.35 + 0.2
    agent.force_flush()
    assert agent.metrics.registry.get_sample_value(
        "agent_asyncio_loop_blocked_seconds_total", {"tool": "unknown"}
    ) == pytest.approx(a["asyncio.loop.blocked.duration"])


def test_blocks_under_the_threshold_are_not_recorded(agent, spans):
    async def short_blocks():
        for _ in range(5):
            lookup(0.02)
            await asyncio.sleep(0.01)

    asyncio.run(short_blocks())
    time.sleep(0.2)
    recorded = {link.context.span_id for s in spans.all() if s.name == BLOCKED for link in s.links}
    calls = spans.tools("lookup")
    # A 20 ms call is recorded only if this busy machine stretched it past the threshold.
    assert all(
        span.context.span_id not in recorded for span in calls if span.attributes["agent.tool.exec.duration"] < 0.1
    )
    assert all(s.attributes["asyncio.loop.blocked.duration"] >= 0.1 for s in spans.all() if s.name == BLOCKED)


def test_the_threshold_is_a_setting_and_an_environment_variable(spans, monkeypatch):
    monkeypatch.setenv("AGENT_OTEL_LOOP_BLOCK_THRESHOLD", "0.5")
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:
        assert handle.settings.loop_block_threshold == 0.5
        asyncio.run(blocking_step(0.3))
        time.sleep(0.3)
        (call,) = spans.tools("lookup")
        if call.attributes["agent.tool.exec.duration"] < 0.5:
            assert [
                s for s in spans.all() if s.name == BLOCKED and s.attributes["asyncio.loop.blocked_by"] == "lookup"
            ] == []
        assert all(s.attributes["asyncio.loop.blocked.duration"] >= 0.5 for s in spans.all() if s.name == BLOCKED)
    finally:
        agent_otel.uninstrument()
    handle = agent_otel.instrument(loop_block_threshold=0, traces_exporters="none", gpu="off", frameworks=())
    try:  # refused and said; the next source is used: the variable set above
        assert "loop_block_threshold" in str(handle.config_errors[0])
        assert handle.settings.loop_block_threshold == 0.5
    finally:
        agent_otel.uninstrument()


def test_it_can_be_turned_off(spans, monkeypatch):
    monkeypatch.setenv("AGENT_OTEL_LOOP_MONITOR", "false")
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:
        assert handle.loop_monitor is None
        assert asyncio.BaseEventLoop.run_forever is ORIGINAL_RUN_FOREVER
        asyncio.run(blocking_step(0.3))
        time.sleep(0.2)
        assert [s for s in spans.all() if s.name == BLOCKED] == []
    finally:
        agent_otel.uninstrument()


ORIGINAL_RUN_FOREVER = asyncio.BaseEventLoop.run_forever


def test_loops_in_several_threads_are_each_watched(agent, spans):
    def agent_thread(seconds):
        asyncio.run(blocking_step(seconds))

    threads = [threading.Thread(target=agent_thread, args=(0.3,), name=f"agent-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = blocked_spans(spans, 2, by="lookup")
    assert sorted(s.attributes["thread.name"] for s in found) == ["agent-0", "agent-1"]
    tools = {s.context.span_id: s for s in spans.tools("lookup")}
    for span in found:
        (blocking,) = [link for link in span.links if link.attributes["asyncio.loop.role"] == "blocking"]
        assert blocking.context.span_id in tools
        assert span.attributes["asyncio.loop.waiting_calls"] == 3  # its own loop's coroutines only


def test_a_loop_running_when_instrument_is_called_is_watched(spans):
    async def main():
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
        try:
            await blocking_step(0.3)
            blocked_spans(spans, by="lookup")
        finally:
            handle.shutdown()

    asyncio.run(main())


def test_a_loop_already_running_in_another_thread_is_watched(spans):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="early-loop")
    thread.start()
    try:
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
        try:
            asyncio.run_coroutine_threadsafe(blocking_step(0.3), loop).result(5)
            (span,) = blocked_spans(spans, by="lookup")
            assert span.attributes["thread.name"] == "early-loop"
            assert span.attributes["asyncio.loop.blocked_by"] == "lookup"
        finally:
            handle.shutdown()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_uvloop_loops_are_watched(agent, spans):
    try:
        import uvloop
    except ImportError:
        if IN_CI:
            pytest.fail("uvloop is not installed (pip install -e '.[dev]')")
        pytest.skip("uvloop is not installed (pip install -e '.[dev]')")
    uvloop.run(blocking_step(0.3))
    (span,) = blocked_spans(spans, by="lookup")
    assert span.attributes["asyncio.loop.blocked_by"] == "lookup"
    assert span.attributes["asyncio.loop.waiting_calls"] == 3


def test_uvloop_imported_after_instrument_is_hooked_and_restored():
    # A fresh interpreter: uvloop must not be imported before instrument().
    pytest.importorskip("uvloop") if not IN_CI else None
    script = """
import asyncio, time, agent_otel
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
exporter = InMemorySpanExporter()
handle.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
import uvloop
hooked = "run_forever" in vars(uvloop.Loop)

@agent_otel.tool
def lookup():
    time.sleep(0.3)

async def main():
    lookup()

uvloop.run(main())
deadline = time.monotonic() + 5
while time.monotonic() < deadline and not any(s.name == "asyncio.loop.blocked" and s.attributes["asyncio.loop.blocked_by"] == "lookup" for s in exporter.get_finished_spans()):
    time.sleep(0.01)
spans = [s for s in exporter.get_finished_spans() if s.name == "asyncio.loop.blocked"
         and s.attributes["asyncio.loop.blocked_by"] == "lookup"]
handle.shutdown()
print(hooked, len(spans), spans[0].attributes["asyncio.loop.blocked_by"], "run_forever" in vars(uvloop.Loop))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1", "lookup", "False"]


def test_no_loop_no_watchdog_thread_and_uninstrument_restores_everything(spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:
        assert asyncio.BaseEventLoop.run_forever is not ORIGINAL_RUN_FOREVER
        time.sleep(0.1)
        assert "agent-otel-loop-monitor" not in [t.name for t in threading.enumerate()]
        asyncio.run(asyncio.sleep(0.01))
        assert "agent-otel-loop-monitor" in [t.name for t in threading.enumerate()]
        assert handle.loop_monitor.watched() == 0  # the loop finished: no heartbeat left behind
    finally:
        agent_otel.uninstrument()
    assert asyncio.BaseEventLoop.run_forever is ORIGINAL_RUN_FOREVER
    assert loop_monitor.current is None
    assert eventually(lambda: "agent-otel-loop-monitor" not in [t.name for t in threading.enumerate()])


def test_the_lag_gauge_shows_a_block_while_it_lasts(agent, spans):
    # The tool holds the loop until the scrape is done: however busy the machine,
    # the scrape falls inside the block, at least 0.3 s into it.
    began, scraped = threading.Event(), threading.Event()
    block_began = []
    seen = []

    @agent_otel.tool
    def hold_loop():
        block_began.append(time.perf_counter())
        began.set()
        scraped.wait(30)

    def scrape():
        if began.wait(30):
            time.sleep(0.3)
            # The scraper thread may be preempted around the read: bound the
            # moment it was taken from both sides.
            before = time.perf_counter()
            lag = agent.metrics.registry.get_sample_value("agent_asyncio_loop_lag_seconds", {"thread": "MainThread"})
            after = time.perf_counter()
            seen.append((lag, before - block_began[0], after - run_began))
        scraped.set()

    async def main():
        scraper = threading.Thread(target=scrape)
        scraper.start()
        hold_loop()
        await asyncio.sleep(0)
        scraper.join()

    run_began = time.perf_counter()
    asyncio.run(main())
    (lag, into_block_s, into_run_s), *_ = seen
    # The heartbeat was due at most one interval after the block began, and not
    # before the loop started (into_block_s: at the latest when the read began;
    # into_run_s: at the earliest when it ended).
    assert into_block_s - agent.loop_monitor.interval_s <= lag <= into_run_s
    assert lag >= 0.3 - agent.loop_monitor.interval_s


def test_a_loop_that_stopped_is_dropped_not_reported_as_blocked(agent, spans):
    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.sleep(0.01))
    started = time.time_ns()
    time.sleep(0.3)  # the loop is not running: nothing is late
    loop.close()
    assert [
        s
        for s in spans.all()
        if s.name == BLOCKED and s.attributes["thread.name"] == "MainThread" and s.start_time > started
    ] == []
    assert agent.loop_monitor.watched() == 0


def test_a_block_that_ended_just_before_shutdown_has_its_span(spans):
    # A short-lived agent: its loop is blocked, the block ends, the loop
    # finishes and the program shuts agent-otel down at once, before the
    # watchdog's next look. The block is recorded all the same, with the
    # call that held the loop and the coroutine that waited on it.
    agent_otel.instrument(service_name="test-agent", traces_exporters="none", gpu="off", frameworks=())
    try:

        async def main():
            waiting = asyncio.create_task(fetch(0.05))
            await asyncio.sleep(0.01)
            lookup(0.4)
            await waiting

        asyncio.run(main())
    finally:
        agent_otel.uninstrument()
    (block,) = [s for s in spans.all() if s.name == BLOCKED and s.attributes["thread.name"] == "MainThread"]
    assert block.attributes["asyncio.loop.blocked_by"] == "lookup"
    assert block.attributes["asyncio.loop.waiting_calls"] == 1
    assert 0.3 <= block.attributes["asyncio.loop.blocked.duration"] <= 2.0


def test_live_attribution_blames_the_blocking_call_not_the_waiting_coroutines(spans):
    handle = agent_otel.instrument(
        traces_exporters="none", frameworks=(), gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.2
    )
    gpu = handle.gpu_timeline.source

    async def turn():
        await asyncio.to_thread(gpu.run_kernel, 0.3)  # the model thinks
        await blocking_step(0.6)  # the GPU waits: a sync tool froze the loop, three async tools wait on it
        await asyncio.to_thread(gpu.run_kernel, 0.3)  # the model answers

    try:
        asyncio.run(turn())
    finally:
        agent_otel.uninstrument()  # closes the timeline: every window is attributed
    (block,) = blocked_spans(spans, by="lookup")
    value = handle.metrics.registry.get_sample_value
    blamed = value("agent_gpu_idle_blocked_seconds_total", {"gpu": "0", "tool": "lookup", "phase": "exec"})
    waiting = value("agent_gpu_idle_blocked_seconds_total", {"gpu": "0", "tool": "fetch", "phase": "exec"}) or 0.0
    period = 1 / 6  # the simulated GPU's sample period
    # The idle window is the block (give or take a sample period at each edge); all of the
    # block goes to lookup. Split by the plain rule, the three fetches would have taken 3/4.
    assert blamed == pytest.approx(block.attributes["asyncio.loop.blocked.duration"], abs=period + 0.05)
    assert waiting < 0.1


@agent_otel.tool
def render(seconds: float) -> None:
    time.sleep(seconds)


def test_one_block_by_two_tools_in_a_row_is_split_where_the_second_began(agent, spans):
    async def two_in_a_row():
        lookup(0.3)
        render(0.3)  # no await in between: the loop stays blocked

    asyncio.run(two_in_a_row())
    found = sorted(
        blocked_spans(spans, 1, by="lookup") + blocked_spans(spans, 1, by="render"), key=lambda s: s.start_time
    )
    (first_tool,), (second_tool,) = spans.tools("lookup"), spans.tools("render")
    assert [s.attributes["asyncio.loop.blocked_by"] for s in found] == ["lookup", "render"]
    assert found[0].start_time == first_tool.start_time
    assert found[0].end_time == found[1].start_time == second_tool.start_time
    assert second_tool.end_time <= found[1].end_time <= second_tool.end_time + 200_000_000


def test_a_block_still_going_on_is_open_ended_for_the_live_attribution(agent, spans):
    seen = []
    returned, shown = threading.Event(), threading.Event()

    @agent_otel.tool
    def long_lookup() -> None:
        shown.wait(10.0)  # blocks the loop until the block was seen (or 10 s)

    def look():
        # Poll as the GPU timeline would, until the block shows or the call returned.
        while not returned.is_set() and not seen:
            now = time.time_ns()
            seen.extend(
                b
                for b in agent.loop_monitor.blocks_between(now - 5_000_000_000, now)
                if b.tool == "long_lookup" and not returned.is_set()
            )
            time.sleep(0.05)
        shown.set()

    async def main():
        looker = threading.Thread(target=look)
        looker.start()
        try:
            long_lookup()
        finally:
            returned.set()
        await asyncio.sleep(0)
        looker.join()

    asyncio.run(main())
    assert seen, "the block showed while it lasted"
    block = seen[0]
    (tool,) = spans.tools("long_lookup")
    assert block.end_ns == 0  # still going on when read
    assert block.blocker == (tool.context.trace_id, tool.context.span_id)
    assert block.start_ns == tool.start_time
