"""The latency SLOs that both the dashboards and the alert rules measure.

An SLO here is "``objective`` of a tool's calls finish within ``threshold``
seconds": one for every tool (the default), and any tool may have its own
(``ToolSLOs``, from ``--slo TOOL=SECONDS:OBJECTIVE``, ``agent_otel.slo``).
Prometheus can only count calls under a bucket boundary, so each threshold
must be one of the toolkit's histogram buckets; anything else would
silently measure a different SLO (the next bound down or up), so it is
refused. ``agent-otel report`` measures any threshold exactly, from the
calls' own durations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent_otel.errors import ConfigError
from agent_otel.slo import ALL_TOOLS, DEFAULT_OBJECTIVE, DEFAULT_THRESHOLD_S, Slos
from dashboards.contract import BUCKETS

__all__ = ["DEFAULT_OBJECTIVE", "DEFAULT_THRESHOLD_S", "LatencySLO", "ToolSLOs"]


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
                f"one of the toolkit's histogram bucket boundaries ({bounds}): Prometheus counts calls only "
                "under a bucket bound, so another threshold would alert on a different SLO (agent-otel report "
                "--slo measures any threshold, from each call's duration)",
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


@dataclass(frozen=True)
class ToolSLOs:
    """The default SLO and the tools with an SLO of their own."""

    default: LatencySLO = field(default_factory=LatencySLO)
    tools: tuple[tuple[str, LatencySLO], ...] = ()

    @classmethod
    def from_slos(cls, slos: Slos, option: str = "--slo") -> ToolSLOs:
        """Each of ``slos`` checked against the bucket bounds (the error names the tool)."""

        def checked(tool: str, threshold_s: float, objective: float) -> LatencySLO:
            try:
                return LatencySLO(threshold_s, objective)
            except ConfigError as exc:
                raise ConfigError(
                    option, f"{tool}={threshold_s:g}:{objective:g}", exc.args[0].split(": expected ", 1)[-1]
                ) from None

        assert slos.default is not None
        default = checked(ALL_TOOLS, slos.default.threshold_s, slos.default.objective)
        tools = tuple((tool, checked(tool, slo.threshold_s, slo.objective)) for tool, slo in sorted(slos.tools.items()))
        return cls(default, tools)

    def groups(self) -> list[tuple[LatencySLO, str]]:
        """(SLO, PromQL matcher of its tools) for each distinct SLO: the tools
        with their own, then the default with every other tool ("" when no
        tool has its own: every tool)."""
        by_slo: dict[LatencySLO, list[str]] = {}
        for tool, slo in self.tools:
            by_slo.setdefault(slo, []).append(tool)
        groups = [(slo, tool_matcher("=~", names)) for slo, names in by_slo.items()]
        others = tool_matcher("!~", [tool for tool, _ in self.tools]) if self.tools else ""
        return [*groups, (self.default, others)]


def tool_matcher(op: str, tools: list[str]) -> str:
    """``tool=~"a|b"`` matching exactly these names (RE2 metacharacters and
    the string's quotes escaped)."""
    pattern = "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", tool) for tool in tools)
    return "tool" + op + '"' + pattern.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_bound(bound: float) -> str:
    """A bucket bound as a person writes it: 0.8, 1, 2.5."""
    return f"{bound:g}"


def format_percent(ratio: float) -> str:
    """A ratio as a short percentage: 0.95 -> 95%, 0.999 -> 99.9%."""
    return f"{ratio * 100:.6g}%"
