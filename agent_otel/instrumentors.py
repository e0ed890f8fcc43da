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
from agent_otel.instrumentation import instrument


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

    framework: str = ""  # the name in agent_otel.capture.frameworks.FRAMEWORKS
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


class LangChainInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_langchain``."""

    framework = "langchain"
    requirement = "langchain-core >= 1.8, < 2"
    module = "langchain_core"


class OpenAIAgentsInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_openai_agents``."""

    framework = "openai_agents"
    requirement = "openai-agents >= 0.24, < 0.25"
    module = "agents"


class LlamaIndexInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_llamaindex``."""

    framework = "llamaindex"
    requirement = "llama-index-core >= 0.14.25, < 0.15"
    module = "llama_index.core"


class McpInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_mcp``."""

    framework = "mcp"
    requirement = "mcp >= 2.3, < 3"
    module = "mcp"


class SmolagentsInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_smolagents``."""

    framework = "smolagents"
    requirement = "smolagents >= 1.26, < 2"
    module = "smolagents"


class PydanticAIInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_pydantic_ai``."""

    framework = "pydantic_ai"
    requirement = "pydantic-ai-slim >= 2.68, < 3"
    module = "pydantic_ai"


class CrewAIInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_crewai``."""

    framework = "crewai"
    requirement = "crewai >= 1.15, < 2"
    module = "crewai"
