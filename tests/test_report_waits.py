"""The report on blocked event loops and on what kind of wait each tool is.

Recorded runs with known ground truth (tests/helpers/traces.py), and one
real instrumented agent whose loop a sync tool blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from agent_otel.commands.cli import main
from helpers.traces import RecordedRun


def report_of(capsys, *argv) -> dict:
    assert main(["report", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def tools(report: dict) -> dict[str, dict]:
    return {tool["tool"]: tool for tool in report["tools"]}


def recommendations(report: dict, kind: str) -> dict[str, dict]:
    return {r["subject"]: r for r in report["recommendations"] if r["kind"] == kind}


def blocked_loop_run(path, with_block: bool = True) -> None:
    """GPU 0 idles 1-4 s. Two async tools are in flight 1-4 s; a sync tool
    called from a third coroutine runs 1.5-3.5 s and the loop runs again at
    3.55 s, so the loop is blocked 1.5-3.55 s with both async tools waiting."""
    run = RecordedRun(path)
    run.agent_run(0.0, 10.0)
    a = run.tool_call("fetch_a", 1.0, 1.0, 4.0, executor="direct")
    b = run.tool_call("fetch_b", 1.0, 1.0, 4.0, executor="direct")
    lookup = run.tool_call("lookup", 1.5, 1.5, 3.5, executor="direct", cpu=0.02)
    run.idle_window(0, 1.0, 4.0)
    if with_block:
        run.loop_block(1.5, 3.55, blocker=lookup, waiting=[a, b])
    run.close()


def test_the_blocking_call_takes_the_block_and_the_report_says_to_offload_it(tmp_path, capsys):
    blocked_loop_run(tmp_path / "traces.jsonl")
    report = report_of(capsys, tmp_path / "traces.jsonl")
    by_tool = tools(report)
    # 1.5-3.55 s all to lookup; 1-1.5 s and 3.55-4 s split between the two waiting tools.
    assert by_tool["lookup"]["gpu_idle_blocked_exec_s"] == pytest.approx(2.05)
    assert by_tool["fetch_a"]["gpu_idle_blocked_s"] == pytest.approx(0.25 + 0.225)
    assert by_tool["fetch_b"]["gpu_idle_blocked_s"] == pytest.approx(0.25 + 0.225)
    assert report["tools"][0]["tool"] == "lookup"
    lookup = by_tool["lookup"]
    assert (lookup["loop_blocks"], lookup["loop_blocked_s"], lookup["loop_blocked_longest_s"]) == (
        1,
        pytest.approx(2.05),
        pytest.approx(2.05),
    )
    assert lookup["gpu_idle_blocked_loop_s"] == pytest.approx(2.05)
    assert by_tool["fetch_a"]["loop_blocks"] == 0
    assert report["event_loops"] == [
        {
            "thread": "MainThread",
            "blocks": 1,
            "blocked_s": pytest.approx(2.05),
            "longest_s": pytest.approx(2.05),
            "by_tool": [{"tool": "lookup", "blocked_s": pytest.approx(2.05)}],
        }
    ]
    offload = recommendations(report, "offload_from_loop")["lookup"]
    assert offload["evidence"]["most_waiting_calls"] == 2
    assert offload["evidence"]["threads"] == ["MainThread"]
    assert offload["evidence"]["gpu_idle_blocked_loop_s"] == pytest.approx(2.05)
    assert "await lookup.aio(...)" in offload["remedy"] and "asyncio.to_thread" in offload["remedy"]
    assert "processes=True" not in offload["remedy"]
    assert offload["docs"] == "docs/remedies.md#calling-from-async-code"
    assert "blocked the loop of MainThread 1 time for 2 s" in offload["message"]


def test_without_the_block_span_the_waiting_tools_would_take_most_of_it(tmp_path, capsys):
    blocked_loop_run(tmp_path / "traces.jsonl", with_block=False)
    report = report_of(capsys, tmp_path / "traces.jsonl")
    assert tools(report)["lookup"]["gpu_idle_blocked_s"] == pytest.approx(2.0 / 3)
    assert report["event_loops"] == []
    assert not recommendations(report, "offload_from_loop")


def test_a_block_with_no_tool_names_the_top_of_the_stack(tmp_path, capsys):
    stack = (
        '  File "/srv/agent/main.py", line 40, in turn\n    plan = build_plan(history)\n'
        '  File "/srv/agent/plan.py", line 12, in build_plan\n    return json.loads(blob)\n'
    )
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 5.0)
    waiting = run.tool_call("fetch", 0.5, 0.5, 3.0, executor="direct")
    run.loop_block(1.0, 1.8, waiting=[waiting], stack=stack)
    run.idle_window(0, 0.5, 3.0)
    run.close()
    report = report_of(capsys, tmp_path / "traces.jsonl")
    # 1.0-1.8 s: the waiting call is out of flight and no tool blocks: unattributed.
    assert tools(report)["fetch"]["gpu_idle_blocked_s"] == pytest.approx(2.5 - 0.8)
    assert report["gpus"][0]["idle_unattributed_s"] == pytest.approx(0.8)
    unknown = recommendations(report, "offload_from_loop")["unknown"]
    assert unknown["evidence"]["innermost_frame"] == "/srv/agent/plan.py:12 in build_plan"
    assert unknown["remedy"] is None
    assert report["event_loops"][0]["by_tool"] == [{"tool": "unknown", "blocked_s": pytest.approx(0.8)}]


def test_cpu_bound_io_bound_and_gil_bound_tools_are_told_apart(tmp_path, capsys):
    """Ground truth by construction: each call's CPU time is given."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 60.0)
    t = 1.0
    for _ in range(4):  # one at a time, 1 s each
        run.tool_call("render_chart", t, t, t + 1.0, cpu=0.95)
        run.tool_call("fetch_prices", t + 1.0, t + 1.0, t + 2.0, cpu=0.01)
        run.tool_call("parse_docs", t + 2.0, t + 2.0, t + 3.0, cpu=0.40)
        t += 3.0
    for _ in range(3):  # alone: 95% CPU
        run.tool_call("tokenize", t, t, t + 1.0, cpu=0.95)
        t += 1.0
    for _ in range(3):  # next to two CPU-busy calls on other threads: its share collapses to 30%
        run.tool_call("tokenize", t, t, t + 3.0, cpu=0.9)
        run.tool_call("hash_files", t, t, t + 3.0, cpu=2.7)
        run.tool_call("hash_files", t, t, t + 3.0, cpu=2.7)
        t += 3.0
    run.idle_window(0, 0.5, t)  # the GPU waits for all of it
    run.close()
    report = report_of(capsys, tmp_path / "traces.jsonl")
    by_tool = tools(report)
    assert by_tool["render_chart"]["exec_cpu_share"] == pytest.approx(0.95)
    assert by_tool["render_chart"]["exec_cpu_s"] == pytest.approx(3.8)
    assert by_tool["render_chart"]["wait_kind"] == "cpu"
    assert by_tool["fetch_prices"]["wait_kind"] == "io"
    assert by_tool["parse_docs"]["wait_kind"] == "mixed"
    tokenize = by_tool["tokenize"]
    assert tokenize["wait_kind"] == "gil"
    assert tokenize["exec_cpu_share_alone"] == pytest.approx(0.95)
    assert tokenize["exec_cpu_share_parallel"] == pytest.approx(0.3)
    assert by_tool["hash_files"]["exec_cpu_share_alone"] is None  # it never ran alone

    process = recommendations(report, "use_process_pool")
    assert set(process) == {"render_chart", "tokenize", "hash_files"}
    assert process["render_chart"]["remedy"] == (
        'agent_otel.pool("render_chart", kind="cpu", processes=True)\n@agent_otel.tool(pool="render_chart")'
    )
    assert "GIL-bound" in process["tokenize"]["message"] and "95%" in process["tokenize"]["message"]
    assert process["tokenize"]["evidence"]["wait_kind"] == "gil"
    asynchronous = recommendations(report, "use_async_io")
    assert set(asynchronous) == {"fetch_prices"}
    assert "await fetch_prices.aio(...)" in asynchronous["fetch_prices"]["remedy"]
    assert "parse_docs" not in process and "parse_docs" not in asynchronous


def test_tools_without_cpu_time_have_no_kind(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 10.0)
    for k in range(4):
        run.tool_call("stream", k, k, k + 0.5)  # a coroutine: no agent.tool.exec.cpu_time
    run.idle_window(0, 0.0, 4.0)
    run.close()
    (stream,) = report_of(capsys, tmp_path / "traces.jsonl")["tools"]
    assert (stream["exec_cpu_s"], stream["exec_cpu_share"], stream["wait_kind"]) == (None, None, None)


def test_the_table_shows_cpu_share_and_blocked_loops(tmp_path, capsys):
    blocked_loop_run(tmp_path / "traces.jsonl")
    assert main(["report", str(tmp_path / "traces.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "LOOP BLOCKED" in out and "CPU" in out
    assert "Event loops" in out and "MainThread" in out
    assert "[offload_from_loop]" in out


AGENT = textwrap.dedent("""
    import asyncio, sys, time
    import agent_otel

    handle = agent_otel.instrument(traces_file=sys.argv[1], traces_exporters="none", frameworks=(),
                                   gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.2)
    gpu = handle.gpu_timeline.source

    @agent_otel.tool
    def lookup(seconds):
        time.sleep(seconds)

    @agent_otel.tool
    async def fetch(seconds):
        await asyncio.sleep(seconds)

    async def turn():
        await asyncio.to_thread(gpu.run_kernel, 0.3)
        tasks = [asyncio.create_task(fetch(0.05)) for _ in range(3)]
        await asyncio.sleep(0.01)
        lookup(0.8)
        await asyncio.gather(*tasks)
        await asyncio.to_thread(gpu.run_kernel, 0.3)

    asyncio.run(turn())
    handle.shutdown()
""")


def test_a_real_agent_whose_loop_a_sync_tool_blocks(tmp_path, capsys):
    traces = tmp_path / "traces.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", AGENT, str(traces)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
    )
    assert done.returncode == 0, done.stderr
    report = report_of(capsys, traces)
    by_tool = tools(report)
    lookup = by_tool["lookup"]
    assert lookup["loop_blocks"] == 1 and 0.8 <= lookup["loop_blocked_s"] < 1.0
    period = 1 / 6  # the simulated GPU's sample period
    assert lookup["gpu_idle_blocked_exec_s"] == pytest.approx(lookup["loop_blocked_s"], abs=period + 0.05)
    assert by_tool["fetch"]["gpu_idle_blocked_s"] < 0.1  # the waiting coroutines: next to nothing
    # The live path applied the same rule: its gpu.idle child spans agree with the report.
    assert lookup["gpu_idle_blocked_live_s"] == pytest.approx(lookup["gpu_idle_blocked_s"], abs=0.01)
    assert lookup["wait_kind"] is None  # one call: too few to tell its kind
    assert lookup["exec_cpu_share"] < 0.05  # it sleeps
    offload = recommendations(report, "offload_from_loop")["lookup"]
    assert offload["evidence"]["most_waiting_calls"] == 3
