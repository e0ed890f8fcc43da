"""Each tool's compliance with its latency SLO, from the raw durations.

A call complies when its duration (request to result: queue and exec, the
``agent_tool_duration_seconds`` the alert rules count) is at most the
threshold, whatever its outcome. Compliance is the share of calls that
comply; the SLO breaks when it is below the objective. ``budget_spent`` is
the share of calls over the threshold against the error budget (1 - the
objective): above 1 the budget is gone. Tools that break their SLO come
first, the furthest below their objective first.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Sequence

from agent_otel.slo import Slo, Slos


@dataclass
class SloCompliance:
    tool: str
    slo: Slo
    calls: int
    within: int  # calls at most threshold_s long

    @property
    def compliance(self) -> float:
        return self.within / self.calls if self.calls else 1.0

    @property
    def breaks(self) -> bool:
        return self.compliance < self.slo.objective

    @property
    def budget_spent(self) -> float:
        """Calls over the threshold per call the objective allows over it."""
        return (1 - self.compliance) / self.slo.error_budget


def compliance(durations: dict[str, Sequence[float]], slos: Slos) -> list[SloCompliance]:
    """``durations``: each tool's call durations (seconds), sorted. Breaking tools first."""
    found = []
    for tool, seconds in durations.items():
        slo = slos.for_tool(tool)
        if slo is None or not seconds:
            continue
        found.append(SloCompliance(tool, slo, len(seconds), bisect_right(seconds, slo.threshold_s)))
    found.sort(key=lambda c: (not c.breaks, c.compliance - c.slo.objective, c.tool))
    return found
