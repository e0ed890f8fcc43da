"""What the settings say about sampling and blaming a GPU, read once.

Usage::

    options = GpuOptions.of(settings)      # agent_otel.config.Settings
    options = GpuOptions.default()         # the settings' defaults (config.py's, nowhere else)
    dataclasses.replace(options, min_idle_s=0.5)

The agent's timeline and the blame service's take them whole
(``attribution.wiring.gpu_timeline``), and so does the ``BlameEngine``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from agent_otel.config import DEFAULTS, Settings
from agent_otel.support.prices import GpuPrices, parse_prices

__all__ = ["GpuOptions"]


@dataclass(frozen=True)
class GpuOptions:
    """What the settings say about sampling and blaming a GPU (``GpuOptions.of(settings)``):
    the one place they are read, for the agent's timeline and the blame service's alike."""

    poll_interval_s: float  # gpu_poll_interval
    idle_threshold: float  # gpu_idle_threshold
    min_idle_s: float  # gpu_min_idle
    horizon_s: float  # attribution_horizon
    share_min_s: float  # gpu_idle_share_min
    children: bool  # gpu_idle_children
    prices: Optional[GpuPrices]  # gpu_hour_price, parsed

    @classmethod
    def of(cls, settings: Settings) -> GpuOptions:
        return cls(
            poll_interval_s=settings.gpu_poll_interval,
            idle_threshold=settings.gpu_idle_threshold,
            min_idle_s=settings.gpu_min_idle,
            horizon_s=settings.attribution_horizon,
            share_min_s=settings.gpu_idle_share_min,
            children=settings.gpu_idle_children,
            prices=parse_prices(settings.gpu_hour_price),
        )

    @classmethod
    def default(cls) -> GpuOptions:
        """The options of the default settings."""
        return cls.of(DEFAULTS)
