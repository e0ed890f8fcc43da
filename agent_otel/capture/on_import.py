"""Run a function when a module is imported.

The framework hooks and the event-loop monitor wait this way for a module
the application has not imported yet (a framework, ``asyncio``,
``uvloop``), so ``instrument()`` imports none of them itself.
``wrapt.register_post_import_hook`` does the same, but importing wrapt
loads asyncio and ``importlib.metadata``: tens of milliseconds of
``instrument()``.

How: a finder first in ``sys.meta_path`` answers only for the names
waited on; it asks the other finders for the module's spec, and wraps the
loader so that the functions run once the module has executed. The module
keeps its own loader (``__loader__``, ``__spec__.loader``). A function that
raises is logged in one line, never raised into the application's import.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Optional

from agent_otel.support import forks

logger = logging.getLogger("agent_otel")

Hook = Callable[[ModuleType], None]

_lock = threading.Lock()
_hooks: dict[str, list[Hook]] = {}  # module name -> functions still waiting for it


def _reinit_after_fork() -> None:
    """In a forked child: a fresh lock (another thread of the parent may have held it)."""
    global _lock
    _lock = threading.Lock()


forks.after_fork_in_child(_reinit_after_fork)


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``name`` is imported: now, if it already is."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    _call(hook, module)


def waiting(name: str) -> bool:
    """Whether a function waits for ``name`` to be imported."""
    with _lock:
        return bool(_hooks.get(name))


def _call(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # the application's import must go on
        logger.warning(
            "agent-otel: a hook run when %s was imported failed (%s: %s)", module.__name__, type(exc).__name__, exc
        )


def _imported(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        _call(hook, module)


class _Finder:
    """A meta path finder for the names waited on; None (ask the next) for the others."""

    def __init__(self) -> None:
        self._busy = threading.local()  # names this thread is finding through the others

    def find_spec(self, fullname: str, path: Any = None, target: Optional[ModuleType] = None) -> Any:
        if fullname not in _hooks:
            return None
        busy = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # no loader to wrap (a namespace package before Python 3.11)
        spec.loader = _Loader(spec.loader, fullname)
        return spec


class _Loader:
    """Executes the module with its own loader, then runs the functions waiting for it."""

    def __init__(self, loader: Any, name: str):
        self._loader = loader
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._loader, attribute)

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its own loader, as if this one had not been there.
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _imported(self._name, sys.modules.get(self._name, module))


_FINDER = _Finder()
