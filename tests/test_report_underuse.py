"""Unused GPU capacity in the report: a GPU that dips to 30% while a tool runs.

The article's case: ``nvidia-smi dmon -s pucv -d 2 -o DT`` shows the GPU at
95% while the model works and at 30% whenever ``vector_search`` runs. It
is never idle (30% is far above the 10% threshold), so idle windows alone
blame nothing; the unused capacity, ``(1 - utilization) x time``, does.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from agent_otel.commands.cli import main
from helpers.traces import T0, RecordedRun

TURNS = 10
TURN_S = 60.0
SEARCH = (20.5, 30.5)  # vector_search in each turn: the GPU at 30%
WEATHER = (35.0, 40.0, 45.0)  # fetch_weather calls, 0.5 s each, while the model keeps working

# The header and units lines `nvidia-smi dmon -s pucv -o DT` prints (columns of -s p, u, c, v).
DMON_HEADER = (
    "#Date        Time         gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk  pviol  tviol\n"
    "#YYYYMMDD    HH:MM:SS     Idx      W      C      C      %      %      %      %      %      %    MHz    MHz      %   bool\n"
)


def utilization_at(seconds: float) -> int:
    """What the GPU does at ``seconds`` after the start: 30% during a search, else 95%."""
    into_turn = seconds % TURN_S
    return 30 if SEARCH[0] < into_turn <= SEARCH[1] else 95


def write_dmon(path, spacing_s: int = 2) -> None:
    """``nvidia-smi dmon -s pucv -d 2 -o DT``, in UTC: one line per GPU every 2 s."""
    lines = [DMON_HEADER]
    for seconds in range(0, int(TURNS * TURN_S) + 1, spacing_s):
        moment = T0 + timedelta(seconds=seconds)
        sm = utilization_at(seconds)
        power = 120 + 5 * sm
        lines.append(
            f" {moment:%Y%m%d}    {moment:%H:%M:%S}       0    {power:3d}     58      -     {sm:2d}     "
            f"{sm // 2:2d}      0      0      0      0   2619   1980      0      0\n"
        )
        if seconds and seconds % 40 == 0:
            lines.append(DMON_HEADER)  # dmon repeats its header now and then
    path.write_text("".join(lines))


@pytest.fixture
def dipping_run(tmp_path):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, TURNS * TURN_S)
    for turn in range(TURNS):
        base = turn * TURN_S
        run.tool_call("vector_search", base + SEARCH[0], base + SEARCH[0], base + SEARCH[1], executor="direct")
        for start in WEATHER:
            run.tool_call("fetch_weather", base + start, base + start, base + start + 0.5, executor="io")
    write_dmon(tmp_path / "gpu-dmon.log")
    return tmp_path


def test_a_tool_the_gpu_dips_for_ranks_first_with_a_recommendation_at_default_settings(dipping_run, capsys):
    assert (
        main(
            [
                "report",
                str(dipping_run / "traces.jsonl"),
                "--gpu-log",
                str(dipping_run / "gpu-dmon.log"),
                "--tz",
                "UTC",
                "--format",
                "json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)

    tools = report["tools"]
    assert [t["tool"] for t in tools] == ["vector_search", "fetch_weather"]  # fetch_weather has 3x the calls
    search, weather = tools
    # Never idle: idle windows alone blame nothing.
    assert search["gpu_idle_blocked_s"] == 0.0 and report["gpus"][0]["idle_s"] == 0.0
    # Truth: 10 s at 30% per turn, 0.7 x 10 x 10 = 70 GPU-s. dmon's 2 s
    # samples place each edge to within one sample.
    assert search["gpu_underused_blocked_s"] == pytest.approx(70.0, abs=TURNS * 2 * 0.7)
    assert search["gpu_underused_blocked_exec_s"] == search["gpu_underused_blocked_s"]
    assert search["gpu_underused_blocked_queue_s"] == 0.0
    assert weather["gpu_underused_blocked_s"] == pytest.approx(TURNS * 3 * 0.5 * 0.05, abs=0.2)
    [gpu] = report["gpus"]
    assert gpu["underused_s"] == pytest.approx(gpu["underused_blocked_s"] + gpu["underused_unattributed_s"])
    assert gpu["underused_s"] == pytest.approx(TURNS * (10 * 0.7 + 50 * 0.05), abs=TURNS * 2 * 0.7)
    assert gpu["missing_s"] == 0.0
    assert 0.8 < gpu["utilization_avg"] < 0.9

    [advice] = [r for r in report["recommendations"] if r["kind"] == "overlap_tool_with_gpu"]
    assert advice["subject"] == "vector_search"
    evidence = advice["evidence"]
    assert evidence["utilization_during"] == pytest.approx(0.30, abs=0.07)
    assert evidence["utilization_otherwise"] == pytest.approx(0.95, abs=0.02)
    assert evidence["underused_share"] > 0.6
    assert advice["message"].startswith(
        'tool="vector_search" leaves gpu="0" waiting: the GPU ran at '
        f"{evidence['utilization_during']:.0%} while its calls were in flight (100 s) "
        f"and {evidence['utilization_otherwise']:.0%} the rest of the time"
    )
    assert advice["docs"] == "docs/remedies.md#when-the-gpu-waits-on-a-tool"


def test_the_table_ranks_by_unused_capacity_and_shows_it(dipping_run, capsys):
    assert (
        main(
            ["report", str(dipping_run / "traces.jsonl"), "--gpu-log", str(dipping_run / "gpu-dmon.log"), "--tz", "UTC"]
        )
        == 0
    )
    out = capsys.readouterr().out
    tools = out[out.index("Tools, by GPU capacity they left unused") : out.index("Executors")].splitlines()
    assert tools[1].split()[:3] == ["TOOL", "UNUSED", "BLOCKED"]
    assert tools[2].split()[0] == "vector_search"
    assert 60.0 < float(tools[2].split()[1]) < 80.0
    assert "[overlap_tool_with_gpu]" in out


def test_without_utilization_samples_the_underused_fields_are_null(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 10.0)
    run.tool_call("search", 1.0, 1.0, 4.0)
    run.idle_window(0, 1.0, 4.0)
    run.provider.shutdown()
    assert main(["report", str(tmp_path / "traces.jsonl"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)

    [tool] = report["tools"]
    assert tool["gpu_idle_blocked_s"] == pytest.approx(3.0)
    assert tool["gpu_underused_blocked_s"] is None
    [gpu] = report["gpus"]
    assert gpu["underused_s"] is None and gpu["missing_s"] is None and gpu["utilization_avg"] is None
    assert not [r for r in report["recommendations"] if r["kind"] == "overlap_tool_with_gpu"]


def test_a_gap_in_a_gpu_log_is_missing_data_said_so(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 60.0)
    run.tool_call("search", 10.0, 10.0, 50.0)
    lines = [DMON_HEADER]
    for seconds in list(range(0, 20, 2)) + list(range(40, 61, 2)):  # nothing from 18 to 40 s
        moment = T0 + timedelta(seconds=seconds)
        lines.append(
            f" {moment:%Y%m%d}    {moment:%H:%M:%S}       0    300     58      -     0      0      0      0"
            "      0      0   2619   1980      0      0\n"
        )
    (tmp_path / "gpu.log").write_text("".join(lines))
    assert (
        main(
            [
                "report",
                str(tmp_path / "traces.jsonl"),
                "--gpu-log",
                str(tmp_path / "gpu.log"),
                "--tz",
                "UTC",
                "--format",
                "json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)

    [gpu] = report["gpus"]
    assert gpu["missing_s"] == pytest.approx(22.0)
    # Idle on both sides of the gap, and not across it.
    assert gpu["idle_s"] == pytest.approx(18.0 + 20.0)
    assert gpu["underused_s"] == pytest.approx(18.0 + 20.0)
    assert any("22 s of its utilization samples are missing" in w for w in report["inputs"]["warnings"])


def test_the_html_timeline_draws_the_unused_capacity_tools_are_blamed_for(dipping_run, tmp_path):
    from helpers.browser import Elements, chromium, console_messages

    page = tmp_path / "report.html"
    assert (
        main(
            [
                "report",
                str(dipping_run / "traces.jsonl"),
                "--gpu-log",
                str(dipping_run / "gpu-dmon.log"),
                "--tz",
                "UTC",
                "--html",
                str(page),
            ]
        )
        == 0
    )
    text = page.read_text()
    data = json.loads(text.split('<script type="application/json" id="report-data">')[1].split("</script>")[0])
    [gpu] = data["gpus"]
    unused = gpu["unused"]
    assert len(unused["start"]) == len(unused["end"]) == len(unused["blamed"]) == TURNS * TURN_S / 2
    during = [
        r for s, r in zip(unused["start"], unused["blamed"]) if SEARCH[0] + 1 <= (s / 1000) % TURN_S < SEARCH[1] - 2
    ]
    assert during and all(r == pytest.approx(0.7) for r in during)
    weather = [r for s, r in zip(unused["start"], unused["blamed"]) if 34 <= (s / 1000) % TURN_S < 46]
    assert max(weather) == pytest.approx(0.05 * 0.5 / 2)  # 5% unused, a quarter of the 2 s sample in flight
    assert "Tools, by GPU capacity they left unused" in text

    result = chromium(tmp_path, page.as_uri(), "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert console_messages(result) == []
    dom = Elements(result.stdout)
    [label] = [e for e in dom.found if e["attrs"].get("class") == "lane-label gpu"]
    assert label["text"].startswith("GPU 0") and "utilization" in label["text"]
    legend = result.stdout.split('id="legend"')[1].split("</div>")[0]
    assert "GPU capacity unused while tool calls ran" in legend  # the red the GPU lane hangs from the top
