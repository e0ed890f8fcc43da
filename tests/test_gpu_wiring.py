"""The agent and the blame service build their GPU timeline the same way from
the same settings (``agent_otel.attribution.wiring.gpu_timeline``): the
same source (with the model server read beside it), options, log and
label caps. Both are started as users start them: ``instrument()``'s
``start`` and ``agent-otel gpu-exporter --pool``'s ``start_blame_service``.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest

import agent_otel.gpu.nvml
from agent_otel.wiring import instrumentation
from agent_otel.attribution.options import GpuOptions
from agent_otel.attribution.service import PoolTimeline
from agent_otel.commands.blame_service import start_blame_service
from agent_otel.config import load_settings
from agent_otel.exporters.prometheus import OTHER, REASON_LABEL_LIMIT, LabelValues
from agent_otel.semconv import GPU_SOURCE_SIMULATED, METRIC_GPU_ERRORS, METRIC_GPU_HOUR_PRICE
from agent_otel.support.text import LABEL_VALUE_LIMIT
from tests.helpers.model_server import FakeModelServer, vllm_v1

POOL = "vllm-a:8000"
WATERMARK_S = 2.0
# More distinct reasons than the label keeps, each longer than a label value may be.
REASONS = [f"driver_error_{index}_" + "x" * (LABEL_VALUE_LIMIT + 50) for index in range(REASON_LABEL_LIMIT + 6)]


class NoGpuNvml:
    """NVML that finds no GPU, with many long error reasons (``gpu="nvml"`` opens it)."""

    kind = "nvml"

    def __init__(self, devices=None, quiet=False, **options):
        self.errors = collections.Counter({reason: 1 for reason in REASONS})
        self.reason = "no GPU (stand-in)"
        self.closed = False

    def devices(self) -> list:
        return []

    def close(self) -> None:
        self.closed = True


def settings_of(**values):
    return load_settings({"traces_exporters": "none", "frameworks": (), **values}, environ={})


def agent_handle(settings) -> instrumentation.Instrumentation:
    handle = instrumentation.start(settings)
    handle.wait_for_gpu(30)
    return handle


def service_handle(settings):
    handle, service = start_blame_service(
        dataclasses.replace(settings, gpu_pool=POOL),
        watermark_s=WATERMARK_S,
        grpc_endpoint=None,
        http_endpoint="127.0.0.1:0",
    )
    return handle, service


def samples(handle: instrumentation.Instrumentation, name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in handle.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_a_source_without_gpus_counts_its_errors_through_the_reason_labels_cap_in_the_agent_and_the_service(
    monkeypatch,
):
    monkeypatch.setattr(agent_otel.gpu.nvml, "NvmlSource", NoGpuNvml)
    settings = settings_of(gpu="nvml")
    capped = LabelValues(REASON_LABEL_LIMIT)
    expected = collections.Counter(capped(reason) for reason in REASONS)
    assert len(expected) == REASON_LABEL_LIMIT + 1 and expected[OTHER] == 6  # what the cap makes of them

    agent = agent_handle(settings)
    try:
        assert agent.gpu_timeline is None
        agent_errors = samples(agent, METRIC_GPU_ERRORS)
    finally:
        agent.shutdown(timeout_s=2.0)
    handle, service = service_handle(settings)
    try:
        assert service is None
        service_errors = samples(handle, METRIC_GPU_ERRORS)
    finally:
        handle.shutdown(timeout_s=2.0)

    assert agent_errors == {(("reason", label),): count for label, count in expected.items()}
    assert service_errors == agent_errors


@pytest.fixture
def model_server():
    server = FakeModelServer(vllm_v1(running=1, waiting=0, kv=0.5, prompt=10, generation=10))
    yield server
    server.stop()


def test_the_agent_and_the_blame_service_get_the_same_timeline_from_the_same_settings(model_server):
    settings = settings_of(
        gpu="simulated",
        model_server_metrics=model_server.url,
        gpu_poll_interval=0.2,
        gpu_idle_threshold=0.2,
        gpu_min_idle=0.3,
        gpu_idle_share_min=0.1,
        gpu_idle_children=False,
        gpu_hour_price=f"pool:{POOL}=2.2,1.5",
        attribution_horizon=200.0,
    )
    options = GpuOptions.of(settings)
    assert options != GpuOptions.default()  # every option differs from its default
    assert all(getattr(options, f.name) != getattr(GpuOptions.default(), f.name) for f in dataclasses.fields(options))

    agent = agent_handle(settings)
    try:
        live = agent.gpu_timeline
        assert live is not None and not isinstance(live, PoolTimeline)
        agent_prices = samples(agent, METRIC_GPU_HOUR_PRICE)
    finally:
        agent.shutdown(timeout_s=2.0)
    handle, service = service_handle(settings)
    try:
        assert service is not None
        pool = service.timeline
        assert handle.gpu_timeline is pool
        service_prices = samples(handle, METRIC_GPU_HOUR_PRICE)
    finally:
        handle.shutdown(timeout_s=2.0)

    assert live.options == options
    # The service's horizon reaches a watermark behind and ahead (attribution/service.py).
    assert pool.options == dataclasses.replace(options, horizon_s=max(options.horizon_s, 2 * WATERMARK_S + 60.0))
    for timeline in (live, pool):
        assert timeline.sampler.interval_s == 0.2
        assert timeline.engine.detector.threshold == 0.2
        assert timeline.engine.detector.min_idle_ns == 300_000_000
        assert timeline.share_min == 0.1 and timeline.children is False
        assert timeline.server is not None  # the model server, read beside the GPU
    assert live.source.kind == pool.delayed.source.kind == GPU_SOURCE_SIMULATED
    # Each its own pool's price: the agent declared none.
    assert agent_prices == {(("gpu", "0"),): 1.5}
    assert service_prices == {(("gpu", "0"),): 2.2}
