"""The latency SLO that both the dashboards and the alert rules measure.

An SLO here is "``objective`` of each tool's calls finish within
``threshold`` seconds". Prometheus can only count calls under a bucket
boundary, so the threshold must be one of the toolkit's histogram buckets;
anything else would silently measure a different SLO, so it is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent_otel.errors import ConfigError
from dashboards.contract import BUCKETS

DEFAULT_THRESHOLD_S = 0.8
DEFAULT_OBJECTIVE = 0.95


@dataclass(frozen=True)
class LatencySLO:
    threshold_s: float = DEFAULT_THRESHOLD_S
    objective: float = DEFAULT_OBJECTIVE

    def __post_init__(self) -> None:
        if self.threshold_s not in BUCKETS:
            bounds = ", ".join(format_bound(b) for b in BUCKETS)
            raise ConfigError(
                "SLO threshold (seconds)",
                self.threshold_s,
                f"one of the toolkit's histogram bucket boundaries ({bounds})",
            )
        if not 0 < self.objective < 1:
            raise ConfigError("SLO objective", self.objective, "a ratio strictly between 0 and 1, e.g. 0.95")

    @property
    def error_budget(self) -> float:
        """The share of calls allowed over the threshold (0.05 for 95%)."""
        return round(1 - self.objective, 10)

    def le_regex(self) -> str:
        """A regex for the SLO bucket's ``le`` label on Prometheus 2 and 3.

        Prometheus 3 (and prometheus_client) write whole numbers as ``1.0``
        where older exporters wrote ``1``; a regex matching both keeps the
        rules and panels working on either server.
        """
        text = format_bound(self.threshold_s)
        if "." in text:
            return re.escape(text)
        return f"{text}(\\.0)?"

    def le_matcher(self) -> str:
        """The PromQL matcher for the SLO bucket, e.g. ``le=~"0\\\\.8"``."""
        return 'le=~"' + self.le_regex().replace("\\", "\\\\") + '"'


def format_bound(bound: float) -> str:
    """A bucket bound as a person writes it: 0.8, 1, 2.5."""
    return f"{bound:g}"


def format_percent(ratio: float) -> str:
    """A ratio as a short percentage: 0.95 -> 95%, 0.999 -> 99.9%."""
    return f"{ratio * 100:.6g}%"
