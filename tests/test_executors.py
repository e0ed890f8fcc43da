"""Tool calls through thread pools, run_in_executor and asyncio.to_thread."""

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest
from opentelemetry import trace

import agent_otel
from agent_otel.support import clock


def attrs(span):
    return dict(span.attributes)


@agent_otel.tool
def lookup(i):
    time.sleep(0.1)
    return i


def by_submission(found):
    return sorted(found, key=lambda s: s.start_time)


def timed_lookup(held: set[int], gate: threading.Event, body: dict):
    """A tool named lookup that notes when its body began and ended, on the spans'
    timeline; the calls in ``held`` wait for ``gate`` first (as part of their execution)."""

    @agent_otel.tool
    def lookup(i):
        began = clock.now_ns()
        if i in held:
            gate.wait(30)
        time.sleep(0.1)
        body[i] = (began, clock.now_ns())
        return i

    return lookup


def assert_measured(span, began_ns: int, ended_ns: int) -> None:
    """Queue: from the submission (the span's start) to the call's first line. Exec: the call's body."""
    # The tolerance is the few lines between agent_otel's clock readings and the body's, on a busy machine.
    a = attrs(span)
    assert a["agent.tool.queue.duration"] == pytest.approx((began_ns - span.start_time) / 1e9, abs=0.05)
    assert a["agent.tool.exec.duration"] == pytest.approx((ended_ns - began_ns) / 1e9, abs=0.05)
    assert a["agent.tool.exec.duration"] >= 0.1


def test_small_pool_shows_queue_time(agent, spans, metric):
    # The first two calls hold both workers until all six are submitted: the
    # other four wait in the queue, each until a 0.1 s call has ended at least.
    gate, body = threading.Event(), {}
    lookup = timed_lookup({0, 1}, gate, body)
    with cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tools") as pool:
        futures = [pool.submit(lookup, i) for i in range(6)]
        gate.set()
        assert [f.result() for f in futures] == list(range(6))
    found = by_submission(spans.tools("lookup"))
    assert len(found) == 6
    for i, span in enumerate(found):
        assert_measured(span, *body[i])
    queues = [attrs(s)["agent.tool.queue.duration"] for s in found]
    assert min(queues[2:]) >= 0.1
    for span in found:
        a = attrs(span)
        assert a["agent.tool.executor"] == "tools"
        assert a["agent.executor.max_workers"] == 2
        # The span starts at submission: its duration is queue plus exec.
        duration = (span.end_time - span.start_time) / 1e9
        assert duration == pytest.approx(a["agent.tool.queue.duration"] + a["agent.tool.exec.duration"], abs=1e-3)
        (event,) = span.events
        assert (event.timestamp - span.start_time) / 1e9 == pytest.approx(a["agent.tool.queue.duration"], abs=1e-6)
    assert metric("agent_tool_queue_seconds_count", {"tool": "lookup", "executor": "tools"}) == 6
    assert metric("agent_executor_wait_seconds_count", {"executor": "tools"}) == 6


def test_ten_thousand_calls_from_twenty_threads(agent, spans, metric):
    @agent_otel.tool
    def echo(x):
        return x

    pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="shared")

    def caller(n):
        for i in range(500):
            if i % 2:
                assert echo(i) == i
            else:
                assert pool.submit(echo, i).result() == i

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.shutdown()
    found = spans.tools("echo")
    assert len(found) == 10_000
    assert sum(1 for s in found if attrs(s)["agent.tool.executor"] == "shared") == 5_000
    for span in found:
        a = attrs(span)
        duration = (span.end_time - span.start_time) / 1e9
        assert abs(a["agent.tool.queue.duration"] + a["agent.tool.exec.duration"] - duration) < 1e-3
    assert metric("agent_tool_calls_total", {"tool": "echo", "outcome": "ok"}) == 10_000
    assert agent.recorder.inflight == {}


def test_parent_context_travels_to_the_worker(agent, spans):
    tracer = trace.get_tracer("test")
    with cf.ThreadPoolExecutor(1) as pool:
        with tracer.start_as_current_span("agent_turn") as turn:
            pool.submit(lookup, 1).result()
    (span,) = spans.tools("lookup")
    assert span.parent.span_id == turn.get_span_context().span_id
    assert span.context.trace_id == turn.get_span_context().trace_id


def test_tool_called_inside_other_work_has_no_queue_time(agent, spans):
    def plan_then_lookup():
        time.sleep(0.05)
        return lookup(3)

    with cf.ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(time.sleep, 0.1)
        assert pool.submit(plan_then_lookup).result() == 3
        blocker.result()
    (span,) = spans.tools("lookup")
    assert attrs(span)["agent.tool.queue.duration"] == 0.0
    assert attrs(span)["agent.tool.executor"] == "direct"


def test_run_in_executor_and_to_thread(agent, spans):
    # The first call holds the only "sql" worker until all three are submitted.
    gate, body = threading.Event(), {}
    lookup = timed_lookup({0}, gate, body)

    async def main():
        loop = asyncio.get_running_loop()
        with cf.ThreadPoolExecutor(1, thread_name_prefix="sql") as pool:
            calls = [loop.run_in_executor(pool, lookup, i) for i in range(3)]
            gate.set()
            results = await asyncio.gather(*calls)
        results += await asyncio.gather(asyncio.to_thread(lookup, 10), asyncio.to_thread(lookup, 11))
        return results

    assert asyncio.run(main()) == [0, 1, 2, 10, 11]
    found = spans.tools("lookup")
    sql = by_submission([s for s in found if attrs(s)["agent.tool.executor"] == "sql"])
    assert len(sql) == 3
    for i, span in enumerate(sql):
        assert_measured(span, *body[i])
    # One worker: the second call waited for the first, the third for both.
    assert attrs(sql[1])["agent.tool.queue.duration"] >= 0.1
    assert attrs(sql[2])["agent.tool.queue.duration"] >= 0.2
    threaded = by_submission([s for s in found if attrs(s)["agent.tool.executor"] == "asyncio-default"])
    assert len(threaded) == 2
    for call, span in zip((10, 11), threaded):  # gather starts its tasks in order
        assert_measured(span, *body[call])


def test_executor_gauges_while_saturated(agent, metric):
    release = threading.Event()
    pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="busy")
    futures = [pool.submit(release.wait) for _ in range(3)]
    queued_tool = pool.submit(lookup, 9)
    deadline = time.monotonic() + 5
    while metric("agent_executor_active_workers", {"executor": "busy"}) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert metric("agent_executor_queue_depth", {"executor": "busy"}) == 3
    assert metric("agent_executor_max_workers", {"executor": "busy"}) == 1
    assert metric("agent_tool_inflight", {"tool": "lookup", "phase": "queue"}) == 1
    release.set()
    for f in futures + [queued_tool]:
        f.result()
    pool.shutdown()
    assert metric("agent_executor_queue_depth", {"executor": "busy"}) == 0
    assert metric("agent_executor_active_workers", {"executor": "busy"}) == 0
    assert metric("agent_tool_inflight", {"tool": "lookup", "phase": "queue"}) == 0


def test_cancelled_before_start_is_a_cancelled_span(agent, spans, metric):
    release = threading.Event()
    pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="q")
    running = pool.submit(release.wait)
    waiting = pool.submit(lookup, 5)
    assert waiting.cancel()
    release.set()
    running.result()
    pool.shutdown()
    (span,) = spans.tools("lookup")
    assert attrs(span)["agent.tool.outcome"] == "cancelled"
    assert attrs(span)["agent.tool.exec.duration"] == 0.0
    assert agent.recorder.inflight == {}
    assert metric("agent_executor_queue_depth", {"executor": "q"}) == 0


def test_uninstrument_restores_submit_exactly(spans):
    original = cf.ThreadPoolExecutor.submit
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    assert cf.ThreadPoolExecutor.submit is not original
    agent_otel.uninstrument()
    assert cf.ThreadPoolExecutor.submit is original
    with cf.ThreadPoolExecutor(1) as pool:
        assert pool.submit(lookup, 4).result() == 4
    assert spans.tools() == []


def wait_for_a_busy_worker(metric, executor: str) -> None:
    """Until the pool's one worker has taken its first call off the queue (when it
    gets a core: on a busy machine, later than the submission), at most 5 s."""
    deadline = time.monotonic() + 5
    while metric("agent_executor_active_workers", {"executor": executor}) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_cancelled_plain_submissions_leave_the_queue(agent, metric):
    release = threading.Event()
    pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="plain")
    running = pool.submit(release.wait)
    waiting = [pool.submit(time.sleep, 0) for _ in range(3)]
    wait_for_a_busy_worker(metric, "plain")
    assert metric("agent_executor_queue_depth", {"executor": "plain"}) == 3
    assert all(f.cancel() for f in waiting)
    assert metric("agent_executor_queue_depth", {"executor": "plain"}) == 0
    release.set()
    running.result()
    pool.shutdown()
    assert metric("agent_executor_active_workers", {"executor": "plain"}) == 0


def test_unnamed_pools_share_one_stable_label(agent, spans, metric):
    for _ in range(3):  # a pool per request, as some agents do
        with cf.ThreadPoolExecutor(1) as pool:
            pool.submit(lookup, 1).result()
    assert {attrs(s)["agent.tool.executor"] for s in spans.tools("lookup")} == {"ThreadPoolExecutor"}
    assert metric("agent_executor_wait_seconds_count", {"executor": "ThreadPoolExecutor"}) == 3


def test_pool_used_before_a_reinstrument_keeps_its_gauges(spans):
    pool = cf.ThreadPoolExecutor(max_workers=3, thread_name_prefix="long_lived")
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    pool.submit(time.sleep, 0).result()
    agent_otel.uninstrument()
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:
        pool.submit(time.sleep, 0).result()
        registry = handle.metrics.registry
        assert registry.get_sample_value("agent_executor_max_workers", {"executor": "long_lived"}) == 3
    finally:
        agent_otel.uninstrument()
        pool.shutdown()


def test_a_future_cancelled_twice_or_by_shutdown_leaves_the_queue_once(agent, metric):
    # Future.cancel returns True again on a cancelled future: the submission is withdrawn once.
    release = threading.Event()
    pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="twice")
    running = pool.submit(release.wait)
    waiting = [pool.submit(time.sleep, 0) for _ in range(4)]
    wait_for_a_busy_worker(metric, "twice")
    assert waiting[0].cancel() and waiting[0].cancel()
    assert metric("agent_executor_queue_depth", {"executor": "twice"}) == 3
    pool.shutdown(wait=False, cancel_futures=True)  # cancels the other three
    assert metric("agent_executor_queue_depth", {"executor": "twice"}) == 0
    release.set()
    running.result()
    pool.shutdown()
    assert metric("agent_executor_active_workers", {"executor": "twice"}) == 0
    assert metric("agent_executor_queue_depth", {"executor": "twice"}) == 0


def test_uninstrument_restores_future_cancel_exactly(spans):
    original = cf.Future.cancel
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    assert cf.Future.cancel is not original
    agent_otel.uninstrument()
    assert cf.Future.cancel is original


def test_waits_fall_in_the_buckets_of_their_seconds():
    import bisect
    import collections

    from agent_otel.exporters.prometheus import Metrics

    metrics = Metrics()
    bounds = metrics.executor_wait.bounds
    edges = [int(b * 1e9) + d for b in bounds for d in (-1, 0, 1)]
    waits = [0, 1, 7_000, 10**12] + edges
    with metrics.lock:
        metrics.observe_waits([("edges", collections.deque(waits))])
    counts, total = metrics.executor_wait.children[("edges",)][:2]
    expected = [0] * (len(bounds) + 1)
    for wait in waits:
        expected[bisect.bisect_left(bounds, wait / 1e9)] += 1
    assert counts == expected
    assert total == pytest.approx(sum(waits) / 1e9)
