"""Where GPU utilization samples come from.

Usage::

    from agent_otel.gpu.sources import open_gpu_source
    source = open_gpu_source("auto")          # NVML, or None without a GPU
    samples = source.poll() if source else []

Four sources share one shape (``agent_otel.gpu.device.GpuSource``): NVML on a real GPU
(``nvml``), a simulated GPU for demos and tests (``simulated``), a
recorded ``nvidia-smi`` log played back (``replay:PATH``), and a model
server's own metrics (``model_server``, ``agent_otel.gpu.server``), which can
also be read beside any of the others. A source only reads;
``agent_otel.gpu.sampler.GpuSampler`` polls it on a background thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from agent_otel.config import GPU_AUTO, GPU_CHOICES, GPU_OFF, REPLAY_PREFIX, describe_choices
from agent_otel.errors import ConfigError
from agent_otel.gpu.device import GpuSource
from agent_otel.semconv import GPU_SOURCE_NVML, GPU_SOURCE_SERVER, GPU_SOURCE_SIMULATED

if TYPE_CHECKING:
    from agent_otel.gpu.server import ModelServerSource

log = logging.getLogger("agent_otel.gpu")

SPECS = describe_choices(GPU_CHOICES)


def open_gpu_source(
    spec: str, devices: Optional[list[str]] = None, *, model_server: Optional[str] = None, **options
) -> Optional[GpuSource]:
    """Open the source ``spec`` names, on ``devices`` (indexes or UUIDs; all by default).

    ``auto`` gives NVML when it initialises and finds a GPU, else the model
    server's metrics when ``model_server`` names them, else None (it never
    falls back to a simulated GPU). ``nvml`` always gives a source: without
    NVML it logs one line, counts the reason in ``errors`` and reports no
    devices. ``model_server`` reads the server's metrics alone. ``off``
    gives None. With ``model_server`` (a metrics URL) and a GPU source, the
    server is read beside it (``WithModelServer``). ``options`` go to the
    source's constructor. Raises ``ConfigError`` for an unknown spec or a
    bad URL and ``InputError`` for an unreadable replay log: configuration
    mistakes, reported when the source is opened, never while sampling.
    """
    text = (spec or "").strip()
    if text == GPU_OFF:
        return None
    server = _server(model_server, as_gpu=text in (GPU_AUTO, GPU_SOURCE_SERVER))
    if text == GPU_SOURCE_SERVER:
        if server is None:
            raise ConfigError("model_server_metrics", None, "the model server's metrics URL, for gpu=model_server")
        return server
    gpu = _gpu_source(text, devices, alone=server is not None, **options)
    if server is None:
        return gpu
    if gpu is None:  # auto without a GPU: the server alone
        return server
    from agent_otel.gpu.server import WithModelServer

    return WithModelServer(gpu, server)


def _server(url: Optional[str], as_gpu: bool) -> Optional[ModelServerSource]:
    if not url:
        return None
    from agent_otel.gpu.server import ModelServerSource  # here: loaded only where a server is read

    try:
        return ModelServerSource(url, as_gpu=as_gpu)
    except ValueError:
        raise ConfigError("model_server_metrics", url, "an http(s)://host:port/metrics URL") from None


def _gpu_source(text: str, devices: Optional[list[str]], alone: bool = False, **options) -> Optional[GpuSource]:
    if text in (GPU_AUTO, GPU_SOURCE_NVML):
        from agent_otel.gpu.nvml import NvmlSource

        source = NvmlSource(devices, quiet=text == GPU_AUTO, **options)
        if text == GPU_AUTO and not source.devices():
            source.close()
            log.info(
                "no NVIDIA GPU found (%s); %s",
                source.reason or "no device",
                "the model server's metrics are the GPU signal" if alone else "GPU sampling is off",
            )
            return None
        return source
    if text == GPU_SOURCE_SIMULATED:
        from agent_otel.gpu.simulated import SimulatedGpu

        return SimulatedGpu(devices=devices, **options)
    if text.startswith(REPLAY_PREFIX) and len(text) > len(REPLAY_PREFIX):
        from agent_otel.gpu.replay import ReplaySource

        return ReplaySource(text[len(REPLAY_PREFIX) :], devices=devices, **options)
    raise ConfigError("gpu", text, SPECS)
