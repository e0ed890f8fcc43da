"""What a GPU source is: the devices it reports on and the shape every source has.

The sources (``nvml``, ``simulated``, ``replay``) build on these, and
``agent_otel.gpu.sources.open_gpu_source`` picks one; keeping the shape
apart lets the sources import it without importing the module that
imports them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Optional, Protocol

from agent_otel.records import GpuSample


@dataclass(frozen=True)
class GpuDevice:
    """One GPU a source reports on. ``index`` is the label samples carry."""

    index: str
    uuid: Optional[str]
    name: str


class GpuSource(Protocol):
    """What the sampler needs from a source of GPU samples."""

    kind: str  # "nvml", "simulated" or "replay"

    @property
    def errors(self) -> collections.Counter:
        """Problems the source degraded around, by kind (e.g. "gpu_lost"),
        exported as agent_otel_gpu_errors_total. poll() never raises."""
        ...

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
