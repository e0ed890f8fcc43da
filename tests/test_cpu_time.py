"""CPU time per call: ``agent.tool.exec.cpu_time`` where one thread ran the whole call.

Ground truth: a tool that spins on the CPU for a known CPU time, and one
that sleeps (waits, as on I/O) for a known wall time.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import agent_otel

CPU = "agent.tool.exec.cpu_time"
EXEC = "agent.tool.exec.duration"


def spin(cpu_seconds: float) -> None:
    """Burn this thread's CPU for ``cpu_seconds`` of its own CPU clock."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        sum(range(200))


@agent_otel.tool
def crunch(cpu_seconds: float) -> None:
    spin(cpu_seconds)


@agent_otel.tool
def wait_on_io(seconds: float) -> None:
    time.sleep(seconds)


def the(spans, name):
    (span,) = spans.tools(name)
    return dict(span.attributes)


def test_a_cpu_bound_sync_tool_spends_its_exec_on_the_cpu(agent, spans):
    crunch(0.2)
    attributes = the(spans, "crunch")
    # Its own thread's CPU clock: at least what it burned, at most its wall time.
    assert 0.2 <= attributes[CPU] <= attributes["agent.tool.exec.duration"] + 1e-3


def test_an_io_bound_sync_tool_spends_almost_none(agent, spans):
    wait_on_io(0.2)
    attributes = the(spans, "wait_on_io")
    assert attributes["agent.tool.exec.duration"] >= 0.2
    assert attributes[CPU] < 0.02


def test_a_pool_worker_measures_its_own_thread(agent, spans):
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(crunch, 0.1).result()
        pool.submit(wait_on_io, 0.1).result()
    assert the(spans, "crunch")[CPU] >= 0.1
    assert the(spans, "wait_on_io")[CPU] < 0.02


def test_an_exception_still_records_the_cpu_time(agent, spans):
    @agent_otel.tool
    def fails():
        spin(0.05)
        raise ValueError("no")

    with pytest.raises(ValueError):
        fails()
    assert the(spans, "fails")[CPU] >= 0.05


def test_a_coroutine_tool_has_none_other_coroutines_share_its_thread(agent, spans):
    @agent_otel.tool
    async def fetch():
        await asyncio.sleep(0.01)

    asyncio.run(fetch())
    assert CPU not in the(spans, "fetch")


def test_generator_tools_have_none_the_consumer_runs_on_the_thread_between_items(agent, spans):
    @agent_otel.tool
    def pages():
        yield 1
        yield 2

    assert list(pages()) == [1, 2]
    assert CPU not in the(spans, "pages")


def test_tool_span_records_it_in_sync_code_only(agent, spans):
    with agent_otel.tool_span("inline"):
        spin(0.05)
    assert the(spans, "inline")[CPU] >= 0.05

    async def agent_step():
        async with agent_otel.tool_span("inline_async"):
            await asyncio.sleep(0.01)
        with agent_otel.tool_span("inline_in_coroutine"):
            await asyncio.sleep(0.01)

    asyncio.run(agent_step())
    assert CPU not in the(spans, "inline_async")
    assert CPU not in the(spans, "inline_in_coroutine")


def test_the_finished_record_carries_it(agent, spans):
    records = []
    agent.pipeline.consumers.append(records.extend)
    crunch(0.05)
    wait_on_io(0.01)
    agent.pipeline.drain()
    by_tool = {record.tool: record for record in records}
    assert by_tool["crunch"].cpu_seconds >= 0.05
    assert by_tool["wait_on_io"].cpu_seconds < 0.01


def test_short_calls_are_sampled_long_ones_always_measured(agent, spans):
    # Reading the thread's CPU clock is a system call: a tool whose calls are
    # short (< 1 ms of exec) has one call in 16 measured, one whose calls are
    # long every call; an unmeasured call that turns out long makes the next
    # one measured. (Whether a call was short is read from its span: on a
    # busy machine even an empty call can take over 1 ms.)
    @agent_otel.tool
    def quick(seconds=0.0):
        if seconds:
            time.sleep(seconds)

    made = 0
    while made < 40 or (made < 400 and sum(s.attributes[EXEC] < 1e-3 for s in spans.tools("quick")) < 16):
        quick()  # until 16 calls were short, however busy the machine
        made += 1
    for seconds in (0.005, 0.0, 0.005, 0.005, 0.005):
        quick(seconds)
    calls = [dict(span.attributes) for span in spans.tools("quick")]
    expected, skip = [], 0
    for attributes in calls:
        expected.append(skip == 0)
        short = attributes[EXEC] < 1e-3
        if skip == 0:
            skip = 15 if short else 0
        else:
            skip = skip - 1 if short else 0
    assert [CPU in attributes for attributes in calls] == expected
    assert 3 <= sum(expected[:made]) < made  # the short ones were sampled
    assert expected[-2:] == [True, True]  # long ones after a long one: all measured
