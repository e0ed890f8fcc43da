"""A smolagents tool and a scripted model for test_smolagents.py.

Imported by the tests when they run, not when pytest collects them (see
``framework_fixture``): smolagents takes seconds to import.
"""

from __future__ import annotations

import time

from smolagents import tool
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
    Model,
)

SLEEP_S = 0.15


@tool
def fetch_page(url: str) -> str:
    """Download a page (slowly).

    Args:
        url: the page's address
    """
    time.sleep(SLEEP_S)
    return f"<html>{url}</html>"


class ScriptedModel(Model):
    """Plays back the model's tool calls; the agent's loop runs for real."""

    def __init__(self, steps):
        super().__init__(model_id="scripted")
        self.steps = list(steps)

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=self.steps.pop(0))


def call(name: str, arguments: dict, call_id: str) -> ChatMessageToolCall:
    return ChatMessageToolCall(
        id=call_id, type="function", function=ChatMessageToolCallFunction(name=name, arguments=arguments)
    )
