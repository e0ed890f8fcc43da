"""The dashboards as code: committed JSON is current, and every panel is sound.

These tests read the committed JSON, as Grafana would, and hold it to the
telemetry contract: only metric names the toolkit exports, variables for
data source, service, instance, tool and GPU, units and thresholds on
every panel. Whether the queries return data is tests/test_prometheus_e2e.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards import build, latency, rules
from dashboards.contract import series_names
from dashboards.slo import LatencySLO

REPO = Path(__file__).resolve().parents[1]
JSON_DIR = REPO / "dashboards" / "json"


def load(name: str) -> dict:
    return json.loads((JSON_DIR / name).read_text())


DASHBOARDS = {name: load(name) for name in ("agent-tools-vs-gpu.json", "tool-latency-and-slos.json", "executors.json")}


def panels(dashboard: dict) -> dict[str, dict]:
    return {panel["title"]: panel for panel in dashboard["panels"]}


def exprs(dashboard: dict) -> list[str]:
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def test_committed_files_match_the_generator():
    stale = build.stale_files(build.artefacts(LatencySLO()))
    assert stale == [], f"run `python -m dashboards` and commit: {[str(p) for p in stale]}"


def test_check_mode_reports_current_files_and_refuses_a_bad_threshold():
    ok = subprocess.run([sys.executable, "-m", "dashboards", "--check"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    # It says what it checked: every generated file, by name.
    (said,) = ok.stdout.splitlines()
    generated = {str(path.relative_to(REPO)) for path in build.artefacts(LatencySLO())}
    assert said.startswith(f"checked {len(generated)} files against the code that generates them, all current: ")
    assert set(said.split(": ", 1)[1].split(", ")) == generated
    bad = subprocess.run(
        [sys.executable, "-m", "dashboards", "--check", "--slo-threshold", "0.75"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "0.75" in bad.stderr and "0.8" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("missing", ["grafana_foundation_sdk", "yaml"])
def test_without_the_dev_extra_it_says_in_one_line_what_to_install(missing):
    # The demo's install (pip install agent-otel) lacks the dev extra: the
    # module is made unimportable as it is there.
    program = (
        f"import runpy, sys; sys.modules[{missing!r}] = None; sys.argv = ['dashboards', '--check']; "
        "runpy.run_module('dashboards', run_name='__main__', alter_sys=True)"
    )
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"python -m dashboards: needs {missing}, which the dev extra installs: "
        "pip install -e '.[dev]' (in the repository, on Python 3.11 or later)"
    ]


def test_dashboards_have_the_titles_and_panels_users_look_for():
    titles = {d["title"]: panels(d) for d in DASHBOARDS.values()}
    assert set(titles) == {"Agent tools vs GPU", "Tool latency and SLOs", "Executors"}
    assert {
        "GPU utilization per GPU",
        "GPU idle windows",
        "GPU idle blamed per tool and phase",
        "Unattributed GPU idle",
        "Tool calls in flight",
        "Tools ranked by GPU capacity left unused",
        "Unused GPU capacity blamed per tool and phase",
        "Unused GPU capacity per GPU",
    } <= set(titles["Agent tools vs GPU"])
    assert {
        "Tool duration p50 / p95 / p99",
        "Queue time p50 / p95 / p99",
        "Exec time p50 / p95 / p99",
        "Calls per second by outcome",
        "Error ratio",
        "SLO compliance (calls within 0.8 s)",
        "Error budget left",
        "Error budget burn rate",
    } <= set(titles["Tool latency and SLOs"])
    assert {
        "Queue depth",
        "Active vs max workers",
        "Wait time p50 / p95 / p99",
        "Saturation now (active / max workers)",
        "Saturated (all workers busy and calls queued)",
    } <= set(titles["Executors"])
    assert len({d["uid"] for d in DASHBOARDS.values()}) == 3


@pytest.mark.parametrize("name", DASHBOARDS)
def test_queries_use_only_metrics_the_toolkit_exports(name):
    known = series_names()
    for expr in exprs(DASHBOARDS[name]):
        # Metric names stand before a selector, or first in label_values().
        selected = {a or b for a, b in re.findall(r"([A-Za-z_:][\w:]*)\{|label_values\((\w+)", expr)}
        mentioned = set(re.findall(r"\bagent_\w+", expr))
        assert selected | mentioned <= known, f"unknown metric in {expr!r}: {(selected | mentioned) - known}"
        assert selected, f"query selects no metric: {expr!r}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_reads_the_selected_prometheus_and_filters_by_service_and_instance(name):
    dashboard = DASHBOARDS[name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for label in ("job", "instance"):
        assert variables[label]["multi"] and variables[label]["includeAll"] and variables[label]["allValue"] == ".*"
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"], panel["title"]


def test_tool_and_gpu_variables_filter_their_dashboards():
    gpu_vars = {v["name"] for v in DASHBOARDS["agent-tools-vs-gpu.json"]["templating"]["list"]}
    assert {"datasource", "traces", "job", "instance", "gpu", "tool"} <= gpu_vars
    latency_vars = {v["name"] for v in DASHBOARDS["tool-latency-and-slos.json"]["templating"]["list"]}
    assert {"datasource", "job", "instance", "tool"} <= latency_vars
    for name in ("agent-tools-vs-gpu.json", "tool-latency-and-slos.json"):
        for expr in exprs(DASHBOARDS[name]):
            if "agent_gpu_" in expr and "label_values" not in expr:
                assert 'gpu=~"$gpu"' in expr, expr
            if "tool" in expr and "agent_tool_" in expr and "label_values" not in expr:
                assert 'tool=~"$tool"' in expr, expr


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_set_units_and_thresholds(name):
    for panel in DASHBOARDS[name]["panels"]:
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("thresholds", {}).get("steps"), f"{panel['title']}: no thresholds"
        if panel["type"] == "table":
            units = [
                p["value"] for o in panel["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "unit"
            ]
            assert units, f"{panel['title']}: no column units"
        elif panel["type"] != "state-timeline":
            assert defaults.get("unit"), f"{panel['title']}: no unit"


def test_latency_panels_carry_exemplars_and_the_slo_line():
    by_title = panels(DASHBOARDS["tool-latency-and-slos.json"])
    for title in ("Tool duration p50 / p95 / p99", "Exec time p50 / p95 / p99"):
        panel = by_title[title]
        assert any(t.get("exemplar") for t in panel["targets"]), title
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert {"color": "red", "value": 0.8} in steps, title
        assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"


def test_gpu_idle_blame_is_stacked_by_tool_and_phase():
    panel = panels(DASHBOARDS["agent-tools-vs-gpu.json"])["GPU idle blamed per tool and phase"]
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert "sum by (tool, phase)" in panel["targets"][0]["expr"]
    assert "agent_gpu_idle_blocked_seconds_total" in panel["targets"][0]["expr"]


def test_saturation_is_highlighted_red_when_every_worker_is_busy():
    panel = panels(DASHBOARDS["executors.json"])["Saturation now (active / max workers)"]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 1}
    assert panel["options"]["colorMode"] == "background"


def test_slo_panels_follow_the_slo_parameters():
    dashboard = json.loads(build.dashboard_json(latency.build(LatencySLO(threshold_s=1, objective=0.99))))
    compliance = panels(dashboard)["SLO compliance (calls within 1 s)"]
    assert 'le=~"1(\\\\.0)?"' in compliance["targets"][0]["expr"]
    assert {"color": "green", "value": 0.99} in compliance["fieldConfig"]["defaults"]["thresholds"]["steps"]
    budget = panels(dashboard)["Error budget left"]["targets"][0]["expr"]
    assert budget.endswith("/ 0.01)")


def test_the_gpu_pools_dashboard_reads_the_pool_rules_and_the_blame_services_by_pool():
    dashboard = load("gpu-pools.json")
    assert dashboard["title"] == "GPU pools"
    assert {
        "GPUs idle now",
        "Tool calls in flight",
        "Idle GPUs blocked by running calls",
        "Late spans",
        "Live: GPU idle blamed per tool and phase",
        "Exact: GPU idle blamed per tool and phase",
        "GPU utilization per GPU",
        "Blame service intake",
        "Blame lag",
    } <= set(panels(dashboard))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["agent_gpu_pool"]["query"] == "label_values(target_info, agent_gpu_pool)"
    known = series_names() | {
        "target_info",
        rules.POOL_INFLIGHT,
        rules.POOL_GPU_IDLE,
        rules.POOL_BLOCKED_LIVE,
        rules.POOL_GPU_BLOCKED,
    }
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            selected = set(re.findall(r"([A-Za-z_:][\w:]*)\{", expr))
            assert selected and selected <= known, f"{panel['title']}: {selected - known}"
            # Every query is narrowed to the selected pools, directly or through target_info.
            assert 'agent_gpu_pool=~"$agent_gpu_pool"' in expr, expr
