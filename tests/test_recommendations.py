"""Each recommendation fires on a run built to need it, with the numbers
that justify it, and stays silent on a healthy run."""

from __future__ import annotations

import heapq

import pytest

from agent_otel.report.analysis import analyse, report_json
from helpers.traces import RecordedRun, write_gpu_csv


def run_pool(run: RecordedRun, requests, *, workers: int, executor: str, timeout: float | None = None) -> None:
    """Record calls as a FIFO thread pool of ``workers`` would run them:
    ``requests`` is (tool, submitted at, seconds of work)."""
    free_at = [0.0] * workers
    for tool, submit, work in sorted(requests, key=lambda r: r[1]):
        start = max(submit, heapq.heappop(free_at))
        heapq.heappush(free_at, start + work)
        run.tool_call(tool, submit, start, start + work, executor=executor, timeout=timeout)


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
    }


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
