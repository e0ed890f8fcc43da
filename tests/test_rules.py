"""The generated Prometheus rules: valid, tested with promtool, parameterized.

promtool's unit tests (dashboards/rules/tests.yml) show each alert firing
when it should and staying silent when it should not; these tests run
them, and check what promtool cannot: the generator's parameters, its
refusal of a threshold Prometheus cannot measure, and the runbook links.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from agent_otel.errors import ConfigError
from conftest import require_tool
from dashboards import rules
from agent_otel.slo import Slos
from dashboards.slo import LatencySLO, ToolSLOs

REPO = Path(__file__).resolve().parents[1]
RULES_DIR = REPO / "dashboards" / "rules"
RULES_FILE = RULES_DIR / "agent-otel-rules.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
CONTRACT_ALERTS = {
    "AgentToolLatencySLOFastBurn",
    "AgentToolLatencySLOSlowBurn",
    "AgentExecutorSaturated",
    "AgentGPUIdleBlockedByTools",
    "AgentModelServerStalling",
    "AgentEventLoopBlocked",
}


def committed_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]]


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [require_tool("promtool", "prometheus"), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_promtool_accepts_the_rules():
    result = promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 15 rules found" in result.stdout


def test_alerts_fire_when_they_should_and_stay_silent_otherwise():
    result = promtool("test", "rules", str(RULES_DIR / "tests.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_unit_tests_evaluate_every_group_in_the_files_order():
    # Unlisted groups are evaluated in a random order, and an alert may then
    # read its recording rules one interval late (a test that fails 1 run in 3).
    groups = [group["name"] for group in yaml.safe_load(RULES_FILE.read_text())["groups"]]
    assert yaml.safe_load((RULES_DIR / "tests.yml").read_text())["group_eval_order"] == groups


def test_every_contract_alert_has_severity_summary_description_and_runbook():
    alerts = {rule["alert"]: rule for rule in committed_rules() if "alert" in rule}
    assert set(alerts) == CONTRACT_ALERTS
    headings = {m.lower() for m in re.findall(r"^## (\w+)\s*$", RUNBOOK.read_text(), flags=re.M)}
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"page", "ticket", "warning"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        anchor = rule["annotations"]["runbook_url"].split("#")[1]
        assert anchor in headings, f"{name}: docs/runbook.md has no '## ' heading for #{anchor}"
    assert alerts["AgentToolLatencySLOFastBurn"]["labels"]["severity"] == "page"
    assert alerts["AgentToolLatencySLOSlowBurn"]["labels"]["severity"] == "ticket"


def test_an_sli_is_recorded_for_every_burn_rate_window():
    recorded = {rule["record"] for rule in committed_rules() if "record" in rule}
    windows = {"5m", "30m", "1h", "6h"}  # fast burn: 1h and 5m; slow burn: 6h and 30m
    pools = {rules.POOL_INFLIGHT, rules.POOL_GPU_IDLE, rules.POOL_BLOCKED_LIVE, rules.POOL_GPU_BLOCKED}
    assert recorded == {f"agent_tool:latency_sli:ratio_rate{w}" for w in windows} | pools


def test_the_generator_refuses_a_threshold_that_is_not_a_bucket():
    with pytest.raises(ConfigError) as error:
        rules.render(LatencySLO(threshold_s=0.75))
    message = str(error.value)
    assert "0.75" in message and "0.5, 0.8, 1, 2.5" in message


@pytest.mark.parametrize("objective", [0, 1, 1.5, -0.1])
def test_the_generator_refuses_an_objective_outside_zero_to_one(objective):
    with pytest.raises(ConfigError, match="objective"):
        LatencySLO(objective=objective)


def test_slo_parameters_reach_the_alert_expressions_and_text():
    text = rules.render(LatencySLO(threshold_s=2.5, objective=0.99), runbook_base="https://docs.example/runbook")
    assert 'le=~"2\\\\.5"' in text
    assert "(14.4 * 0.01)" in text and "(6 * 0.01)" in text
    assert "99% within 2.5 s" in text
    assert "runbook_url: https://docs.example/runbook#agenttoollatencyslofastburn" in text


def test_a_whole_number_threshold_matches_buckets_written_by_prometheus_2_and_3(tmp_path):
    # Prometheus 3 and prometheus_client write le="1.0"; older exporters le="1".
    (tmp_path / "rules.yml").write_text(rules.render(LatencySLO(threshold_s=1)))
    (tmp_path / "tests.yml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            {"series": 'agent_tool_duration_seconds_count{job="a",tool="new"}', "values": "0+10x10"},
                            {
                                "series": 'agent_tool_duration_seconds_bucket{job="a",tool="new",le="1.0"}',
                                "values": "0+5x10",
                            },
                            {"series": 'agent_tool_duration_seconds_count{job="a",tool="old"}', "values": "0+10x10"},
                            {
                                "series": 'agent_tool_duration_seconds_bucket{job="a",tool="old",le="1"}',
                                "values": "0+10x10",
                            },
                            # Never the SLO bucket: 10 must not match the regex for 1.
                            {
                                "series": 'agent_tool_duration_seconds_bucket{job="a",tool="old",le="10.0"}',
                                "values": "0+10x10",
                            },
                        ],
                        "promql_expr_test": [
                            {
                                "expr": "agent_tool:latency_sli:ratio_rate5m",
                                "eval_time": "10m",
                                "exp_samples": [
                                    {
                                        "labels": 'agent_tool:latency_sli:ratio_rate5m{job="a",slo="latency",tool="new"}',
                                        "value": 0.5,
                                    },
                                    {
                                        "labels": 'agent_tool:latency_sli:ratio_rate5m{job="a",slo="latency",tool="old"}',
                                        "value": 1,
                                    },
                                ],
                            }
                        ],
                    }
                ],
            }
        )
    )
    result = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


PER_TOOL_TESTS = """
rule_files: [rules.yml]
evaluation_interval: 1m
group_eval_order: [agent-otel-slo-recording, agent-otel-gpu-pools, agent-otel-alerts]
tests:
  # 60 calls a minute each. "search" answers 50 of them within 2.5 s and 6
  # within 0.8 s: its own SLO (90% within 2.5 s) is burnt at 1.7x, far
  # from alerting, though the default SLO would page. "lookup" answers 50
  # within 0.25 s: 17% slow against its 1% budget (99% within 0.25 s), over
  # 14.4x, so it pages. "fetch", on the default (95% within 0.8 s), misses
  # 1 call in 60 and stays silent.
  - interval: 1m
    input_series:
      - series: 'agent_tool_duration_seconds_count{job="agent",tool="search"}'
        values: '0+60x60'
      - series: 'agent_tool_duration_seconds_bucket{job="agent",tool="search",le="0.8"}'
        values: '0+6x60'
      - series: 'agent_tool_duration_seconds_bucket{job="agent",tool="search",le="2.5"}'
        values: '0+50x60'
      - series: 'agent_tool_duration_seconds_count{job="agent",tool="lookup"}'
        values: '0+60x60'
      - series: 'agent_tool_duration_seconds_bucket{job="agent",tool="lookup",le="0.25"}'
        values: '0+50x60'
      - series: 'agent_tool_duration_seconds_bucket{job="agent",tool="lookup",le="0.8"}'
        values: '0+60x60'
      - series: 'agent_tool_duration_seconds_count{job="agent",tool="fetch"}'
        values: '0+60x60'
      - series: 'agent_tool_duration_seconds_bucket{job="agent",tool="fetch",le="0.8"}'
        values: '0+59x60'
    promql_expr_test:
      - expr: 'round(agent_tool:latency_sli:ratio_rate5m, 0.001)'
        eval_time: 10m
        exp_samples:
          - labels: '{job="agent",slo="latency",tool="search"}'
            value: 0.833
          - labels: '{job="agent",slo="latency",tool="lookup"}'
            value: 0.833
          - labels: '{job="agent",slo="latency",tool="fetch"}'
            value: 0.983
    alert_rule_test:
      - eval_time: 10m
        alertname: AgentToolLatencySLOFastBurn
        exp_alerts:
          - exp_labels: {severity: page, slo: latency, job: agent, tool: lookup}
            exp_annotations:
              summary: Tool lookup is burning its latency error budget fast
              description: '16.67% of lookup calls in agent took longer than 0.25 s over the last 1h (and still over the last 5m): more than 14.4x the 1% the SLO (99% within 0.25 s) allows.'
              runbook_url: docs/runbook.md#agenttoollatencyslofastburn
      - eval_time: 60m
        alertname: AgentToolLatencySLOSlowBurn
        exp_alerts:
          - exp_labels: {severity: ticket, slo: latency, job: agent, tool: lookup}
            exp_annotations:
              summary: Tool lookup is burning its latency error budget slowly but steadily
              description: '16.67% of lookup calls in agent took longer than 0.25 s over the last 6h (and still over the last 30m): more than 6x the 1% the SLO (99% within 0.25 s) allows.'
              runbook_url: docs/runbook.md#agenttoollatencysloslowburn
"""


def test_tools_with_their_own_slo_alert_on_their_own_threshold_and_objective(tmp_path):
    slos = ToolSLOs.from_slos(Slos.parse(["search=2.5:0.9", "lookup=0.25:0.99"]))
    text = rules.render(slos)
    assert "# lookup: 99% of its calls within 0.25 s." in text
    (tmp_path / "rules.yml").write_text(text)
    (tmp_path / "tests.yml").write_text(PER_TOOL_TESTS)
    assert promtool("check", "rules", "rules.yml", cwd=tmp_path).returncode == 0
    result = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_slo_alone_renders_the_committed_rules():
    assert rules.render(ToolSLOs.from_slos(Slos.parse([]))) == RULES_FILE.read_text()


@pytest.mark.parametrize("spec", ["search=0.75:0.95", "*=3:0.95"])
def test_a_tool_threshold_off_the_buckets_is_refused_naming_the_tool(spec):
    with pytest.raises(ConfigError) as error:
        ToolSLOs.from_slos(Slos.parse([spec]))
    message = str(error.value)
    assert repr(spec) in message and "--slo" in message
    assert "Prometheus counts calls only under a bucket bound" in message


def test_the_generator_takes_tool_slos_on_its_command_line(tmp_path, capsys):
    from dashboards.build import main

    assert main(["--check", "--slo", "search=0.75:0.9"]) == 2
    assert "invalid value 'search=0.75:0.9' for --slo" in capsys.readouterr().err
    assert main(["--check", "--slo", "*=0.8:0.95"]) == 0  # the default, spelled out: the committed files
    assert main(["--check", "--slo", "search=2.5:0.9"]) == 1  # the rules would change


def test_tool_names_are_matched_exactly_in_the_rules():
    groups = ToolSLOs.from_slos(Slos.parse(["a.b=2.5:0.9", 'say"hi=2.5:0.9'])).groups()
    assert groups[0][1] == 'tool=~"a\\\\.b|say\\"hi"'
    assert groups[1][1] == 'tool!~"a\\\\.b|say\\"hi"'
