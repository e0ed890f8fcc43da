"""What the blamed GPU idle time costs, at the ``gpu_hour_price`` the user gives.

Usage::

    from agent_otel.report.cost import price_analysis
    price_analysis(analysis, parse_prices("table"))   # analysis.costs, and money in the recommendations

Each GPU's idle seconds (blamed on each tool, or on none) are priced at
that GPU's price per hour (its pool's, its model's, or the default:
``agent_otel.support.prices``). "Per day at this load" scales the report's window
to 24 hours: the idle time the same load would leave in a day. A GPU with
no price adds no money (its seconds still show elsewhere); with no price at
all there is no ``costs`` and no money anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from agent_otel.support.prices import CURRENCY, GpuPrices
from agent_otel.records import NS_PER_S

if TYPE_CHECKING:
    from agent_otel.report.analysis import Analysis

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0


@dataclass
class ToolCost:
    tool: str
    gpu_hours: float  # blamed idle GPU-hours, on priced GPUs, in the window
    cost: float

    def per_day(self, scale: float) -> tuple[float, float]:
        return self.gpu_hours * scale, self.cost * scale


@dataclass
class GpuCost:
    gpu: str
    price: float  # per GPU-hour
    idle_cost: float
    blocked_cost: float
    unattributed_cost: float
    model_cost: float = 0.0  # the model server's share (model calls in flight)


@dataclass
class Costs:
    """The money of one report: per GPU, per tool, and per day at this load."""

    source: str
    window_s: float
    gpus: list[GpuCost] = field(default_factory=list)
    tools: list[ToolCost] = field(default_factory=list)  # most expensive first
    unpriced_gpus: list[str] = field(default_factory=list)

    @property
    def day_scale(self) -> float:
        """A day over the window: what multiplies the window's idle time into a day's at this load."""
        return SECONDS_PER_DAY / self.window_s if self.window_s > 0 else 0.0

    def tool(self, name: str) -> Optional[ToolCost]:
        return next((cost for cost in self.tools if cost.tool == name), None)


def _money(value: float) -> float:
    return round(value, 4)


def money_text(value: float) -> str:
    """``$12``, ``$3.40``, ``$0.012``: what a reader acts on."""
    if value >= 100:
        return f"{CURRENCY}{value:,.0f}"
    if value >= 0.1:
        return f"{CURRENCY}{value:.2f}"
    return f"{CURRENCY}{value:.2g}"


def hours_text(hours: float) -> str:
    return f"{hours:.0f}" if hours >= 100 else f"{hours:.2g}"


def _split(key: str) -> tuple[str, str]:
    """``(pool, gpu)`` of a GPU key (``gpu_key``: ``pool/gpu``, or ``gpu`` without a pool)."""
    pool, _, gpu = key.rpartition("/")
    return pool, gpu


def compute_costs(analysis: Analysis, prices: GpuPrices) -> Costs:
    """Price the analysis's blame; see the module docstring."""
    costs = Costs(source=prices.source(), window_s=(analysis.end_ns - analysis.start_ns) / NS_PER_S)
    price_of: dict[str, Optional[float]] = {}
    for stats in analysis.gpus:
        pool, gpu = _split(stats.gpu)
        price = prices.price(pool, analysis.gpu_names.get(stats.gpu))
        price_of[stats.gpu] = price
        if price is None:
            costs.unpriced_gpus.append(stats.gpu)
            continue
        per_s = price / SECONDS_PER_HOUR
        costs.gpus.append(
            GpuCost(
                stats.gpu,
                price,
                stats.idle_s * per_s,
                stats.idle_blocked_s * per_s,
                stats.idle_unattributed_s * per_s,
                stats.idle_model_s * per_s,
            )
        )
    hours: dict[str, float] = {}
    money: dict[str, float] = {}
    blame = analysis.blame
    for (gpu, tool, _phase), seconds in blame.blocked_s.items() if blame is not None else ():
        price = price_of.get(gpu)
        if price is None:
            continue
        hours[tool] = hours.get(tool, 0.0) + seconds / SECONDS_PER_HOUR
        money[tool] = money.get(tool, 0.0) + seconds / SECONDS_PER_HOUR * price
    costs.tools = sorted((ToolCost(tool, hours[tool], money[tool]) for tool in hours), key=lambda t: (-t.cost, t.tool))
    return costs


def price_analysis(analysis: Analysis, prices: Optional[GpuPrices]) -> None:
    """Set ``analysis.costs`` and add money to the recommendations about a
    tool, a pool or a GPU that idle time was blamed on; nothing without prices."""
    if prices is None:
        return
    costs = analysis.costs = compute_costs(analysis, prices)
    scale = costs.day_scale
    if not scale:
        return
    pools = {pool.executor: pool.tools for pool in analysis.executors}
    gpu_costs = {g.gpu: g for g in costs.gpus}
    for recommendation in analysis.recommendations:
        evidence = recommendation.evidence
        tools = [evidence["tool"]] if "tool" in evidence else pools.get(evidence.get("executor", ""), [])
        priced = [cost for cost in (costs.tool(tool) for tool in tools) if cost is not None and cost.cost > 0]
        if priced:
            hours, money = (sum(cost.per_day(scale)[i] for cost in priced) for i in (0, 1))
            whose = f'tool="{tools[0]}"' if len(tools) == 1 else f'the tools of pool="{evidence["executor"]}"'
            recommendation.message += (
                f" At this load the GPU idle time blamed on {whose} is about {hours_text(hours)} GPU-hours, "
                f"{money_text(money)}, a day: what this fix saves at most."
            )
        elif recommendation.kind == "idle_not_tools" and evidence.get("gpu") in gpu_costs:
            gpu = gpu_costs[evidence["gpu"]]
            hours = gpu.unattributed_cost / gpu.price * scale
            money = gpu.unattributed_cost * scale
            recommendation.message += (
                f" At this load that idle time is about {hours_text(hours)} GPU-hours, {money_text(money)}, a day."
            )
        else:
            continue
        evidence["gpu_hours_per_day"] = round(hours, 4)
        evidence["cost_per_day"] = _money(money)
