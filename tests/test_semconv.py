"""The contract as code (agent_otel/semconv.py) against everything that uses it.

- the GenAI names equal the installed OpenTelemetry semantic conventions';
- docs/telemetry.md documents every name, and names nothing else;
- importing the contract (and the dashboards) loads none of the runtime;
- every metric and label the generated dashboards and alert rules query is
  one a live instrumented process really exports, and everything that
  process exports is in the contract, with the contract's type and labels.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agent_otel import semconv

REPO = Path(__file__).resolve().parents[1]
TELEMETRY_DOC = (REPO / "docs" / "telemetry.md").read_text()


def constants(prefixes: tuple[str, ...]) -> dict[str, str]:
    return {
        name: value for name, value in vars(semconv).items() if name.startswith(prefixes) and isinstance(value, str)
    }


def test_gen_ai_names_equal_the_installed_semantic_conventions():
    # The conventions keep GenAI names in a private, incubating package:
    # agent-otel writes them out (see semconv's docstring) and this test
    # is where the two are compared.
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes, thread_attributes
    from opentelemetry.semconv.attributes import error_attributes, service_attributes

    ours = constants(("GEN_AI_",))
    compared = 0
    for name, value in ours.items():
        theirs = getattr(gen_ai_attributes, name, None)
        if theirs is not None:
            assert value == theirs, f"semconv.{name} is {value!r}, the conventions say {theirs!r}"
            compared += 1
    assert compared >= 7, "the installed conventions define the GenAI tool attributes"
    assert semconv.GEN_AI_OPERATION_EXECUTE_TOOL == gen_ai_attributes.GenAiOperationNameValues.EXECUTE_TOOL.value
    assert semconv.TOOL_TYPE_FUNCTION == "function"
    assert semconv.ERROR_TYPE == error_attributes.ERROR_TYPE
    assert semconv.SERVICE_NAME == service_attributes.SERVICE_NAME
    assert semconv.THREAD_NAME == thread_attributes.THREAD_NAME


def test_every_name_is_documented_in_telemetry_md():
    documented = set(re.findall(r"`([^`\s]+)`", TELEMETRY_DOC))
    attributes = {
        value
        for name, value in vars(semconv).items()
        if isinstance(value, str) and re.fullmatch(r"(gen_ai|agent|gpu|error)\.[a-z_.]+", value) and name.isupper()
    }
    assert attributes, "semconv defines attributes"
    assert attributes - {semconv.THREAD_NAME} <= documented, attributes - documented
    for spec in semconv.METRICS.values():
        assert spec.name in TELEMETRY_DOC, spec.name
        for label in spec.labels:
            assert f"`{label}`" in TELEMETRY_DOC, label
    for value in (
        semconv.SPAN_GPU_IDLE,
        semconv.EVENT_EXEC_START,
        semconv.EVENT_TOOL_ATTEMPT,
        semconv.EVENT_POOL_REJECTED,
        *semconv.OUTCOMES,
        *semconv.SPAN_PHASES,
        semconv.EXECUTOR_DIRECT,
        semconv.EXECUTOR_ASYNCIO_DEFAULT,
        semconv.EXECUTOR_UNNAMED,
        semconv.EXECUTOR_ANYIO,
        semconv.OTHER_TOOL,
    ):
        assert f"`{value}`" in TELEMETRY_DOC or f'"{value}"' in TELEMETRY_DOC, value
    assert "execute_tool {gen_ai.tool.name}" in TELEMETRY_DOC
    buckets = ", ".join(f"{b:g}" for b in semconv.DURATION_BUCKETS)
    assert (
        buckets
        == re.sub(r"\*\*", "", re.search(r"Histogram buckets \(seconds\): ([\d.,\s*]+)\.", TELEMETRY_DOC).group(1))
        .replace("\n", " ")
        .strip()
    )


def test_telemetry_md_names_nothing_the_contract_lacks():
    documented = set(re.findall(r"`((?:gen_ai|agent|gpu)\.[a-z_.]+)`", TELEMETRY_DOC))
    known = {value for value in vars(semconv).values() if isinstance(value, str)}
    assert documented - known == set()
    metrics = set(re.findall(r"`(agent_[a-z_]+)`", TELEMETRY_DOC)) - {semconv.LABEL_GPU_POOL}
    assert metrics == set(semconv.METRICS), metrics ^ set(semconv.METRICS)


def test_the_contract_and_the_gpu_modules_import_without_opentelemetry():
    # bench/gpu_probe.py runs them on a bare GPU host.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('opentelemetry', 'prometheus_client'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import agent_otel.semconv, agent_otel.config, agent_otel.records\n"
        "import agent_otel.gpu.nvml, agent_otel.gpu.sampler, agent_otel.gpu.timeline\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_importing_the_contract_and_the_dashboards_loads_no_runtime():
    code = (
        "import sys, agent_otel.semconv, agent_otel.config, dashboards.build, dashboards.rules\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.trace', "
        "'prometheus_client', 'agent_otel.wiring.instrumentation', 'agent_otel.capture', 'agent_otel.exporters', "
        "'agent_otel.remedies', 'grpc'))))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout


# ---------------------------------------------------------------- dashboards and rules vs a live process


def dashboard_queries() -> list[str]:
    found = []
    for path in sorted((REPO / "dashboards" / "json").glob("*.json")):
        dashboard = json.loads(path.read_text())
        found += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        found += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def rule_queries() -> tuple[list[str], set[str]]:
    """Every expression (and annotation text, which may hold a query) of the rules, and the recorded names."""
    rules = [
        rule
        for group in yaml.safe_load((REPO / "dashboards" / "rules" / "agent-otel-rules.yml").read_text())["groups"]
        for rule in group["rules"]
    ]
    texts = [rule["expr"] for rule in rules] + [text for rule in rules for text in rule.get("annotations", {}).values()]
    return texts, {rule["record"] for rule in rules if "record" in rule}


def metric_names(query: str) -> set[str]:
    """The toolkit's metric names a query reads (not recorded names, not the pool label)."""
    return set(re.findall(r"\b(agent_[a-z_]+)\b(?!:)", query)) - {semconv.LABEL_GPU_POOL}


def label_names(query: str) -> set[str]:
    labels = set()
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", query):
        labels.update(part.strip() for part in grouping.split(",") if part.strip())
    labels.update(re.findall(r"[{,]\s*([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*(?:\"|%q)", query))
    labels.update(re.findall(r"label_values\([^,]*,\s*(\w+)\)", query))
    return labels


@pytest.fixture(scope="module")
def live_scrapes() -> tuple[dict, dict]:
    """(metric families with samples while calls were in flight, at the end) of a live process."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "contract_workload.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    during, after = done.stdout.split("----\n")

    def families(text: str) -> dict:
        return {family.name: family for family in text_string_to_metric_families(text.strip() + "\n")}

    return families(during), families(after)


def exported_series(*scrapes: dict) -> set[str]:
    return {sample.name for families in scrapes for family in families.values() for sample in family.samples}


def test_the_dashboards_and_rules_query_only_what_a_live_process_exports(live_scrapes):
    # The blame service's own metrics: tests/test_blame_service.py holds a
    # running service to exporting exactly these.
    exported = exported_series(*live_scrapes) | {spec.name for spec in semconv.METRICS.values() if spec.blame_service}
    rule_texts, recorded = rule_queries()
    used_by = {"dashboards": dashboard_queries(), "rules": rule_texts}
    for where, queries in used_by.items():
        assert queries, where
        for query in queries:
            used = metric_names(query)
            assert used <= exported, f"{where}: {query!r} reads {used - exported}, which the process never exported"
            assert used <= semconv.series_names(), f"{where}: {query!r}: {used - semconv.series_names()}"
    # Recording rules read only exported series; alerts may read the recorded ones.
    assert all(
        re.fullmatch(r"agent_tool:latency_sli:ratio_rate\w+|agent_gpu_pool:\w+:\w+", name) for name in recorded
    ), recorded
    used_series = {name for queries in used_by.values() for query in queries for name in metric_names(query)}
    assert {
        semconv.METRIC_TOOL_INFLIGHT,
        semconv.METRIC_GPU_IDLE_BLOCKED,
        semconv.METRIC_TOOL_DURATION + "_bucket",
    } <= used_series


def test_the_dashboards_and_rules_use_only_the_labels_the_metrics_carry():
    known = {label for spec in semconv.METRICS.values() for label in spec.labels} | {"job", "instance", "le"}
    known.add(semconv.LABEL_GPU_POOL)  # target_info's
    rule_texts, _ = rule_queries()
    for query in dashboard_queries() + rule_texts:
        assert label_names(query) <= known, f"{query!r}: unknown labels {label_names(query) - known}"


def test_a_live_process_exports_the_contract_with_its_types_and_labels(live_scrapes):
    during, after = live_scrapes
    ours = {name: family for name, family in {**during, **after}.items() if name.startswith("agent_")}
    # The parser names a counter's family without "_total".
    by_metric = {
        spec.name.removesuffix("_total") if spec.kind == semconv.COUNTER else spec.name: spec
        for spec in semconv.METRICS.values()
        if not spec.blame_service
    }
    assert set(ours) == set(by_metric), set(ours) ^ set(by_metric)
    for name, family in ours.items():
        spec = by_metric[name]
        assert family.type == spec.kind, name
        assert family.documentation == spec.help, name
        for sample in family.samples + (during[name].samples if name in during else []):
            labels = set(sample.labels) - {"le"}
            assert labels == set(spec.labels), (sample.name, sample.labels, spec.labels)
            if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf":
                assert float(sample.labels["le"]) in spec.buckets, sample
    # Every metric had samples, except the GPU error and missing-data counters
    # (a simulated GPU never fails, and never loses samples).
    silent = {name for name, family in ours.items() if not family.samples and not during.get(name, family).samples}
    assert silent <= {
        semconv.METRIC_GPU_ERRORS.removesuffix("_total"),
        semconv.METRIC_GPU_MISSING.removesuffix("_total"),
    }, silent
    phases = {sample.labels["phase"] for sample in during[semconv.METRIC_TOOL_INFLIGHT].samples}
    assert phases == set(semconv.PHASES)
    outcomes = {sample.labels["outcome"] for sample in after[semconv.METRIC_TOOL_CALLS.removesuffix("_total")].samples}
    assert {semconv.OUTCOME_OK, semconv.OUTCOME_ERROR, semconv.OUTCOME_FALLBACK} <= outcomes <= set(semconv.OUTCOMES)
