"""LangChain and LangGraph: every ``langchain_core`` tool run is an ``execute_tool`` span.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["langchain"])

Hooked, in ``langchain_core.tools``:

- ``BaseTool.run``: every sync run (``invoke``, ``@tool`` functions,
  ``StructuredTool``, LangGraph's ``ToolNode`` in a sync graph).
- ``BaseTool.arun``: async runs. When the tool has no async implementation,
  LangChain runs its sync ``_run`` on the event loop's default executor: the
  span starts at ``arun`` and exec starts when a worker picks it up.
- ``StructuredTool.ainvoke`` / ``Tool.ainvoke`` without a coroutine: these
  hand ``invoke`` to the executor; same timing.
- ``langgraph.prebuilt.tool_node.get_executor_for_config`` (when LangGraph
  is installed): a sync ``ToolNode`` runs the tool calls of one model turn on
  a thread pool of ``max_concurrency`` workers; each submission is marked so
  its span starts at submission.

Name, description and tool call id come from the tool and the ``ToolCall``.
A ``ToolException`` that the tool handles itself (``handle_tool_error``)
returns a ``ToolMessage`` with status "error": the span's outcome is then
``error`` with ``error.type`` ``tool_error``.
"""

from __future__ import annotations

import contextlib
import functools
from concurrent.futures import Executor
from typing import Any, Optional

from agent_otel.capture import recorder as _recorder
from agent_otel.capture.frameworks.calls import (MarkedWork, async_call, hook_event_loop, meta, sync_call,
                                          unhook_event_loop)
from agent_otel.capture.frameworks.instrumentor import FrameworkInstrumentor
from agent_otel.capture.patching import Patches, importable

FRAMEWORK = "langchain"
_patches = Patches()


def instrument() -> None:
    from langchain_core.tools import BaseTool, StructuredTool, Tool

    _patches.wrap(BaseTool, "run", _wrap_run)
    _patches.wrap(BaseTool, "arun", _wrap_arun)
    _patches.wrap(StructuredTool, "ainvoke", _wrap_ainvoke)
    _patches.wrap(Tool, "ainvoke", _wrap_ainvoke)
    if importable("langgraph.prebuilt"):
        from langgraph.prebuilt import tool_node

        _patches.wrap(tool_node, "get_executor_for_config", _wrap_get_executor_for_config)
    _patches.apply(hook_event_loop, unhook_event_loop)


def uninstrument() -> None:
    _patches.restore()


def _describe(tool, call_id: Optional[str]):
    return lambda: (meta(tool.name, tool.description), call_id)


def _failed(result: Any) -> Optional[str]:
    """The error text of a ToolMessage with status "error" (an error LangChain handled)."""
    if getattr(result, "status", None) == "error" and getattr(result, "type", None) == "tool":
        return str(getattr(result, "content", ""))[:200]
    return None


def _runs_in_thread(tool) -> bool:
    """Whether ``arun`` will hand this tool's sync ``_run`` to the default executor."""
    from langchain_core.tools import BaseTool, StructuredTool, Tool

    implementation = type(tool)._arun
    if implementation is BaseTool._arun:
        return True
    if implementation is StructuredTool._arun or implementation is Tool._arun:
        return getattr(tool, "coroutine", None) is None
    return False


def _wrap_run(original):
    @functools.wraps(original)
    def run(self, tool_input, *args, **kwargs):
        return sync_call(FRAMEWORK, original, (self, tool_input, *args), kwargs,
                         _describe(self, kwargs.get("tool_call_id")), _failed)

    return run


def _wrap_arun(original):
    @functools.wraps(original)
    async def arun(self, tool_input, *args, **kwargs):
        describe = _describe(self, kwargs.get("tool_call_id"))
        if _recorder.current is not None and _runs_in_thread(self):
            return await async_call(FRAMEWORK, original, (self, tool_input, *args), kwargs, describe,
                                    _failed, thread_owner=self)
        return await async_call(FRAMEWORK, original, (self, tool_input, *args), kwargs, describe, _failed)

    return arun


def _wrap_ainvoke(original):
    # Only the no-coroutine case is a tool run here: with a coroutine,
    # ainvoke goes on to BaseTool.arun, which is hooked itself.
    @functools.wraps(original)
    async def ainvoke(self, input, config=None, **kwargs):
        if _recorder.current is None or getattr(self, "coroutine", None) is not None:
            return await original(self, input, config, **kwargs)
        call_id = input.get("id") if isinstance(input, dict) and input.get("type") == "tool_call" else None
        return await async_call(FRAMEWORK, original, (self, input, config), kwargs,
                                _describe(self, call_id), _failed, thread_owner=self)

    return ainvoke


class _ToolCallSubmitter(Executor):
    """What a sync ToolNode submits through: each tool call as a marked work item."""

    def __init__(self, executor: Executor):
        self._executor = executor

    def submit(self, fn, /, *args, **kwargs):
        call = args[0] if args else None
        if _recorder.current is not None and isinstance(call, dict) and isinstance(call.get("name"), str):
            fn = MarkedWork(fn, call["name"])
        return self._executor.submit(fn, *args, **kwargs)


def _wrap_get_executor_for_config(original):
    @contextlib.contextmanager
    @functools.wraps(original)
    def get_executor_for_config(config):
        with original(config) as executor:
            yield _ToolCallSubmitter(executor)

    return get_executor_for_config


class LangChainInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_langchain``."""

    framework = FRAMEWORK
    requirement = "langchain-core >= 1.8, < 2"
    module = "langchain_core"
