"""Attribution: idle windows x tool calls -> blame per tool and phase.

``rule`` is the contract's rule (the only implementation, live and offline),
``horizon`` keeps the recent finished calls, and ``live`` joins the GPU
timeline with the calls while the agent runs.
"""

from agent_otel.attribution.rule import (
    BlameTotals,
    CallShare,
    UnderuseTotals,
    WindowAttribution,
    attribute,
    attribute_underuse,
    gpu_key,
)

__all__ = [
    "BlameTotals",
    "CallShare",
    "UnderuseTotals",
    "WindowAttribution",
    "attribute",
    "attribute_underuse",
    "gpu_key",
]
