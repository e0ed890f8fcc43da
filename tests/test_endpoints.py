"""What an OTLP/gRPC endpoint means, against the blame service's real receiver
(`agent-otel gpu-exporter --pool`, plain text, as shipped):

- ``http://host:port``: plain text; every span arrives.
- ``host:port`` and ``https://host:port``: TLS, as OpenTelemetry says; the
  handshake with the plain-text receiver fails, and the agent says so in
  one line that gives the endpoint to write.

Each agent is a real process calling ``instrument()``, its spans sent by the
SDK's gRPC exporter.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from test_pools_e2e import REPO, Process, base_env

POOL = "vllm-a.models:8000"

AGENT = textwrap.dedent(
    """
    import sys
    import agent_otel

    handle = agent_otel.instrument(
        service_name="endpoint-agent",
        otlp_endpoint=sys.argv[1],
        gpu_pool=sys.argv[2],
        export_interval=0.2,
        shutdown_timeout=6,
        frameworks=(),
    )


    @agent_otel.tool
    def search(query):
        return query


    for i in range(3):
        search(i)
    handle.shutdown()
    print("agent done", flush=True)
    """
)


class BlameService:
    """``agent-otel gpu-exporter --pool`` on a simulated GPU, on free local ports."""

    def __init__(self, work: Path, *extra: str, env: dict | None = None):
        self.process = Process(
            "blame service",
            [
                sys.executable,
                "-m",
                "agent_otel.commands.cli",
                "gpu-exporter",
                "--gpu",
                "simulated",
                "--pool",
                POOL,
                "--otlp-grpc",
                "127.0.0.1:0",
                "--otlp-http",
                "off",
                *extra,
            ],
            {**base_env(), "AGENT_OTEL_PROMETHEUS_PORT": "0", **(env or {})},
            work / "blame.log",
        )
        self.grpc = self.process.wait_line(r"OTLP/gRPC on (127\.0\.0\.1:\d+)").group(1)
        self.metrics_url = self.process.wait_line(r"metrics at (http://\S+)").group(1)

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture(scope="module")
def blame_service(tmp_path_factory):
    service = BlameService(tmp_path_factory.mktemp("blame"))
    yield service
    service.stop()


def run_agent(endpoint: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", AGENT, endpoint, POOL],
        # The gRPC exporter gives up on a batch after this (its default is 10 s).
        env={**base_env(), "OTEL_EXPORTER_OTLP_TIMEOUT": "2"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0 and "agent done" in result.stdout, result.stdout + result.stderr
    return result.stderr


def tls_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("agent-otel:") and "TLS handshake" in line]


def test_http_scheme_reaches_the_plain_text_receiver(blame_service):
    before = blame_service.metric("agent_otel_received_spans_total")
    stderr = run_agent(f"http://{blame_service.grpc}")
    assert blame_service.metric("agent_otel_received_spans_total") - before == 3
    assert tls_lines(stderr) == []
    assert "failed" not in stderr


@pytest.mark.parametrize("scheme", ["", "https://"], ids=["host:port", "https"])
def test_a_tls_endpoint_against_the_plain_text_receiver_says_so_in_one_line_with_the_endpoint_to_write(
    blame_service, scheme
):
    before = blame_service.metric("agent_otel_received_spans_total")
    stderr = run_agent(f"{scheme}{blame_service.grpc}")
    assert blame_service.metric("agent_otel_received_spans_total") == before  # TLS: nothing arrives
    (line,) = tls_lines(stderr)
    assert f"write http://{blame_service.grpc} for a receiver without TLS" in line
    assert ("https:// means TLS" if scheme else "an endpoint without http:// means TLS") in line


@pytest.mark.parametrize(
    ("endpoint", "environ", "advised"),
    [
        ("http://gw:4317", {}, None),
        ("gw:4317", {}, "gw:4317"),
        ("https://gw:4317", {}, "gw:4317"),
        ("gw:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, None),
        ("gw:4317", {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false", "OTEL_EXPORTER_OTLP_INSECURE": "true"}, "gw:4317"),
        ("https://gw:4317", {"OTEL_EXPORTER_OTLP_INSECURE": "true"}, "gw:4317"),  # https:// wins, as in the SDK
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, "collector:4317"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, None),
        (None, {}, None),  # the SDK's default, http://localhost:4317
    ],
)
def test_advice_only_where_the_exporter_opens_tls_and_only_for_a_tls_failure(endpoint, environ, advised):
    import dataclasses

    from agent_otel.config import DEFAULTS
    from agent_otel.wiring.sinks import grpc_tls_advice

    settings = dataclasses.replace(DEFAULTS, otlp_endpoint=endpoint)
    advise = grpc_tls_advice(settings, environ)
    if advised is None:
        assert advise is None
        return
    assert advise is not None
    assert f"write http://{advised} " in advise(
        "... Tls handshake failed (TSI_PROTOCOL_FAILURE): ... WRONG_VERSION_NUMBER"
    )
    assert advise("failed to connect to all addresses; Connection refused") == ""
    assert grpc_tls_advice(dataclasses.replace(settings, otlp_protocol="http/protobuf"), environ) is None
