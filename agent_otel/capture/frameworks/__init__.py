"""Framework hooks: each framework's tool calls become ``execute_tool`` spans.

Usage::

    import agent_otel
    agent_otel.instrument()                              # every installed framework
    agent_otel.instrument(frameworks=["langchain"])      # only these

``instrument()`` calls ``instrument_frameworks``; each name maps to one
module here with the same shape: ``instrument()`` and ``uninstrument()``
side by side, hooking the point where that framework runs a tool. A
framework that is not installed is skipped; one whose version the hook does
not understand is skipped with one warning. A framework that is installed
but not imported yet is hooked when the application imports it, so
``instrument()`` never imports a framework the agent does not use. With no explicit list, a
framework whose entry point is named in ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``
(``agent_otel_langchain``, ...) is skipped too, so the variable turns a hook
off however it was loaded.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from types import ModuleType
from typing import NamedTuple, Optional

from agent_otel.support import forks
from agent_otel.errors import ConfigError
from agent_otel.capture.on_import import when_imported
from agent_otel.capture.patching import VersionNotUnderstood, importable, logger, warn_once


class Framework(NamedTuple):
    """One framework agent-otel hooks: everything else about it is derived from this.

    Its ``opentelemetry-instrument`` entry point is ``ENTRY_POINT_PREFIX`` +
    its name, the class ``agent_otel.wiring.instrumentors.<instrumentor>``;
    pyproject.toml lists both, and the pip extra ``extra`` installs
    ``requirement`` (with ``pip_extras``) and ``companions`` for the hook's
    tests (tests/test_registries.py fails when they drift).
    """

    hook: str  # the hook module: instrument() and uninstrument()
    module: str  # the framework's import name
    requirement: str  # the distribution and the versions the hook understands
    instrumentor: str  # its class name in agent_otel.wiring.instrumentors
    extra: str = "frameworks"  # the pyproject extra that installs it
    pip_extras: tuple[str, ...] = ()  # the distribution's own extras the tests install
    companions: tuple[str, ...] = ()  # other distributions the hook's tests need beside it


_HOOKS = "agent_otel.capture.frameworks."

# Every framework agent-otel hooks, by name (the `frameworks` setting's values).
FRAMEWORKS: dict[str, Framework] = {
    "langchain": Framework(
        _HOOKS + "langchain",
        "langchain_core",
        "langchain-core >= 1.8, < 2",
        "LangChainInstrumentor",
        # LangGraph's agents, and LangChain's OpenAI chat model for the
        # time-to-first-token tests against a local OpenAI-compatible server
        # (tests/frameworks/fake_openai.py)
        companions=("langgraph >= 1.2, < 2", "langchain-openai >= 1.7, < 2"),
    ),
    "openai_agents": Framework(
        _HOOKS + "openai_agents", "agents", "openai-agents >= 0.24, < 0.25", "OpenAIAgentsInstrumentor"
    ),
    "llamaindex": Framework(
        _HOOKS + "llamaindex", "llama_index.core", "llama-index-core >= 0.14.25, < 0.15", "LlamaIndexInstrumentor"
    ),
    "mcp": Framework(_HOOKS + "mcp", "mcp", "mcp >= 2.3, < 3", "McpInstrumentor"),
    "smolagents": Framework(_HOOKS + "smolagents", "smolagents", "smolagents >= 1.26, < 2", "SmolagentsInstrumentor"),
    # CrewAI needs openai<3, openai-agents needs openai>=3: its tests run in a venv of their own.
    "crewai": Framework(_HOOKS + "crewai", "crewai", "crewai >= 1.15, < 2", "CrewAIInstrumentor", extra="crewai"),
    "pydantic_ai": Framework(
        _HOOKS + "pydantic_ai",
        "pydantic_ai",
        "pydantic-ai-slim >= 2.68, < 3",
        "PydanticAIInstrumentor",
        pip_extras=("openai",),
    ),
}
ENTRY_POINT_PREFIX = "agent_otel_"

_lock = threading.RLock()
_hooked: dict[str, ModuleType] = {}  # name -> its hook module, while hooked
_pending: set[str] = set()  # names to hook when their framework is imported
_hooking: set[str] = set()  # names whose hook is being installed right now
_generation = 0  # a pending hook registered before the last uninstrument does nothing


def _reinit_after_fork() -> None:
    global _lock
    _lock = threading.RLock()


forks.after_fork_in_child(_reinit_after_fork)


def _disabled_by_environment() -> set[str]:
    names = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return {name.strip() for name in names.split(",") if name.strip()}


def check_names(names: Optional[tuple[str, ...]]) -> None:
    """Raise ``ConfigError`` naming the first value that is not a known framework."""
    for name in names or ():
        if name not in FRAMEWORKS:
            raise ConfigError("frameworks", name, "one of " + ", ".join(FRAMEWORKS))


def instrument_frameworks(names: Optional[tuple[str, ...]] = None) -> list[str]:
    """Hook the named frameworks (None: every installed one); returns the names hooked now.

    One installed but not imported yet is hooked when the application
    imports it (``pending()`` lists those).

    Raises ``ConfigError`` for a name that is not a known framework. Hooking
    a framework that is already hooked does nothing.
    """
    check_names(names)
    if names is not None:
        wanted = list(dict.fromkeys(names))
    else:
        disabled = _disabled_by_environment()
        wanted = [name for name in FRAMEWORKS if ENTRY_POINT_PREFIX + name not in disabled and "*" not in disabled]
    # Imports (the framework's, the hook's, even find_spec's) happen outside
    # _lock: a thread importing a framework holds Python's import lock for it
    # while its post-import hook waits for _lock, so holding _lock while
    # importing could deadlock against it.
    installed = {name: FRAMEWORKS[name].module in sys.modules or importable(FRAMEWORKS[name].module) for name in wanted}
    now, later = [], []
    with _lock:
        generation = _generation
        for name in wanted:
            if name in _hooked or name in _pending or name in _hooking:
                continue
            if FRAMEWORKS[name].module in sys.modules:
                _hooking.add(name)
                now.append(name)
            elif installed[name]:
                _pending.add(name)
                later.append(name)
            elif names is not None:
                logger.warning("agent-otel: framework %r is not installed; not hooked", name)
    for name in now:
        _hook(name, generation)
    for name in later:
        _hook_on_import(name, generation)
    return hooked()


def _hook(name: str, generation: int) -> None:
    """Install one framework's hook (claimed in ``_hooking`` by the caller)."""
    module: Optional[ModuleType] = None
    try:
        module = importlib.import_module(FRAMEWORKS[name].hook)
        module.instrument()
    except Exception as exc:  # an unknown version or a broken install must not stop the agent
        if module is not None:
            module.uninstrument()  # undo what was hooked before the failure
        if isinstance(exc, VersionNotUnderstood):
            warn_once(
                f"{name}:version",
                "agent-otel: the installed %s is a version this hook "
                "does not understand (%s); its tool calls are not traced",
                name,
                exc,
            )
        else:
            warn_once(
                f"{name}:import",
                "agent-otel: cannot hook %s (%s: %s); its tool calls are not traced",
                name,
                type(exc).__name__,
                exc,
            )
        module = None
    with _lock:
        _hooking.discard(name)
        stale = module is not None and generation != _generation
        if module is not None and not stale:
            _hooked[name] = module
    if stale and module is not None:  # uninstrumented while it was being hooked
        module.uninstrument()


def _hook_on_import(name: str, generation: int) -> None:
    def on_import(_module) -> None:
        with _lock:
            if generation != _generation or name not in _pending:
                return
            _pending.discard(name)
            _hooking.add(name)
        _hook(name, generation)

    when_imported(FRAMEWORKS[name].module, on_import)


def uninstrument_frameworks(names: Optional[tuple[str, ...]] = None) -> None:
    """Restore the named hooked frameworks (None: all) exactly as they were."""
    global _generation
    with _lock:
        if names is None:
            _generation += 1
            _pending.clear()
        else:
            _pending.difference_update(names)
        for name in reversed(list(_hooked)):
            if names is None or name in names:
                _hooked.pop(name).uninstrument()


def hooked() -> list[str]:
    """The frameworks hooked now."""
    with _lock:
        return [name for name in FRAMEWORKS if name in _hooked]


def pending() -> list[str]:
    """The frameworks installed but not imported yet: hooked when they are."""
    return sorted(_pending)


class FrameworkHooks:
    """The ``Instrumentation.background`` part that removes the hooks at shutdown."""

    part_name = "the framework hooks"

    def shutdown(self, timeout_s: float) -> bool:
        uninstrument_frameworks()
        return True
