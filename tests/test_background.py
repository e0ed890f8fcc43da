"""Every background part has the one shape of agent_otel.support.background.Background:
``shutdown(timeout_s: float) -> bool``, in seconds."""

from __future__ import annotations

import importlib
import inspect
import typing

import pytest

from agent_otel.support.background import Background

# By name, imported by the test that checks each: collecting this module (which
# every xdist worker does) loads none of them (the blame service loads gRPC).
PARTS = [
    "agent_otel.exporters.batch.BatchSpanProcessor",
    "agent_otel.wiring.pipeline.Pipeline",
    "agent_otel.attribution.live.LiveTimeline",
    "agent_otel.attribution.service.PoolTimeline",
    "agent_otel.gpu.sampler.GpuSampler",
    "agent_otel.exporters.prometheus.MetricsServer",
    "agent_otel.capture.frameworks.FrameworkHooks",
    "agent_otel.capture.loop_monitor.LoopMonitor",
    "agent_otel.commands.blame_service.BlameService",
    "agent_otel.receiver.server.OtlpReceiver",
]


@pytest.mark.parametrize("name", PARTS, ids=lambda name: name.rsplit(".", 1)[1])
def test_shutdown_takes_seconds_and_says_whether_it_finished(name):
    module, _, attribute = name.rpartition(".")
    part = getattr(importlib.import_module(module), attribute)
    hints = typing.get_type_hints(part.shutdown)
    parameters = list(inspect.signature(part.shutdown).parameters)
    assert parameters[:2] == ["self", "timeout_s"], parameters
    assert hints["timeout_s"] is float and hints["return"] is bool


def test_the_protocol_is_what_the_parts_implement():
    hints = typing.get_type_hints(Background.shutdown)
    assert list(inspect.signature(Background.shutdown).parameters) == ["self", "timeout_s"]
    assert hints == {"timeout_s": float, "return": bool}
