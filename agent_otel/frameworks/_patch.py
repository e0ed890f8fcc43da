"""What every framework hook shares: exact patching and one warning.

``Patches`` remembers each attribute it replaced and puts the original back,
so uninstrumenting restores the library exactly. ``warn_once`` keeps a hook
that meets a framework version it does not understand to one log line.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Callable

logger = logging.getLogger("agent_otel.frameworks")

_warned: set[str] = set()


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` is seen; later calls are silent."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


class VersionNotUnderstood(Exception):
    """The installed framework lacks something the hook relies on."""


class Patches:
    """Attribute replacements of one framework hook, undone in reverse order."""

    def __init__(self):
        self._applied: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` (defined on owner itself) by ``make_wrapper(original)``."""
        try:
            original = vars(owner)[name]
        except KeyError:
            raise VersionNotUnderstood(f"{getattr(owner, '__name__', owner)}.{name} not found") from None
        wrapper = make_wrapper(original)
        setattr(owner, name, wrapper)
        self._applied.append((owner, name, original))

    def restore(self) -> None:
        while self._applied:
            owner, name, original = self._applied.pop()
            setattr(owner, name, original)

    def __bool__(self) -> bool:
        return bool(self._applied)


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
