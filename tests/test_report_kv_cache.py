"""Memory held while tools run: the model server's KV cache in the idle
windows, charged to the tools blamed for them (agent_otel.report.kv_cache).

The gpu.idle window spans are the live path's and the blame service's with a
model server read (agent.model_server.kv_cache.usage: the mean of its
readings during the window).
"""

from __future__ import annotations

import json

import pytest

from agent_otel.commands.cli import main
from helpers.server_traces import kv_window
from helpers.traces import RecordedRun


@pytest.fixture
def run(tmp_path):
    """embed runs 1-4 s, search 3-7.5 s; the GPU idles 2-5 s with 60 % of the KV cache
    in use, and 6-7 s with 20 %. Blame: 2-3 s embed, 3-4 s both (half each), 4-5 s
    and 6-7 s search."""
    recorded = RecordedRun(tmp_path / "traces.jsonl")
    recorded.agent_run(0.0, 8.0)
    recorded.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    recorded.tool_call("search", 3.0, 3.0, 7.5, executor="direct")
    kv_window(recorded, 2.0, 5.0, 0.6)
    kv_window(recorded, 6.0, 7.0, 0.2)
    recorded.close()
    return tmp_path


def report(capsys, path, *options) -> dict:
    assert main(["report", str(path / "traces.jsonl"), *options, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cache_in_use_while_the_gpu_idled_is_charged_to_the_tools_blamed(run, capsys):
    kv = report(capsys, run)["kv_cache"]
    assert kv["windows"] == 2 and kv["idle_s"] == pytest.approx(4.0)
    assert kv["kv_cache_usage_avg"] == pytest.approx((0.6 * 3 + 0.2 * 1) / 4)
    tools = {t["tool"]: t for t in kv["tools"]}
    assert [t["tool"] for t in kv["tools"]] == ["search", "embed"]  # most cache held first
    assert tools["embed"]["gpu_idle_blocked_s"] == pytest.approx(1.5)
    assert tools["embed"]["kv_cache_held_s"] == pytest.approx(0.6 * 1.5)
    assert tools["embed"]["kv_cache_held_share"] == pytest.approx(0.6)
    assert tools["search"]["kv_cache_held_s"] == pytest.approx(0.6 * 1.5 + 0.2 * 1.0)
    assert tools["search"]["kv_cache_held_share"] == pytest.approx((0.9 + 0.2) / 2.5, abs=1e-4)


def test_the_table_and_the_html_show_it(run, capsys, tmp_path):
    page = tmp_path / "r.html"
    assert main(["report", str(run / "traces.jsonl"), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "Model server KV cache held while tools blocked the idle GPU" in out
    assert "cache was 50 % in use on average" in out
    assert 'id="kv-cache-table"' in page.read_text()


def test_without_the_servers_readings_nothing_is_shown(tmp_path, capsys):
    recorded = RecordedRun(tmp_path / "traces.jsonl")
    recorded.agent_run(0.0, 8.0)
    recorded.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    kv_window(recorded, 2.0, 5.0, None)
    recorded.close()
    found = report(capsys, tmp_path)
    assert found["kv_cache"] is None
    assert found["tools"][0]["gpu_idle_blocked_s"] == pytest.approx(2.0)
