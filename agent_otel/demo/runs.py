"""One run of a demo scenario under the current ``instrument()``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable


from agent_otel.demo import agent, tools
from agent_otel.demo.gpu import GpuChoice
from agent_otel.errors import AgentOtelError
from agent_otel.semconv import GPU_SOURCE_SIMULATED


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    description: str
    tools: Callable[[tools.Services], tools.Toolset]
    serve: Callable


SCENARIOS = {
    "baseline": Scenario(
        "baseline",
        "as commonly written",
        f"each round, one batched model step for all conversations, then wait for all their tool calls on one "
        f"shared {tools.BASELINE_POOL_WORKERS}-worker pool, the CRM's sync client called straight from the "
        f"async code (it blocks the event loop); the quote API client waits up to "
        f"{tools.CLIENT_TIMEOUT_S:g} s per attempt, {tools.BASELINE_QUOTE_ATTEMPTS} attempts",
        tools.baseline_tools,
        agent.serve_baseline,
    ),
    "fixed": Scenario(
        "fixed",
        "with the remedies",
        f"async tool calls with continuous batching (the GPU serves other conversations meanwhile), "
        f"a pool per tool class ({tools.FIXED_POOL_WORKERS} workers each; the CRM's sync client awaited with "
        f".aio(), off the event loop), and the quote API bounded at "
        f"{tools.FIXED_QUOTE_TIMEOUT_S:g} s per attempt, {tools.FIXED_QUOTE_RETRIES + 1} attempts, "
        f"then the last known price",
        tools.fixed_tools,
        agent.serve_fixed,
    ),
}


def run_scenario(
    scenario: Scenario, handle, gpu: GpuChoice, *, seconds: float, conversations: int, seed: int, stop: threading.Event
) -> None:
    """Serve ``conversations`` for ``seconds`` (or until ``stop``); the tool
    calls in flight then finish, and every conversation gets a last model step."""
    services = tools.Services(seed)
    model = agent.Model(model_kernel(handle, gpu))
    deadline = time.monotonic() + seconds
    scenario.serve(
        model, scenario.tools(services), services, conversations, lambda: stop.is_set() or time.monotonic() >= deadline
    )


def model_kernel(handle, gpu: GpuChoice) -> Callable[[float], None]:
    """What a model step runs: matmuls on the real GPU; on the simulated GPU
    ``instrument()`` samples, a wait: the model call's span (``model_span``)
    keeps that GPU busy while it is in flight, as it does in any agent's
    process (docs/gpu.md)."""
    if gpu.real is not None:
        return gpu.real.run_kernel
    timeline = handle.gpu_timeline
    if timeline is None or timeline.source.kind != GPU_SOURCE_SIMULATED:
        raise AgentOtelError(
            "the demo needs instrument() to sample its simulated GPU, and it does not "
            "(was instrument() already called with other settings?)"
        )
    return time.sleep


def gpu_name(handle) -> str:
    """The sampled GPU's name, as its source reports it."""
    timeline = handle.gpu_timeline
    devices = timeline.source.devices() if timeline is not None else []
    return devices[0].name if devices else "no GPU sampled"
