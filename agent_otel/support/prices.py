"""What an idle GPU-hour costs: the ``gpu_hour_price`` setting.

Usage::

    from agent_otel.support.prices import parse_prices
    prices = parse_prices("table,pool:vllm-a:8000=2.20")
    prices.price(pool="vllm-a:8000", gpu_name="NVIDIA H100 80GB HBM3")   # 2.2: the pool's own
    prices.price(pool="", gpu_name="NVIDIA H100 80GB HBM3")              # 3.0: the table's
    parse_prices(None)                                                   # None: no money shown

The setting is a comma list; each entry is one of:

- ``PRICE``: every GPU's price per hour (``2.5``);
- ``pool:POOL=PRICE``: the GPUs of one GPU pool (``agent.gpu.pool``);
- ``MODEL=PRICE``: GPUs whose name contains ``MODEL`` (case ignored:
  ``H100=3.1`` for ``NVIDIA H100 80GB HBM3``);
- ``table``: the default table below for the GPU models it lists.

A GPU's price is its pool's, else the first ``MODEL`` entry its name
matches (yours before the table's), else the plain ``PRICE``; with none,
it has no price and its idle time is shown in seconds only. Prices are in
one currency, US dollars unless you give them in another (the outputs
write ``$``).

Where the table's numbers come from: the middle of the "specialty
provider" on-demand range per GPU of Mercatus's cloud GPU pricing survey
(https://www.mercatus-ai.com/blog/cloud-gpu-pricing, May 2026: A100 80GB
$1.10 to $1.50, H100 SXM5 $2.50 to $3.50, H200 SXM5 $3.50 to $4.50 an
hour). Hyperscalers charge more, long-tail providers less, reservations
30 to 50 % less: the table is a starting point for an estimate, never a
bill; give your own price where you know it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from agent_otel.errors import ConfigError

# GPU model (matched in the GPU's name, case ignored), price per GPU-hour.
DEFAULT_TABLE: tuple[tuple[str, float], ...] = (("H200", 4.00), ("H100", 3.00), ("A100", 1.30))
TABLE_SOURCE = "the middle of the specialty-provider on-demand range, mercatus-ai.com cloud GPU pricing, May 2026"
TABLE = "table"
POOL_PREFIX = "pool:"
CURRENCY = "$"
EXPECTED = (
    "a comma list of PRICE, MODEL=PRICE, pool:POOL=PRICE or table, prices per GPU-hour >= 0 "
    "(e.g. 2.5 or table,H100=3.1)"
)


@dataclass(frozen=True)
class GpuPrices:
    """Prices per GPU-hour, as the setting gives them; see the module docstring."""

    default: Optional[float] = None
    pools: dict[str, float] = field(default_factory=dict)
    models: tuple[tuple[str, float], ...] = ()  # (lower-case name part, price), first match wins
    table: bool = False  # the default table was asked for (its entries are at the end of models)
    text: str = ""  # the setting as given

    def price(self, pool: str = "", gpu_name: Optional[str] = None) -> Optional[float]:
        """The price of one hour of a GPU of ``pool`` named ``gpu_name``; None: no price."""
        if pool and pool in self.pools:
            return self.pools[pool]
        name = (gpu_name or "").lower()
        if name:
            for part, price in self.models:
                if part in name:
                    return price
        return self.default

    def source(self) -> str:
        """Where the prices come from, for the outputs."""
        given = f"gpu_hour_price={self.text}"
        return f"{given} (the table: {TABLE_SOURCE})" if self.table else given


def _number(entry: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError("gpu_hour_price", entry, EXPECTED) from None
    if not (value >= 0 and value < float("inf")):
        raise ConfigError("gpu_hour_price", entry, EXPECTED)
    return value


def parse_prices(text: Optional[str], where: str = "gpu_hour_price") -> Optional[GpuPrices]:
    """The prices the setting's ``text`` gives; None for none. Raises
    ``ConfigError`` naming ``where`` and the bad entry."""
    if text is None or not text.strip():
        return None
    default: Optional[float] = None
    pools: dict[str, float] = {}
    models: list[tuple[str, float]] = []
    table = False
    try:
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            if entry.lower() == TABLE:
                table = True
            elif "=" in entry:
                key, value = (part.strip() for part in entry.rsplit("=", 1))
                price = _number(entry, value)
                if key.lower().startswith(POOL_PREFIX) and len(key) > len(POOL_PREFIX):
                    pools[key[len(POOL_PREFIX) :]] = price
                elif key and not key.lower().startswith(POOL_PREFIX):
                    models.append((key.lower(), price))
                else:
                    raise ConfigError(where, entry, EXPECTED)
            else:
                default = _number(entry, entry)
    except ConfigError as error:
        raise ConfigError(where, error.value, EXPECTED) from None
    if table:
        models += [(part.lower(), price) for part, price in DEFAULT_TABLE]
    if default is None and not pools and not models:
        raise ConfigError(where, text, EXPECTED)
    return GpuPrices(default, pools, tuple(models), table, text.strip())


def problem(text: str) -> Optional[str]:
    """What is wrong with the setting's ``text`` (what was expected), or None: the check ``agent_otel.config`` runs."""
    try:
        parse_prices(text)
    except ConfigError:
        return EXPECTED
    return None
