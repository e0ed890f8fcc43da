"""CrewAI: tool runs as ``execute_tool`` spans.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["crewai"])

Hooked:

- ``crewai.tools.base_tool.BaseTool.run`` / ``arun`` and the same methods of
  ``Tool`` (what ``@tool`` makes, which overrides them): a tool run directly.
- ``crewai.tools.structured_tool.CrewStructuredTool.invoke`` / ``ainvoke``:
  how a crew's agents run tools (each tool is converted to a
  ``CrewStructuredTool`` around its ``_run``). ``ainvoke`` of a sync tool
  runs it on the event loop's default executor: the span starts at
  ``ainvoke`` and exec starts when a worker picks it up.
- ``crewai.agents.agent_executor.ThreadPoolExecutor``: an agent given
  several native tool calls in one step runs them on a pool of up to 8
  workers. The hook's pool marks each submitted call, so its span starts at
  submission and queue time is real.

Agent runs: ``Crew.kickoff`` (and ``kickoff_async``, which runs it on a
thread) is one ``invoke_agent {crew name}`` span (``runs``) unless the
application opened its own ``agent_span`` around it.

Name and description come from the tool. CrewAI does not pass the model's
tool call id down to the tool, so spans carry none.

CrewAI is not in the ``frameworks`` extra: it requires ``openai < 3`` while
``openai-agents`` requires ``openai >= 3``, so the two cannot share one
environment (see docs/frameworks.md).
"""

from __future__ import annotations

import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor
import inspect

from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks import runs
from agent_otel.capture.frameworks.calls import (
    MarkedWork,
    async_call,
    hook_event_loop,
    meta,
    positional,
    sync_call,
    unhook_event_loop,
)
from agent_otel.capture.patching import Patches

FRAMEWORK = "crewai"
_patches = Patches()


def instrument() -> None:
    from crewai.agents import agent_executor
    from crewai.tools.base_tool import BaseTool, Tool
    from crewai.tools.structured_tool import CrewStructuredTool

    for tool_class in (BaseTool, Tool):
        _patches.wrap(tool_class, "run", _wrap_run)
        _patches.wrap(tool_class, "arun", _wrap_arun)
    _patches.wrap(CrewStructuredTool, "invoke", _wrap_run)
    _patches.wrap(CrewStructuredTool, "ainvoke", _wrap_ainvoke)
    _patches.wrap(agent_executor, "ThreadPoolExecutor", _tool_call_pool)
    _patches.apply(hook_event_loop, unhook_event_loop)
    from crewai import Crew

    _patches.wrap(Crew, "kickoff", _wrap_kickoff)


def uninstrument() -> None:
    _patches.restore()


def _wrap_kickoff(original):
    @functools.wraps(original)
    def kickoff(self, *args, **kwargs):
        return runs.sync_run(lambda: getattr(self, "name", None) or "crew", self, original, (self, *args), kwargs)

    return kickoff


def _describe(tool):
    return lambda: (meta(tool.name, tool.description), None)


def _wrap_run(original):
    @functools.wraps(original)
    def run(self, *args, **kwargs):
        return sync_call(
            FRAMEWORK, original, (self, *args), kwargs, _describe(self), arguments=positional((self, *args), kwargs)
        )

    return run


def _wrap_arun(original):
    @functools.wraps(original)
    async def arun(self, *args, **kwargs):
        return await async_call(
            FRAMEWORK, original, (self, *args), kwargs, _describe(self), arguments=positional((self, *args), kwargs)
        )

    return arun


def _wrap_ainvoke(original):
    @functools.wraps(original)
    async def ainvoke(self, *args, **kwargs):
        if current_recorder() is not None and not inspect.iscoroutinefunction(self.func):
            return await async_call(
                FRAMEWORK,
                original,
                (self, *args),
                kwargs,
                _describe(self),
                thread_owner=self,
                arguments=positional((self, *args), kwargs),
            )
        return await async_call(
            FRAMEWORK, original, (self, *args), kwargs, _describe(self), arguments=positional((self, *args), kwargs)
        )

    return ainvoke


def _tool_name(executor, tool_call):
    """The name the tool's span will have: its own, which the model's call names sanitized."""
    from crewai.utilities.agent_utils import extract_tool_call_info

    info = extract_tool_call_info(tool_call)
    if info is None:
        return None
    function_name = info[1]
    tool = (getattr(executor, "_tool_name_mapping", None) or {}).get(function_name)
    return getattr(tool, "name", None) or function_name


def _tool_call_pool(pool_class: type[ThreadPoolExecutor]) -> type[ThreadPoolExecutor]:
    class ToolCallPool(pool_class):  # type: ignore[valid-type,misc]  # the framework's own pool class
        """The agent's pool for parallel native tool calls, submitting each as a marked work item."""

        def submit(self, fn, /, *args, **kwargs):
            # CrewAI submits (context.run, executor._execute_single_native_tool_call, tool_call).
            if (
                current_recorder() is not None
                and isinstance(getattr(fn, "__self__", None), contextvars.Context)
                and len(args) == 2
                and getattr(args[0], "__name__", "") == "_execute_single_native_tool_call"
            ):
                try:
                    name = _tool_name(args[0].__self__, args[1])
                except Exception:
                    name = None
                if name is not None:
                    return super().submit(functools.partial(fn, MarkedWork(args[0], name), args[1]), **kwargs)
            return super().submit(fn, *args, **kwargs)

    ToolCallPool.__name__ = ToolCallPool.__qualname__ = pool_class.__name__
    return ToolCallPool
