"""The one way agent-otel patches a library: an undo stack of exact replacements.

Usage::

    _patches = Patches()
    _patches.wrap(BaseTool, "run", _wrap_run)      # BaseTool.run = _wrap_run(what is there now)
    ...
    _patches.restore()                               # undo, last first

Every hook (the executor hook, the event-loop hook, each framework hook)
goes through ``Patches``:

- ``wrap`` reads the attribute at install time, so a wrapper another
  instrumentor installed before agent-otel stays in the chain: ours calls it.
- ``restore`` puts back exactly what ``wrap`` replaced, if the attribute is
  still our wrapper. If someone wrapped on top of ours since (another
  instrumentor, installed after agent-otel), removing ours would remove
  theirs too: ours stays in the chain, marked inactive, and their wrapper
  keeps working. Every wrapper agent-otel installs calls straight through
  when inactive (``Patch.active``), and does nothing of its own when
  agent-otel is not instrumented.
- A later ``wrap`` of the same attribute with the same wrapper factory finds
  our inactive wrapper still in the chain (the attribute itself, or behind
  the ``__wrapped__`` of the wrappers on top) and makes it active again,
  instead of wrapping twice.

``warn_once`` keeps a hook that meets a framework version it does not
understand to one log line.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import threading
import types
from typing import Any, Callable, Optional

logger = logging.getLogger("agent_otel.capture.frameworks")

_warned: set[str] = set()


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` is seen; later calls are silent."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


class VersionNotUnderstood(Exception):
    """The installed library lacks something the hook relies on."""


WrapperFactory = Callable[[Any], Any]

# What a patch replaced when ``owner`` did not define the attribute itself
# (``install(..., inherited=True)``): removing the patch deletes it again.
_ABSENT: Any = object()


class Patch:
    """One replaced attribute: ``owner.name`` was ``replaced``, is now ``installed``.

    ``installed`` is what ``make_wrapper(replaced)`` made, behind a switch
    that calls ``replaced`` directly while the patch is inactive (for a
    function); a class or other object is installed as made, and passes
    through by itself when agent-otel is not instrumented.
    """

    __slots__ = ("owner", "name", "replaced", "wrapper", "installed", "factory", "_active")

    def __init__(self, owner: Any, name: str, replaced: Any, factory: WrapperFactory):
        self.owner = owner
        self.name = name
        self.replaced = replaced
        self.factory = factory
        # An inherited attribute is wrapped where it was found; removing puts nothing back but deletes ours.
        callable_replaced = _as_method(owner, getattr(owner, name) if replaced is _ABSENT else replaced)
        self.wrapper = factory(callable_replaced)
        self.installed = _switch(self, self.wrapper, callable_replaced)
        self._active = True
        if self.installed is self.wrapper and getattr(self.wrapper, SELF_SWITCHING, False):
            setattr(self.wrapper, INACTIVE, False)

    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        self._active = value
        if self.installed is self.wrapper and getattr(self.wrapper, SELF_SWITCHING, False):
            setattr(self.wrapper, INACTIVE, not value)

    def in_chain(self, current: Any) -> bool:
        """Whether ``current`` is our installed object, or wraps it (through ``__wrapped__``)."""
        seen = 0
        while current is not None and seen < 32:
            if current is self.installed:
                return True
            current = getattr(current, "__wrapped__", None)
            seen += 1
        return False


def _as_method(owner: Any, replaced: Any) -> Any:
    """``replaced`` as a plain function a wrapper can call with ``self`` first.

    A method another instrumentor wrapped with ``wrapt`` (every OpenTelemetry
    contrib instrumentor does) is a descriptor, not a function: called
    unbound it would take ``self`` for its first argument. It is bound to
    the instance on each call instead.
    """
    # type(), not isinstance(): a wrapt proxy passes isinstance checks for what it wraps.
    if (
        not inspect.isclass(owner)
        or type(replaced) is types.FunctionType
        or not hasattr(replaced, "__get__")
        or type(replaced) in (staticmethod, classmethod)
        or isinstance(replaced, type)
    ):
        return replaced

    def call_as_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return replaced.__get__(self, type(self))(*args, **kwargs)

    try:
        functools.update_wrapper(call_as_method, replaced)
    except AttributeError:
        call_as_method.__wrapped__ = replaced  # type: ignore[attr-defined]
    return call_as_method


# A wrapper function marked ``self_switching`` is installed without the
# switch in front: it calls straight through by itself while its function
# attribute INACTIVE is true (Patch.active keeps that attribute up to date).
# One Python call fewer per call of a hot entry point (a framework's tool run).
SELF_SWITCHING = "agent_otel_self_switching"
INACTIVE = "agent_otel_inactive"


def self_switching(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``wrapper`` (a function a wrapper factory returns) as one that begins with
    ``if wrapper.agent_otel_inactive: return original(...)``: it is installed as it is."""
    setattr(wrapper, SELF_SWITCHING, True)
    setattr(wrapper, INACTIVE, False)
    return wrapper


def _switch(patch: Patch, wrapper: Any, replaced: Any) -> Any:
    """``wrapper`` while ``patch`` is active, ``replaced`` once it is not: a function of the same kind
    (``wrapper`` itself where it switches by itself: ``self_switching``)."""
    if type(wrapper) is not types.FunctionType or getattr(wrapper, SELF_SWITCHING, False):
        return wrapper
    if inspect.iscoroutinefunction(wrapper):

        async def switch_async(*args: Any, **kwargs: Any) -> Any:
            return await (wrapper if patch.active else replaced)(*args, **kwargs)

        switch: Callable[..., Any] = switch_async
    else:

        def switch_sync(*args: Any, **kwargs: Any) -> Any:
            return (wrapper if patch.active else replaced)(*args, **kwargs)

        switch = switch_sync
    functools.update_wrapper(switch, wrapper)  # name, docstring, and __wrapped__ = wrapper -> replaced
    return switch


# Our patches still in place: active ones, and inactive ones left in a chain
# because someone wrapped on top of them.
_in_place: list[Patch] = []
_lock = threading.Lock()


def _attribute(owner: Any, name: str, inherited: bool = False) -> Any:
    try:
        return vars(owner)[name]
    except KeyError:
        if inherited and hasattr(owner, name):
            return _ABSENT
        raise VersionNotUnderstood(f"{getattr(owner, '__name__', owner)}.{name} not found") from None


def install(owner: Any, name: str, make_wrapper: WrapperFactory, *, inherited: bool = False) -> Patch:
    """Replace ``owner.name`` by ``make_wrapper(what is there now)``, or make our inactive
    wrapper still in its chain active again. ``owner`` must define the attribute itself,
    unless ``inherited``: then one it inherits is wrapped, and ``remove`` deletes ours.
    Raises ``VersionNotUnderstood`` when there is no such attribute."""
    with _lock:
        current = _attribute(owner, name, inherited)
        for patch in _in_place:
            if patch.owner is owner and patch.name == name and patch.factory is make_wrapper:
                if patch.active:
                    raise RuntimeError(f"{getattr(owner, '__name__', owner)}.{name} is already patched")
                if patch.in_chain(current):
                    patch.active = True
                    return patch
        patch = Patch(owner, name, current, make_wrapper)
        setattr(owner, name, patch.installed)
        _in_place.append(patch)
        return patch


def remove(patch: Patch) -> bool:
    """Undo ``patch``: put back what it replaced, when the attribute is still ours.
    Otherwise (wrapped on top of ours, or replaced) leave it, inactive. True if put back."""
    with _lock:
        patch.active = False
        current = vars(patch.owner).get(patch.name)
        if current is patch.installed:
            if patch.replaced is _ABSENT:
                delattr(patch.owner, patch.name)
            else:
                setattr(patch.owner, patch.name, patch.replaced)
            _in_place.remove(patch)
            return True
        if not patch.in_chain(current):
            _in_place.remove(patch)  # replaced outright: no longer anywhere to reuse
        return False


def in_place() -> list[Patch]:
    """Our patches still in place (active, or inactive under someone else's wrapper)."""
    with _lock:
        return list(_in_place)


class Patches:
    """The patches of one hook, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], object]] = []

    def wrap(self, owner: Any, name: str, make_wrapper: WrapperFactory, *, inherited: bool = False) -> Patch:
        """``install`` a patch that ``restore`` removes."""
        patch = install(owner, name, make_wrapper, inherited=inherited)
        self._undo.append(lambda: remove(patch))
        return patch

    def wrap_overrides(self, base: type, name: str, make_wrapper: WrapperFactory) -> None:
        """Wrap ``name`` wherever ``base`` or a subclass defines it, now and in subclasses made later.

        For a method every subclass overrides (a model's ``generate``): the
        base's own is no help. Later subclasses are caught by a hook on
        ``base.__init_subclass__``; restore removes it and unwraps them too.
        Each class's method is one ``install``ed patch.
        """
        patches: list[Patch] = []

        def wrap_class(cls: type) -> None:
            if name in vars(cls) and not any(patch.owner is cls for patch in patches):
                patches.append(install(cls, name, make_wrapper))

        pending = [base]
        while pending:
            cls = pending.pop()
            wrap_class(cls)
            pending.extend(cls.__subclasses__())

        own_hook = vars(base).get("__init_subclass__", _ABSENT)

        def hook_subclasses(_found: Any) -> Any:
            def __init_subclass__(cls: type, **kwargs: Any) -> None:
                if own_hook is not _ABSENT:
                    own_hook.__get__(None, cls)(**kwargs)
                else:
                    super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]  # cls is a class
                wrap_class(cls)

            return classmethod(__init_subclass__)

        hook = install(base, "__init_subclass__", hook_subclasses, inherited=True)

        def undo() -> None:
            remove(hook)
            while patches:
                remove(patches.pop())

        self._undo.append(undo)

    def apply(self, do: Callable[[], object], undo: Callable[[], object]) -> None:
        """A change made through another ``Patches`` (a shared hook): ``do`` it now, ``undo`` it on restore."""
        do()
        self._undo.append(undo)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __bool__(self) -> bool:
        return bool(self._undo)


class SharedPatch:
    """A patch several hooks need (the event-loop hook): installed by the first
    ``acquire``, removed by the last ``release``."""

    def __init__(self, owner: Any, name: str, make_wrapper: WrapperFactory):
        self._owner = owner
        self._name = name
        self._make_wrapper = make_wrapper
        self._users = 0
        self._patch: Optional[Patch] = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        patch = self._patch
        return patch is not None and patch.active

    def acquire(self) -> None:
        with self._lock:
            if self._users == 0:
                self._patch = install(self._owner, self._name, self._make_wrapper)
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._patch is not None:
                remove(self._patch)
                self._patch = None


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
