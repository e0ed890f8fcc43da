"""deploy/kubernetes: rendered with kustomize, every object validated offline,
and the objects agreeing with each other and with the rest of the repository.

- Rendering: `kubectl kustomize` (kustomize built into kubectl), for the base
  and every overlay.
- Kubernetes kinds: the `kubernetes-validate` package's schemas (shipped in
  the package, no network), strict (an unknown field fails).
- Prometheus Operator kinds: the openAPIV3Schema of the CRDs of release
  v0.93.0, kept in tests/schemas/ (copied unchanged from the
  prometheus-operator repository, example/prometheus-operator-crd/), with
  unknown fields refused as `kubectl apply --validate=strict` would.
- The PrometheusRule's groups are the rules file's, and `promtool check
  rules` accepts them.
- The gateway routes each pool's tool spans (the contract's resource
  attribute) to the headless Service of that pool's blame service, on the
  port its receiver listens on; agents, monitors and policies name ports,
  labels and services that exist.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from agent_otel.commands.cli import build_parser
from agent_otel.semconv import AGENT_GPU_POOL
from conftest import require_tool
from test_compose import COMPONENT_KEYS, unknown_keys

REPO = Path(__file__).resolve().parents[1]
KUBERNETES = REPO / "deploy" / "kubernetes"
KUSTOMIZATIONS = sorted(path.parent for path in KUBERNETES.rglob("kustomization.yaml"))
CRD_DIR = Path(__file__).parent / "schemas" / "prometheus-operator-v0.93.0"
# The oldest Kubernetes release still supported upstream, and the newest the
# validator knows.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(directory: Path) -> list[dict]:
    result = subprocess.run(
        [require_tool("kubectl", "kubectl (kustomize is built in)"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.load_all(result.stdout, Loader=SAFE_LOADER) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {str(path.relative_to(KUBERNETES)): render(path) for path in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def example(rendered) -> list[dict]:
    return rendered["overlays/example"]


def objects(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict], kind: str, name: str) -> dict:
    (found,) = [doc for doc in objects(docs, kind) if doc["metadata"]["name"] == name]
    return found


def named(docs: list[dict], kind: str, prefix: str) -> dict:
    (found,) = [doc for doc in objects(docs, kind) if doc["metadata"]["name"].startswith(prefix)]
    return found


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels only, or a plain map) selects ``labels``."""
    match = selector.get("matchLabels", selector) if "matchExpressions" not in selector else None
    assert match is not None, "only matchLabels selectors are checked here"
    return bool(match) and all(labels.get(key) == value for key, value in match.items())


def container(workload: dict) -> dict:
    (found,) = workload["spec"]["template"]["spec"]["containers"]
    return found


def env(workload: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in container(workload).get("env", [])}


def ports(workload: dict) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container(workload)["ports"]}


def listen_port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def gateway_config(docs: list[dict]) -> dict:
    config_map = named(docs, "ConfigMap", "agent-otel-gateway-config")
    return yaml.load(config_map["data"]["config.yaml"], Loader=SAFE_LOADER)


def blame_services(docs: list[dict]) -> dict[str, dict]:
    """The blame DaemonSets by the pool their command serves."""
    found = {}
    for daemon_set in objects(docs, "DaemonSet"):
        args = container(daemon_set)["args"]
        if args[0] == "gpu-exporter":
            found[build_parser(args[0]).parse_args(args).gpu_pool] = daemon_set
    return found


def test_there_is_a_base_and_an_overlay():
    assert {str(path.relative_to(KUBERNETES)) for path in KUSTOMIZATIONS} >= {"base", "overlays/example"}


# ---------------------------------------------------------------- validation


def test_every_kubernetes_object_validates_against_the_api_schemas(rendered):
    from kubernetes_validate import utils as kubernetes_validate

    checked = set()
    for where, docs in rendered.items():
        for doc in docs:
            if doc["apiVersion"].startswith("monitoring.coreos.com/"):
                continue
            for version in KUBERNETES_VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{where}: {doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): {exc}")
            checked.add(doc["kind"])
    assert checked >= {"Deployment", "DaemonSet", "Service", "ConfigMap", "NetworkPolicy", "Role", "Namespace"}


def test_the_kubernetes_validator_refuses_an_unknown_field(example):
    from kubernetes_validate import utils as kubernetes_validate

    daemon_set = copy.deepcopy(objects(example, "DaemonSet")[0])
    daemon_set["spec"]["template"]["spec"]["nodeSelectors"] = {"typo": "x"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemon_set, KUBERNETES_VERSIONS[0], strict=True)


def _crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the CRD version's schema, unknown fields refused."""
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=SAFE_LOADER)
        assert crd["metadata"]["annotations"]["operator.prometheus.io/version"] == "0.93.0", path
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[(api_version, crd["spec"]["names"]["kind"])] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def _strict(schema):
    """A structural schema with unknown fields refused (what the API server's
    strict field validation does), metadata left to the API server."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    return schema


def _without_metadata_schema(schema: dict) -> dict:
    schema = dict(schema)
    schema["properties"] = {**schema["properties"], "metadata": {"type": "object"}}
    return schema


def test_every_prometheus_operator_object_validates_against_its_crd(rendered):
    schemas = _crd_schemas()
    checked = set()
    for where, docs in rendered.items():
        for doc in docs:
            if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
                continue
            schema = schemas.get((doc["apiVersion"], doc["kind"]))
            assert schema is not None, f"{where}: no CRD kept for {doc['apiVersion']} {doc['kind']}"
            errors = sorted(
                jsonschema.Draft7Validator(_without_metadata_schema(schema)).iter_errors(doc), key=lambda e: e.path
            )
            assert not errors, f"{where}: {doc['kind']}/{doc['metadata']['name']}: " + "; ".join(
                f"{'.'.join(map(str, error.path))}: {error.message}" for error in errors
            )
            checked.add(doc["kind"])
    assert checked == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def test_the_crd_schemas_refuse_an_unknown_field(example):
    schema = _without_metadata_schema(_crd_schemas()[("monitoring.coreos.com/v1", "ServiceMonitor")])
    monitor = copy.deepcopy(objects(example, "ServiceMonitor")[0])
    assert not list(jsonschema.Draft7Validator(schema).iter_errors(monitor))
    monitor["spec"]["endpoints"][0]["intervall"] = "5s"
    assert list(jsonschema.Draft7Validator(schema).iter_errors(monitor))


# ---------------------------------------------------------------- rules and dashboards: the same as dashboards/


def test_the_prometheus_rule_carries_the_rules_files_groups_and_promtool_accepts_them(example, tmp_path):
    (rule,) = objects(example, "PrometheusRule")
    rules_file = yaml.load((REPO / "dashboards" / "rules" / "agent-otel-rules.yml").read_text(), Loader=SAFE_LOADER)
    assert rule["spec"]["groups"] == rules_file["groups"]
    path = tmp_path / "prometheus-rule-groups.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(
        [require_tool("promtool", "prometheus"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_dashboard_config_maps_are_the_dashboards_for_the_grafana_sidecar(example):
    config_maps = [doc for doc in objects(example, "ConfigMap") if "grafana_dashboard" in doc["metadata"]["labels"]]
    loaded = {}
    for config_map in config_maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"]["grafana_folder"] == "Agent OTel"
        loaded.update(config_map["data"])
    committed = {path.name: path.read_text() for path in (REPO / "dashboards" / "json").glob("*.json")}
    assert loaded == committed
    # Under the 256 KiB of kubectl's client-side last-applied annotation, one ConfigMap each.
    assert max(len(text) for text in loaded.values()) < 256 * 1024


# ---------------------------------------------------------------- the objects agree


def test_the_gateway_routes_each_pools_tool_spans_to_that_pools_blame_service(example):
    config = gateway_config(example)
    pools = blame_services(example)
    assert pools
    pipelines = config["service"]["pipelines"]
    routing = config["connectors"]["routing/blame"]
    assert "default_pipelines" not in routing  # a span of no listed pool goes to no blame service
    routed = set()
    for route in routing["table"]:
        assert route["context"] == "resource"
        match = re.fullmatch(r'attributes\["([^"]+)"\] == "([^"]+)"', route["condition"])
        assert match, route["condition"]
        attribute, pool = match.groups()
        assert attribute == AGENT_GPU_POOL
        assert pool in pools, f"route for pool {pool!r}: no blame service DaemonSet serves it"
        routed.add(pool)
        (pipeline,) = route["pipelines"]
        assert pipelines[pipeline]["receivers"] == ["routing/blame"]
        (exporter_name,) = pipelines[pipeline]["exporters"]
        assert exporter_name.startswith("loadbalancing/")
        exporter = config["exporters"][exporter_name]
        # All of a pool's spans to one pod of the pool, whichever gateway replica took them.
        assert exporter["routing_key"] == "attributes"
        assert exporter["routing_attributes"] == [AGENT_GPU_POOL]
        daemon_set = pools[pool]
        resolver = exporter["resolver"]["k8s"]
        service_name, namespace = resolver["service"].split(".")
        service = one(example, "Service", service_name)
        assert service["metadata"]["namespace"] == namespace == daemon_set["metadata"]["namespace"]
        assert service["spec"]["clusterIP"] == "None"  # headless: the resolver reads its pods
        assert selects(service["spec"]["selector"], daemon_set["spec"]["template"]["metadata"]["labels"])
        # No other pool's pods behind that Service.
        for other, other_set in pools.items():
            if other != pool:
                assert not selects(service["spec"]["selector"], other_set["spec"]["template"]["metadata"]["labels"])
        (port,) = resolver["ports"]
        (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == port]
        args = build_parser("gpu-exporter").parse_args(container(daemon_set)["args"])
        assert ports(daemon_set)[service_port["targetPort"]] == listen_port(args.otlp_grpc) == port
        assert exporter["protocol"]["otlp"]["tls"]["insecure"] is True  # the receiver speaks plain text
    assert routed == set(pools)


def test_the_kubernetes_gateway_is_collector_gateway_yaml_but_for_the_blame_exporters(example):
    k8s = gateway_config(example)
    compose = yaml.load((REPO / "collector" / "gateway.yaml").read_text(), Loader=SAFE_LOADER)
    for section in ("extensions", "receivers", "processors"):
        assert k8s[section] == compose[section], section
    assert k8s["connectors"]["span_metrics"] == compose["connectors"]["span_metrics"]
    assert k8s["connectors"]["routing/blame"].keys() == compose["connectors"]["routing/blame"].keys()

    def without_blame(config: dict, key: str) -> dict:
        return {name: value for name, value in config[key].items() if "blame_" not in name}

    assert without_blame(k8s, "exporters") == without_blame(compose, "exporters")
    assert without_blame(k8s["service"], "pipelines") == without_blame(compose["service"], "pipelines")
    assert k8s["service"]["extensions"] == compose["service"]["extensions"]
    assert k8s["service"]["telemetry"] == compose["service"]["telemetry"]
    # Each pool's pipeline is the compose gateway's, with the load-balancing exporter.
    compose_blame = [p for name, p in compose["service"]["pipelines"].items() if name.startswith("traces/blame_")]
    for name, pipeline in k8s["service"]["pipelines"].items():
        if name.startswith("traces/blame_"):
            assert pipeline["receivers"] == compose_blame[0]["receivers"]
            assert pipeline["processors"] == compose_blame[0]["processors"]
    compose_exporter = next(e for name, e in compose["exporters"].items() if name.startswith("otlp_grpc/blame_"))
    for name, exporter in k8s["exporters"].items():
        if name.startswith("loadbalancing/"):
            assert exporter["retry_on_failure"] == compose_exporter["retry_on_failure"]
            assert exporter["sending_queue"] == compose_exporter["sending_queue"]


# The load-balancing exporter's settings (exporter/loadbalancingexporter/config.go):
# the exporter helper's, and the OTLP exporter's under protocol.otlp.
LOADBALANCING_KEYS = {
    "timeout": None,
    "retry_on_failure": COMPONENT_KEYS["otlp_grpc"]["retry_on_failure"],
    "sending_queue": COMPONENT_KEYS["otlp_grpc"]["sending_queue"],
    "routing_key": None,
    "routing_attributes": None,
    "protocol": {"otlp": {key: value for key, value in COMPONENT_KEYS["otlp_grpc"].items() if key != "endpoint"}},
    "resolver": {
        "static": {"hostnames": None},
        "dns": {"hostname": None, "port": None, "interval": None, "timeout": None},
        "k8s": {"service": None, "ports": None, "timeout": None, "return_hostnames": None},
    },
}


def test_the_gateways_exporters_use_only_settings_they_have(example):
    config = gateway_config(example)
    checked = 0
    for name, settings in config["exporters"].items():
        if name.startswith("loadbalancing/"):
            assert unknown_keys(settings, LOADBALANCING_KEYS, name) == []
            checked += 1
    for section in ("connectors", "processors"):
        for name, settings in config[section].items():
            kind = name.split("/")[0]
            if kind in COMPONENT_KEYS:
                assert unknown_keys(settings or {}, COMPONENT_KEYS[kind], name) == []
                checked += 1
    assert checked >= 3


def test_the_gateway_listens_where_its_deployment_service_and_policy_say(example):
    config = gateway_config(example)
    deployment = one(example, "Deployment", "agent-otel-gateway")
    container_ports = ports(deployment)
    assert container_ports["otlp-grpc"] == listen_port(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    assert container_ports["otlp-http"] == listen_port(config["receivers"]["otlp"]["protocols"]["http"]["endpoint"])
    assert container_ports["span-metrics"] == listen_port(config["exporters"]["prometheus"]["endpoint"])
    assert container_ports["health"] == listen_port(config["extensions"]["health_check"]["endpoint"])
    telemetry = config["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert container_ports["metrics"] == telemetry["port"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container(deployment)[probe]["httpGet"]["port"] == "health"
    # The config file is mounted where the command reads it.
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    config_map = named(example, "ConfigMap", "agent-otel-gateway-config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    (mount,) = container(deployment)["volumeMounts"]
    assert container(deployment)["args"] == [f"--config={mount['mountPath']}/config.yaml"]
    # The Service's ports reach named container ports; the Service selects the pods.
    service = one(example, "Service", "agent-otel-gateway")
    assert selects(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    for port in service["spec"]["ports"]:
        assert container_ports[port["targetPort"]] == port["port"]
    # The resolver may read the blame services' endpoints.
    role = one(example, "Role", "agent-otel-gateway")
    resources = {resource for rule in role["rules"] for resource in rule["resources"] if "watch" in rule["verbs"]}
    assert {"endpoints", "endpointslices"} <= resources
    binding = one(example, "RoleBinding", "agent-otel-gateway")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == binding["subjects"][0]["name"]


def test_the_blame_service_runs_on_the_pools_gpu_nodes_and_reads_nvml_without_taking_a_gpu(example):
    for pool, daemon_set in blame_services(example).items():
        spec = daemon_set["spec"]["template"]["spec"]
        assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
        assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in spec["tolerations"])
        assert spec["runtimeClassName"] == "nvidia"
        found = env(daemon_set)
        assert found["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert "utility" in found["NVIDIA_DRIVER_CAPABILITIES"]
        resources = container(daemon_set)["resources"]
        assert "nvidia.com/gpu" not in {**resources.get("requests", {}), **resources.get("limits", {})}
        assert resources["requests"] and resources["limits"]["memory"]
        assert container(daemon_set)["readinessProbe"] and container(daemon_set)["livenessProbe"]
        args = build_parser("gpu-exporter").parse_args(container(daemon_set)["args"])
        assert args.gpu == "nvml" and args.gpu_pool == pool
        # Its receivers and /metrics listen on the pod's address, on the ports it declares.
        assert args.otlp_grpc.startswith("0.0.0.0:") and args.otlp_http.startswith("0.0.0.0:")
        assert ports(daemon_set)["otlp-http"] == listen_port(args.otlp_http)
        assert ports(daemon_set)["metrics"] == int(found["AGENT_OTEL_PROMETHEUS_PORT"])
        assert found["AGENT_OTEL_PROMETHEUS_ADDRESS"] == "0.0.0.0"
        # Its own gpu.idle spans go to the gateway, in plain text.
        assert_reaches_gateway(example, found["OTEL_EXPORTER_OTLP_ENDPOINT"])
        # A variable referred to as $(NAME) is defined before it.
        assert_references_defined_first(daemon_set)


def assert_reaches_gateway(docs: list[dict], endpoint: str):
    match = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+):(\d+)", endpoint)
    assert match, f"{endpoint}: expected http://<service>.<namespace>:<port> (plain text: http://)"
    name, namespace, port = match.group(1), match.group(2), int(match.group(3))
    service = one(docs, "Service", name)
    assert service["metadata"]["namespace"] == namespace
    assert port == next(p["port"] for p in service["spec"]["ports"] if p["name"] == "otlp-grpc")


def assert_references_defined_first(workload: dict):
    defined: set[str] = set()
    for item in container(workload).get("env", []):
        for reference in re.findall(r"\$\(([A-Z_]+)\)", item.get("value") or ""):
            assert reference in defined, f"{item['name']} refers to $({reference}) before it is defined"
        defined.add(item["name"])


def test_the_example_agent_has_what_an_agent_needs(example):
    agent = one(example, "Deployment", "support-agent")
    found = env(agent)
    assert found["OTEL_SERVICE_NAME"]
    assert_reaches_gateway(example, found["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert found["AGENT_OTEL_GPU_POOL"] in blame_services(example)
    assert ports(agent)["metrics"] == int(found["AGENT_OTEL_PROMETHEUS_PORT"])
    assert found["AGENT_OTEL_PROMETHEUS_ADDRESS"] == "0.0.0.0"
    assert_references_defined_first(agent)
    # Its namespace may reach the gateway's OTLP ports (and nothing else of it).
    namespace = one(example, "Namespace", agent["metadata"]["namespace"])
    policy = one(example, "NetworkPolicy", "agent-otel-gateway")
    otlp_rules = [
        rule
        for rule in policy["spec"]["ingress"]
        if any(selects(peer.get("namespaceSelector", {}), namespace["metadata"]["labels"]) for peer in rule["from"])
    ]
    assert [sorted(p["port"] for p in rule["ports"]) for rule in otlp_rules] == [["otlp-grpc", "otlp-http"]]
    # Its pods are scraped, with its name as the job (the dashboards' Service).
    monitor = one(example, "PodMonitor", "agent-otel-agents")
    labels = agent["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert selects(monitor["spec"]["selector"], labels)
    assert labels[monitor["spec"]["jobLabel"]] == found["OTEL_SERVICE_NAME"]
    assert {endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]} <= set(ports(agent))


def test_monitors_and_policies_name_ports_and_pods_that_exist(example):
    gateway = one(example, "Deployment", "agent-otel-gateway")
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    for daemon_set in blame_services(example).values():
        labels = daemon_set["spec"]["template"]["metadata"]["labels"]
        monitor = one(example, "PodMonitor", "agent-otel-blame")
        assert selects(monitor["spec"]["selector"], labels)
        assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= set(ports(daemon_set))
        policy = one(example, "NetworkPolicy", "agent-otel-blame")
        assert selects(policy["spec"]["podSelector"], labels)
        otlp = [rule for rule in policy["spec"]["ingress"] if {"otlp-grpc"} <= {p["port"] for p in rule["ports"]}]
        # OTLP from the gateway's pods only.
        assert [[peer.keys() for peer in rule["from"]] for rule in otlp] == [[{"podSelector": None}.keys()]]
        assert selects(otlp[0]["from"][0]["podSelector"], gateway_labels)
        for rule in policy["spec"]["ingress"]:
            assert {p["port"] for p in rule["ports"]} <= set(ports(daemon_set))
    service_monitor = one(example, "ServiceMonitor", "agent-otel-gateway")
    service = one(example, "Service", "agent-otel-gateway")
    assert selects(service_monitor["spec"]["selector"], service["metadata"]["labels"])
    assert {e["port"] for e in service_monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    policy = one(example, "NetworkPolicy", "agent-otel-gateway")
    assert selects(policy["spec"]["podSelector"], gateway_labels)
    for rule in policy["spec"]["ingress"]:
        assert {p["port"] for p in rule["ports"]} <= set(ports(gateway))
