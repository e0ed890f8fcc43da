"""Where GPU utilization samples come from.

Usage::

    from agent_otel.gpu.sources import open_gpu_source
    source = open_gpu_source("auto")          # NVML, or None without a GPU
    samples = source.poll() if source else []

Three sources share one shape (``GpuSource``): NVML on a real GPU
(``nvml``), a simulated GPU for demos and tests (``simulated``), and a
recorded ``nvidia-smi`` log played back (``replay:PATH``). A source only
reads; ``agent_otel.gpu.sampler.GpuSampler`` polls it on a background thread.
"""

from __future__ import annotations

import collections
import logging
from typing import NamedTuple, Optional, Protocol

from agent_otel.config import GPU_SOURCES, describe_choices
from agent_otel.errors import ConfigError
from agent_otel.records import GpuSample

log = logging.getLogger("agent_otel.gpu")

SPECS = describe_choices(GPU_SOURCES)


class GpuDevice(NamedTuple):
    """One GPU a source reports on. ``index`` is the label samples carry."""

    index: str
    uuid: Optional[str]
    name: str


class GpuSource(Protocol):
    """What the sampler needs from a source of GPU samples."""

    kind: str  # "nvml", "simulated" or "replay"
    # Problems the source degraded around, by kind (e.g. "gpu_lost"),
    # exported as agent_otel_gpu_errors_total. poll() never raises.
    errors: collections.Counter
    # Optional (read with getattr, default False): True when the source
    # vouches for every gap between its samples, marking lost data itself
    # with MISSING samples (NvmlSource), so the timeline needs no gap limit.

    def devices(self) -> list[GpuDevice]:
        """The GPUs being sampled."""

    def poll(self) -> list[GpuSample]:
        """New samples since the last poll, every selected GPU, epoch ns,
        in time order per GPU."""

    def close(self) -> None:
        """Release the source; idempotent."""


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
