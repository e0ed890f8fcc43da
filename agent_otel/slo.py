"""Latency SLOs, per tool: "``objective`` of a tool's calls finish within ``threshold_s`` seconds".

Spelled ``TOOL=SECONDS:OBJECTIVE`` on the command line (``agent-otel report
--slo``, ``python -m dashboards --slo``), repeatable; the tool ``*`` sets the
SLO of every tool without one of its own::

    agent-otel report traces.jsonl --slo '*=0.8:0.95' --slo embed=0.25:0.99

The report measures an SLO from each call's duration (request to result,
queue and exec), so any threshold is exact there. The alert rules can only
count calls under a histogram bucket bound (``semconv.DURATION_BUCKETS``):
``dashboards.slo`` refuses any other threshold rather than measure a
different SLO than the one asked for (docs/dashboards.md). ``on_bucket_bound``
tells the report's reader whether the rules could alert on the same SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from agent_otel.errors import ConfigError
from agent_otel.semconv import DURATION_BUCKETS

DEFAULT_THRESHOLD_S = 0.8
DEFAULT_OBJECTIVE = 0.95
ALL_TOOLS = "*"
SPELLING = "TOOL=SECONDS:OBJECTIVE, e.g. 'search=0.8:0.95', or '*=0.8:0.95' for every tool"


@dataclass(frozen=True)
class Slo:
    threshold_s: float = DEFAULT_THRESHOLD_S
    objective: float = DEFAULT_OBJECTIVE

    @property
    def error_budget(self) -> float:
        """The share of calls allowed over the threshold (0.05 for 95%)."""
        return round(1 - self.objective, 10)

    @property
    def on_bucket_bound(self) -> bool:
        """Whether the threshold is a bound of the duration histograms (the alert rules can measure it)."""
        return self.threshold_s in DURATION_BUCKETS

    def describe(self) -> str:
        """``95% within 0.8 s``."""
        return f"{self.objective * 100:.6g}% within {self.threshold_s:g} s"


@dataclass(frozen=True)
class Slos:
    """The SLO of each tool: its own, else the default (``*``), else none."""

    default: Optional[Slo] = field(default_factory=Slo)
    tools: dict[str, Slo] = field(default_factory=dict)

    def for_tool(self, tool: str) -> Optional[Slo]:
        return self.tools.get(tool, self.default)

    @classmethod
    def parse(cls, specs: Sequence[str], option: str = "--slo", default: Optional[Slo] = None) -> Slos:
        """From ``TOOL=SECONDS:OBJECTIVE`` texts; without a ``*`` one, ``default``
        (``Slo()``, 95% within 0.8 s, the alert rules' default, when None)."""
        tools: dict[str, Slo] = {}
        chosen_default = default if default is not None else Slo()
        seen_default = False
        for spec in specs:
            tool, slo = parse_spec(spec, option)
            if tool == ALL_TOOLS:
                if seen_default:
                    raise ConfigError(option, spec, f"one SLO for '{ALL_TOOLS}' (given twice)")
                seen_default, chosen_default = True, slo
            elif tool in tools:
                raise ConfigError(option, spec, f"one SLO per tool ({tool!r} given twice)")
            else:
                tools[tool] = slo
        return cls(chosen_default, tools)


def parse_spec(text: str, option: str = "--slo") -> tuple[str, Slo]:
    """``"search=0.8:0.95"`` -> ``("search", Slo(0.8, 0.95))``; a clear ``ConfigError`` otherwise."""
    tool, equals, target = text.rpartition("=")
    tool = tool.strip()
    seconds, colon, objective = target.partition(":")
    if not equals or not tool or not colon:
        raise ConfigError(option, text, SPELLING)
    try:
        threshold_s, ratio = float(seconds), float(objective)
    except ValueError:
        raise ConfigError(option, text, SPELLING) from None
    if not (math.isfinite(threshold_s) and threshold_s > 0):
        raise ConfigError(option, text, "a threshold of seconds above 0 (TOOL=SECONDS:OBJECTIVE)")
    if not 0 < ratio < 1:
        raise ConfigError(option, text, "an objective strictly between 0 and 1, e.g. 0.95 (TOOL=SECONDS:OBJECTIVE)")
    return tool, Slo(threshold_s, ratio)
