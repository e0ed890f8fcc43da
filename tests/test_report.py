"""``agent-otel report``: a recorded agent run in, the report a user reads out."""

from __future__ import annotations

import gc
import io
import json
import random
import subprocess
import sys

import pytest

from agent_otel.commands.cli import main
from agent_otel.report import progress as progress_module
from agent_otel.report.analysis import analyse, report_json
from agent_otel.report.progress import Progress
from agent_otel.report.reader import read_traces
from agent_otel.report.stats import assign_rows, max_overlap, peak_depth, percentile
from agent_otel.report.table import render, terminal_style
from helpers.traces import RecordedRun, write_gpu_csv

CONTRACT_KEYS = {
    "window": {"start", "end", "seconds"},
    "tools": {
        "tool",
        "calls",
        "errors",
        "duration_p50_s",
        "duration_p95_s",
        "duration_p99_s",
        "exec_p50_s",
        "exec_p95_s",
        "exec_p99_s",
        "queue_p50_s",
        "queue_p95_s",
        "queue_p99_s",
        "gpu_idle_blocked_s",
        "gpu_idle_blocked_queue_s",
        "gpu_idle_blocked_exec_s",
    },
    "executors": {"executor", "submissions", "wait_p95_s", "max_queue_depth", "max_workers"},
    "gpus": {"gpu", "busy_s", "idle_s", "idle_blocked_s", "idle_unattributed_s"},
    "recommendations": {"kind", "subject", "message", "evidence"},
}
# Keys the report adds (docs/report.md); the contract allows additions only.
ADDED_KEYS = {
    "tools": {
        "gpu_idle_blocked_live_s",
        "executors",
        "timeout_s",
        "exec_cpu_s",
        "exec_cpu_share",
        "exec_cpu_share_alone",
        "exec_cpu_share_parallel",
        "wait_kind",
        "loop_blocks",
        "loop_blocked_s",
        "loop_blocked_longest_s",
        "gpu_idle_blocked_loop_s",
        "gpu_underused_blocked_s",
        "gpu_underused_blocked_queue_s",
        "gpu_underused_blocked_exec_s",
        "gpu_idle_blocked_per_call_s",
        "latency_share",
        "slo",
    },
    "executors": {"max_concurrent_exec", "peak_in_flight", "queued_calls", "tools"},
    "gpus": {
        "uuid",
        "underused_s",
        "underused_blocked_s",
        "underused_unattributed_s",
        "missing_s",
        "utilization_avg",
        "simulated",
        "idle_model_s",
        "underused_model_s",
        "model_in_flight_s",
        "model_idle_ratio",
        "idle_samples_s",
        "busy_samples_s",
        "edges_moved",
    },
}


def report_of(capsys, *argv) -> dict:
    assert main(["report", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def stalled_run(tmp_path):
    """An agent run of 9 s with one GPU idle from 2 s to 5 s.

    embed (direct) executes 1-4 s; search (pool io) is queued 3-3.5 s and
    executes 3.5-4.5 s. So the idle window is blamed: 2-3 s embed alone
    (1 s), 3-4 s split between both (0.5 s each, search's half queued then
    executing), 4-4.5 s search alone, 4.5-5 s nobody.
    """
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 9.0)
    run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct", call_id="call_embed")
    run.tool_call("search", 3.0, 3.5, 4.5, call_id="call_search")
    for number in range(4):  # quick, after the stall
        start = 5.5 + number * 0.8
        run.tool_call("search", start, start, start + 0.1, call_id=f"call_late_{number}")
    run.close()
    busy_but_stalled = [(k / 10, 0, 3 if 20 < k <= 50 else 85) for k in range(100)]
    write_gpu_csv(tmp_path / "gpu.csv", busy_but_stalled)
    return tmp_path


def test_idle_time_is_blamed_on_the_calls_in_flight_queue_and_exec_apart(stalled_run, capsys):
    report = report_of(capsys, stalled_run / "traces.jsonl", "--gpu-log", stalled_run / "gpu.csv", "--tz", "UTC")

    assert report["window"] == {
        "start": "2026-03-02T09:00:00.000000Z",
        "end": "2026-03-02T09:00:09.000000Z",
        "seconds": 9.0,
    }
    tools = {t["tool"]: t for t in report["tools"]}
    assert [t["tool"] for t in report["tools"]] == ["embed", "search"]
    assert tools["embed"]["gpu_idle_blocked_s"] == pytest.approx(1.5)
    assert tools["embed"]["gpu_idle_blocked_exec_s"] == pytest.approx(1.5)
    assert tools["embed"]["gpu_idle_blocked_queue_s"] == 0.0
    assert tools["search"]["gpu_idle_blocked_queue_s"] == pytest.approx(0.25)
    assert tools["search"]["gpu_idle_blocked_exec_s"] == pytest.approx(0.75)
    assert tools["search"]["gpu_idle_blocked_s"] == pytest.approx(1.0)
    [gpu] = report["gpus"]
    assert {key: gpu[key] for key in CONTRACT_KEYS["gpus"] | {"uuid"}} == {
        "gpu": "0",
        "busy_s": pytest.approx(6.0),
        "idle_s": pytest.approx(3.0),
        "idle_blocked_s": pytest.approx(2.5),
        "idle_unattributed_s": pytest.approx(0.5),
        "uuid": None,
    }
    # Unused capacity from the log's samples (0.1 s apart, 85% busy but 3% in 2-5 s), by the same rule:
    # embed 1-4 s and search 3-4.5 s in flight, four 0.1 s searches later, nobody the rest of the time.
    assert gpu["underused_s"] == pytest.approx(0.15 * 6 + 0.97 * 3)
    assert gpu["underused_blocked_s"] == pytest.approx(0.15 * 1 + 0.97 * 2.5 + 0.15 * 4 * 0.1)
    assert gpu["underused_blocked_s"] + gpu["underused_unattributed_s"] == pytest.approx(gpu["underused_s"])
    assert gpu["missing_s"] == 0.0
    assert report["inputs"]["gpu_source"] == "gpu-log"
    assert report["inputs"]["gpu_logs"][0]["overlaps_traces"] is True
    assert report["inputs"]["warnings"] == []


def test_json_keys_are_the_contracts(stalled_run, capsys):
    report = report_of(capsys, stalled_run / "traces.jsonl", "--gpu-log", stalled_run / "gpu.csv", "--tz", "UTC")
    assert set(report) == set(CONTRACT_KEYS) | {
        "inputs",
        "event_loops",
        "models",
        "turns",
        "slos",
        "cost",
        "model_server",
        "kv_cache",
    }
    assert set(report["window"]) == CONTRACT_KEYS["window"]
    for section in ("tools", "executors", "gpus"):
        assert report[section], section
        for row in report[section]:
            assert set(row) == CONTRACT_KEYS[section] | ADDED_KEYS[section], section
    for tool in report["tools"]:
        assert isinstance(tool["calls"], int) and isinstance(tool["errors"], int)
        assert all(isinstance(tool[key], float) for key in CONTRACT_KEYS["tools"] if key.endswith("_s"))
    for executor in report["executors"]:
        assert isinstance(executor["max_queue_depth"], int)
        assert executor["max_workers"] is None  # not known from traces


def test_call_ids_are_kept_only_for_the_outputs_that_show_them(stalled_run):
    """analyse(call_ids=False), as the command runs it without --html or
    --perfetto: the ids are dropped after the read, and the report is the same."""
    paths, log = [str(stalled_run / "traces.jsonl")], [str(stalled_run / "gpu.csv")]
    kept = analyse(paths, log, tz="UTC", idle_threshold=0.1, min_idle_s=0.5)
    dropped = analyse(paths, log, tz="UTC", idle_threshold=0.1, min_idle_s=0.5, call_ids=False)
    assert sorted(call.call_id for call in kept.calls) == sorted(
        ["call_embed", "call_search"] + [f"call_late_{number}" for number in range(4)]
    )
    assert [call.call_id for call in dropped.calls] == [None] * 6
    assert report_json(dropped) == report_json(kept)


def test_calls_errors_and_percentiles_per_tool(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    # ten lookups, the k-th queued k*10 ms and executing k*100 ms (k = 1..10)
    for k in range(1, 11):
        submit = k * 2.0
        outcome = {3: "error", 7: "timeout", 9: "cancelled"}.get(k, "ok")
        run.tool_call("lookup", submit, submit + k * 0.01, submit + k * 0.01 + k * 0.1, outcome=outcome)
    run.close()

    (lookup,) = report_of(capsys, tmp_path / "traces.jsonl")["tools"]
    assert lookup["calls"] == 10
    assert lookup["errors"] == 2  # error and timeout; a cancelled call is not the tool's failure
    # linear interpolation between closest ranks: h = (n - 1) p
    assert lookup["exec_p50_s"] == pytest.approx(0.55)
    assert lookup["exec_p95_s"] == pytest.approx(0.955)
    assert lookup["exec_p99_s"] == pytest.approx(0.991)
    assert lookup["queue_p50_s"] == pytest.approx(0.055)
    assert lookup["queue_p99_s"] == pytest.approx(0.0991)
    assert lookup["duration_p50_s"] == pytest.approx(0.605)
    assert lookup["duration_p95_s"] == pytest.approx(1.0505)
    assert lookup["gpu_idle_blocked_s"] == 0.0


def test_exec_start_comes_from_the_event_or_else_the_queue_duration(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.tool_call("with_event", 0.0, 0.4, 1.0)
    run.tool_call("without_event", 0.0, 0.3, 1.0, exec_event=False)
    run.close()
    tools = {t["tool"]: t for t in report_of(capsys, tmp_path / "traces.jsonl")["tools"]}
    assert tools["with_event"]["queue_p50_s"] == pytest.approx(0.4)
    assert tools["with_event"]["exec_p50_s"] == pytest.approx(0.6)
    assert tools["without_event"]["queue_p50_s"] == pytest.approx(0.3)
    assert tools["without_event"]["exec_p50_s"] == pytest.approx(0.7)


def test_executor_queue_depth_is_rebuilt_from_the_queue_intervals(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    # queued [0, 1), [0.6, 1.5), [0.8, 1.0) -> three at once; [1.5, 2) starts
    # as [0.6, 1.5) leaves, so it never makes a fourth
    for submit, start in [(0.0, 1.0), (0.6, 1.5), (0.8, 1.0), (1.5, 2.0)]:
        run.tool_call("fetch", submit, start, start + 0.2, executor="io")
    run.tool_call("fetch", 0.0, 0.0, 3.0, executor="direct")
    run.close()
    executors = {e["executor"]: e for e in report_of(capsys, tmp_path / "traces.jsonl")["executors"]}
    assert executors["io"]["submissions"] == 4
    assert executors["io"]["max_queue_depth"] == 3
    assert executors["io"]["wait_p95_s"] == pytest.approx(0.985)  # waits 0.2, 0.5, 0.9, 1.0
    assert executors["io"]["max_concurrent_exec"] == 2  # [1.0, 1.2) twice
    assert executors["direct"]["max_queue_depth"] == 0


def test_queue_statistics_count_only_calls_that_waited_for_a_worker(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    # A two-worker pool given four calls at once: two are handed to the idle
    # workers within half a millisecond (no queueing), two wait a second.
    for start in (0.0004, 0.0005, 1.0, 1.0):
        run.tool_call("fetch", 0.0, start, start + 1.0, executor="io")
    run.close()
    executor = report_of(capsys, tmp_path / "traces.jsonl")["executors"][0]
    assert executor["queued_calls"] == 2
    assert executor["max_queue_depth"] == 2  # not 4: the hand-offs are no queue
    table = render(analyse([str(tmp_path / "traces.jsonl")], [], tz=None, idle_threshold=0.1, min_idle_s=0.5))
    header = next(line for line in table.splitlines() if "MAX QUEUED" in line)
    row = next(line for line in table.splitlines() if line.lstrip().startswith("io "))
    assert row.split()[3:5] == ["2", "2"], (header, row)


def test_gpu_idle_from_the_traces_own_gpu_idle_spans(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 10.0)
    embed = run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    run.idle_window(0, 2.0, 6.0)
    run.idle_window(1, 3.0, 4.0)
    # what the live path blamed: the report recomputes, and shows both
    run.blamed_child(embed, 0, 2.0, 4.0, 2.0, "exec")
    run.blamed_child(embed, 1, 3.0, 4.0, 1.0, "exec")
    run.close()
    report = report_of(capsys, tmp_path / "traces.jsonl")
    assert report["inputs"]["gpu_source"] == "traces"
    (embed_row,) = report["tools"]
    assert embed_row["gpu_idle_blocked_s"] == pytest.approx(3.0)  # 2 s on GPU 0 + 1 s on GPU 1
    assert embed_row["gpu_idle_blocked_live_s"] == pytest.approx(3.0)
    gpus = {g["gpu"]: g for g in report["gpus"]}
    assert gpus["0"]["idle_s"] == pytest.approx(4.0)
    assert gpus["0"]["idle_unattributed_s"] == pytest.approx(2.0)
    assert gpus["0"]["busy_s"] == pytest.approx(6.0)  # the window minus idle
    assert gpus["0"]["uuid"] == "GPU-00000000"
    assert gpus["1"]["idle_blocked_s"] == pytest.approx(1.0)


def test_the_live_blame_is_read_from_the_windows_totals_once_with_or_without_children(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 10.0)
    embed = run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    run.tool_call("ping", 2.0, 2.0, 2.01, executor="direct")
    # Totals of every share; a child only for embed's large share, and none on GPU 1.
    run.idle_window(0, 2.0, 6.0, blocked=(("embed", "exec", 1.995), ("ping", "exec", 0.005)))
    run.blamed_child(embed, 0, 2.0, 4.0, 1.995, "exec")
    run.idle_window(1, 3.0, 4.0, blocked=(("embed", "exec", 1.0),))
    run.close()
    tools = {row["tool"]: row for row in report_of(capsys, tmp_path / "traces.jsonl")["tools"]}
    assert tools["embed"]["gpu_idle_blocked_live_s"] == pytest.approx(2.995)  # not 4.99: the child is in the totals
    assert tools["ping"]["gpu_idle_blocked_live_s"] == pytest.approx(0.005)  # a share with no span of its own
    assert tools["embed"]["gpu_idle_blocked_s"] == pytest.approx(2.995)  # the report's own blame agrees


def test_a_gpu_log_that_misses_the_traces_says_so(stalled_run, capsys):
    other_day = [(86400 * 3 + k / 10, 0, 2) for k in range(50)]
    write_gpu_csv(stalled_run / "old.csv", other_day)
    args = ["report", str(stalled_run / "traces.jsonl"), "--gpu-log", str(stalled_run / "old.csv"), "--tz", "UTC"]

    assert main(args) == 0
    table = capsys.readouterr().out
    warning = next(line for line in table.splitlines() if line.startswith("warning:"))
    assert "old.csv (2026-03-05T09:00:00.000000Z to 2026-03-05T09:00:04.900000Z) does not overlap the traces" in warning
    assert "--tz" in warning

    report = report_of(capsys, *args[1:])
    assert report["inputs"]["gpu_logs"][0]["overlaps_traces"] is False
    assert any("does not overlap" in w for w in report["inputs"]["warnings"])
    assert all(t["gpu_idle_blocked_s"] == 0.0 for t in report["tools"])


def test_spans_in_two_overlapping_files_count_once(stalled_run, capsys):
    traces = stalled_run / "traces.jsonl"
    lines = traces.read_text().splitlines()
    (stalled_run / "part.jsonl").write_text("\n".join(lines[:3]) + "\n")
    report = report_of(capsys, traces, stalled_run / "part.jsonl")
    assert sum(t["calls"] for t in report["tools"]) == 6
    assert report["inputs"]["spans"] == 7
    assert report["inputs"]["duplicate_spans"] == 3


def test_the_table_ranks_tools_and_fits_the_terminal(stalled_run):
    analysis = analyse(
        [str(stalled_run / "traces.jsonl")],
        [str(stalled_run / "gpu.csv")],
        tz="UTC",
        idle_threshold=0.1,
        min_idle_s=0.5,
    )
    plain = render(analysis)
    assert "\x1b[" not in plain
    rows = plain.split("Tools, by GPU capacity they left unused")[1].splitlines()
    # TOOL, UNUSED (GPU-s of capacity blamed), BLOCKED (idle), IN QUEUE, IN EXEC
    assert rows[2].split()[:5] == ["embed", "1.605", "1.500", "0.000", "1.500"]  # 0.15 + 0.97 + 0.97 / 2
    assert rows[3].split()[:5] == ["search", "1.030", "1.000", "0.250", "0.750"]  # 0.97 / 2 + 0.97 / 2 + 4 x 0.015
    assert "EXEC P95" in plain

    narrow = render(analysis, width=60, colour=True)
    assert "\x1b[1m" in narrow
    visible = [line.replace("\x1b[0m", "") for line in narrow.splitlines()]
    for code in ("\x1b[1m", "\x1b[2m", "\x1b[31m", "\x1b[33m", "\x1b[36m"):
        visible = [line.replace(code, "") for line in visible]
    assert max(len(line) for line in visible) < 60
    assert "EXEC P95" not in narrow and "BLOCKED" in narrow


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "77")
    assert terminal_style(Terminal()) == (77, True)
    assert terminal_style(io.StringIO()) == (None, False)
    monkeypatch.setenv("NO_COLOR", "1")
    assert terminal_style(Terminal()) == (77, False)


def test_malformed_traces_exit_2_with_one_line(tmp_path, capsys):
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"resourceSpans": []}\n{"resourceSpans": [}\n')
    assert main(["report", str(traces)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"agent-otel report: error: {traces}:2: not JSON (Expecting value)\n"


def test_malformed_traces_from_the_command_line_print_no_traceback(tmp_path):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(
        '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"xyz","spanId":"eee19b7ec3c1b174",'
        '"startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "agent_otel.commands.cli", "report", str(traces)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"agent-otel report: error: {traces}:1: traceId is not 32 hex digits: 'xyz'"]
    assert "Traceback" not in result.stderr


def test_bad_options_are_one_line_errors(stalled_run, capsys):
    assert main(["report", str(stalled_run / "traces.jsonl"), "--idle-threshold", "1.5"]) == 2
    assert "invalid value 1.5 for --idle-threshold" in capsys.readouterr().err
    assert main(["report", str(stalled_run / "traces.jsonl"), "--html", str(stalled_run / "no" / "r.html")]) == 2
    assert "for --html" in capsys.readouterr().err


def test_progress_shows_on_a_terminal_and_stays_quiet_in_a_pipe(stalled_run, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress_module, "REDRAW_EVERY_S", 0.0)
    traces = str(stalled_run / "traces.jsonl")
    size = (stalled_run / "traces.jsonl").stat().st_size
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        progress = Progress([traces], stream=stream)
        analyse([traces], idle_threshold=0.1, min_idle_s=0.5, progress=progress)
        assert progress.done == size
        assert (f"reading traces: {size / 1e6:.1f} MB of {size / 1e6:.1f} MB (100%)" in stream.getvalue()) is shown
        progress.finish()
        assert stream.getvalue().endswith("\r\x1b[K") is shown


def test_statistics_helpers():
    assert percentile([1.0], 99) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([], 50) == 0.0
    assert max_overlap([(0, 10), (10, 20), (5, 6), (7, 7)]) == 2
    rows = assign_rows([(0, 10), (2, 4), (4, 8), (10, 12), (3, 5)])
    assert rows == [0, 1, 1, 0, 2]


def test_peak_depth_of_columns_is_the_brute_force_overlap():
    """peak_depth (two columns, C-level sorts) against counting every instant by hand."""
    rng = random.Random(3)
    for _ in range(200):
        pairs = [(a, a + rng.choice((0, 0, 1, 2, 5))) for a in (rng.randrange(12) for _ in range(rng.randrange(8)))]
        instants = {a for a, _ in pairs} | {b for _, b in pairs}
        expected = max((sum(1 for a, b in pairs if a <= t < b) for t in instants), default=0)
        assert peak_depth([a for a, _ in pairs], [b for _, b in pairs]) == expected == max_overlap(pairs)


def test_report_json_of_an_empty_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    report = report_json(analyse([str(tmp_path / "empty.jsonl")], idle_threshold=0.1, min_idle_s=0.5))
    assert report["window"] == {"start": None, "end": None, "seconds": 0.0}
    assert report["tools"] == [] and report["gpus"] == [] and report["recommendations"] == []
    assert report["inputs"]["warnings"] == [f"{tmp_path / 'empty.jsonl'} is empty"]


def test_the_records_wait_in_the_oldest_generation_after_the_pause(stalled_run):
    """The collector is paused while reading and analysing; then what was
    made goes to the oldest generation, not to the youngest, whose next
    collection would scan all of it (a million records at 1M spans)."""
    gc.collect()
    assert gc.isenabled()
    analysis = analyse([str(stalled_run / "traces.jsonl")], idle_threshold=0.1, min_idle_s=0.5)
    assert gc.isenabled()
    oldest = {id(obj) for obj in gc.get_objects(generation=2)}
    assert analysis.calls and all(id(call) in oldest for call in analysis.calls)


def test_a_call_seen_by_client_and_server_counts_once(tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

    path = tmp_path / "mcp.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(str(path))))
    tracer = provider.get_tracer("test")
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}
    with tracer.start_as_current_span("execute_tool lookup", attributes=tool):  # the client's view
        with tracer.start_as_current_span("execute_tool lookup", attributes=tool):  # the server's own span
            pass
        with tracer.start_as_current_span("execute_tool other", attributes={**tool, "gen_ai.tool.name": "other"}):
            pass  # a different tool called inside it is a call of its own
    provider.shutdown()
    analysis = analyse([str(path)], idle_threshold=0.1, min_idle_s=0.5)
    assert sorted((t.tool, t.calls) for t in analysis.tools) == [("lookup", 1), ("other", 1)]


def test_merged_traces_of_several_pools_blame_each_gpu_on_its_own_pool(tmp_path, capsys):
    # Two GPU hosts, each with its blame service's gpu.idle windows, and an
    # agent per host. GPU 0 of both hosts idles 2-6 s; each agent's tool
    # runs 1-4 s on its own host's model server, so each GPU is blamed for
    # 2 s on its own pool's tool only, never on the other host's.
    for pool, tool in (("vllm-a:8000", "search"), ("vllm-b:8000", "sql")):
        agent = RecordedRun(tmp_path / f"agent-{tool}.jsonl", service=f"agent-{tool}", pool=pool)
        agent.agent_run(0.0, 8.0)
        agent.tool_call(tool, 1.0, 1.0, 4.0, executor="direct")
        agent.close()
        gpu_host = RecordedRun(tmp_path / f"gpu-{tool}.jsonl", service="agent-otel-gpu-exporter", pool=pool)
        gpu_host.idle_window(0, 2.0, 6.0)
        gpu_host.close()
    report = report_of(capsys, *sorted(tmp_path.glob("*.jsonl")))
    tools = {t["tool"]: t for t in report["tools"]}
    assert tools["search"]["gpu_idle_blocked_s"] == pytest.approx(2.0)
    assert tools["sql"]["gpu_idle_blocked_s"] == pytest.approx(2.0)
    gpus = {g["gpu"]: g for g in report["gpus"]}
    assert set(gpus) == {"vllm-a:8000/0", "vllm-b:8000/0"}
    assert gpus["vllm-a:8000/0"]["idle_blocked_s"] == pytest.approx(2.0)
    assert gpus["vllm-a:8000/0"]["idle_unattributed_s"] == pytest.approx(2.0)
    assert not report["inputs"]["warnings"]


def test_one_gpu_seen_by_several_processes_is_idle_once_and_blamed_on_all_their_calls(tmp_path, capsys):
    # Three prefork workers share GPU 0 and declared no pool: each sampled it
    # and wrote its own gpu.idle windows, the same idle stretch as each saw
    # it. Worker a's search runs 1-4 s, worker b's sql 3-5 s; worker c made
    # no call. GPU 0 idled 2-6 s (c's window), a and b each saw a part.
    # Another host's GPU 0 (another UUID) is another GPU, left as it is.
    workers = {name: RecordedRun(tmp_path / f"worker-{name}.jsonl", service="api") for name in "abc"}
    workers["a"].agent_run(0.0, 8.0)
    workers["a"].tool_call("search", 1.0, 1.0, 4.0, executor="direct")
    workers["b"].tool_call("sql", 3.0, 3.0, 5.0, executor="direct")
    workers["a"].idle_window(0, 2.0, 5.5, utilization=0.0)
    workers["b"].idle_window(0, 2.5, 6.0, utilization=0.04)
    workers["c"].idle_window(0, 2.0, 6.0, utilization=0.02)
    workers["c"].idle_window(0, 7.0, 7.5)  # after every window above: its own
    other_host = RecordedRun(tmp_path / "other-host.jsonl", service="api")
    other_host.idle_window(0, 3.0, 4.0, uuid="GPU-elsewhere")
    for run in (*workers.values(), other_host):
        run.close()
    report = report_of(capsys, *sorted(tmp_path.glob("*.jsonl")))
    (gpu,) = report["gpus"]
    # 4 s (2-6 s) and 0.5 s (7-7.5 s) on this host's GPU 0, and the other host's 1 s (3-4 s):
    # not the 3.5 + 3.5 + 4 s the three workers wrote.
    assert gpu["idle_s"] == pytest.approx(4.0 + 0.5 + 1.0)
    tools = {t["tool"]: t for t in report["tools"]}
    # 2-3 s: search alone; 3-4 s: both, half each; 4-5 s: sql alone. The
    # other host's 3-4 s likewise, half each.
    assert tools["search"]["gpu_idle_blocked_s"] == pytest.approx(1.0 + 0.5 + 0.5)
    assert tools["sql"]["gpu_idle_blocked_s"] == pytest.approx(0.5 + 1.0 + 0.5)
    assert gpu["idle_unattributed_s"] == pytest.approx(1.0 + 0.5)  # 5-6 s and 7-7.5 s


def test_the_union_of_one_gpus_windows_covers_exactly_what_they_cover():
    from agent_otel.records import IdleWindow
    from agent_otel.report.analysis import union_per_gpu

    rng = random.Random(7)
    for _ in range(200):
        windows = []
        for _process in range(rng.randint(1, 4)):  # each process's windows are disjoint
            t = rng.randint(0, 5)
            for _ in range(rng.randint(0, 4)):
                start = t + rng.randint(0, 5)
                t = start + rng.randint(1, 6)
                gpu = rng.choice("01")
                windows.append(IdleWindow(gpu, start, t, rng.random(), uuid=f"GPU-{gpu}", pool=rng.choice(("", "p"))))
        merged = union_per_gpu(list(windows))
        for key in {(w.pool, w.gpu, w.uuid) for w in windows}:
            covered = {t for w in windows if (w.pool, w.gpu, w.uuid) == key for t in range(w.start_ns, w.end_ns)}
            mine = sorted((w.start_ns, w.end_ns) for w in merged if (w.pool, w.gpu, w.uuid) == key)
            assert {t for start, end in mine for t in range(start, end)} == covered
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(mine, mine[1:]))
            assert sum(end - start for start, end in mine) == len(covered)  # disjoint: each instant once
    # The union's utilization: its windows' average, weighted by their durations.
    (union,) = union_per_gpu([IdleWindow("0", 0, 4, 0.0, uuid="G"), IdleWindow("0", 2, 3, 0.05, uuid="G")])
    assert (union.start_ns, union.end_ns, union.utilization_avg) == (0, 4, pytest.approx(0.01))


def test_a_gpu_pool_no_tool_call_declares_is_named_in_a_warning(stalled_run, capsys):
    # The GPU host declared a pool; the agent did not: nothing can be blamed.
    gpu_host = RecordedRun(stalled_run / "gpu.jsonl", service="agent-otel-gpu-exporter", pool="vllm-a:8000")
    gpu_host.idle_window(0, 2.0, 5.0)
    gpu_host.close()
    report = report_of(capsys, stalled_run / "traces.jsonl", stalled_run / "gpu.jsonl")
    assert all(t["gpu_idle_blocked_s"] == 0.0 for t in report["tools"])
    (warning,) = report["inputs"]["warnings"]
    assert "GPU pool 'vllm-a:8000'" in warning and "agent.gpu.pool=vllm-a:8000" in warning


def test_a_gpu_log_is_blamed_on_the_pool_it_is_given(stalled_run, capsys):
    pooled = RecordedRun(stalled_run / "pooled.jsonl", service="other-agent", pool="vllm-a:8000")
    pooled.tool_call("rerank", 2.0, 2.0, 5.0, executor="direct")
    pooled.close()
    # GPU 0 idle from 2 s to 5 s, busy around it.
    write_gpu_csv(stalled_run / "gpu.csv", [(k / 10, 0, 2 if 20 < k <= 50 else 90) for k in range(90)])
    traces = [stalled_run / "traces.jsonl", stalled_run / "pooled.jsonl"]
    for pool, blamed in (("vllm-a:8000", {"rerank"}), ("", {"embed", "search"})):
        report = report_of(capsys, *traces, "--gpu-log", stalled_run / "gpu.csv", "--tz", "UTC", "--gpu-pool", pool)
        assert {t["tool"] for t in report["tools"] if t["gpu_idle_blocked_s"] > 0} == blamed, pool
        assert [g["gpu"] for g in report["gpus"]] == [f"{pool}/0" if pool else "0"]


def test_attribution_in_groups_gives_the_same_blame(monkeypatch):
    """The report attributes time-disjoint groups of calls one at a time
    (bounded memory); the blame is the one attribute() gives at once."""
    import random

    from agent_otel.attribution import attribute
    import numpy as np

    from agent_otel.records import IdleWindow, ToolCall
    from agent_otel.report import analysis as analysis_module
    from agent_otel.spans.calls import CallTable

    rng = random.Random(3)
    calls, windows = [], []
    t = 10**18
    for i in range(6000):
        t += rng.randrange(10**7, 10**9)
        queue = rng.choice((0, rng.randrange(10**8)))
        end = t + queue + rng.randrange(10**7, 2 * 10**9)
        calls.append(ToolCall(f"t{i % 7}", "io", t, t + queue, end if rng.random() > 0.001 else 0))
        if rng.random() < 0.4:
            windows.append(IdleWindow(str(i % 2), t + 5, end, 0.01))
    monkeypatch.setattr(analysis_module, "ATTRIBUTION_GROUP", 200)
    table = CallTable.of(calls)
    rows = np.arange(len(calls))
    grouped, whole = list(analysis_module._attribute(windows, table, rows)), attribute(windows, calls)
    assert len(grouped) == len(whole) == len(windows)
    for a, b in zip(grouped, whole):
        assert a.window == b.window
        assert a.unattributed_s == pytest.approx(b.unattributed_s, abs=1e-9)
        assert [id(s.call) for s in a.shares] == [id(s.call) for s in b.shares]
        for mine, theirs in zip(a.shares, b.shares):
            assert (mine.queue_s, mine.exec_s) == pytest.approx((theirs.queue_s, theirs.exec_s), abs=1e-9)


def test_plain_arrays_read_as_value_of_reads_them():
    """The reader's fast path for array attributes (the gpu.idle window's
    per-tool totals) gives what the generic reading gives, or defers to it."""
    from agent_otel.spans.otlp_json import JsonValue, value_of
    from agent_otel.spans.decode import _plain_array

    cases = [
        (JsonValue(arrayValue={"values": [{"stringValue": "a"}, {"stringValue": "b"}]}), "stringValue", str),
        (JsonValue(arrayValue={"values": [{"doubleValue": 0.5}, {"doubleValue": 2.0}]}), "doubleValue", float),
        (JsonValue(arrayValue={"values": []}), "doubleValue", float),
    ]
    for value, kind, of in cases:
        assert _plain_array(value, kind, of) == value_of(value, "k")
    deferred = [
        JsonValue(arrayValue={"values": [{"doubleValue": 1}]}),  # an int: value_of makes it 1.0
        JsonValue(arrayValue={"values": [{"stringValue": "a", "doubleValue": 1.0}]}),  # two keys
        JsonValue(arrayValue={"values": [{"doubleValue": "1.5"}]}),  # a string
        JsonValue(arrayValue={"values": {"doubleValue": 1.0}}),  # not a list
        JsonValue(arrayValue=[{"doubleValue": 1.0}]),  # not an object
        JsonValue(stringValue="x", arrayValue={"values": [{"doubleValue": 1.0}]}),  # the string wins
        None,
    ]
    for value in deferred:
        assert _plain_array(value, "doubleValue", float) is None
    assert value_of(deferred[0], "k") == [1.0] and value_of(deferred[5], "k") == "x"


def test_without_call_ids_peer_spans_are_told_apart_by_them_all_the_same(tmp_path):
    """read_traces(call_ids=False) keeps no id in the records, only a hash
    of each: another instrumentation's span of the same tool within one of
    agent-otel's calls is that call only where their ids agree."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    root = run.span("invoke_agent research", 0.0, 10.0, {"gen_ai.operation.name": "invoke_agent"})
    run.tool_call("search", 1.0, 1.0, 3.0, call_id="call_a", parent=root)
    run.tool_call("search", 5.0, 5.0, 7.0, call_id="call_c", parent=root)
    peer = {"openinference.span.kind": "TOOL", "tool.name": "search"}
    run.span("search", 1.0, 3.0, {**peer, "gen_ai.tool.call.id": "call_a"}, parent=root)  # the same call
    run.span("search", 5.0, 7.0, {**peer, "gen_ai.tool.call.id": "call_b"}, parent=root)  # another one
    run.close()
    for keep in (True, False):
        data = read_traces([str(tmp_path / "traces.jsonl")], call_ids=keep)
        assert (data.peer_tool_spans, data.peer_tool_spans_merged) == (2, 1), keep
        assert sorted(str(call.call_id) for call in data.calls) == (
            ["call_a", "call_b", "call_c"] if keep else ["None", "None", "None"]
        )


def test_a_report_is_the_same_with_or_without_the_records(stalled_run):
    """analyse(records=False), the JSON's and the table's way (no ToolCall
    kept, the blame folded into its totals), gives the report the records
    give."""
    paths = [str(stalled_run / "traces.jsonl")]
    logs = [str(stalled_run / "gpu.csv")]
    with_records = analyse(paths, logs, tz="UTC", idle_threshold=0.1, min_idle_s=0.5)
    columns_only = analyse(paths, logs, tz="UTC", idle_threshold=0.1, min_idle_s=0.5, records=False)
    assert with_records.attributions and not columns_only.attributions
    assert report_json(columns_only) == report_json(with_records)
    assert report_json(with_records)["tools"][0]["gpu_idle_blocked_s"] > 0
