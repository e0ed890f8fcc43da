"""The report and the model calls: edges from the spans, the model server's
share, and GPU data that contradicts the model calls (docs/attribution.md,
docs/report.md).

The engineered agent: 10 turns over ~21 s; each turn a model call, a
search, a second model call, then a short flaky call, a CPU-bound parse
and some of the agent's own code. The simulated GPU is busy exactly while
the model generates, sampled as NVML samples it (each sample the average
over the 1/6 s before it, on a grid that does not line up with the calls),
and written to the GPU log a user would record. The truth is known: the
GPU idles exactly between the model calls, so each tool is to blame for
its whole duration.
"""

from __future__ import annotations

import json
import random

import pytest

from agent_otel.commands.cli import main
from agent_otel.gpu.simulated import SimulatedGpu
from helpers.traces import T0_NS, RecordedRun, ns, write_gpu_csv

TURNS = 10


def report_of(capsys, *argv) -> dict:
    assert main(["report", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def sampled(busy: list[tuple[float, float]], end: float, *, period_s: float = 1 / 6, offset_s: float = 0.5517):
    """(seconds after T0, gpu, percent) samples of a simulated GPU busy during ``busy``."""
    now = [ns(-offset_s)]
    gpu = SimulatedGpu(sample_period_s=period_s, clock=lambda: now[0])
    samples = []
    for start, stop in busy:
        for moment, started in ((start, True), (stop, False)):
            now[0] = ns(moment)
            samples += gpu.poll()
            gpu.model_call(started)
    now[0] = ns(end)
    samples += gpu.poll()
    return [((s.timestamp_ns - T0_NS) / 1e9, 0, round(100 * s.utilization)) for s in samples]


@pytest.fixture
def engineered(tmp_path):
    """Returns (directory, truth by tool in seconds, model seconds)."""
    rng = random.Random(26)
    run = RecordedRun(tmp_path / "traces.jsonl")
    busy = []
    truth = {"search": 0.0, "flaky": 0.0, "cpu_parse": 0.0}
    t = 0.0
    for number in range(TURNS):
        first, search, second = rng.uniform(0.13, 0.19), rng.uniform(0.6, 0.8), rng.uniform(0.11, 0.17)
        flaky, parse, own = rng.uniform(0.08, 0.12), rng.uniform(0.45, 0.55), rng.uniform(0.4, 0.5)
        turn = run.invoke_agent("research", t, t + first + search + second + flaky + parse + own)
        run.model_call("llama", t, t + first, input_tokens=500, output_tokens=20, parent=turn)
        busy.append((t, t + first))
        t += first
        run.tool_call("search", t, t, t + search, call_id=f"s{number}", parent=turn)
        truth["search"] += search
        t += search
        run.model_call("llama", t, t + second, input_tokens=600, output_tokens=30, parent=turn)
        busy.append((t, t + second))
        t += second
        run.tool_call("flaky", t, t, t + flaky, outcome="error", call_id=f"f{number}", parent=turn)
        truth["flaky"] += flaky
        t += flaky
        run.tool_call("cpu_parse", t, t, t + parse, call_id=f"p{number}", parent=turn)
        truth["cpu_parse"] += parse
        t += parse + own  # the agent's own code: nobody's
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", sampled(busy, t + 1.0))
    model_s = sum(stop - start for start, stop in busy)
    return tmp_path, truth, model_s, t


def test_tools_blame_and_gpu_busy_match_the_truth_with_edges_from_the_spans(engineered, capsys):
    directory, truth, model_s, seconds = engineered
    assert 19.0 < seconds < 23.0
    report = report_of(capsys, directory / "traces.jsonl", "--gpu-log", directory / "gpu.csv", "--tz", "UTC")
    blamed = {tool["tool"]: tool["gpu_idle_blocked_s"] for tool in report["tools"]}
    for tool, expected in truth.items():
        assert abs(blamed[tool] - expected) <= max(0.1 * expected, 0.05), (tool, blamed[tool], expected)
    (gpu,) = report["gpus"]
    assert gpu["busy_s"] == pytest.approx(model_s, rel=0.05)
    assert gpu["edges_moved"] > 2 * TURNS
    assert report["inputs"]["gpu_edges"] == "spans"
    # the GPU was busy whenever the model generated: no contradiction, nothing the model server's
    assert gpu["idle_model_s"] == pytest.approx(0.0, abs=0.01)
    assert gpu["model_in_flight_s"] == pytest.approx(model_s, rel=0.01)
    assert not any("contradicts" in warning for warning in report["inputs"]["warnings"])
    # The samples' own answer is in the JSON beside it: more busy time than the model's.
    assert gpu["busy_samples_s"] > 1.2 * model_s
    assert gpu["idle_samples_s"] < gpu["idle_s"]


def test_the_samples_own_edges_stay_available(engineered, capsys):
    directory, truth, model_s, _ = engineered
    report = report_of(
        capsys, directory / "traces.jsonl", "--gpu-log", directory / "gpu.csv", "--tz", "UTC", "--gpu-edges", "samples"
    )
    blamed = {tool["tool"]: tool["gpu_idle_blocked_s"] for tool in report["tools"]}
    # Each window starts and ends on the samples' 1/6 s grid: the short
    # call right after a model call loses most of its blame.
    assert blamed["flaky"] < 0.7 * truth["flaky"]
    (gpu,) = report["gpus"]
    assert gpu["busy_s"] > 1.2 * model_s
    assert gpu["edges_moved"] == 0 and gpu["idle_samples_s"] is None
    assert report["inputs"]["gpu_edges"] == "samples"


def test_a_gpu_that_reads_idle_while_the_model_generates_is_called_out(engineered, capsys):
    directory, truth, model_s, seconds = engineered
    # The same agent, with a simulated GPU nobody drove: idle throughout.
    write_gpu_csv(directory / "idle.csv", sampled([], seconds + 1.0))
    report = report_of(capsys, directory / "traces.jsonl", "--gpu-log", directory / "idle.csv", "--tz", "UTC")
    (gpu,) = report["gpus"]
    assert gpu["idle_model_s"] == pytest.approx(model_s, rel=0.01)
    assert gpu["model_idle_ratio"] == pytest.approx(1.0, abs=0.01)
    warnings = [w for w in report["inputs"]["warnings"] if "contradicts the model calls" in w]
    assert len(warnings) == 1, report["inputs"]["warnings"]
    assert "GPU 0" in warnings[0] and "clocks apart" in warnings[0] and "another GPU or host" in warnings[0]
    # The model's time is the model server's, not the tools', nor unattributed.
    (model,) = report["models"]
    assert model["gpu_idle_blocked_s"] == pytest.approx(model_s, rel=0.01)
    assert model["gpu_idle_blocked_queued_s"] == pytest.approx(model_s, rel=0.01)  # no first token reported
    blamed = {tool["tool"]: tool["gpu_idle_blocked_s"] for tool in report["tools"]}
    for tool, expected in truth.items():
        assert blamed[tool] == pytest.approx(expected, abs=0.01)


def test_a_coarse_gpu_log_is_named_with_what_it_can_and_cannot_show(engineered, capsys):
    directory, _truth, _model_s, seconds = engineered
    # nvidia-smi dmon -d 2: one sample every 2 s, averaged; the model's short calls vanish in it.
    write_gpu_csv(directory / "dmon.csv", [(2.0 * k, 0, 5) for k in range(int(seconds / 2) + 2)])
    report = report_of(
        capsys, directory / "traces.jsonl", "--gpu-log", directory / "dmon.csv", "--tz", "UTC", "--min-idle", "0.5"
    )
    coarse = [w for w in report["inputs"]["warnings"] if "coarser than the minimum idle time" in w]
    assert len(coarse) == 1
    assert "dmon.csv" in coarse[0] and "one sample every 2 s" in coarse[0]
    assert "it cannot show idle stretches shorter than 2 s" in coarse[0]
    assert report["inputs"]["gpu_logs"][0]["sample_interval_s"] == pytest.approx(2.0)
    # and the contradiction names the coarse log among its likely causes
    (contradiction,) = [w for w in report["inputs"]["warnings"] if "contradicts the model calls" in w]
    assert "coarse GPU log (one sample every 2 s" in contradiction


def test_idle_time_while_a_model_call_is_pending_is_not_the_tools(tmp_path, capsys):
    # One process, parallel branches: a background summary's model call is
    # in flight (queued 1 s, then streaming) while a tool runs and the GPU idles.
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.tool_call("fetch", 0.0, 0.0, 4.0)
    run.model_call("summarizer", 1.0, 3.0, first_chunk=1.0)
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 0) for k in range(0, 41)])
    report = report_of(capsys, tmp_path / "traces.jsonl", "--gpu-log", tmp_path / "gpu.csv", "--tz", "UTC")
    (fetch,) = report["tools"]
    assert fetch["gpu_idle_blocked_s"] == pytest.approx(2.0, abs=0.01)
    (model,) = report["models"]
    assert model["gpu_idle_blocked_queued_s"] == pytest.approx(1.0, abs=0.01)
    assert model["gpu_idle_blocked_decode_s"] == pytest.approx(1.0, abs=0.01)
    (gpu,) = report["gpus"]
    assert gpu["idle_model_s"] == pytest.approx(2.0, abs=0.01)
    assert gpu["idle_blocked_s"] + gpu["idle_model_s"] + gpu["idle_unattributed_s"] == pytest.approx(gpu["idle_s"])


def test_the_sentences_show_the_blame_that_was_computed(engineered, capsys):
    directory, truth, _model_s, _ = engineered
    assert (
        main(["report", str(directory / "traces.jsonl"), "--gpu-log", str(directory / "gpu.csv"), "--tz", "UTC"]) == 0
    )
    text = capsys.readouterr().out
    per_call = truth["flaky"] / TURNS  # 0.10 s: "0.0" on main
    assert f"flaky idles the GPU {per_call:.2g} s per call ({truth['flaky']:.1f} s blamed over 10 calls)" in text
    assert "idles the GPU 0.0 s per call" not in text
    assert "of the turns' time" in text and "of end-to-end latency" not in text


def test_turns_that_ran_at_once_are_not_shown_as_wall_time(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    for conversation in range(4):  # four conversations at once, 10 s each, in a 10 s run
        turn = run.invoke_agent("conversation", 0.0, 10.0)
        run.model_call("llama", 0.0, 1.0, parent=turn)
        run.tool_call("search", 1.0, 1.0, 0.01 + 9.0, parent=turn, call_id=f"c{conversation}")
    run.close()
    assert main(["report", str(tmp_path / "traces.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "4 turns (invoke_agent spans): 40.0 s summed over turns that ran at once (the run lasted 10.0 s)" in text
    assert "40.0 s end to end" not in text


def test_the_model_server_has_its_row_in_the_gpu_table_and_a_sentence(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.tool_call("fetch", 0.0, 0.0, 4.0)
    run.model_call("summarizer", 1.0, 3.0, first_chunk=1.0)
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 0) for k in range(0, 41)])
    assert main(["report", str(tmp_path / "traces.jsonl"), "--gpu-log", str(tmp_path / "gpu.csv"), "--tz", "UTC"]) == 0
    text = capsys.readouterr().out
    assert "MODEL SERVER" in text
    assert (
        "the model server idles the GPU 2.0 s while summarizer calls are in flight "
        "(1.0 s before their first token, 1.0 s streaming)" in text
    )


def test_a_small_blame_per_call_is_not_rounded_to_nothing(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    for number in range(10):  # ten turns, each a model call and a 32 ms tool call on an idle GPU
        t = 1.0 * number
        turn = run.invoke_agent("quick", t, t + 0.9)
        run.model_call("llama", t, t + 0.3, parent=turn)
        run.tool_call("flaky", t + 0.3, t + 0.3, t + 0.332, call_id=f"f{number}", parent=turn)
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 0) for k in range(0, 101)])
    assert main(["report", str(tmp_path / "traces.jsonl"), "--gpu-log", str(tmp_path / "gpu.csv"), "--tz", "UTC"]) == 0
    text = capsys.readouterr().out
    assert "flaky idles the GPU 0.032 s per call (0.32 s blamed over 10 calls)" in text
