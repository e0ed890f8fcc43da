"""How much a GPU pool's blame service costs, at 1, 10 and 100 agents.

Usage::

    .venv/bin/python bench/blame_service.py            # about 3 minutes on 2 cores
    .venv/bin/python bench/blame_service.py --quick    # fewer rounds and markers (a smoke run)

Simulated agents send what agent-otel's exporters send: tool spans as the
recorder writes them (``execute_tool {tool}`` with the GenAI and agent.tool
attributes, an ``exec.start`` event on queued calls), each agent its own
resource with the pool (``agent.gpu.pool``), 512 spans per request spread
over the agents, as a Collector gateway batches them. The GPU is the
simulated one, always idle, so every call is blamed.

(a) **Ingest**, CPU time per span of the service's request path (decode
    with the report's reader, pool/dedupe/watermark checks, the engine's
    call store, metrics), in this process on one core
    (``time.process_time``); next to it the decode alone. Rounds are
    interleaved (each agent count once per round, rotating) and each figure
    is the median and [min-max]. Then the same over OTLP/gRPC to a real
    ``agent-otel gpu-exporter --pool`` process: spans per second of the
    service's own CPU time (``/proc/PID/stat``), the receiver and gRPC
    included.
(b) **Memory** per minute of spans in flight: ``tracemalloc`` over one
    minute of calls held for attribution (the call records, the engine's
    store, the dedupe keys), at 5 tool calls per second per agent. What
    the service holds is the calls that end between its frontier (a
    watermark ago) and a watermark ahead, plus those an open idle window
    still needs: two watermarks' worth, or longer stalls.
(c) **End-to-end delay**, a real service (watermark 2 s) and agents that
    export every second (each request holds the calls that ended during
    the second before it): from a marker call's end until the service's
    ``/metrics`` holds its whole blame (polled every 50 ms). Expect the
    watermark plus up to one GPU poll interval (0.5 s): the export delay is
    hidden inside the watermark as long as it is shorter.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path

import grpc
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent_otel.attribution.service import PoolTimeline  # noqa: E402
from agent_otel.commands.blame_service import BlameService  # noqa: E402
from agent_otel.support.clock import now_ns  # noqa: E402
from agent_otel.exporters.prometheus import BlameServiceMetrics, Metrics  # noqa: E402
from agent_otel.gpu.simulated import SimulatedGpu  # noqa: E402
from agent_otel.receiver.decode import tool_calls  # noqa: E402
from agent_otel.receiver.server import GRPC_SERVICE  # noqa: E402

POOL = "bench-pool:8000"
AGENTS = (1, 10, 100)
PER_REQUEST = 512
TOOLS = [f"tool_{i:02d}" for i in range(20)]
CALLS_PER_AGENT_S = 5.0


# ---------------------------------------------------------------- workload


def add_attribute(span, key: str, value) -> None:
    attribute = span.attributes.add()
    attribute.key = key
    if isinstance(value, str):
        attribute.value.string_value = value
    elif isinstance(value, bool):
        attribute.value.bool_value = value
    elif isinstance(value, int):
        attribute.value.int_value = value
    else:
        attribute.value.double_value = value


def tool_span(span, rng: random.Random, end_ns: int, serial: int) -> None:
    """One tool span as agent-otel's recorder makes it."""
    queued = rng.random() < 0.4
    queue_s = rng.uniform(0.01, 0.3) if queued else 0.0
    exec_s = rng.uniform(0.02, 0.8)
    submit = end_ns - round((queue_s + exec_s) * 1e9)
    tool = rng.choice(TOOLS)
    span.trace_id = serial.to_bytes(16, "big")
    span.span_id = (serial * 7919 + 1).to_bytes(8, "big")
    span.parent_span_id = (serial * 7919 + 2).to_bytes(8, "big")
    span.name = f"execute_tool {tool}"
    span.kind = 1
    span.start_time_unix_nano = submit
    span.end_time_unix_nano = end_ns
    for key, value in (
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", tool),
        ("gen_ai.tool.type", "function"),
        ("agent.tool.queue.duration", queue_s),
        ("agent.tool.exec.duration", exec_s),
        ("agent.tool.executor", "tools" if queued else "direct"),
        ("agent.tool.outcome", "ok"),
    ):
        add_attribute(span, key, value)
    if queued:
        add_attribute(span, "agent.executor.max_workers", 4)
        event = span.events.add()
        event.name, event.time_unix_nano = "exec.start", submit + round(queue_s * 1e9)


def request_of(agents: int, spans: int, rng: random.Random, serial: int, end_of=lambda: now_ns()) -> bytes:
    """``spans`` tool spans spread over ``agents`` resources, as one request."""
    request = ExportTraceServiceRequest()
    scopes = []
    for agent in range(agents):
        resource_spans = request.resource_spans.add()
        for key, value in (
            ("service.name", f"agent-{agent}"),
            ("agent.gpu.pool", POOL),
            ("telemetry.sdk.language", "python"),
            ("telemetry.sdk.name", "opentelemetry"),
            ("telemetry.sdk.version", "1.45.2"),
        ):
            attribute = resource_spans.resource.attributes.add()
            attribute.key, attribute.value.string_value = key, value
        scope = resource_spans.scope_spans.add()
        scope.scope.name, scope.scope.version = "agent_otel", "0.1.0"
        scopes.append(scope)
    for index in range(spans):
        tool_span(scopes[index % agents].spans.add(), rng, end_of() - rng.randrange(0, 1_000_000_000), serial + index)
    return request.SerializeToString()


def new_service(watermark_s: float = 30.0) -> BlameService:
    metrics = Metrics(gpu_pool=POOL)
    timeline = PoolTimeline(
        SimulatedGpu(), pool=POOL, watermark_s=watermark_s, tracer=trace.NoOpTracer(), metrics=metrics, clock=now_ns
    )
    service_metrics = BlameServiceMetrics(
        metrics.registry,
        metrics.tool_label,
        held_calls=timeline.held_calls,
        dropped_calls=lambda: timeline.engine.horizon.dropped,
        lag_s=timeline.lag_s,
    )
    return BlameService(timeline, service_metrics, grpc_endpoint=None, http_endpoint="127.0.0.1:0")


# ---------------------------------------------------------------- (a) ingest


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """``median [min-max]`` of ``values`` times ``scale``."""
    m, lo, hi = statistics.median(values) * scale, min(values) * scale, max(values) * scale
    return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def ingest_in_process(rounds: int, requests: int) -> None:
    print(
        f"(a) ingest, in this process, one core: {requests} requests of {PER_REQUEST} tool spans per round, "
        f"{rounds} interleaved rounds, median [min-max]; no goal is set for the blame service: for scale"
    )
    rng = random.Random(1)
    serial = 1
    bodies = {}
    for agents in AGENTS:
        bodies[agents] = [request_of(agents, PER_REQUEST, rng, serial + k * PER_REQUEST) for k in range(requests)]
        serial += requests * PER_REQUEST
    full: dict[int, list[float]] = {a: [] for a in AGENTS}
    decode: dict[int, list[float]] = {a: [] for a in AGENTS}
    for round_ in range(rounds):
        order = AGENTS[round_ % 3 :] + AGENTS[: round_ % 3]
        for agents in order:
            parsed = [ExportTraceServiceRequest.FromString(b) for b in bodies[agents]]
            started = time.process_time()
            for request in parsed:
                tool_calls(request)
            decode[agents].append((time.process_time() - started) / (requests * PER_REQUEST))
            service = new_service()
            started = time.process_time()
            for body in bodies[agents]:
                service.consume(ExportTraceServiceRequest.FromString(body), "bench", "grpc")
            full[agents].append((time.process_time() - started) / (requests * PER_REQUEST))
            assert service.timeline.held_calls() == requests * PER_REQUEST
    print(
        f"    {'agents':>6}   {'decode µs/span':>20}   {'service µs/span':>20}   {'spans/s on one core':>19}   "
        f"{'x 1 agent, same round':>21}"
    )
    for agents in AGENTS:
        per_span = statistics.median(full[agents])
        ratios = [value / base for value, base in zip(full[agents], full[1])]
        print(
            f"    {agents:6d}   {spread(decode[agents], 1e6, 1):>20}   {spread(full[agents], 1e6, 1):>20}"
            f"   {1 / per_span:19,.0f}   {spread(ratios):>21}"
        )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_service(watermark_s: float, poll_s: float = 0.5) -> tuple[subprocess.Popen, str, str]:
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
            "--pool",
            POOL,
            "--otlp-grpc",
            "127.0.0.1:0",
            "--otlp-http",
            "off",
            "--prometheus-port",
            "0",
            "--watermark",
            str(watermark_s),
            "--poll-interval",
            str(poll_s),
            "--max-request-bytes",
            str(64 << 20),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    metrics_url = grpc_endpoint = ""
    for line in process.stdout:
        found = re.search(r"metrics at (\S+)", line)
        if found:
            metrics_url = found.group(1)
        found = re.search(r"OTLP/gRPC on (\S+?)[;,]", line)
        if found:
            grpc_endpoint = found.group(1)
            break
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
    return process, grpc_endpoint, metrics_url


def ingest_over_grpc(requests: int) -> None:
    print(
        f"    over OTLP/gRPC to a gpu-exporter --pool process ({requests} requests of {PER_REQUEST} spans, "
        "the service's CPU time; one run per agent count, a process each: a throughput over all the requests, "
        "not rounds):"
    )
    rng = random.Random(2)
    print("    agents   spans/s of service CPU   wall spans/s")
    serial = 10_000_000
    for agents in AGENTS:
        process, endpoint, _ = start_service(watermark_s=30.0)
        try:
            bodies = [request_of(agents, PER_REQUEST, rng, serial + k * PER_REQUEST) for k in range(requests)]
            serial += requests * PER_REQUEST
            with grpc.insecure_channel(endpoint) as channel:
                export = channel.unary_unary(
                    f"/{GRPC_SERVICE}/Export",
                    request_serializer=None,
                    response_deserializer=ExportTraceServiceResponse.FromString,
                )
                export(bodies[0], timeout=30)  # warm: connection, first imports
                cpu, wall = cpu_seconds(process.pid), time.perf_counter()
                for body in bodies[1:]:
                    response = export(body, timeout=30)
                    assert response.partial_success.rejected_spans == 0
                cpu, wall = cpu_seconds(process.pid) - cpu, time.perf_counter() - wall
            spans = (requests - 1) * PER_REQUEST
            print(f"    {agents:6d}   {spans / cpu:22,.0f}   {spans / wall:12,.0f}")
        finally:
            process.terminate()
            process.wait(timeout=30)


# ---------------------------------------------------------------- (b) memory


def memory_per_minute() -> None:
    print(
        f"(b) memory for one minute of spans held for attribution ({CALLS_PER_AGENT_S:g} tool calls/s per agent), "
        "tracemalloc (bytes held, the same in every run: no rounds)"
    )
    print("    agents   calls/min   MB      bytes per call")
    rng = random.Random(3)
    serial = 50_000_000
    for agents in AGENTS:
        calls = round(agents * CALLS_PER_AGENT_S * 60)
        minute = 60_000_000_000
        start = now_ns()
        requests = []
        for k in range(0, calls, PER_REQUEST):
            n = min(PER_REQUEST, calls - k)
            # ends spread over the minute, as a minute of agents' calls
            requests.append(
                ExportTraceServiceRequest.FromString(
                    request_of(
                        min(agents, n),
                        n,
                        rng,
                        serial + k,
                        end_of=lambda start=start, minute=minute: start + rng.randrange(0, minute),
                    )
                )
            )
        serial += calls
        service = new_service(watermark_s=120.0)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for request in requests:  # decoded here: the calls it keeps are counted
            service.timeline.add_calls(tool_calls(request).calls)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del requests
        assert service.timeline.held_calls() == calls
        print(f"    {agents:6d}   {calls:9,d}   {held / 1e6:5.1f}   {held / calls:14.0f}")


# ---------------------------------------------------------------- (c) end-to-end delay


MARKER = re.compile(r'^agent_gpu_idle_blocked_seconds_total\{gpu="0",phase="exec",tool="(marker_\d+)"\} (\S+)$', re.M)


def end_to_end(markers: int) -> None:
    watermark_s = 2.0
    print(
        f"(c) end-to-end delay, span end -> whole blame on /metrics: watermark {watermark_s:g} s, GPU polled "
        f"every 0.5 s, agents export every 1 s, {markers} marker calls of 0.2 s (the p50 and max are over the "
        "markers of one run)"
    )
    print("    agents   spans/s   delay p50   delay max   over the watermark (p50)")
    for agents in AGENTS:
        process, endpoint, metrics_url = start_service(watermark_s=watermark_s)
        try:
            delays = run_agents(agents, endpoint, metrics_url, markers)
        finally:
            process.terminate()
            process.wait(timeout=30)
        rate = agents * CALLS_PER_AGENT_S
        p50 = statistics.median(delays)
        print(f"    {agents:6d}   {rate:7.0f}   {p50:7.2f} s   {max(delays):7.2f} s   {p50 - watermark_s:+.2f} s")


def run_agents(agents: int, endpoint: str, metrics_url: str, markers: int) -> list[float]:
    """Agents send their calls every second; agent 0 also sends marker calls.
    Returns, per marker, seconds from its end until /metrics held its final blame."""
    rng = random.Random(agents)
    stop = threading.Event()
    ends: dict[str, int] = {}
    seen: dict[str, list[tuple[float, float]]] = {}
    serial = [90_000_000 + agents * 1_000_000]

    def send():
        with grpc.insecure_channel(endpoint) as channel:
            export = channel.unary_unary(
                f"/{GRPC_SERVICE}/Export",
                request_serializer=None,
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
            next_marker = time.time() + 3.0  # past the start of the GPU timeline
            pending: list[tuple[str, int]] = []
            while not stop.is_set():
                tick = time.time()
                # one export per agent per second, each with the calls it finished in that second
                request = ExportTraceServiceRequest()
                for _agent in range(agents):
                    resource_spans = request.resource_spans.add()
                    attribute = resource_spans.resource.attributes.add()
                    attribute.key, attribute.value.string_value = "agent.gpu.pool", POOL
                    scope = resource_spans.scope_spans.add()
                    for _ in range(rng.randrange(3, 8)):
                        tool_span(scope.spans.add(), rng, now_ns() - rng.randrange(0, 1_000_000_000), serial[0])
                        serial[0] += 1
                if tick >= next_marker and len(ends) < markers:
                    name = f"marker_{len(ends)}"
                    end = now_ns() - rng.randrange(0, 1_000_000_000)  # it ended during the last export interval
                    pending.append((name, end))
                    ends[name] = end
                    next_marker = tick + 1.5
                for name, end in pending:
                    span = request.resource_spans[0].scope_spans[0].spans.add()
                    span.trace_id, span.span_id = serial[0].to_bytes(16, "big"), serial[0].to_bytes(8, "big")
                    serial[0] += 1
                    span.name = f"execute_tool {name}"
                    span.start_time_unix_nano, span.end_time_unix_nano = end - 200_000_000, end
                    add_attribute(span, "gen_ai.operation.name", "execute_tool")
                    add_attribute(span, "gen_ai.tool.name", name)
                pending = []
                export(request.SerializeToString(), timeout=30)
                stop.wait(max(0.0, tick + 1.0 - time.time()))

    def watch():
        while not stop.is_set():
            text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
            now = time.time()
            for name, value in MARKER.findall(text):
                seen.setdefault(name, []).append((now, float(value)))
            stop.wait(0.05)

    threads = [threading.Thread(target=send, daemon=True), threading.Thread(target=watch, daemon=True)]
    for thread in threads:
        thread.start()
    deadline = time.time() + markers * 1.5 + 18
    while time.time() < deadline and (len(ends) < markers or time.time() < max(ends.values()) / 1e9 + 6):
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(30)
    delays = []
    for name, end in ends.items():
        points = seen.get(name)
        assert points, f"{name} was never blamed"
        final = points[-1][1]
        complete = next(t for t, v in points if v >= final - 1e-9)
        delays.append(complete - end / 1e9)
    return delays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and markers (a smoke run)")
    args = parser.parse_args()
    print(f"CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}")
    ingest_in_process(rounds=2 if args.quick else 5, requests=20 if args.quick else 60)
    ingest_over_grpc(requests=10 if args.quick else 40)
    memory_per_minute()
    end_to_end(markers=3 if args.quick else 8)
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        sys.exit(main())
