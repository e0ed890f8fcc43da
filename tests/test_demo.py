"""`agent-otel demo`, run the way a new user runs it: as a command.

The demo runs in a subprocess (it sets up its own instrument(), which this
test session's shared tracer provider would otherwise catch), on the
simulated GPU, with short runs. Each run's report is read back with
`agent-otel report --format json`, as a user would. Serve mode is tested in
test_demo_serve.py (a module of its own, so that it runs beside the recorded
runs under pytest-xdist).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import sys

import pytest
from helpers.demo import agent_otel

TOOLS_THAT_STALL = {"search_docs", "fetch_quote"}


def report(path, gpu_log=None) -> dict:
    """``agent-otel report PATH [--gpu-log LOG] --format json``, run once per input (the tests only read it)."""
    return copy.deepcopy(_report(str(path), None if gpu_log is None else str(gpu_log)))


@functools.cache
def _report(path: str, gpu_log) -> dict:
    logs = [] if gpu_log is None else ["--gpu-log", gpu_log]
    done = subprocess.run(
        [sys.executable, "-m", "agent_otel.commands.cli", "report", path, *logs, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def blocked(report_json: dict) -> dict[str, dict]:
    return {tool["tool"]: tool for tool in report_json["tools"]}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    process = agent_otel("demo", "--out", str(out), "--seconds", "4", "--gpu", "simulated")
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output
    return out, output


def test_the_demo_writes_both_runs_traces_and_timelines(demo):
    out, output = demo
    for run in ("baseline", "fixed"):
        assert (out / f"{run}.jsonl").stat().st_size > 0
        page = (out / f"{run}.html").read_text()
        assert page.startswith("<!DOCTYPE html>")
        assert "search_docs" in page and "fetch_quote" in page
        assert f"{out / run}.html" in output
    assert "GPU: Simulated GPU (--gpu simulated)" in output


def test_the_demo_says_how_long_each_run_lasted_as_its_report_does(demo):
    out, output = demo
    assert "starting new turns for 4 s each" in output
    said = [float(seconds) for seconds in re.findall(r"traced (\d+\.\d) s: new turns for 4 s, then the turns", output)]
    reported = [report(out / f"{run}.jsonl")["window"]["seconds"] for run in ("baseline", "fixed")]
    assert said == [round(seconds, 1) for seconds in reported]
    assert all(seconds >= 4 for seconds in reported)


def test_the_baseline_blames_the_stalling_tools_not_the_fast_one(demo):
    out, _ = demo
    baseline = report(out / "baseline.jsonl")
    tools = blocked(baseline)
    assert set(tools) == {"search_docs", "fetch_quote", "lookup_account", "calculator"}
    top = baseline["tools"][0]
    assert top["tool"] in TOOLS_THAT_STALL, baseline["tools"]
    assert top["gpu_idle_blocked_s"] > 1.0
    calculator = tools["calculator"]
    # A 5 ms tool: the GPU never waits on it executing, only on its place in the shared queue.
    assert calculator["gpu_idle_blocked_exec_s"] < 0.1
    assert calculator["gpu_idle_blocked_s"] < top["gpu_idle_blocked_s"] / 2
    # Calls queue for the shared two-worker pool: the report sees it.
    assert tools["search_docs"]["queue_p95_s"] > 0.3
    assert baseline["gpus"][0]["idle_blocked_s"] > 0.5 * baseline["window"]["seconds"]


def test_the_baselines_top_blocker_gets_a_recommendation(demo):
    out, _ = demo
    baseline = report(out / "baseline.jsonl")
    top = baseline["tools"][0]["tool"]
    advice = [r for r in baseline["recommendations"] if r["subject"] == top or r["evidence"].get("tool") == top]
    assert advice, (top, baseline["recommendations"])
    assert all(r["remedy"] for r in advice if r["kind"] != "overlap_tool_with_gpu"), advice


def test_the_fix_removes_most_of_the_gpu_idle_time_blocked_by_tools(demo):
    out, output = demo
    baseline, fixed = report(out / "baseline.jsonl"), report(out / "fixed.jsonl")
    baseline_blocked = sum(g["idle_blocked_s"] for g in baseline["gpus"])
    fixed_blocked = sum(g["idle_blocked_s"] for g in fixed["gpus"])
    assert baseline_blocked > 1.0
    assert fixed_blocked < 0.5 * baseline_blocked
    # The fixed run serves more tool calls per second, on the same scripted latencies.
    calls = {
        name: sum(t["calls"] for t in r["tools"]) / r["window"]["seconds"]
        for name, r in (("baseline", baseline), ("fixed", fixed))
    }
    assert calls["fixed"] > 1.5 * calls["baseline"]
    # The fixed quote tool answered within its bound: no call waited for the hung API.
    assert blocked(fixed)["fetch_quote"]["duration_p99_s"] < 2.0
    # The comparison the demo printed is the reports' numbers: the report of
    # each run's traces with its GPU log, as the demo made it (without the
    # log the report takes the live gpu.idle spans, which can differ by more
    # than the printed rounding).
    row = re.search(r"^  blocked by tool calls \(s\)\s+(\S+)\s+(\S+)$", output, re.M)
    assert row, output
    with_logs = [report(out / f"{name}.jsonl", out / f"{name}-gpu.csv") for name in ("baseline", "fixed")]
    expected = [sum(g["idle_blocked_s"] for g in r["gpus"]) for r in with_logs]
    # Printed to one decimal: equal up to that rounding (sums in another order can land either side of .x5).
    printed = [float(value) for value in row.groups()]
    assert printed == pytest.approx(expected, abs=0.05 + 1e-9)


def test_the_baseline_blocks_the_event_loop_and_the_fix_does_not(demo):
    out, output = demo
    baseline, fixed = report(out / "baseline.jsonl"), report(out / "fixed.jsonl")
    # The sync CRM client called from the agent's coroutine: every call of it blocked the loop.
    account = blocked(baseline)["lookup_account"]
    assert account["loop_blocks"] == account["calls"] > 0
    assert account["loop_blocked_s"] >= 0.3 * account["calls"]  # each call lasts 0.3-0.7 s
    (loop,) = [loop for loop in baseline["event_loops"] if loop["thread"] == "MainThread"]
    assert loop["by_tool"][0]["tool"] == "lookup_account"
    offload = [r for r in baseline["recommendations"] if r["kind"] == "offload_from_loop"]
    assert [r["subject"] for r in offload if r["subject"] != "unknown"] == ["lookup_account"]
    assert "await lookup_account.aio(...)" in offload[0]["remedy"]
    # Fixed: awaited with .aio() on a pool, it never holds the loop.
    assert blocked(fixed)["lookup_account"]["loop_blocks"] == 0
    assert blocked(fixed)["lookup_account"]["executors"] == ["demo-accounts"]
    assert not [r for r in fixed["recommendations"] if r["kind"] == "offload_from_loop" and r["subject"] != "unknown"]
    row = re.search(r"^event loop blocked \(s\)\s+(\S+)\s+(\S+)$", output, re.M)
    assert row, output
    assert float(row.group(1)) == pytest.approx(sum(loop["blocked_s"] for loop in baseline["event_loops"]), abs=0.06)
