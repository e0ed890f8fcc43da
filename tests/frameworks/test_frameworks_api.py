"""Choosing frameworks and turning hooks off (loading them with ``opentelemetry-instrument``:
test_opentelemetry_instrument.py)."""

from __future__ import annotations

import re

import pytest
from frameworks.framework_support import require_framework

import agent_otel
from agent_otel.capture import frameworks
from agent_otel.wiring.instrumentation import current

EXTRA = ["langchain", "openai_agents", "llamaindex", "mcp", "smolagents"]
IMPORTS = {
    "langchain": "langchain_core",
    "openai_agents": "agents",
    "llamaindex": "llama_index.core",
    "mcp": "mcp",
    "smolagents": "smolagents",
}


@pytest.fixture
def every_framework_of_the_extra():
    for name in EXTRA:
        require_framework(name, IMPORTS[name])


def test_instrument_hooks_every_installed_framework(every_framework_of_the_extra, spans):
    agent_otel.instrument(traces_exporters="none", gpu="off")
    try:
        assert set(EXTRA) <= set(frameworks.hooked())
    finally:
        agent_otel.uninstrument()
    assert frameworks.hooked() == []


def test_an_explicit_list_narrows_the_hooks(every_framework_of_the_extra, spans):
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["mcp", "smolagents"])
    try:
        assert frameworks.hooked() == ["mcp", "smolagents"]
    finally:
        agent_otel.uninstrument()


def test_an_unknown_framework_name_is_said_and_the_known_ones_are_hooked(every_framework_of_the_extra, spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=["langchain", "langchian"])
    try:
        (error,) = handle.config_errors
        assert re.search("'langchian'.*frameworks.*langchain, openai_agents", str(error)), error
        assert frameworks.hooked() == ["langchain"]
    finally:
        agent_otel.uninstrument()
    assert current() is None
    with pytest.raises(agent_otel.ConfigError, match="'crew'"):  # the library function itself refuses
        frameworks.instrument_frameworks(("crew",))


def test_disabled_instrumentations_variable_turns_a_hook_off(every_framework_of_the_extra, spans, monkeypatch):
    monkeypatch.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "requests, agent_otel_mcp")
    agent_otel.instrument(traces_exporters="none", gpu="off")
    try:
        assert "mcp" not in frameworks.hooked()
        assert "langchain" in frameworks.hooked()
    finally:
        agent_otel.uninstrument()


def test_an_instrumentor_starts_agent_otel_once_and_removes_only_its_hook(
    every_framework_of_the_extra, spans, monkeypatch
):
    from agent_otel.wiring.instrumentors import LangChainInstrumentor, McpInstrumentor

    monkeypatch.setenv("AGENT_OTEL_GPU", "off")
    monkeypatch.setenv("AGENT_OTEL_FRAMEWORKS", "langchain,mcp")
    LangChainInstrumentor().instrument()
    McpInstrumentor().instrument()
    try:
        handle = current()
        assert handle is not None
        assert frameworks.hooked() == ["langchain", "mcp"]
        LangChainInstrumentor().instrument()  # already instrumented: nothing changes
        assert current() is handle

        LangChainInstrumentor().uninstrument()
        assert frameworks.hooked() == ["mcp"]
        assert current() is handle
    finally:
        McpInstrumentor().uninstrument()
        agent_otel.uninstrument()
    assert frameworks.hooked() == []
