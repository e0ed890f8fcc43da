"""Where GPU utilization samples come from.

Usage::

    from agent_otel.gpu.sources import open_gpu_source
    source = open_gpu_source("auto")          # NVML, or None without a GPU
    samples = source.poll() if source else []

Three sources share one shape (``agent_otel.gpu.device.GpuSource``): NVML on a real GPU
(``nvml``), a simulated GPU for demos and tests (``simulated``), and a
recorded ``nvidia-smi`` log played back (``replay:PATH``). A source only
reads; ``agent_otel.gpu.sampler.GpuSampler`` polls it on a background thread.
"""

from __future__ import annotations

import logging
from typing import Optional

from agent_otel.config import GPU_SOURCES, describe_choices
from agent_otel.errors import ConfigError
from agent_otel.gpu.device import GpuSource

log = logging.getLogger("agent_otel.gpu")

SPECS = describe_choices(GPU_SOURCES)


def open_gpu_source(spec: str, devices: Optional[list[str]] = None, **options) -> Optional[GpuSource]:
    """Open the source ``spec`` names, on ``devices`` (indexes or UUIDs; all by default).

    ``auto`` gives NVML when it initialises and finds a GPU, else None (it
    never falls back to a simulated GPU). ``nvml`` always gives a source:
    without NVML it logs one line, counts the reason in ``errors`` and
    reports no devices. ``off`` gives None. ``options`` go to the source's
    constructor. Raises ``ConfigError`` for an unknown spec and
    ``InputError`` for an unreadable replay log: both are configuration
    mistakes, reported when the source is opened, never while sampling.
    """
    text = (spec or "").strip()
    if text == "off":
        return None
    if text in ("auto", "nvml"):
        from agent_otel.gpu.nvml import NvmlSource

        source = NvmlSource(devices, quiet=text == "auto", **options)
        if text == "auto" and not source.devices():
            source.close()
            log.info("no NVIDIA GPU found (%s); GPU sampling is off", source.reason or "no device")
            return None
        return source
    if text == "simulated":
        from agent_otel.gpu.simulated import SimulatedGpu

        return SimulatedGpu(devices=devices, **options)
    if text.startswith("replay:") and len(text) > len("replay:"):
        from agent_otel.gpu.replay import ReplaySource

        return ReplaySource(text[len("replay:") :], devices=devices, **options)
    raise ConfigError("gpu", spec, SPECS)
