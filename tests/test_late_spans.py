"""Late spans at the blame service: none with the defaults, and a clear word
when the watermark is too short.

A tool span that reaches the blame service after the blame has passed its
call's start is late: part of its GPU time stays unblamed. The default
watermark (30 s) covers the agents' default export interval (5 s) plus the
gateway's batching (1 s), so default agents and a default service lose
nothing; a watermark shorter than the export interval turns spans late, and
the service says so in one line naming the likely cause and the setting,
then at most one line a minute with how many more.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from agent_otel.attribution.service import DEFAULT_WATERMARK_S
from agent_otel.commands.blame_service import LateSpans
from agent_otel.config import DEFAULTS
from test_blame_service import POOL, Service, call
from test_endpoints import BlameService
from test_pools_e2e import REPO, base_env

# The gateway's batching of a pool's tool spans (collector/gateway.yaml, batch/blame).
GATEWAY_BATCH_S = 1.0

AGENT = textwrap.dedent(
    """
    import random
    import sys
    import time
    import agent_otel

    # Everything at its default but where the spans go and the pool.
    handle = agent_otel.instrument(service_name=sys.argv[3], otlp_endpoint=sys.argv[1], gpu_pool=sys.argv[2])


    @agent_otel.tool
    def search(query):
        time.sleep(random.uniform(0.05, 0.3))
        return query


    deadline = time.monotonic() + float(sys.argv[4])
    calls = 0
    while time.monotonic() < deadline:
        search(calls)
        calls += 1
    handle.shutdown()
    print("agent done", calls, flush=True)
    """
)


def test_the_default_watermark_covers_the_default_export_interval_and_the_gateways_batching():
    assert DEFAULT_WATERMARK_S >= 2 * (DEFAULTS.export_interval + GATEWAY_BATCH_S)


def run_agents(endpoint: str, pool: str, seconds: float, count: int) -> None:
    agents = [
        subprocess.Popen(
            [sys.executable, "-c", AGENT, endpoint, pool, f"agent-{i}", str(seconds)],
            env=base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        for i in range(count)
    ]
    for agent in agents:
        output, _ = agent.communicate(timeout=seconds + 60)
        assert agent.returncode == 0 and "agent done" in output, output


def late_lines(service: BlameService) -> list[str]:
    return [line for line in service.process.lines if "arrive late at the blame service" in line]


def test_a_watermark_shorter_than_the_export_interval_says_so_in_one_line(tmp_path):
    service = BlameService(tmp_path, "--watermark", "1")
    try:
        run_agents(f"http://{service.grpc}", "vllm-a.models:8000", seconds=6.0, count=1)
        late = service.metric("agent_otel_late_spans_total")
        received = service.metric("agent_otel_received_spans_total")
    finally:
        service.stop()
    assert received > 0 and late > 0
    (line,) = late_lines(service)
    assert "GPU pool 'vllm-a.models:8000'" in line and "watermark 1 s" in line
    assert "export_interval, OTEL_BSP_SCHEDULE_DELAY" in line and "raise --watermark" in line


@pytest.mark.slow  # a minute of real time: the run
def test_default_agents_and_a_default_blame_service_have_no_late_span_in_a_minute(tmp_path):
    service = BlameService(tmp_path)
    try:
        run_agents(f"http://{service.grpc}", "vllm-a.models:8000", seconds=60.0, count=2)
        late = service.metric("agent_otel_late_spans_total")
        received = service.metric("agent_otel_received_spans_total")
        # The blame has passed the first half of the run: spans were checked, and blamed.
        blamed = service.metric("agent_gpu_idle_blocked_seconds_total")
    finally:
        service.stop()
    figures = f"received {received:.0f} tool spans, blamed {blamed:.1f} s of GPU idle time, {late:.0f} late"
    print(figures)
    assert received > 100, figures
    assert blamed > 10, figures
    assert late == 0, figures
    assert late_lines(service) == []


def test_late_spans_name_the_cause_once_then_a_count_a_minute(caplog):
    caplog.set_level(logging.WARNING, logger="agent_otel")
    service = Service(watermark_s=2.0)
    now = [0.0]
    late = LateSpans(POOL, 2.0, clock=lambda: now[0])
    # Exported 4 s after they end: longer than the 2 s watermark.
    calls = [call(service, "search", t, t, t + 0.5, span_id=i + 1) for i, t in enumerate(range(1, 15))]
    for c in calls:
        arrival = (c.end_ns - service.origin) / 1e9 + 4.0
        service.run_to(arrival)
        now[0] = arrival
        late.report(service.timeline.add_calls([c]))
    # A call longer than the watermark, sent at once.
    service.run_to(25.0)
    hung = call(service, "hung_tool", 19.0, 19.0, 24.9, span_id=100)
    now[0] = 25.0
    late.report(service.timeline.add_calls([hung]))
    # A minute after the first line: one line with the count since.
    service.run_to(70.0)
    now[0] = 70.0
    late.report(service.timeline.add_calls([call(service, "search", 60.0, 60.0, 60.5, span_id=200)]))
    service.timeline.shutdown()
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("agent_otel")]
    assert len(lines) == 3, lines
    first, long_call, repeat = lines
    assert "'search', 0.5 s long, received 4.0 s after it ended; watermark 2 s" in first
    assert "export interval" in first and "raise --watermark" in first
    assert "'hung_tool', 5.9 s long, received 0.1 s after it ended" in long_call
    assert "last longer than the watermark" in long_call
    assert "export interval" not in long_call
    # All 15 search spans were late: the first line said the first, the repeat counts the
    # 14 since (first at 5.5 s, the repeat at 70 s).
    assert repeat.endswith("(14 times in the last 64 s)"), repeat
