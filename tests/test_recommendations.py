"""Each recommendation fires on a run built to need it, with the numbers
that justify it, and stays silent on a healthy run."""

from __future__ import annotations

import heapq

import pytest

from agent_otel.report.analysis import analyse, report_json
from agent_otel.report.recommendations import KINDS, SUPERSEDES, candidates
from helpers.traces import RecordedRun, write_gpu_csv


def run_pool(
    run: RecordedRun,
    requests,
    *,
    workers: int,
    executor: str,
    timeout: float | None = None,
    sized: bool = False,
    stretch: float = 1.0,
) -> None:
    """Record calls as a FIFO thread pool of ``workers`` would run them:
    ``requests`` is (tool, submitted at, seconds of work); ``sized``: the
    spans carry the pool's size; ``stretch``: each call's work takes that
    many times longer (a saturated backend)."""
    free_at = [0.0] * workers
    for tool, submit, work in sorted(requests, key=lambda r: r[1]):
        start = max(submit, heapq.heappop(free_at))
        heapq.heappush(free_at, start + work * stretch)
        run.tool_call(
            tool,
            submit,
            start,
            start + work * stretch,
            executor=executor,
            timeout=timeout,
            workers=workers if sized else None,
        )


def queue_burst(run, at=0.0):
    """A 2-worker pool "crawl": 10 calls of 1 s spaced out, then a burst of 8
    at once (1 ms apart) that queues 6 deep, three times its workers."""
    spaced = [("crawl", at + 2.0 * k, 1.0) for k in range(10)]
    burst = [("crawl", at + 25.0 + 0.001 * k, 1.0) for k in range(8)]
    run_pool(run, spaced + burst, workers=2, executor="crawl", sized=True)


def more_workers_more_queueing(run, at=0.0):
    """A pool "db" of 2 workers, then of 8: with 8 each call ran 3x longer
    (the database is the limit) and the calls queued longer, not shorter."""
    run_pool(run, [("query", at + 0.3 * k, 0.1) for k in range(12)], workers=2, executor="db", sized=True)
    bursts = [("query", at + 10.0 + 1.0 * b + 0.01 * k, 0.1) for b in range(3) for k in range(12)]
    run_pool(run, bursts, workers=8, executor="db", sized=True, stretch=3.0)


def recommendations(tmp_path, record, gpu_samples=None) -> list[dict]:
    run = RecordedRun(tmp_path / "traces.jsonl")
    record(run)
    run.close()
    logs = []
    if gpu_samples is not None:
        write_gpu_csv(tmp_path / "gpu.csv", gpu_samples)
        logs = [str(tmp_path / "gpu.csv")]
    analysis = analyse([str(tmp_path / "traces.jsonl")], logs, tz="UTC", idle_threshold=0.1, min_idle_s=0.5)
    return report_json(analysis)["recommendations"]


def of_kind(found: list[dict], kind: str) -> list[dict]:
    return [r for r in found if r["kind"] == kind]


def test_a_healthy_run_gets_no_recommendations(tmp_path):
    def record(run):
        run.agent_run(0.0, 12.0)
        # a pool with room to spare, calls spread out, one short GPU stall
        # while a tool call really was running
        run_pool(run, [("lookup", k * 0.35, 0.1) for k in range(30)], workers=4, executor="io", timeout=0.3)
        run.tool_call("generate_plan", 4.0, 4.0, 5.0, executor="direct")

    gpu = [(k / 10, 0, 2 if 40 < k <= 48 else 80) for k in range(120)]
    assert recommendations(tmp_path, record, gpu) == []


def test_a_saturated_pool_gets_more_workers(tmp_path):
    def record(run):
        # 30 searches submitted together to a pool of 2 workers
        run_pool(run, [("web_search", 0.001 * k, 0.2) for k in range(30)], workers=2, executor="io")

    (found,) = of_kind(recommendations(tmp_path, record), "raise_pool_workers")
    assert found["subject"] == "io"
    evidence = found["evidence"]
    assert evidence["max_concurrent_exec"] == 2
    assert evidence["peak_in_flight"] == 30
    assert evidence["suggested_workers"] == 30
    assert evidence["max_queue_depth"] == 28
    assert evidence["queue_share"] > 0.8
    assert evidence["most_waiting_tool"] == "web_search"
    assert found["message"].startswith('pool="io" with 30 workers')
    # the contract's keys, plus the code that applies it and where the docs explain it
    assert set(found) == {"kind", "subject", "message", "evidence", "remedy", "docs"}
    assert found["remedy"] == 'agent_otel.pool("io", workers=30)\n@agent_otel.tool(pool="io")'
    assert found["docs"] == "docs/remedies.md#pools"


def test_queueing_without_more_calls_in_flight_than_ran_is_not_the_pools_size(tmp_path):
    def record(run):
        # every call waits 0.3 s, but never more than one is in flight:
        # the workers were busy with something the traces do not show
        for k in range(30):
            run.tool_call("web_search", k * 0.5, k * 0.5 + 0.3, k * 0.5 + 0.35, executor="io")

    assert of_kind(recommendations(tmp_path, record), "raise_pool_workers") == []


def test_a_timeout_far_above_p99_is_tightened(tmp_path):
    def record(run):
        for k in range(40):
            run.tool_call("lookup", k, k, k + 0.1 + 0.01 * (k % 5), executor="direct", timeout=30.0)

    (found,) = of_kind(recommendations(tmp_path, record), "set_timeout")
    assert found["subject"] == "lookup"
    assert found["evidence"]["timeout_s"] == 30.0
    assert found["evidence"]["duration_p99_s"] == pytest.approx(0.14)
    assert found["evidence"]["suggested_timeout_s"] == 0.28
    assert found["evidence"]["calls_over_suggested"] == 0
    assert "timeout=0.28 s from p99 0.14 s" in found["message"]
    assert found["remedy"] == "@agent_otel.tool(timeout=0.28, retries=1, fallback=...)"


@pytest.mark.parametrize("timeout", [None, 0.5])
def test_no_timeout_advice_without_a_known_or_a_loose_timeout(tmp_path, timeout):
    def record(run):
        for k in range(40):
            run.tool_call("lookup", k, k, k + 0.1 + 0.01 * (k % 5), executor="direct", timeout=timeout)

    assert of_kind(recommendations(tmp_path, record), "set_timeout") == []


def test_a_slow_tool_sharing_a_pool_with_fast_ones_is_isolated(tmp_path):
    def record(run):
        slow = [("render_pdf", k * 1.0, 2.0) for k in range(10)]
        fast = [("lookup", k * 0.17, 0.02) for k in range(60)]
        run_pool(run, slow + fast, workers=2, executor="shared")

    (found,) = of_kind(recommendations(tmp_path, record), "isolate_tool")
    assert found["subject"] == "render_pdf"
    evidence = found["evidence"]
    assert evidence["executor"] == "shared"
    assert evidence["exec_p50_s"] == pytest.approx(2.0)
    assert evidence["other_tools_exec_p50_s"] == pytest.approx(0.02)
    assert evidence["worker_time_share"] > 0.9
    assert evidence["other_tools_wait_p95_s"] > evidence["other_tools_exec_p95_s"]
    assert found["message"].startswith('give tool="render_pdf" its own pool with 2 workers')


def test_a_slow_tool_in_a_roomy_pool_is_left_alone(tmp_path):
    def record(run):
        slow = [("render_pdf", k * 1.0, 2.0) for k in range(10)]
        fast = [("lookup", k * 0.17, 0.02) for k in range(60)]
        run_pool(run, slow + fast, workers=8, executor="shared")

    assert of_kind(recommendations(tmp_path, record), "isolate_tool") == []


def test_bursts_of_one_tool_are_batched(tmp_path):
    def record(run):
        for burst in range(5):
            for k in range(6):
                submit = burst * 1.0 + k * 0.005
                run.tool_call("get_embedding", submit, submit, submit + 0.05, executor="direct")
        run.tool_call("get_embedding", 7.0, 7.0, 7.05, executor="direct")

    (found,) = of_kind(recommendations(tmp_path, record), "batch_calls")
    assert found["subject"] == "get_embedding"
    assert found["evidence"] == {
        "tool": "get_embedding",
        "calls": 31,
        "bursts": 5,
        "calls_in_bursts": 30,
        "largest_burst": 6,
        "median_burst": 6,
        "burst_gap_s": 0.05,
        "calls_saved": 25,
        # the window from the p50: a tenth of its 0.05 s, 5 ms, joins the first two of each burst (5 ms apart)
        "duration_p50_s": 0.05,
        "window_p50_share": 0.1,
        "suggested_window_s": 0.005,
        "calls_joined_by_window": 10,
    }
    assert (
        "A window of 5 ms, 10% of its p50 of 0.05 s (a lone call waits that long), joins 10 of the 30"
        in found["message"]
    )
    assert found["remedy"] == "@agent_otel.batch(max_size=6, window_ms=5)"


def test_a_queue_deeper_than_twice_the_workers_gets_a_bound_and_caller_runs(tmp_path):
    (found,) = of_kind(recommendations(tmp_path, queue_burst), "bound_queue")
    evidence = found["evidence"]
    assert found["subject"] == "crawl"
    assert evidence["workers"] == 2 and evidence["max_queue_depth"] == 6
    assert evidence["suggested_queue_limit"] == 4 and evidence["queue_limit_per_worker"] == 2
    # the 7th and 8th of the burst found 6 and 7 outstanding (2 running, 4 queued): they run in the caller
    assert evidence["calls_caller_runs"] == 2
    assert "at about twice its 2 workers, then caller-runs" in found["message"]
    assert found["remedy"] == (
        'agent_otel.pool("crawl", workers=2, queue_limit=4, rejection="caller_runs")\n@agent_otel.tool(pool="crawl")'
    )


def test_a_pool_that_queues_all_along_gets_more_workers_not_a_bound(tmp_path):
    def record(run):  # 30 calls of 1 s at once on 2 workers: most of their time queued
        run_pool(run, [("crawl", 0.001 * k, 1.0) for k in range(30)], workers=2, executor="crawl", sized=True)

    found = recommendations(tmp_path, record)
    assert [r["subject"] for r in of_kind(found, "raise_pool_workers")] == ["crawl"]
    assert of_kind(found, "bound_queue") == []  # with a worker per call in flight the queue does not grow


def test_more_workers_that_made_queueing_worse_gets_fewer_workers(tmp_path):
    found = recommendations(tmp_path, more_workers_more_queueing)
    (advice,) = of_kind(found, "fewer_workers")
    evidence = advice["evidence"]
    assert advice["subject"] == "db"
    assert (evidence["workers_before"], evidence["workers_after"]) == (2, 8)
    assert (evidence["calls_before"], evidence["calls_after"]) == (12, 36)
    assert evidence["wait_p95_before_s"] < 0.01 < 0.1 < evidence["wait_p95_after_s"]
    assert evidence["exec_p50_before_s"] == pytest.approx(0.1) and evidence["exec_p50_after_s"] == pytest.approx(0.3)
    assert "Raising concurrency made queueing worse: go back to 2 workers" in advice["message"]
    assert advice["remedy"].startswith('agent_otel.pool("db", workers=2, queue_limit=4, rejection="caller_runs")')
    assert of_kind(found, "raise_pool_workers") == []  # not more of them


def test_more_workers_that_cut_the_queue_are_left_alone(tmp_path):
    def record(run):
        run_pool(run, [("query", 0.05 * k, 0.1) for k in range(24)], workers=2, executor="db", sized=True)
        run_pool(run, [("query", 10.0 + 0.05 * k, 0.1) for k in range(24)], workers=8, executor="db", sized=True)

    assert of_kind(recommendations(tmp_path, record), "fewer_workers") == []


def test_spaced_out_calls_are_not_bursts(tmp_path):
    def record(run):
        for k in range(30):
            run.tool_call("get_embedding", k * 0.2, k * 0.2, k * 0.2 + 0.05, executor="direct")

    assert of_kind(recommendations(tmp_path, record), "batch_calls") == []


def test_gpu_idle_with_no_tool_in_flight_points_elsewhere(tmp_path):
    def record(run):
        run.agent_run(0.0, 10.0)
        run.tool_call("web_search", 1.0, 1.0, 2.5, executor="direct")

    gpu = [(k / 10, 0, 1 if 20 < k <= 80 else 90) for k in range(100)]
    (found,) = of_kind(recommendations(tmp_path, record, gpu), "idle_not_tools")
    assert found["subject"] == "0"
    assert found["evidence"]["idle_s"] == pytest.approx(6.0)
    assert found["evidence"]["idle_unattributed_s"] == pytest.approx(5.5)
    assert found["evidence"]["unattributed_share"] == pytest.approx(5.5 / 6, abs=1e-4)
    assert "the stall is elsewhere" in found["message"]
    assert found["remedy"] is None  # no tool setting fixes it


def test_gpu_idle_while_tools_run_is_the_tools(tmp_path):
    def record(run):
        run.agent_run(0.0, 10.0)
        run.tool_call("web_search", 1.0, 1.0, 8.5, executor="direct")

    gpu = [(k / 10, 0, 1 if 20 < k <= 80 else 90) for k in range(100)]
    assert of_kind(recommendations(tmp_path, record, gpu), "idle_not_tools") == []


# -- the article's cases (issue 13 item 4) --------------------------------------------------------


def tail_calls(run, tool, at=0.0, *, parent=None, n=40, executor="direct"):
    """``n`` calls of ``tool``, one a second from ``at``: 0.1 s each, every tenth 1.0 s (a long tail)."""
    for k in range(n):
        seconds = 1.0 if k % 10 == 9 else 0.1
        run.tool_call(tool, at + k, at + k, at + k + seconds, executor=executor, parent=parent)


def test_a_long_tail_without_a_timeout_gets_one_at_twice_p99(tmp_path):
    (found,) = of_kind(recommendations(tmp_path, lambda run: tail_calls(run, "geocode")), "set_timeout")
    evidence = found["evidence"]
    assert evidence["timeout_s"] is None
    assert evidence["duration_p50_s"] == pytest.approx(0.1)
    assert evidence["duration_p99_s"] == pytest.approx(1.0)
    assert evidence["timeout_factor"] == 2.0 and evidence["middle_tier"] is False
    assert evidence["suggested_timeout_s"] == 2.0
    assert "it has no timeout and a long tail (p99 10.0x its p50 of 0.1 s over 40 calls)" in found["message"]
    assert found["remedy"] == "@agent_otel.tool(timeout=2, retries=1, fallback=...)"


def test_the_timeout_comes_from_the_healthy_calls_and_says_how_many_it_would_cut(tmp_path):
    def record(run):
        # 120 calls: 0.1 s, every tenth 1.0 s (the healthy tail); 6 of them (5 %)
        # hang for 30 s, and 2 more time out (the tool's own 60 s timeout fired).
        for k in range(120):
            seconds = 30.0 if k % 20 == 7 else 1.0 if k % 10 == 9 else 0.1
            run.tool_call("geocode", 40.0 * k, 40.0 * k, 40.0 * k + seconds, executor="direct")
        for k in range(2):
            run.tool_call(
                "geocode", 5000.0 + 70 * k, 5000.0 + 70 * k, 5060.0 + 70 * k, executor="direct", outcome="timeout"
            )

    (found,) = of_kind(recommendations(tmp_path, record), "set_timeout")
    evidence = found["evidence"]
    assert evidence["calls"] == 122
    assert evidence["healthy_calls"] == 114 and evidence["unhealthy_calls"] == 8
    assert evidence["duration_p99_s"] == pytest.approx(1.0)  # not 30 s: the hung calls are no measure
    assert evidence["suggested_timeout_s"] == 2.0
    assert evidence["calls_over_suggested"] == 8  # it would have cut the 6 hung calls and the 2 timed out
    assert (
        "from p99 1 s of its 114 healthy calls (8 left out: timed out, cancelled, cut by its timeout"
        in found["message"]
    )
    assert "it would have cut 8 of its 122 calls" in found["message"]


def test_a_tool_called_inside_another_tools_call_gets_the_middle_tier_timeout(tmp_path):
    def record(run):
        outer = run.tool_call("plan", 0.0, 0.0, 50.0, executor="direct")
        tail_calls(run, "geocode", 1.0, parent=outer, executor="io")

    (found,) = of_kind(recommendations(tmp_path, record), "set_timeout")
    assert found["subject"] == "geocode"
    assert found["evidence"]["middle_tier"] is True
    assert found["evidence"]["timeout_factor"] == 1.5
    assert found["evidence"]["suggested_timeout_s"] == 1.5  # 1.5 x p99 1.0 s: it fires before its caller's
    assert "called from inside another tool's call" in found["message"]
    assert found["remedy"] == "@agent_otel.tool(timeout=1.5, retries=1, fallback=...)"


def test_a_short_tail_without_a_timeout_gets_no_timeout_advice(tmp_path):
    def record(run):
        for k in range(40):  # p99 1.4x p50
            run.tool_call("lookup", k, k, k + 0.1 + 0.01 * (k % 5), executor="direct")

    assert of_kind(recommendations(tmp_path, record), "set_timeout") == []


def pooled_recommendations(tmp_path, requests, *, workers, cpus, cpu_share=None):
    run = RecordedRun(tmp_path / "traces.jsonl", cpus=cpus)
    free_at = [0.0] * workers
    for tool, submit, work in sorted(requests, key=lambda r: r[1]):
        start = max(submit, heapq.heappop(free_at))
        heapq.heappush(free_at, start + work)
        cpu = None if cpu_share is None else work * cpu_share
        run.tool_call(tool, submit, start, start + work, executor="shared", cpu=cpu)
    run.close()
    analysis = analyse([str(tmp_path / "traces.jsonl")], [], idle_threshold=0.1, min_idle_s=0.5)
    return report_json(analysis)["recommendations"]


def test_io_workers_are_capped_at_four_per_core_and_the_pool_split(tmp_path):
    # 30 searches and 30 lookups submitted at once to 2 workers, on a 2-core agent: 60 in flight
    requests = [("web_search", 0.001 * k, 0.2) for k in range(30)] + [
        ("lookup", 0.0005 + 0.001 * k, 0.2) for k in range(30)
    ]
    (found,) = of_kind(
        pooled_recommendations(tmp_path, requests, workers=2, cpus=2, cpu_share=0.01), "raise_pool_workers"
    )
    evidence = found["evidence"]
    assert evidence["peak_in_flight"] == 60
    assert evidence["cores"] == 2 and evidence["cpu_bound"] is False
    assert evidence["worker_cap"] == 8
    assert evidence["suggested_workers"] == 8
    assert evidence["split_tool"] in ("web_search", "lookup")
    assert evidence["split_tool_workers"] == 8
    assert found["message"].startswith('pool="shared" with 8 workers, not 60:')
    assert "past 8 workers (4 x 2 cores for I/O) more threads make p99 worse" in found["message"]
    assert "Rather than one giant pool, split the pool" in found["message"]
    assert found["remedy"] == (
        'agent_otel.pool("shared", workers=8)\n@agent_otel.tool(pool="shared")\n'
        f'agent_otel.pool("{evidence["split_tool"]}", workers=8)\n@agent_otel.tool(pool="{evidence["split_tool"]}")'
    )


def test_cpu_bound_workers_are_capped_at_the_core_count_in_processes(tmp_path):
    requests = [("parse", 0.001 * k, 0.2) for k in range(30)]
    (found,) = of_kind(
        pooled_recommendations(tmp_path, requests, workers=2, cpus=4, cpu_share=0.95), "raise_pool_workers"
    )
    evidence = found["evidence"]
    assert evidence["cpu_bound"] is True
    assert evidence["worker_cap"] == 4 and evidence["suggested_workers"] == 4
    assert evidence["split_tool"] is None  # one tool: no pool to split it from
    assert "about the core count (4) for CPU-bound calls" in found["message"]
    assert found["remedy"].startswith('agent_otel.pool("shared", workers=4, kind="cpu", processes=True)')


def test_without_the_core_count_workers_stop_at_the_thread_ceiling(tmp_path):
    requests = [("web_search", 0.0001 * k, 0.5) for k in range(300)]
    (found,) = of_kind(pooled_recommendations(tmp_path, requests, workers=2, cpus=None), "raise_pool_workers")
    assert found["evidence"]["cores"] is None
    assert found["evidence"]["peak_in_flight"] == 300
    assert found["evidence"]["suggested_workers"] == 200
    assert "core count is unknown" in found["message"]


def test_a_sequential_loop_is_not_batched(tmp_path):
    def record(run):
        turn = run.invoke_agent("research", 0.0, 10.0)
        for burst in range(5):  # one caller, each call after the previous answered: nothing to batch
            for k in range(6):
                start = burst * 1.0 + k * 0.011
                run.tool_call("get_embedding", start, start, start + 0.01, executor="direct", parent=turn)

    assert of_kind(recommendations(tmp_path, record), "batch_calls") == []


def test_calls_from_concurrent_turns_within_the_window_are_batched(tmp_path):
    def record(run):
        for burst in range(4):  # each call from its own turn (trace), answered before the next arrives
            for k in range(5):
                start = burst * 1.0 + k * 0.02
                run.tool_call("get_embedding", start, start, start + 0.01, executor="io")

    (found,) = of_kind(recommendations(tmp_path, record), "batch_calls")
    assert found["evidence"]["bursts"] == 4 and found["evidence"]["calls_in_bursts"] == 20
    assert "bursts of concurrent calls" in found["message"]


def idle_gpu(*stalls):
    """GPU samples every 0.1 s over 0..20 s: 90% busy, 1% during the ``stalls`` ((start, end) seconds)."""
    return [(k / 10, 0, 1 if any(a * 10 < k <= b * 10 for a, b in stalls) else 90) for k in range(200)]


def test_a_direct_call_blamed_while_executing_is_offloaded_or_bounded(tmp_path):
    def record(run):
        run.agent_run(0.0, 20.0)
        for k in range(3):  # a coroutine tool, say: no CPU time, so no kind of wait
            run.tool_call("classify", 2.0 + 5 * k, 2.0 + 5 * k, 3.0 + 5 * k, executor="direct")

    found = recommendations(tmp_path, record, idle_gpu((2, 3), (7, 8), (12, 13)))
    (advice,) = of_kind(found, "offload_or_bound")
    assert advice["subject"] == "classify"
    assert advice["evidence"]["gpu_idle_blocked_exec_s"] == pytest.approx(3.0, abs=0.1)
    assert advice["evidence"]["suggested_timeout_s"] is None  # 3 calls tell no p99
    assert advice["message"].startswith('offload tool="classify" or bound it: all 3 of its calls ran in')
    assert "a timeout near 2x its p99 (its 3 calls are too few to tell a p99)" in advice["message"]
    assert advice["remedy"].startswith('agent_otel.pool("classify")\n@agent_otel.tool(pool="classify")')
    assert advice["docs"] == "docs/remedies.md#calling-from-async-code"


def test_a_direct_io_call_gets_the_advice_for_its_kind_and_one_timeout(tmp_path):
    def record(run):
        run.agent_run(0.0, 20.0)
        tail = [1.0 if k % 10 == 9 else 0.1 for k in range(30)]
        at = 0.0
        for seconds in tail:  # waits on I/O: 1% CPU
            run.tool_call("fetch", at, at, at + seconds, executor="direct", cpu=0.01 * seconds)
            at += seconds + 0.5

    samples = [(k / 10, 0, 90) for k in range(300)]
    run_samples = []
    # the GPU idles through the long calls
    starts = []
    at = 0.0
    for k in range(30):
        seconds = 1.0 if k % 10 == 9 else 0.1
        if seconds == 1.0:
            starts.append((at, at + seconds))
        at += seconds + 0.5
    run_samples = [(t, g, 1 if any(a < t <= b for a, b in starts) else u) for t, g, u in samples]
    found = recommendations(tmp_path, record, run_samples)
    kinds = {r["kind"] for r in found if r["subject"] == "fetch"}
    assert "use_async_io" in kinds and "offload_or_bound" not in kinds  # the same offload, said for its kind
    (timeout,) = of_kind(found, "set_timeout")
    assert timeout["evidence"]["suggested_timeout_s"] == 2.0


def retrying_calls(run, tool, at, *, waits, calls=3, parent_kwargs=None):
    """``calls`` calls of ``tool`` whose HTTP client timed out (1 s) once per wait, then answered."""
    for c in range(calls):
        start = at + 20 * c
        t = start
        attempts = []
        for wait in waits:
            attempts.append((t, t + 1.0))
            t += 1.0 + wait
        end = t + 0.2
        call = run.tool_call(tool, start, start, end, executor="direct")
        for a, b in attempts:
            run.child_span(call, "GET /quote", a, b, error=True)
        run.child_span(call, "GET /quote", t, end)


def test_retries_with_back_off_inside_a_plain_tool_are_flagged(tmp_path):
    found = recommendations(tmp_path, lambda run: retrying_calls(run, "quote", 0.0, waits=(0.1, 0.4, 1.6)))
    (advice,) = of_kind(found, "hidden_retries")
    evidence = advice["evidence"]
    assert evidence["calls_with_failures"] == 3 and evidence["failures"] == 9
    assert evidence["failed_child_spans"] == 9 and evidence["failed_child_names"] == ["GET /quote"]
    assert evidence["failed_attempts_s"] == pytest.approx(3 * 3.5)  # from exec start to the last failure
    assert evidence["backoff_calls"] == 3
    assert evidence["backoff_waits_s"] == pytest.approx([0.1, 0.4])
    assert "the waits between failed attempts grew (0.1, 0.4 s): a back-off" in advice["message"]
    assert "a fixed interval, because the GPU is waiting for this answer" in advice["message"]
    assert advice["remedy"] == "@agent_otel.tool(timeout=..., retries=1, retry_interval=0.1, fallback=...)"
    assert advice["docs"] == "docs/remedies.md#timeouts"


def test_retries_seen_only_as_exception_events_are_flagged_too(tmp_path):
    def record(run):
        for c in range(4):
            start = 10.0 * c
            run.tool_call("search", start, start, start + 2.5, executor="io", exceptions=(start + 1.0, start + 2.0))

    (advice,) = of_kind(recommendations(tmp_path, record), "hidden_retries")
    assert advice["evidence"]["exception_events"] == 8 and advice["evidence"]["failed_child_spans"] == 0
    assert advice["evidence"]["failed_attempts_s"] == pytest.approx(8.0)
    assert advice["evidence"]["backoff_calls"] == 0  # one wait per call: no growth to see
    assert "8 exception events on its spans" in advice["message"]


def test_a_failed_nested_tool_call_retried_with_back_off_is_a_hidden_retry(tmp_path):
    def record(run):
        # A plain tool whose code calls another @agent_otel.tool and, when it
        # fails, calls it again after 0.1 s, then 0.2 s (a back-off).
        for c in range(3):
            start = 20.0 * c
            outer = run.tool_call("plan_trip", start, start, start + 2.5, executor="direct")
            t = start
            for wait, outcome in ((0.1, "timeout"), (0.2, "error"), (None, "ok")):
                run.tool_call("fetch_quote", t, t, t + 0.6, executor="direct", outcome=outcome, parent=outer)
                t += 0.6 + (wait or 0.0)
            # a failed call of another tool that nothing retried: no retry
            run.tool_call("geocode", t, t, t + 0.1, executor="direct", outcome="error", parent=outer)

    (advice,) = of_kind(recommendations(tmp_path, record), "hidden_retries")
    evidence = advice["evidence"]
    assert advice["subject"] == "plan_trip"
    assert evidence["calls_with_failures"] == 3 and evidence["failures"] == 6
    assert evidence["failed_child_spans"] == 6 and evidence["failed_child_names"] == ["fetch_quote"]
    assert evidence["backoff_calls"] == 3
    assert evidence["backoff_waits_s"] == pytest.approx([0.1, 0.2])
    assert "the waits between failed attempts grew (0.1, 0.2 s): a back-off" in advice["message"]


def test_failures_the_toolkit_retried_are_not_hidden_retries(tmp_path):
    def record(run):
        for c in range(4):
            start = 10.0 * c
            call = run.tool_call("quote", start, start, start + 2.5, executor="default", retries=1)
            run.child_span(call, "GET /quote", start, start + 2.0, error=True)

    assert of_kind(recommendations(tmp_path, record), "hidden_retries") == []


def every_trigger(run):
    """One run with each rule's trigger, and the overlaps that made rules contradict each other.

    0-55 s, GPU busy: pool sizes, timeouts, batching, retries. 60-100 s: direct calls
    that hold the GPU idle. 100-130 s: the GPU idle with no call in flight. 130-155 s:
    a tool during which the GPU runs at 30%."""
    run_pool(run, [("web_search", 0.001 * k, 0.2) for k in range(30)], workers=2, executor="io")
    slow = [("render_pdf", k * 1.0, 2.0) for k in range(10)]
    fast = [("lookup_fast", k * 0.17, 0.02) for k in range(60)]
    run_pool(run, slow + fast, workers=2, executor="shared")  # isolate render_pdf; its queue would raise "shared"
    for k in range(40):
        run.tool_call("lookup", k * 0.5, k * 0.5, k * 0.5 + 0.1 + 0.01 * (k % 5), executor="direct", timeout=30.0)
    tail_calls(run, "geocode", 5.0)
    for burst in range(5):
        for k in range(6):
            submit = 20.0 + burst * 1.0 + k * 0.005
            run.tool_call("get_embedding", submit, submit, submit + 0.05, executor="direct")
    retrying_calls(run, "quote", 0.5, waits=(0.1, 0.4, 1.6))  # 0.5, 20.5, 40.5
    # 60-100 s, the GPU idles (util 1%) during each of these direct calls
    for k in range(3):
        crm = run.tool_call("crm", 60.0 + k * 3, 60.0 + k * 3, 61.0 + k * 3, executor="direct", cpu=0.01)
        run.loop_block(60.0 + k * 3, 61.0 + k * 3, blocker=crm)  # blocks the event loop: offload, not the rest
        run.tool_call("fetch", 70.0 + k * 3, 70.0 + k * 3, 71.0 + k * 3, executor="direct", cpu=0.01)
        run.tool_call("render", 80.0 + k * 3, 80.0 + k * 3, 81.0 + k * 3, executor="direct", cpu=0.95)
        run.tool_call("classify", 90.0 + k * 3, 90.0 + k * 3, 91.0 + k * 3, executor="direct")
    for k in range(10):
        run.tool_call("search_docs", 130.0 + 2.5 * k, 130.0 + 2.5 * k, 132.0 + 2.5 * k, executor="docs")
    run.agent_run(0.0, 160.0)
    queue_burst(run, 200.0)
    more_workers_more_queueing(run, 300.0)


def every_trigger_gpu():
    stalls = [(60.0 + k * 3 + d, 61.0 + k * 3 + d) for k in range(3) for d in (0, 10, 20, 30)] + [(100.0, 130.0)]
    samples = []
    for k in range(1600):
        t = k / 10
        if any(a < t <= b for a, b in stalls):
            utilization = 1
        elif any(130.0 + 2.5 * j < t <= 132.0 + 2.5 * j for j in range(10)):
            utilization = 30
        else:
            utilization = 98
        samples.append((t, 0, utilization))
    return samples


EXPECTED = {
    ("raise_pool_workers", "io"),
    ("isolate_tool", "render_pdf"),
    ("set_timeout", "lookup"),
    ("set_timeout", "geocode"),
    ("batch_calls", "get_embedding"),
    ("hidden_retries", "quote"),
    ("offload_from_loop", "crm"),
    ("use_async_io", "fetch"),
    ("use_process_pool", "render"),
    ("offload_or_bound", "classify"),
    ("idle_not_tools", "0"),
    ("overlap_tool_with_gpu", "search_docs"),
    ("bound_queue", "crawl"),
    ("fewer_workers", "db"),
    ("batch_calls", "query"),  # its bursts of 12 concurrent calls 10 ms apart batch too
}


def test_every_rule_fires_on_its_trigger_and_none_contradicts_another(tmp_path):
    run = RecordedRun(tmp_path / "traces.jsonl")
    every_trigger(run)
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", every_trigger_gpu())
    analysis = analyse(
        [str(tmp_path / "traces.jsonl")], [str(tmp_path / "gpu.csv")], tz="UTC", idle_threshold=0.1, min_idle_s=0.5
    )
    found = {(rec.kind, rec.subject) for rec in analysis.recommendations}
    assert found == EXPECTED
    assert {kind for kind, _ in found} == set(KINDS)  # every rule, once at least

    # Before resolving, rules that contradict each other fired together; after, none does.
    raw = candidates(analysis)
    raw_keys = {(rec.kind, rec.subject) for rec in raw}
    assert {
        ("raise_pool_workers", "shared"),  # isolate the slow tool, or raise the shared pool?
        ("use_async_io", "crm"),
        ("offload_or_bound", "crm"),
        ("offload_or_bound", "fetch"),
        ("offload_or_bound", "render"),
    } <= raw_keys - found
    for winner, loser, scope in SUPERSEDES:
        key = "executor" if scope == "pool" else "tool"
        winners = {rec.evidence.get(key) for rec in analysis.recommendations if rec.kind == winner}
        assert not any(rec.kind == loser and rec.evidence.get(key) in winners for rec in analysis.recommendations), (
            winner,
            loser,
        )
    # one timeout per tool, whichever rule says it
    timeouts: dict[str, set] = {}
    for rec in raw:
        if rec.evidence.get("suggested_timeout_s") is not None:
            timeouts.setdefault(rec.evidence["tool"], set()).add(rec.evidence["suggested_timeout_s"])
    assert all(len(values) == 1 for values in timeouts.values()), timeouts


def test_the_retry_advice_times_each_attempt_from_the_calls_with_no_failure_inside(tmp_path):
    def record(run):
        for k in range(25):  # answered first time: 0.1 .. 0.196 s
            run.tool_call("quote", 100.0 + k, 100.0 + k, 100.1 + k + 0.004 * k, executor="direct")
        retrying_calls(run, "quote", 0.0, waits=(0.1, 0.4, 1.6))  # 3 calls of about 5 s

    found = recommendations(tmp_path, record)
    (advice,) = of_kind(found, "hidden_retries")
    assert advice["evidence"]["duration_p99_s"] == pytest.approx(0.19504, abs=1e-4)
    assert advice["evidence"]["suggested_timeout_s"] == 0.39
    assert advice["remedy"] == "@agent_otel.tool(timeout=0.39, retries=1, retry_interval=0.1, fallback=...)"
    assert "timeout=0.39 s per attempt (2x the p99 of the calls with no failure inside, 0.2 s)" in advice["message"]
    assert of_kind(found, "set_timeout") == []  # the same tool's timeout is said once, with the retries
