"""The OpenAI Agents SDK's function tools and a scripted ``Model`` for test_openai_agents.py.

Imported by the tests when they run, not when pytest collects them (see
``framework_fixture``): the SDK takes seconds to import.
"""

from __future__ import annotations

import asyncio
import json
import time

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from frameworks.framework_support import run_with_one_worker
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

SLEEP_S = 0.15
set_tracing_disabled(True)  # the SDK's own tracing would try to reach its backend


@function_tool
def fetch_page(url: str) -> str:
    """Download a page (slowly)."""
    time.sleep(SLEEP_S)
    return f"<html>{url}</html>"


@function_tool
async def ask_database(query: str) -> str:
    """Query the database."""
    await asyncio.sleep(SLEEP_S)
    return f"rows for {query}"


@function_tool
def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    raise PermissionError("card declined")


class ScriptedModel(Model):
    """Plays back model turns; the SDK's tool loop runs for real."""

    def __init__(self, turns, delay_s=0.0):
        self.turns = list(turns)
        self.delay_s = delay_s  # what each call takes

    async def get_response(self, *args, **kwargs):
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


def call(name: str, arguments: dict, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        name=name,
        arguments=json.dumps(arguments),
        call_id=call_id,
        id=f"fc_{call_id}",
        status="completed",
    )


def answer(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def run_agent(turns):
    agent = Agent(name="support", tools=[fetch_page, ask_database, charge_card], model=ScriptedModel(turns))
    return run_with_one_worker(lambda: Runner.run(agent, "help me"))
