"""The OpenTelemetry entry point of each framework hook.

``opentelemetry-instrument python agent.py`` loads every class registered in
the ``opentelemetry_instrumentor`` entry-point group (pyproject.toml) and
calls ``instrument()`` on it, unless ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``
names it.
"""

from __future__ import annotations

from typing import Any, Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from agent_otel.capture.patching import importable


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

    framework: str = ""
    requirement: str = ""
    module: str = ""

    def instrumentation_dependencies(self) -> Collection[str]:
        return (self.requirement,)

    def _instrument(self, **kwargs: Any) -> None:
        if not importable(self.module):
            return
        import agent_otel
        from agent_otel.capture import frameworks

        handle = agent_otel.instrument()
        wanted = handle.settings.frameworks
        if wanted is None or self.framework in wanted:
            frameworks.instrument_frameworks((self.framework,))

    def _uninstrument(self, **kwargs: Any) -> None:
        from agent_otel.capture import frameworks

        frameworks.uninstrument_frameworks((self.framework,))
