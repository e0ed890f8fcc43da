"""Every background part has the one shape of agent_otel.background.Background:
``shutdown(timeout_s: float) -> bool``, in seconds."""

from __future__ import annotations

import inspect
import typing

import pytest

from agent_otel.attribution.live import LiveTimeline
from agent_otel.attribution.service import PoolTimeline
from agent_otel.background import Background
from agent_otel.blame_service import BlameService
from agent_otel.capture.frameworks import FrameworkHooks
from agent_otel.capture.loop_monitor import LoopMonitor
from agent_otel.exporters.batch import BatchSpanProcessor
from agent_otel.exporters.prometheus import MetricsServer
from agent_otel.gpu.sampler import GpuSampler
from agent_otel.pipeline import Pipeline
from agent_otel.receiver.server import OtlpReceiver

PARTS = [
    BatchSpanProcessor,
    Pipeline,
    LiveTimeline,
    PoolTimeline,
    GpuSampler,
    MetricsServer,
    FrameworkHooks,
    LoopMonitor,
    BlameService,
    OtlpReceiver,
]


@pytest.mark.parametrize("part", PARTS, ids=lambda part: part.__name__)
def test_shutdown_takes_seconds_and_says_whether_it_finished(part):
    hints = typing.get_type_hints(part.shutdown)
    parameters = list(inspect.signature(part.shutdown).parameters)
    assert parameters[:2] == ["self", "timeout_s"], parameters
    assert hints["timeout_s"] is float and hints["return"] is bool


def test_the_protocol_is_what_the_parts_implement():
    hints = typing.get_type_hints(Background.shutdown)
    assert list(inspect.signature(Background.shutdown).parameters) == ["self", "timeout_s"]
    assert hints == {"timeout_s": float, "return": bool}
