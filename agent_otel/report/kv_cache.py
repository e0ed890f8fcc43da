"""GPU memory held while tools run: the model server's KV cache in the idle windows.

Usage::

    from agent_otel.report.kv_cache import KvCacheHeld, KvWindow
    held = KvCacheHeld(traces.kv_windows)
    for attribution in attributions:
        held.add(attribution)
    KvCache.of(held).tools   # per tool: the share of the cache in use while it blocked the idle GPU (report.parts)

Where a model server's metrics are read (``model_server_metrics``), each
``gpu.idle`` window's span carries the server's mean KV-cache usage during
the window (``agent.model_server.kv_cache.usage``). While the GPU idles,
the cache in use is held by requests that are not computing: the agents'
conversations waiting on their tools (their prefixes kept for the next
turn). So each tool is charged the window's usage for the idle time blamed
on it: ``usage x blamed seconds``, cache-seconds held by requests waiting
on that tool, and, over its blamed time, the share of the cache it held on
average. That share is what the server cannot give to other requests: it
limits concurrency. The live path counts the same
(``agent_gpu_idle_kv_cache_held_seconds_total``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

from agent_otel.attribution import WindowAttribution, gpu_key
from agent_otel.records import NS_PER_S


class KvWindow(NamedTuple):
    """An idle window's model-server readings, from its ``gpu.idle`` span."""

    gpu: str  # gpu_key: pool/gpu, or gpu
    start_ns: int
    end_ns: int
    usage: float  # the KV cache's mean usage, 0..1
    waiting_max: Optional[float]  # most requests queued at the server


@dataclass
class KvCacheHeld:
    """The KV cache held per tool over the windows that carry the server's readings."""

    windows: Sequence[KvWindow]
    idle_s: float = 0.0  # idle seconds of the windows with readings
    held_s: float = 0.0  # usage x idle seconds, summed
    blocked_s: dict[str, float] = field(default_factory=dict)  # tool -> idle seconds blamed, in those windows
    tool_held_s: dict[str, float] = field(default_factory=dict)  # tool -> usage x its blamed seconds
    matched: int = 0  # windows attributed that had readings
    _by_gpu: dict[str, tuple[list[int], list[KvWindow]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        grouped: dict[str, list[KvWindow]] = {}
        for window in self.windows:
            grouped.setdefault(window.gpu, []).append(window)
        for gpu, windows in grouped.items():
            windows.sort(key=lambda w: w.start_ns)
            self._by_gpu[gpu] = ([w.start_ns for w in windows], windows)

    def usage(self, gpu: str, start_ns: int, end_ns: int) -> Optional[float]:
        """The time-weighted mean usage of the readings overlapping ``[start_ns, end_ns)`` on ``gpu``."""
        found = self._by_gpu.get(gpu)
        if found is None:
            return None
        starts, windows = found
        total, weighted = 0, 0.0
        index = max(0, bisect.bisect_right(starts, start_ns) - 1)
        while index < len(windows) and windows[index].start_ns < end_ns:
            window = windows[index]
            overlap = min(end_ns, window.end_ns) - max(start_ns, window.start_ns)
            if overlap > 0:
                total += overlap
                weighted += overlap * window.usage
            index += 1
        return weighted / total if total else None

    def add(self, attribution: WindowAttribution) -> None:
        window = attribution.window
        usage = self.usage(gpu_key(window), window.start_ns, window.end_ns)
        if usage is None:
            return
        self.matched += 1
        seconds = (window.end_ns - window.start_ns) / NS_PER_S
        self.idle_s += seconds
        self.held_s += usage * seconds
        for share in attribution.shares:
            tool = share.call.tool
            self.blocked_s[tool] = self.blocked_s.get(tool, 0.0) + share.blocked_s
            self.tool_held_s[tool] = self.tool_held_s.get(tool, 0.0) + usage * share.blocked_s
