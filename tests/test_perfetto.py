"""``--perfetto``: the timeline as Chrome trace-event JSON, checked against
the trace-event format (the JSON that Perfetto and chrome://tracing load)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from agent_otel.commands.cli import main
from helpers.traces import RecordedRun, write_gpu_csv

PHASES = {"M", "X", "C", "s", "f"}


@pytest.fixture
def trace(tmp_path):
    """A pool of two worker threads; GPU 0 idle 2-5 s, GPU 1 idle 3-4 s."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 8.0)
    run.tool_call("embed", 1.0, 1.0, 4.0, executor="gpu-pool", thread="gpu-pool_0", call_id="call_1")
    run.tool_call("search", 3.0, 3.5, 4.5, executor="io", thread="io_0", call_id="call_2")
    run.tool_call("search", 3.2, 3.6, 4.2, executor="io", thread="io_1", call_id="call_3")
    run.tool_call("search", 3.3, 4.2, 4.4, executor="io", thread="io_1", call_id="call_4")
    # asyncio tasks share one thread name and overlap in time
    run.tool_call("fetch", 2.0, 2.0, 3.0, executor="asyncio", thread="MainThread")
    run.tool_call("fetch", 2.5, 2.5, 3.5, executor="asyncio", thread="MainThread")
    run.tool_call("notify", 6.0, 6.0, 6.5, executor="direct")  # no thread name
    run.close()
    samples = [(k / 10, 0, 2 if 20 < k <= 50 else 90) for k in range(80)]
    samples += [(k / 10, 1, 2 if 30 < k <= 40 else 90) for k in range(80)]
    write_gpu_csv(tmp_path / "gpu.csv", samples)
    out = tmp_path / "trace.json"
    assert (
        main(
            [
                "report",
                str(tmp_path / "traces.jsonl"),
                "--gpu-log",
                str(tmp_path / "gpu.csv"),
                "--tz",
                "UTC",
                "--perfetto",
                str(out),
                "--format",
                "json",
            ]
        )
        == 0
    )
    return json.loads(out.read_text())


def test_every_event_has_the_fields_its_phase_needs(trace):
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"]["window_start"] == "2026-03-02T09:00:00.000000Z"
    events = trace["traceEvents"]
    assert events
    for event in events:
        assert event["ph"] in PHASES, event
        assert isinstance(event["name"], str) and event["name"], event
        assert isinstance(event["pid"], int), event
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0, event
        if event["ph"] in ("X", "s", "f"):
            assert isinstance(event["tid"], int), event
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0, event
            assert isinstance(event["cat"], str) and isinstance(event["args"], dict), event
        if event["ph"] == "C":
            assert event["args"] and all(isinstance(v, (int, float)) for v in event["args"].values()), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name") and isinstance(event["args"]["name"], str)
        if event["ph"] in ("s", "f"):
            assert isinstance(event["id"], int) and event["cat"] == "blame"
        if event["ph"] == "f":
            assert event["bp"] == "e"


def slices_by_track(trace):
    tracks = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            tracks[(event["pid"], event["tid"])].append(event)
    return tracks


def test_slices_on_one_track_never_partly_overlap(trace):
    for track, slices in slices_by_track(trace).items():
        slices.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for event in slices:
            while open_ends and open_ends[-1] <= event["ts"]:
                open_ends.pop()
            if open_ends:
                assert event["ts"] + event["dur"] <= open_ends[-1], (track, event)
            open_ends.append(event["ts"] + event["dur"])


def test_tracks_are_named_gpus_executors_workers_and_queues(trace):
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(processes.values()) == [
        "GPUs",
        "executor asyncio",
        "executor direct",
        "executor gpu-pool",
        "executor io",
    ]
    names = defaultdict(set)
    for (pid, _tid), name in threads.items():
        names[processes[pid]].add(name)
    assert names["GPUs"] == {"GPU 0 idle", "GPU 1 idle"}
    assert names["executor io"] == {"io_0", "io_1", "queue 1", "queue 2", "queue 3"}
    assert names["executor asyncio"] == {"MainThread", "MainThread (2)"}
    assert names["executor direct"] == {"worker 1 (inferred)"}
    # every slice sits on a named track
    for track in slices_by_track(trace):
        assert track in threads


def test_calls_have_a_queue_slice_and_an_exec_slice(trace):
    by_call = defaultdict(dict)
    for event in trace["traceEvents"]:
        if event["ph"] == "X" and event["cat"] in ("queue", "exec"):
            by_call[event["args"]["call_id"]][event["cat"]] = event
    call_2 = by_call["call_2"]
    assert call_2["queue"]["ts"] == pytest.approx(3_000_000)
    assert call_2["queue"]["dur"] == pytest.approx(500_000)
    assert call_2["exec"]["ts"] == pytest.approx(3_500_000)
    assert call_2["exec"]["dur"] == pytest.approx(1_000_000)
    assert call_2["exec"]["name"] == "search"
    assert len(call_2["exec"]["args"]["trace_id"]) == 32
    assert "queue" not in by_call["call_1"]  # never waited


def test_gpu_counters_and_idle_slices(trace):
    counters = defaultdict(list)
    for event in trace["traceEvents"]:
        if event["ph"] == "C":
            counters[event["name"]].append(event["args"]["utilization"])
    assert set(counters) == {"GPU 0 utilization %", "GPU 1 utilization %"}
    assert set(counters["GPU 0 utilization %"]) == {2.0, 90.0}
    idle = sorted((e["args"]["gpu"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["name"] == "gpu.idle")
    assert idle == [
        ("0", pytest.approx(2_000_000), pytest.approx(3_000_000)),
        ("1", pytest.approx(3_000_000), pytest.approx(1_000_000)),
    ]


def test_flow_arrows_pair_an_idle_window_with_each_call_it_blamed(trace):
    events = trace["traceEvents"]
    tracks = slices_by_track(trace)
    flows = defaultdict(dict)
    for event in events:
        if event["ph"] in ("s", "f"):
            assert event["ph"] not in flows[event["id"]], "a flow id used twice"
            flows[event["id"]][event["ph"]] = event

    def enclosing(event):
        return [x for x in tracks[(event["pid"], event["tid"])] if x["ts"] <= event["ts"] <= x["ts"] + x["dur"]]

    targets = set()
    for pair in flows.values():
        assert set(pair) == {"s", "f"}
        (window,) = [x for x in enclosing(pair["s"]) if x["name"] == "gpu.idle"]
        (call,) = enclosing(pair["f"])
        targets.add(
            (window["args"]["gpu"], call["name"], call["cat"], call["args"]["call_id"] or call["args"]["span_id"])
        )
    # GPU 0 idle 2-5 s: embed, the three searches (queued and executing), both fetches
    # GPU 1 idle 3-4 s: embed, the searches, the second fetch (until 3.5)
    assert ("0", "embed", "exec", "call_1") in targets
    # one arrow per window and call: to the exec slice when the blamed
    # stretch reaches execution, to the queue slice when it was all queued
    assert ("0", "search", "exec", "call_2") in targets and ("0", "search", "queue", "call_2") not in targets
    assert ("1", "search", "queue", "call_4") in targets  # queued 3.3-4.2, GPU 1 idle until 4
    assert not any(name == "notify" for _, name, _, _ in targets)
    gpu0_fetch = [t for t in targets if t[0] == "0" and t[1] == "fetch"]
    assert len(gpu0_fetch) == 2


def test_turns_and_model_calls_have_tracks_of_their_own(tmp_path):
    run = RecordedRun(tmp_path / "traces.jsonl")
    turn = run.invoke_agent("support", 0.0, 10.0)
    run.model_call("llama-3-70b", 0.0, 2.0, parent=turn, input_tokens=800, output_tokens=40, first_chunk=0.3)
    run.tool_call("search", 2.0, 3.0, 6.0, parent=turn)
    run.model_call("llama-3-70b", 6.0, 8.0, parent=turn)
    run.model_call("embedder", 7.0, 7.5, parent=turn)
    run.close()
    out = tmp_path / "trace.json"
    assert main(["report", str(tmp_path / "traces.jsonl"), "--perfetto", str(out), "--format", "json"]) == 0
    events = json.loads(out.read_text())["traceEvents"]

    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    (turn_slice,) = [e for e in slices if processes[e["pid"]] == "Agent turns"]
    assert (turn_slice["name"], turn_slice["ts"], turn_slice["dur"]) == ("support", 0.0, 10_000_000.0)
    assert turn_slice["args"]["model_s"] == pytest.approx(4.0)  # the embedder's 7-7.5 s is inside 6-8: once
    assert turn_slice["args"]["tool_queue_s"] == pytest.approx(1.0)
    assert turn_slice["args"]["tool_exec_s"] == pytest.approx(3.0)
    model_slices = [e for e in slices if processes[e["pid"]] == "Models"]
    assert sorted((threads[(e["pid"], e["tid"])], e["ts"]) for e in model_slices) == [
        ("embedder", 7_000_000.0),
        ("llama-3-70b", 0.0),
        ("llama-3-70b", 6_000_000.0),
    ]
    first = next(e for e in model_slices if e["ts"] == 0.0)
    assert first["args"]["input_tokens"] == 800 and first["args"]["time_to_first_chunk_s"] == pytest.approx(0.3)
