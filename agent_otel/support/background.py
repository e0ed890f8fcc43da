"""The one shape of every part that runs in the background.

A span processor's export thread, the metrics pipeline, the GPU sampler and
timeline, the loop monitor, the /metrics server, the framework hooks: each
is started by ``instrument()`` (or a command) and stopped by its
``shutdown(timeout_s)``, which returns within ``timeout_s`` seconds, True
when the part stopped and flushed everything in that time, else False.
``Instrumentation.shutdown`` runs them all at once under one deadline and
names the ones that returned False.
"""

from __future__ import annotations

from typing import Protocol


class Background(Protocol):
    """A part with a thread, a server or patches to stop (see the module docstring)."""

    def shutdown(self, timeout_s: float) -> bool:
        """Stop within ``timeout_s`` seconds; True when stopped and flushed in time."""
        ...
