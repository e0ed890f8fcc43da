"""What idle costs: the blamed GPU idle time as money (gpu_hour_price).

The run: 9 s, one GPU idle from 2 s to 5 s; embed is blamed 1.5 s and
search 1.0 s of it, 0.5 s nobody (tests/test_report.py's stalled run).
"""

from __future__ import annotations

import json

import pytest

from agent_otel.commands.cli import main
from agent_otel.errors import ConfigError
from agent_otel.support.prices import DEFAULT_TABLE, parse_prices
from helpers.traces import RecordedRun, T0, write_gpu_csv


@pytest.fixture
def stalled_run(tmp_path):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 9.0)
    run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    run.tool_call("search", 3.0, 3.5, 4.5)
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 3 if 20 < k <= 50 else 85) for k in range(100)])
    return tmp_path


def report(capsys, run, *options) -> dict:
    argv = ["report", str(run / "traces.jsonl"), "--gpu-log", str(run / "gpu.csv"), "--tz", "UTC"]
    assert main([*argv, *options, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_no_price_no_money(stalled_run, capsys, monkeypatch):
    monkeypatch.delenv("AGENT_OTEL_GPU_HOUR_PRICE", raising=False)
    found = report(capsys, stalled_run)
    assert found["cost"] is None
    assert all("cost_per_day" not in r["evidence"] for r in found["recommendations"])
    assert main(["report", str(stalled_run / "traces.jsonl"), "--gpu-log", str(stalled_run / "gpu.csv")]) == 0
    assert "$" not in capsys.readouterr().out


def test_blamed_idle_time_is_priced_per_tool_and_per_day_at_this_load(stalled_run, capsys):
    found = report(capsys, stalled_run, "--gpu-hour-price", "3.6")  # $0.001 a GPU-second
    cost = found["cost"]
    assert cost["idle_cost"] == pytest.approx(0.003)
    assert cost["idle_blocked_cost"] == pytest.approx(0.0025)
    assert cost["idle_unattributed_cost"] == pytest.approx(0.0005)
    assert cost["idle_model_cost"] == 0.0  # no model call in flight
    parts = cost["idle_blocked_cost"] + cost["idle_model_cost"] + cost["idle_unattributed_cost"]
    assert parts == pytest.approx(cost["idle_cost"])
    tools = {t["tool"]: t for t in cost["tools"]}
    assert list(tools) == ["embed", "search"]  # most expensive first
    assert tools["embed"]["gpu_idle_blocked_cost"] == pytest.approx(0.0015)
    assert tools["embed"]["gpu_idle_blocked_gpu_hours"] == pytest.approx(1.5 / 3600, rel=1e-3)
    # 1.5 s in a 9 s window: 14,400 s a day, 4 GPU-hours, $14.40.
    assert tools["embed"]["gpu_hours_per_day"] == pytest.approx(4.0)
    assert tools["embed"]["cost_per_day"] == pytest.approx(14.4)
    assert cost["source"] == "gpu_hour_price=3.6" and cost["unpriced_gpus"] == []


def test_the_recommendations_say_what_a_fix_saves_a_day(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 10.0)
    run.tool_call("embed", 1.0, 1.0, 9.0, executor="direct")  # the GPU idles 2-9 s, all of it embed's
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 2 if 20 < k <= 90 else 90) for k in range(100)])
    plain = report(capsys, tmp_path)
    priced = report(capsys, tmp_path, "--gpu-hour-price", "2")
    about_embed = [r for r in priced["recommendations"] if r["evidence"].get("tool") == "embed"]
    assert about_embed, priced["recommendations"]
    for recommendation in about_embed:
        # 7 s of 10 s blamed: 16.8 GPU-hours a day, $33.60 at $2.
        assert recommendation["evidence"]["gpu_hours_per_day"] == pytest.approx(16.8)
        assert recommendation["evidence"]["cost_per_day"] == pytest.approx(33.6)
        assert "about 17 GPU-hours, $33.60, a day" in recommendation["message"]
        [before] = [r for r in plain["recommendations"] if r["kind"] == recommendation["kind"]]
        assert "GPU-hours" not in before["message"]


def test_the_table_and_the_html_show_the_money(stalled_run, capsys, tmp_path):
    argv = ["report", str(stalled_run / "traces.jsonl"), "--gpu-log", str(stalled_run / "gpu.csv"), "--tz", "UTC"]
    assert main([*argv, "--gpu-hour-price", "3.6", "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "What the GPU idle time costs (gpu_hour_price)" in out
    assert "idle $0.003: blocked by tools $0.0025" in out
    page = (tmp_path / "r.html").read_text()
    assert 'id="cost-table"' in page and "$14.40" in page


def test_prices_per_pool_per_model_and_the_default_table():
    prices = parse_prices("table,pool:vllm-a:8000=2.2,h100=9,0.5")
    assert prices.price("vllm-a:8000", "NVIDIA H100 80GB HBM3") == 2.2  # the pool's own first
    assert prices.price("", "NVIDIA H100 80GB HBM3") == 9.0  # yours before the table's
    assert prices.price("", "NVIDIA A100-SXM4-80GB") == dict(DEFAULT_TABLE)["A100"]
    assert prices.price("", "Tesla T4") == 0.5  # the plain price
    assert parse_prices("table").price("", "Tesla T4") is None  # the table has no T4: no money
    assert "mercatus" in parse_prices("table").source()
    assert parse_prices(None) is None and parse_prices("  ") is None
    for bad in ("cheap", "H100=", "=3", "pool:=2", "-1", "nan"):
        with pytest.raises(ConfigError, match="gpu_hour_price"):
            parse_prices(bad)


def test_a_bad_price_names_the_option(stalled_run, capsys):
    assert main(["report", str(stalled_run / "traces.jsonl"), "--gpu-hour-price", "two dollars"]) == 2
    assert "--gpu-hour-price" in capsys.readouterr().err


def test_the_gpu_model_comes_from_the_logs_name_column(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 9.0)
    run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    run.close()
    lines = ["timestamp, index, name, utilization.gpu [%]"]
    for k in range(90):
        moment = f"{T0:%Y/%m/%d %H:%M}:{k / 10:06.3f}"
        lines.append(f"{moment}, 0, NVIDIA H100 80GB HBM3, {3 if 20 < k <= 50 else 85} %")
    (tmp_path / "gpu.csv").write_text("\n".join(lines) + "\n")
    found = report(capsys, tmp_path, "--gpu-hour-price", "table")
    [gpu] = found["cost"]["gpus"]
    assert gpu["gpu_hour_price"] == dict(DEFAULT_TABLE)["H100"]


def test_idle_time_no_tool_held_is_priced_on_its_recommendation(tmp_path, capsys):
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 10.0)
    run.tool_call("embed", 0.5, 0.5, 1.0, executor="direct")  # done before the GPU idles
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 2 if 20 < k <= 90 else 90) for k in range(100)])
    found = report(capsys, tmp_path, "--gpu-hour-price", "2")
    [idle] = [r for r in found["recommendations"] if r["kind"] == "idle_not_tools"]
    # 7 s of 10 s with no call in flight: 16.8 GPU-hours a day, $33.60 at $2.
    assert idle["evidence"]["gpu_hours_per_day"] == pytest.approx(16.8)
    assert idle["evidence"]["cost_per_day"] == pytest.approx(33.6)
    assert "about 17 GPU-hours, $33.60, a day" in idle["message"]
