"""Progress of a long read, on stderr when a person is watching.

Shown only when stderr is a terminal and the read has taken longer than
half a second; redrawn at most ten times a second; cleared at the end, so
piped or redirected output never carries it.
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Optional, TextIO

from agent_otel.support.inputs import input_size

SHOW_AFTER_S = 0.5
REDRAW_EVERY_S = 0.1


class Progress:
    """Call with the bytes of each line read; ``finish()`` when done."""

    def __init__(self, paths: Iterable[str], label: str = "reading traces", stream: Optional[TextIO] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.label = label
        self.total = sum(input_size(path) for path in paths)
        self.done = 0
        self._started = time.monotonic()
        self._drawn_at = 0.0
        self._drawn = False

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._started >= SHOW_AFTER_S and now - self._drawn_at >= REDRAW_EVERY_S:
            self._drawn_at = now
            self._drawn = True
            if self.total:
                shown = f"{_mb(self.done)} of {_mb(self.total)} ({self.done / self.total:.0%})"
            else:  # standard input: the size is not known
                shown = _mb(self.done)
            self.stream.write(f"\r{self.label}: {shown}\x1b[K")
            self.stream.flush()

    def finish(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"
