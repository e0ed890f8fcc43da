"""What the host gives this process: its CPUs.

Importing it loads nothing else of the toolkit, so the remedies' pools,
``instrument()`` (the ``agent.process.cpu.count`` resource attribute) and
the report's worker advice share one count.
"""

from __future__ import annotations

import os


def cores() -> int:
    """CPUs this process may run on (a container's affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
