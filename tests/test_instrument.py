"""instrument(): settings, exporters, /metrics, shutdown bounds."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace

import agent_otel
from agent_otel.config import load_settings
from agent_otel.errors import ConfigError
from agent_otel.support import host
from agent_otel.report.analysis import analyse, report_json

UNPATCHED_SUBMIT = vars(ThreadPoolExecutor)["submit"]  # at collection, before any test instruments


def run_agent(code: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a small agent in a fresh interpreter (its own global tracer provider)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True, timeout=timeout
    )


def test_instrument_is_idempotent(agent):
    assert agent_otel.instrument() is agent


def test_reuses_the_provider_the_app_set(agent):
    assert agent.tracer_provider is trace.get_tracer_provider()
    assert not agent.owns_provider


@pytest.mark.parametrize(
    "env,setting,value",
    [
        ({"AGENT_OTEL_PROMETHEUS_PORT": "nine"}, "AGENT_OTEL_PROMETHEUS_PORT", "nine"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "smoke-signals"}, "OTEL_EXPORTER_OTLP_PROTOCOL", "smoke-signals"),
        ({"OTEL_TRACES_EXPORTER": "otlp,zipkinn"}, "OTEL_TRACES_EXPORTER", "otlp,zipkinn"),
        ({"AGENT_OTEL_GPU_IDLE_THRESHOLD": "1.5"}, "AGENT_OTEL_GPU_IDLE_THRESHOLD", "1.5"),
    ],
)
def test_invalid_environment_is_said_and_the_agent_goes_on(monkeypatch, caplog, spans, env, setting, value):
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    caplog.set_level("ERROR", logger="agent_otel")
    handle = agent_otel.instrument(gpu="off", frameworks=())
    try:
        # One error line names the variable and the value; the setting is as if not given.
        (error,) = handle.config_errors
        assert isinstance(error, ConfigError) and setting in str(error) and repr(value) in str(error)
        (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert setting in line and repr(value) in line and "ignored" in line
        defaults = load_settings({}, environ={})
        name = {"AGENT_OTEL_PROMETHEUS_PORT": "prometheus_port", "AGENT_OTEL_GPU_IDLE_THRESHOLD": "gpu_idle_threshold"}
        if setting in name:
            assert getattr(handle.settings, name[setting]) == getattr(defaults, name[setting])

        # ... and the agent's tool calls are traced as usual.
        @agent_otel.tool
        def search(q):
            return q

        assert search("x") == "x"
        assert [s.name for s in spans.tools("search")] == ["execute_tool search"]
    finally:
        agent_otel.uninstrument()


def test_invalid_arguments_are_said_and_the_rest_is_used(monkeypatch, caplog, spans):
    monkeypatch.setenv("AGENT_OTEL_PROMETHEUS_PORT", "0")
    caplog.set_level("ERROR", logger="agent_otel")
    handle = agent_otel.instrument(
        prometheus_port="http", no_such_option=1, gpu="off", frameworks=("langchian",), service_name="kept"
    )
    try:
        errors = [str(e) for e in handle.config_errors]
        assert any("no_such_option" in e for e in errors)
        assert any("'http'" in e and "prometheus_port" in e for e in errors)
        assert any("'langchian'" in e and "frameworks" in e for e in errors)
        assert len(errors) == 3 == len([r for r in caplog.records if r.levelname == "ERROR"])
        # The invalid argument gave way to the next source: the environment's port.
        assert handle.settings.prometheus_port == 0 and handle.prometheus_url is not None
        assert handle.settings.frameworks == ()
    finally:
        agent_otel.uninstrument()


def test_a_failure_inside_instrument_leaves_the_agent_running_uninstrumented(monkeypatch, caplog, spans):
    # Not a setting: agent-otel's own set-up breaks half-way (here the pipeline
    # thread cannot start, after the executors and the recorder were hooked).
    from agent_otel.wiring.pipeline import Pipeline

    def cannot_start(self):
        raise RuntimeError("can't start new thread")

    submit = ThreadPoolExecutor.submit
    monkeypatch.setattr(Pipeline, "start", cannot_start)
    with caplog.at_level("ERROR", logger="agent_otel"):
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    assert isinstance(handle.failure, RuntimeError)
    [said] = [r.getMessage() for r in caplog.records if "instrument() failed" in r.getMessage()]
    assert "RuntimeError: can't start new thread" in said and "the agent runs as without it" in said
    # What was hooked before the failure is undone; nothing is left half-instrumented.
    assert ThreadPoolExecutor.submit is submit
    assert agent_otel.wiring.instrumentation.current() is None

    @agent_otel.tool
    def search(query: str) -> str:
        return query.upper()

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(search, "gpu").result() == "GPU"
    assert search("idle") == "IDLE"
    assert spans.tools() == []
    # A later instrument() sets up afresh.
    monkeypatch.undo()
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:
        assert handle.failure is None
        search("again")
        assert len(spans.tools("search")) == 1
    finally:
        agent_otel.uninstrument()


def test_a_command_still_refuses_an_invalid_setting():
    # The commands (agent-otel demo, gpu-exporter) resolve settings without a problems list:
    # an invalid value is an error they print, in one line, before starting anything.
    with pytest.raises(ConfigError, match="prometheus_port"):
        load_settings({"prometheus_port": "http"}, environ={})
    with pytest.raises(ConfigError, match="no_such_option"):
        load_settings({"no_such_option": 1}, environ={})


def test_a_traces_file_that_cannot_be_written_leaves_the_other_exporters(tmp_path):
    result = run_agent(f"""
        import agent_otel
        handle = agent_otel.instrument(traces_file={str(tmp_path / "no-such-dir" / "t.jsonl")!r},
                                       traces_exporters="console", gpu="off", frameworks=())
        @agent_otel.tool
        def search(q):
            return q
        assert search("x") == "x"
        print("errors", len(handle.config_errors))
        handle.shutdown()
    """)
    assert result.returncode == 0, result.stderr
    assert "errors 1" in result.stdout
    assert '"name": "execute_tool search"' in result.stdout  # the console exporter still ran
    assert "traces file" in result.stderr and "no-such-dir" in result.stderr and "ignored" in result.stderr


def fetch(url, accept=None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.headers["Content-Type"], response.read().decode()


def test_metrics_endpoint_text_and_openmetrics_with_exemplars(spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), prometheus_port=0)
    try:
        assert handle.metrics_server.address == "127.0.0.1"

        @agent_otel.tool
        def search(q):
            return q

        search("a")
        (span,) = spans.tools("search")
        trace_id = format(span.context.trace_id, "032x")
        content_type, text = fetch(handle.prometheus_url)
        assert content_type.startswith("text/plain")
        assert 'agent_tool_calls_total{outcome="ok",tool="search"} 1.0' in text
        assert 'agent_tool_duration_seconds_bucket{le="0.8",tool="search"} 1.0' in text
        content_type, text = fetch(handle.prometheus_url, "application/openmetrics-text; version=1.0.0")
        assert content_type.startswith("application/openmetrics-text")
        exemplar_lines = [
            line
            for line in text.splitlines()
            if line.startswith("agent_tool_duration_seconds_bucket") and "# {" in line
        ]
        assert exemplar_lines and all(f'trace_id="{trace_id}"' in line for line in exemplar_lines)
    finally:
        agent_otel.uninstrument()
    with pytest.raises(OSError):
        fetch(handle.prometheus_url)


def test_busy_port_degrades_to_no_metrics_server(caplog):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), prometheus_port=port)
        assert handle.metrics_server is None
        assert "cannot serve /metrics" in caplog.text

        @agent_otel.tool
        def still_works():
            return 1

        assert still_works() == 1
    finally:
        agent_otel.uninstrument()
        blocker.close()


def test_tool_names_beyond_the_cap_fold_into_other(spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), tool_name_limit=3)
    try:
        for i in range(5):
            with agent_otel.tool_span(f"tool_{i}"):
                pass
        handle.pipeline.drain()
        value = handle.metrics.registry.get_sample_value
        assert [value("agent_tool_calls_total", {"tool": f"tool_{i}", "outcome": "ok"}) for i in range(5)] == [
            1.0,
            1.0,
            1.0,
            None,
            None,
        ]
        assert value("agent_tool_calls_total", {"tool": "_other", "outcome": "ok"}) == 2.0
        assert len(spans.tools()) == 5  # spans keep the real names
    finally:
        agent_otel.uninstrument()


def test_traces_file_is_otlp_json_lines(tmp_path):
    path = tmp_path / "traces.jsonl"
    result = run_agent(
        f"""
        import agent_otel
        handle = agent_otel.instrument(traces_file={str(path)!r}, traces_exporters="none", gpu="off")
        @agent_otel.tool
        def search(q):
            return q
        for i in range(3):
            search(i)
        handle.shutdown()
    """,
        env={"OTEL_SERVICE_NAME": "support-agent"},
    )
    assert result.returncode == 0, result.stderr
    lines = path.read_text().splitlines()
    spans = []
    for line in lines:
        request = json.loads(line)
        for resource_spans in request["resourceSpans"]:
            resource = {
                a["key"]: a["value"]["stringValue"]
                for a in resource_spans["resource"]["attributes"]
                if "stringValue" in a["value"]
            }
            assert resource["service.name"] == "support-agent"
            for scope_spans in resource_spans["scopeSpans"]:
                spans += scope_spans["spans"]
    assert [s["name"] for s in spans] == ["execute_tool search"] * 3
    assert all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)
    # the CPUs the process may use travel on the resource, and the report reads them and the service
    cpus = [
        a["value"]
        for a in json.loads(lines[0])["resourceSpans"][0]["resource"]["attributes"]
        if a["key"] == "agent.process.cpu.count"
    ]
    assert cpus == [{"intValue": str(host.cores())}]
    inputs = report_json(analyse([str(path)], idle_threshold=0.1, min_idle_s=0.5))["inputs"]
    assert inputs["services"] == ["support-agent"] and inputs["cpu_count"] == host.cores()


def test_console_exporter_and_sdk_disabled():
    code = """
        import agent_otel
        handle = agent_otel.instrument(gpu="off")
        @agent_otel.tool
        def search(q):
            return q
        assert search(1) == 1
        handle.shutdown()
    """
    console = run_agent(code, env={"OTEL_TRACES_EXPORTER": "console"})
    assert console.returncode == 0, console.stderr
    assert '"name": "execute_tool search"' in console.stdout
    disabled = run_agent(code, env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert disabled.returncode == 0, disabled.stderr
    assert "execute_tool" not in disabled.stdout


class SilentServer:
    """Accepts connections and never answers: an OTLP endpoint that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = []
        self._stop = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.connections.append(conn)
            except OSError:
                pass

    def close(self):
        self._stop = True
        self.thread.join()
        for conn in self.connections:
            conn.close()
        self.sock.close()


def closed_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


SLOW_EXPORT_AGENT = """
    import json, time
    import agent_otel
    handle = agent_otel.instrument(gpu="off", export_interval=0.05)
    @agent_otel.tool
    def search(q):
        return q
    costs = []
    for i in range(2000):
        t = time.perf_counter()
        search(i)
        costs.append(time.perf_counter() - t)
    time.sleep(0.3)  # let the exporter try (every 0.05 s), and hang or fail, meanwhile
    t = time.perf_counter()
    handle.shutdown()
    costs.sort()
    print(json.dumps({"shutdown_s": time.perf_counter() - t, "p50_s": costs[1000], "max_s": costs[-1]}))
"""


SHUTDOWN_BOUND_S = 0.5


@pytest.mark.parametrize("kind", ["unreachable", "silent"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_unreachable_or_silent_endpoint_slows_nothing(kind, protocol):
    server = SilentServer() if kind == "silent" else None
    port = server.port if server else closed_port()
    scheme_path = "" if protocol == "grpc" else "/v1/traces"
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}{scheme_path}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "30",
        # shutdown() waits this long for the hung export (the default, 5 s, only makes the test longer)
        "AGENT_OTEL_SHUTDOWN_TIMEOUT": str(SHUTDOWN_BOUND_S),
    }
    try:
        started = time.monotonic()
        result = run_agent(SLOW_EXPORT_AGENT, env=env, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        if server:
            server.close()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # the bound, plus slack for a busy machine; not the OTLP timeout (30 s)
    assert report["shutdown_s"] < SHUTDOWN_BOUND_S + 2.0
    assert report["p50_s"] < 0.002  # a tool call never waits for the network
    assert elapsed < 30


def test_instrument_again_after_uninstrument_exports_again(tmp_path):
    # In a fresh process: the first instrument() makes the global tracer
    # provider. A failed one first (its set-up breaks after it set the global
    # provider, which OpenTelemetry allows once) must not leave it unusable.
    first, second, failed = tmp_path / "first.jsonl", tmp_path / "second.jsonl", tmp_path / "failed.jsonl"
    result = run_agent(f"""
        import agent_otel
        from agent_otel.wiring.pipeline import Pipeline
        start = Pipeline.start
        def cannot_start(self):
            raise RuntimeError("can't start new thread")
        Pipeline.start = cannot_start
        handle = agent_otel.instrument(traces_exporters="none", traces_file={str(failed)!r}, gpu="off")
        assert isinstance(handle.failure, RuntimeError), handle.failure
        Pipeline.start = start
        @agent_otel.tool
        def search(q):
            return q
        search("uninstrumented")
        for path in ({str(first)!r}, {str(second)!r}):
            handle = agent_otel.instrument(traces_exporters="console", traces_file=path, gpu="off")
            search(path)
            handle.shutdown()
    """)
    assert result.returncode == 0, result.stderr
    assert "instrument() failed (RuntimeError" in result.stderr
    assert not failed.exists() or "execute_tool" not in failed.read_text()
    assert first.read_text().count("execute_tool search") == 1
    assert second.read_text().count("execute_tool search") == 1
    assert result.stdout.count('"name": "execute_tool search"') == 2  # the console exporter came back too


POOL_AGENT = """
    import json, urllib.request
    import agent_otel
    handle = agent_otel.instrument(traces_file={traces!r}, traces_exporters="none", prometheus_port=0,
                                   frameworks=(){extra})

    @agent_otel.tool
    def search(q):
        return q

    search("x")
    text = urllib.request.urlopen(handle.prometheus_url, timeout=5).read().decode()
    print(json.dumps({{"pool": handle.gpu_pool, "timeline": handle.gpu_timeline is not None,
                      "target_info": [l for l in text.splitlines() if l.startswith("target_info")]}}))
    handle.shutdown()
"""


@pytest.mark.parametrize("how", ["argument", "AGENT_OTEL_GPU_POOL", "OTEL_RESOURCE_ATTRIBUTES"])
def test_a_declared_gpu_pool_is_a_resource_attribute_and_turns_local_blame_off(tmp_path, how):
    traces = tmp_path / "traces.jsonl"
    extra, env = "", {}
    if how == "argument":
        extra = ', gpu_pool="vllm-a:8000"'
    elif how == "AGENT_OTEL_GPU_POOL":
        env = {how: "vllm-a:8000"}
    else:
        env = {how: "agent.gpu.pool=vllm-a:8000,deployment.environment.name=test"}
    # gpu=auto by default: with a pool it samples nothing here, whatever GPU the host has.
    result = run_agent(POOL_AGENT.format(traces=str(traces), extra=extra), env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {
        "pool": "vllm-a:8000",
        "timeline": False,
        "target_info": ['target_info{agent_gpu_pool="vllm-a:8000"} 1.0'],
    }
    (line,) = traces.read_text().splitlines()
    (resource_spans,) = json.loads(line)["resourceSpans"]
    resource = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
    assert resource["agent.gpu.pool"] == {"stringValue": "vllm-a:8000"}


def test_no_pool_keeps_the_local_gpu_and_no_target_info(tmp_path):
    result = run_agent(POOL_AGENT.format(traces=str(tmp_path / "t.jsonl"), extra=', gpu="simulated"'))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"pool": "", "timeline": True, "target_info": []}


def test_a_gpu_source_with_a_pool_is_said_and_left_to_the_pool(caplog):
    caplog.set_level("ERROR", logger="agent_otel")
    handle = agent_otel.instrument(gpu="simulated", gpu_pool="vllm-a:8000", traces_exporters="none", frameworks=())
    try:
        (error,) = handle.config_errors
        assert "gpu" in str(error) and "gpu-exporter --pool" in str(error)
        assert handle.settings.gpu == "auto" and handle.gpu_timeline is None  # the pool's service blames
    finally:
        agent_otel.uninstrument()


def test_a_gpu_log_that_cannot_be_written_leaves_the_sampling(tmp_path):
    handle = agent_otel.instrument(
        gpu="simulated", gpu_log_file=str(tmp_path / "no-such-dir" / "gpu.csv"), traces_exporters="none", frameworks=()
    )
    try:
        (error,) = handle.config_errors
        assert "gpu_log_file" in str(error) and "no-such-dir" in str(error)
        assert handle.gpu_timeline is not None  # the GPU is still sampled, without the log
    finally:
        agent_otel.uninstrument()


def test_a_replay_log_that_cannot_be_read_is_said_and_nothing_is_sampled(tmp_path):
    handle = agent_otel.instrument(gpu=f"replay:{tmp_path / 'missing.csv'}", traces_exporters="none", frameworks=())
    try:
        (error,) = handle.config_errors
        assert "missing.csv" in str(error)
        assert handle.gpu_timeline is None
    finally:
        agent_otel.uninstrument()
