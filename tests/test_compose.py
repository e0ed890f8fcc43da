"""The compose stack holds together, checked without Docker.

Docker does not run here, so these tests read docker-compose.yml and the
configs it mounts the way the containers would, and check that the names
and ports each config uses for another service are that service's real
name and port: a typo there is a stack that starts and shows nothing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from agent_otel.commands.cli import build_parser
from conftest import require_tool

REPO = Path(__file__).resolve().parents[1]
# libyaml's safe loader where PyYAML has it (its wheels do): the files below are
# read when the module is imported, which every xdist worker does.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path):
    return yaml.load(path.read_text(), Loader=SAFE_LOADER)


COMPOSE = load_yaml(REPO / "docker-compose.yml")
GPU_OVERRIDE = load_yaml(REPO / "docker-compose.gpu.yml")
SERVICES = COMPOSE["services"]


def mounts(service: dict) -> dict[str, Path]:
    """Container path -> host path, for the bind mounts of a service."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            found[target] = REPO / source
    return found


def mounted_yaml(service: str, container_path: str, compose: dict = COMPOSE) -> dict:
    return load_yaml(mounts(compose["services"][service])[container_path])


def host_port(address: str) -> tuple[str, int]:
    """("collector", 4317) from "collector:4317" or "http://collector:4317"."""
    parts = urlsplit(address if "//" in address else f"//{address}")
    return parts.hostname, parts.port


def parse_command(command: list[str]):
    """An agent-otel service's command, parsed as the image's entrypoint would
    (agent_otel.commands.cli.main: only the chosen command's module is imported)."""
    return build_parser(command[0]).parse_args(command)


def listen_port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


COLLECTOR = mounted_yaml("collector", "/etc/otelcol-contrib/config.yaml")
JAEGER = mounted_yaml("jaeger", "/etc/jaeger/config.yaml")
PROMETHEUS = mounted_yaml("prometheus", "/etc/prometheus/prometheus.yml")
DATASOURCES = load_yaml(REPO / "deploy/grafana/provisioning/datasources/datasources.yml")["datasources"]

# What each service listens on inside the compose network, from its own config.
LISTENS = {
    "collector": {
        listen_port(COLLECTOR["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]),
        listen_port(COLLECTOR["receivers"]["otlp"]["protocols"]["http"]["endpoint"]),
        listen_port(COLLECTOR["exporters"]["prometheus"]["endpoint"]),
        COLLECTOR["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"],
    },
    "jaeger": {
        listen_port(JAEGER["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]),
        listen_port(JAEGER["extensions"]["jaeger_query"]["http"]["endpoint"]),
        JAEGER["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]["port"],
    },
    "prometheus": {9090},  # its default --web.listen-address
    "grafana": {3000},
    "demo": {int(SERVICES["demo"]["environment"]["AGENT_OTEL_PROMETHEUS_PORT"])},
    "blame": {
        int(SERVICES["blame"]["environment"]["AGENT_OTEL_PROMETHEUS_PORT"]),
        *(
            listen_port(parse_command(SERVICES["blame"]["command"]).otlp_grpc),
            listen_port(parse_command(SERVICES["blame"]["command"]).otlp_http),
        ),
    },
}


def assert_reaches(address: str, service: str, port: int | None = None):
    host, found_port = host_port(address)
    assert host == service, f"{address}: expected the compose service {service!r}"
    assert found_port in LISTENS[service], f"{address}: {service} listens on {sorted(LISTENS[service])}"
    if port is not None:
        assert found_port == port, f"{address}: expected port {port}"


@pytest.mark.parametrize("compose", [COMPOSE, GPU_OVERRIDE], ids=["docker-compose.yml", "docker-compose.gpu.yml"])
def test_every_mounted_file_exists(compose):
    for name, service in compose["services"].items():
        for target, source in mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).is_file(), name


def test_images_are_pinned_to_a_version():
    for name, service in {**SERVICES, **GPU_OVERRIDE["services"]}.items():
        image = service.get("image")
        if image and "build" not in service:
            tag = image.rsplit(":", 1)[1] if ":" in image else ""
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: image {image} is not pinned to a version"


def test_the_dockerfile_starts_from_a_pinned_python_and_runs_as_a_user():
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\d+\.\d+\.\d+-slim", dockerfile, flags=re.M)
    assert re.search(r"^USER \w+", dockerfile, flags=re.M)
    assert 'ENTRYPOINT ["agent-otel"]' in dockerfile


@pytest.mark.parametrize("service", [SERVICES["demo"], SERVICES["blame"]], ids=["demo", "blame"])
def test_agent_otel_services_send_otlp_to_the_collector_and_serve_metrics(service):
    # The image's entrypoint is agent-otel: the command must parse as its arguments.
    args = parse_command(service["command"])
    assert args.command in {"demo", "gpu-exporter"}
    assert_reaches(
        service["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"],
        "collector",
        listen_port(COLLECTOR["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]),
    )
    assert service["environment"]["AGENT_OTEL_PROMETHEUS_ADDRESS"] == "0.0.0.0"


def test_the_blame_service_samples_a_simulated_gpu_or_with_the_gpu_override_the_hosts_gpus():
    base = parse_command(SERVICES["blame"]["command"])
    gpu = GPU_OVERRIDE["services"]["blame"]
    on_gpu = parse_command(gpu["command"])
    assert (base.gpu, on_gpu.gpu) == ("simulated", "nvml")
    # The same service otherwise: pool, receivers and watermark.
    assert {k: v for k, v in vars(base).items() if k not in ("gpu", "_module")} == {
        k: v for k, v in vars(on_gpu).items() if k not in ("gpu", "_module")
    }
    assert base.gpu_pool == "local-gpu"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_the_collector_uses_current_component_names_and_sends_traces_to_jaeger():
    exporters = COLLECTOR["exporters"]
    assert "otlp" not in exporters and "otlphttp" not in exporters and "spanmetrics" not in COLLECTOR["connectors"]
    assert_reaches(
        exporters["otlp_grpc/jaeger"]["endpoint"],
        "jaeger",
        listen_port(JAEGER["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]),
    )
    pipelines = COLLECTOR["service"]["pipelines"]
    defined = {
        name for section in ("receivers", "processors", "exporters", "connectors") for name in COLLECTOR[section]
    }
    for pipeline in pipelines.values():
        assert pipeline["processors"][0] == "memory_limiter"
        for component in pipeline["receivers"] + pipeline["processors"] + pipeline["exporters"]:
            assert component in defined, f"pipeline uses {component!r}, which is not configured"
    assert "span_metrics" in pipelines["traces/tool_spans"]["exporters"]
    assert "span_metrics" in pipelines["metrics"]["receivers"]
    assert "prometheus" in pipelines["metrics"]["exporters"]


def test_span_metrics_have_the_slo_bucket_and_match_jaegers_monitor_tab():
    span_metrics = COLLECTOR["connectors"]["span_metrics"]
    assert "800ms" in span_metrics["histogram"]["explicit"]["buckets"]
    backend = JAEGER["extensions"]["jaeger_storage"]["metric_backends"]["prometheus_store"]["prometheus"]
    assert backend["metric_namespace"] == span_metrics["namespace"].replace(".", "_")
    assert backend["latency_unit"] == span_metrics["histogram"]["unit"]
    assert_reaches(backend["endpoint"], "prometheus", 9090)


def test_the_gateway_config_matches_the_single_host_one():
    gateway = load_yaml(REPO / "collector" / "gateway.yaml")

    def shared(config: dict) -> set[str]:
        return {name for name in config["service"]["pipelines"] if not name.startswith("traces/blame_")}

    assert shared(gateway) == shared(COLLECTOR)
    assert gateway["connectors"]["span_metrics"]["histogram"] == COLLECTOR["connectors"]["span_metrics"]["histogram"]
    assert gateway["exporters"]["otlp_grpc/jaeger"]["endpoint"] == "${env:JAEGER_OTLP_ENDPOINT}"


def test_prometheus_scrapes_real_services_with_exemplars_and_the_rules():
    command = SERVICES["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in command
    for job in PROMETHEUS["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _ = host_port(target)
                if host != "localhost":
                    assert_reaches(target, host)
    jobs = {job["job_name"]: job for job in PROMETHEUS["scrape_configs"]}
    assert_reaches(jobs["agent-otel-blame"]["static_configs"][0]["targets"][0], "blame", 9464)
    # Prometheus reads a relative rule file beside its config file.
    config_dir = Path("/etc/prometheus")
    assert mounts(SERVICES["prometheus"])[str(config_dir / "prometheus.yml")].name == "prometheus.yml"
    rules_mount = mounts(SERVICES["prometheus"])["/etc/prometheus/rules"]
    for rule_file in PROMETHEUS["rule_files"]:
        assert not Path(rule_file).is_absolute(), rule_file
        in_container = config_dir / rule_file
        assert (rules_mount / in_container.relative_to("/etc/prometheus/rules")).is_file(), rule_file
        # The same relative path from the file in the repository (deploy/prometheus/rules links to it).
        assert (REPO / "deploy" / "prometheus" / rule_file).resolve() == (
            rules_mount / in_container.relative_to("/etc/prometheus/rules")
        ).resolve()


def test_promtool_accepts_the_prometheus_config_as_a_user_runs_it(tmp_path):
    # As docs/deploy.md says to run it, from anywhere: promtool reads the
    # rule files relative to the config file.
    result = subprocess.run(
        [
            require_tool("promtool", "prometheus"),
            "check",
            "config",
            str(REPO / "deploy" / "prometheus" / "prometheus.yml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_grafana_links_prometheus_exemplars_to_jaeger_and_back():
    by_type = {ds["type"]: ds for ds in DATASOURCES}
    prometheus, jaeger = by_type["prometheus"], by_type["jaeger"]
    assert_reaches(prometheus["url"], "prometheus", 9090)
    assert_reaches(jaeger["url"], "jaeger", listen_port(JAEGER["extensions"]["jaeger_query"]["http"]["endpoint"]))
    destination = prometheus["jsonData"]["exemplarTraceIdDestinations"][0]
    assert destination == {"name": "trace_id", "datasourceUid": jaeger["uid"]}
    assert jaeger["jsonData"]["tracesToMetrics"]["datasourceUid"] == prometheus["uid"]
    for query in jaeger["jsonData"]["tracesToMetrics"]["queries"]:
        assert "$$__tags" in query["query"], "provisioning files need $$ for a literal $"


def test_grafana_provisions_the_dashboards_without_anonymous_admin():
    grafana = SERVICES["grafana"]
    environment = grafana["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert environment["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    provisioning = mounts(grafana)["/etc/grafana/provisioning"]
    provider = load_yaml(provisioning / "dashboards" / "dashboards.yml")["providers"][0]
    dashboards_dir = mounts(grafana)[provider["options"]["path"]]
    assert sorted(p.name for p in dashboards_dir.glob("*.json")) == [
        "agent-tools-vs-gpu.json",
        "executors.json",
        "gpu-pools.json",
        "tool-latency-and-slos.json",
    ]
    assert provider["folder"] == "Agent OTel"
    home = Path(environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (dashboards_dir / home.relative_to(provider["options"]["path"])).is_file()


def test_published_ports_bind_to_loopback_only():
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


# ---------------------------------------------------------------- routing tool spans to blame services

GATEWAY = load_yaml(REPO / "collector" / "gateway.yaml")
POOL_CONDITION = re.compile(r'attributes\["agent\.gpu\.pool"\] == "([^"]+)"')

# The settings of the components the blame routes use, as the Collector
# components of 0.160.0 declare them (their config.schema.yaml and config.go
# in opentelemetry-collector and -contrib): a key outside these is a config
# the Collector refuses to load.
_TLS_CLIENT = {
    "insecure",
    "insecure_skip_verify",
    "server_name_override",
    "ca_file",
    "ca_pem",
    "cert_file",
    "cert_pem",
    "key_file",
    "key_pem",
    "min_version",
    "max_version",
    "cipher_suites",
    "curve_preferences",
    "include_system_ca_certs_pool",
    "reload_interval",
    "tpm",
}
COMPONENT_KEYS = {
    # connector/routingconnector/config.go
    "routing": {
        "error_mode": None,
        "default_pipelines": None,
        "table": {"context": None, "condition": None, "statement": None, "pipelines": None, "action": None},
    },
    # exporter/otlpexporter: configgrpc.ClientConfig + exporterhelper timeout, sending_queue, retry_on_failure
    "otlp_grpc": {
        "endpoint": None,
        "compression": None,
        "headers": None,
        "balancer_name": None,
        "authority": None,
        "auth": None,
        "middlewares": None,
        "read_buffer_size": None,
        "write_buffer_size": None,
        "wait_for_ready": None,
        "keepalive": {"time": None, "timeout": None, "permit_without_stream": None},
        "tls": {key: None for key in _TLS_CLIENT},
        "timeout": None,
        "sending_queue": {
            "enabled": None,
            "num_consumers": None,
            "queue_size": None,
            "sizer": None,
            "block_on_overflow": None,
            "wait_for_result": None,
            "storage": None,
            "batch": None,
        },
        "retry_on_failure": {
            "enabled": None,
            "initial_interval": None,
            "randomization_factor": None,
            "multiplier": None,
            "max_interval": None,
            "max_elapsed_time": None,
            "max_retries": None,
        },
    },
    # processor/batchprocessor/config.schema.yaml
    "batch": {
        "timeout": None,
        "send_batch_size": None,
        "send_batch_max_size": None,
        "metadata_keys": None,
        "metadata_cardinality_limit": None,
    },
}


def unknown_keys(config: object, allowed: object, where: str) -> list[str]:
    if allowed is None or not isinstance(config, (dict, list)):
        return []
    if isinstance(config, list):
        return [found for i, item in enumerate(config) for found in unknown_keys(item, allowed, f"{where}[{i}]")]
    found = [f"{where}.{key}" for key in config if key not in allowed]
    return found + [
        item
        for key, value in config.items()
        if key in allowed
        for item in unknown_keys(value, allowed[key], f"{where}.{key}")
    ]


@pytest.mark.parametrize("config", [COLLECTOR, GATEWAY], ids=["otelcol-config.yaml", "gateway.yaml"])
def test_blame_routes_use_only_settings_the_collector_components_have(config):
    checked = 0
    for section in ("connectors", "exporters", "processors"):
        for name, settings in config[section].items():
            kind = name.split("/")[0]
            if kind in COMPONENT_KEYS:
                assert unknown_keys(settings or {}, COMPONENT_KEYS[kind], name) == []
                checked += 1
    assert checked >= 4
    assert "loadbalancing" not in config["exporters"] and "otlp" not in config["exporters"]  # renamed components


@pytest.mark.parametrize("config", [COLLECTOR, GATEWAY], ids=["otelcol-config.yaml", "gateway.yaml"])
def test_tool_spans_go_to_the_blame_service_of_their_pool_and_every_span_to_jaeger(config):
    pipelines = config["service"]["pipelines"]
    # Jaeger gets every span, unfiltered.
    assert pipelines["traces"]["processors"] == ["memory_limiter", "batch"]
    assert any(e.startswith("otlp_grpc/jaeger") for e in pipelines["traces"]["exporters"])
    # Only tool spans reach the router.
    assert "routing/blame" in pipelines["traces/tool_spans"]["exporters"]
    assert "filter/tool_spans" in pipelines["traces/tool_spans"]["processors"]
    routing = config["connectors"]["routing/blame"]
    assert "default_pipelines" not in routing  # a span of no listed pool goes to no blame service
    pools = []
    for route in routing["table"]:
        assert route["context"] == "resource"
        pools.append(POOL_CONDITION.fullmatch(route["condition"]).group(1))
        (pipeline,) = route["pipelines"]
        assert pipelines[pipeline]["receivers"] == ["routing/blame"]
        assert pipelines[pipeline]["processors"][0] == "memory_limiter"
        (exporter,) = pipelines[pipeline]["exporters"]
        assert exporter.startswith("otlp_grpc/blame_")
        endpoint = config["exporters"][exporter]["endpoint"]
        if config is COLLECTOR:  # the compose stack: the blame service of that pool, on its OTLP/gRPC port
            blame = parse_command(SERVICES["blame"]["command"])
            assert pools[-1] == blame.gpu_pool
            assert_reaches(endpoint, "blame", listen_port(blame.otlp_grpc))
        else:
            assert re.fullmatch(r"\$\{env:BLAME_\w+_ENDPOINT\}", endpoint), endpoint
    assert len(set(pools)) == len(pools) >= 1
    # A pool's pipeline batches briefly: the blame service's watermark counts it.
    assert config["processors"]["batch/blame"]["timeout"] == "1s"
