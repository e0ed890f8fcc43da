"""The ``hooked`` fixture: agent_otel with one framework hooked, for one test."""

from __future__ import annotations

import pytest

import agent_otel


@pytest.fixture
def hooked(spans):
    """``hooked(name, **settings)``: agent_otel instrumented with one framework hooked, for one test."""

    def instrument(name: str, **settings):
        return agent_otel.instrument(
            service_name="test-agent", traces_exporters="none", gpu="off", frameworks=[name], **settings
        )

    yield instrument
    agent_otel.uninstrument()
