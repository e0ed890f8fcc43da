"""What every framework hook shares: exact patching and one warning.

``Patches`` remembers each attribute it replaced and puts the original back,
so uninstrumenting restores the library exactly. ``warn_once`` keeps a hook
that meets a framework version it does not understand to one log line.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Callable

logger = logging.getLogger("agent_otel.capture.frameworks")

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
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` (defined on owner itself) by ``make_wrapper(original)``."""
        try:
            original = vars(owner)[name]
        except KeyError:
            raise VersionNotUnderstood(f"{getattr(owner, '__name__', owner)}.{name} not found") from None
        wrapper = make_wrapper(original)
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    def wrap_overrides(self, base: type, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        """Wrap ``name`` wherever ``base`` or a subclass defines it, now and in subclasses made later.

        For a method every subclass overrides (a model's ``generate``): the
        base's own is no help. Later subclasses are caught by a hook on
        ``base.__init_subclass__``; restore removes it and unwraps them too.
        """
        wrapped: list[tuple[type, Any]] = []

        def wrap_class(cls: type) -> None:
            original = vars(cls).get(name)
            if original is not None and not getattr(original, "__agent_otel_wrapped__", False):
                wrapper = make_wrapper(original)
                try:
                    wrapper.__agent_otel_wrapped__ = True
                except AttributeError:
                    pass
                setattr(cls, name, wrapper)
                wrapped.append((cls, original))

        pending = [base]
        while pending:
            cls = pending.pop()
            wrap_class(cls)
            pending.extend(cls.__subclasses__())
        own_hook = vars(base).get("__init_subclass__")

        def __init_subclass__(cls, **kwargs):
            if own_hook is not None:
                own_hook.__get__(None, cls)(**kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            wrap_class(cls)

        base.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[method-assign]

        def undo() -> None:
            if own_hook is not None:
                base.__init_subclass__ = own_hook  # type: ignore[method-assign]
            else:
                del base.__init_subclass__
            for cls, original in reversed(wrapped):
                setattr(cls, name, original)
            wrapped.clear()

        self._undo.append(undo)

    def apply(self, do: Callable[[], None], undo: Callable[[], None]) -> None:
        """Any other change (a shared hook): ``do`` it now, ``undo`` it on restore."""
        do()
        self._undo.append(undo)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __bool__(self) -> bool:
        return bool(self._undo)


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
