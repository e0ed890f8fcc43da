"""The OpenTelemetry entry points of agent-otel's framework hooks.

``opentelemetry-instrument python agent.py`` loads every class registered in
the ``opentelemetry_instrumentor`` entry-point group (pyproject.toml) and
calls ``instrument()`` on it, unless ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``
names it. They sit above ``instrument()`` (they call it), beside it in the
wiring, so the hooks in ``agent_otel.capture.frameworks`` import nothing
above them.
"""

from __future__ import annotations

from typing import Any, Collection

# mypy 2.4 does not see the class in the installed module (a py.typed package): it is Any to mypy.
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from agent_otel.capture import frameworks
from agent_otel.capture.patching import importable
from agent_otel.wiring.instrumentation import instrument


class FrameworkInstrumentor(BaseInstrumentor):
    """Entry point for ``opentelemetry-instrument``: start agent-otel, hook one framework.

    Loaded with no ``agent_otel.instrument()`` call in the application, it
    calls ``instrument()`` itself (settings from the environment), so spans
    and metrics exist. ``instrument()`` is idempotent, and so is hooking a
    framework twice: loading every agent-otel entry point, in any order,
    with or without the application's own ``instrument()`` call, yields one
    set of hooks. ``uninstrument()`` removes this framework's hook only; the
    application's ``agent_otel.uninstrument()`` removes everything.
    """

    # Set per framework from its agent_otel.capture.frameworks.FRAMEWORKS entry:
    framework: str = ""  # its name there
    requirement: str = ""  # the versions the hook understands
    module: str = ""  # the framework's import name

    def instrumentation_dependencies(self) -> Collection[str]:
        return (self.requirement,)

    def _instrument(self, **kwargs: Any) -> None:
        if not importable(self.module):
            return
        handle = instrument()
        wanted = handle.settings.frameworks
        if wanted is None or self.framework in wanted:
            frameworks.instrument_frameworks((self.framework,))

    def _uninstrument(self, **kwargs: Any) -> None:
        frameworks.uninstrument_frameworks((self.framework,))


def _instrumentor(name: str, framework: frameworks.Framework) -> type[FrameworkInstrumentor]:
    return type(
        framework.instrumentor,
        (FrameworkInstrumentor,),
        {
            "__doc__": f"``opentelemetry-instrument`` entry point ``{frameworks.ENTRY_POINT_PREFIX}{name}``.",
            "__module__": __name__,
            "__qualname__": framework.instrumentor,
            "framework": name,
            "requirement": framework.requirement,
            "module": framework.module,
        },
    )


# One class per framework of the registry (LangChainInstrumentor, ...), the
# entry points pyproject.toml names.
INSTRUMENTORS = {name: _instrumentor(name, framework) for name, framework in frameworks.FRAMEWORKS.items()}
globals().update({cls.__name__: cls for cls in INSTRUMENTORS.values()})
