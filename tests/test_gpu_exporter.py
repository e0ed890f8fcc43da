"""agent-otel gpu-exporter as an operator runs it on a GPU host."""

import json
import pytest
import os
import re
import subprocess
import sys
import time
import urllib.request


def test_gpu_exporter_serves_metrics_and_writes_idle_spans(tmp_path):
    traces = tmp_path / "gpu.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    env.update({"OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1"})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_otel.commands.cli",
            "gpu-exporter",
            "--gpu",
            "simulated",
            "--prometheus-port",
            "0",
            "--poll-interval",
            "0.05",
            "--min-idle",
            "0.2",
            "--traces-file",
            str(traces),
            "--duration",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = process.stdout.readline()
        assert "sampling 1 GPU(s) via simulated: 0 Simulated GPU" in first
        url = re.search(r"metrics at (\S+)", process.stdout.readline()).group(1)
        assert url.startswith("http://127.0.0.1:")
        time.sleep(0.5)
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'agent_gpu_utilization_ratio{gpu="0"} 0.0' in text
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    spans = [
        span
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    (idle,) = [s for s in spans if s["name"] == "gpu.idle"]
    attributes = {a["key"]: a["value"] for a in idle["attributes"]}
    # The simulated GPU was never given work: one window, the whole run.
    assert 1.0 < attributes["gpu.idle.duration"]["doubleValue"] < 3.0  # of the 2 s run
    assert attributes["gpu.idle.unattributed_duration"]["doubleValue"] == attributes["gpu.idle.duration"]["doubleValue"]
    assert "gpu.idle.blocked_by" not in attributes


def test_gpu_exporter_with_a_pool_is_the_blame_service_and_exports_its_contract(tmp_path):
    """Tool spans in over OTLP, the pool's blame and the service's own metrics
    out, with exactly the names, types and labels of agent_otel.semconv."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from agent_otel import semconv

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    env.update({"OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1", "AGENT_OTEL_GPU_POOL": "vllm-a:8000"})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_otel.commands.cli",
            "gpu-exporter",
            "--gpu",
            "simulated",
            "--prometheus-port",
            "0",
            "--otlp-grpc",
            "127.0.0.1:0",
            "--otlp-http",
            "127.0.0.1:0",
            "--watermark",
            "2",
            "--poll-interval",
            "0.1",
            "--min-idle",
            "0.2",
            "--duration",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert "sampling 1 GPU(s) via simulated" in process.stdout.readline()
        url = re.search(r"metrics at (\S+)", process.stdout.readline()).group(1)
        line = process.stdout.readline()
        assert "blame service of GPU pool 'vllm-a:8000'" in line and "watermark 2 s" in line
        grpc_endpoint = re.search(r"OTLP/gRPC on (\S+),", line).group(1)

        def idle_blamed() -> float:
            found = re.search(
                r'^agent_gpu_idle_seconds_total\{gpu="0"\} (\S+)$',
                urllib.request.urlopen(url, timeout=5).read().decode(),
                flags=re.M,
            )
            return float(found.group(1)) if found else 0.0

        deadline = time.monotonic() + 20
        while idle_blamed() < 0.5:  # the engine is blaming: its frontier is a watermark behind now
            assert time.monotonic() < deadline, "the blame service never blamed GPU time"
            time.sleep(0.1)
        provider = TracerProvider(
            resource=Resource.create({"service.name": "agent-1", "agent.gpu.pool": "vllm-a:8000"})
        )
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=grpc_endpoint, insecure=True)))
        tracer = provider.get_tracer("agent_otel")
        # Not a tool span: refused. Sent first, so the exporter has connected
        # before the clock of the call below starts (on a loaded machine the
        # first export can take most of a second, and a call that arrives more
        # than a watermark after it ended is late).
        tracer.start_span("chat gpt-4o").end()
        now = time.time_ns()
        span = tracer.start_span(
            "execute_tool search",
            start_time=now - 800_000_000,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
        )
        span.end(end_time=now - 100_000_000)
        provider.shutdown()
        # A late span: its call ended before the frontier, a watermark behind
        # now (an exporter that was stuck for seconds): counted late, blamed nowhere.
        late = TracerProvider(resource=Resource.create({"agent.gpu.pool": "vllm-a:8000"}))
        late.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=grpc_endpoint, insecure=True)))
        now = time.time_ns()
        span = late.get_tracer("agent_otel").start_span(
            "execute_tool sql",
            start_time=now - 6_000_000_000,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "sql"},
        )
        span.end(end_time=now - 4_000_000_000)
        late.shutdown()
        time.sleep(2.5)  # the watermark passes the search call
        request = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        text = urllib.request.urlopen(request, timeout=5).read().decode()
    finally:
        process.terminate()
        process.communicate(timeout=30)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["target"].type == "info"
    assert families["target"].samples[0].labels == {"agent_gpu_pool": "vllm-a:8000"}
    ours = {
        spec.name.removesuffix("_total") if spec.kind == semconv.COUNTER else spec.name: spec
        for spec in semconv.METRICS.values()
        if spec.blame_service
    }
    for name, spec in ours.items():
        family = families[name]
        assert family.type == spec.kind and family.documentation == spec.help, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels), (sample.name, sample.labels)
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("agent_otel_received_spans_total", (("transport", "grpc"),))] == 3
    assert value[("agent_otel_refused_spans_total", (("reason", "not_a_tool_span"),))] == 1
    assert value[("agent_otel_late_spans_total", (("tool", "sql"),))] == 1
    assert ("agent_otel_late_spans_total", (("tool", "search"),)) not in value
    assert ("agent_gpu_idle_blocked_seconds_total", (("gpu", "0"), ("phase", "exec"), ("tool", "sql"))) not in value
    assert value[
        ("agent_gpu_idle_blocked_seconds_total", (("gpu", "0"), ("phase", "exec"), ("tool", "search")))
    ] == pytest.approx(0.7, abs=0.2)
