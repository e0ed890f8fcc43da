"""LangChain tools and a LangGraph agent for test_langchain.py and test_interop.py.

Imported by the tests when they run, not when pytest collects them (see
``framework_fixture``): LangChain takes about a second to import.
"""

from __future__ import annotations

import asyncio
import time

from langchain_core.callbacks import Callbacks
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool

SLEEP_S = 0.15


@tool
def fetch_page(url: str) -> str:
    """Download a page (slowly)."""
    time.sleep(SLEEP_S)
    return f"<html>{url}</html>"


@tool
async def ask_database(query: str) -> str:
    """Query the database."""
    await asyncio.sleep(SLEEP_S)
    return f"rows for {query}"


class Resize(BaseTool):
    """A classic tool subclass with only a sync ``_run``."""

    name: str = "resize"
    description: str = "Resize an image."

    def _run(self, size: int) -> str:
        time.sleep(SLEEP_S)
        return f"resized to {size}"


def handler_probe(seen: list) -> BaseTool:
    """A tool ``probe`` that notes ``("tool", the names of its run's callback handlers)`` in ``seen``.

    Made here, not in the test: LangChain resolves the ``Callbacks`` annotation
    in the globals of the module the function is defined in.
    """

    def probe(x: int, callbacks: Callbacks = None) -> int:
        """Return x."""
        seen.append(("tool", [type(handler).__name__ for handler in callbacks.handlers]))
        return x

    return tool(probe)


def tool_call(name: str, args: dict, call_id: str) -> dict:
    return {"type": "tool_call", "name": name, "args": args, "id": call_id}


def react_graph(tools, turns, asynchronous=False):
    """A LangGraph agent as its docs build one: a model node, a ToolNode, tools_condition."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    model = FakeMessagesListChatModel(responses=turns)

    def call_model(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: MessagesState):
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", acall_model if asynchronous else call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def three_page_turns():
    calls = [tool_call("fetch_page", {"url": f"{i}.example"}, f"t{i}") for i in range(3)]
    return [AIMessage("", tool_calls=calls), AIMessage("all fetched")]


def react_agent(tools, turns, model_sleep_s=None, **kwargs):
    """LangGraph's prebuilt agent, ``create_react_agent``, at its default version
    (v2: each tool call of a model turn is a ``Send`` of its own to the ToolNode);
    each model call takes ``model_sleep_s``."""
    import warnings

    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langgraph.prebuilt import create_react_agent

    class ScriptedModel(FakeMessagesListChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
        return create_react_agent(ScriptedModel(responses=turns, sleep=model_sleep_s), tools, **kwargs)
