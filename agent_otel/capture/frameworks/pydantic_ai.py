"""Pydantic AI (``pydantic-ai-slim``): function tool calls as spans, agent runs as turns.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["pydantic_ai"])

Hooked:

- ``pydantic_ai.toolsets.function.FunctionToolset.call_tool``: where an
  agent runs each function tool (``@agent.tool``, ``@agent.tool_plain``,
  ``Tool``, a ``FunctionToolset``). Name and description come from the tool's
  definition, the call id from ``RunContext.tool_call_id``. Pydantic AI runs
  a sync tool function on anyio's worker threads (``anyio.to_thread.run_sync``
  as ``pydantic_ai._utils`` imports it), or on the executor a
  ``using_thread_executor`` block names: the span starts when the agent
  calls the tool, exec starts when a worker picks it up (``agent.tool.executor``
  ``anyio``, or that pool's name). An async tool runs on the loop (queue 0).
- ``pydantic_ai._utils.run_sync``: lets the span see that hand-off.
- ``pydantic_ai.agent.AbstractAgent.run`` (also what ``run_sync`` runs): one
  run is an ``invoke_agent {agent name}`` span (``runs``) unless the
  application opened its own ``agent_span`` around it.

Model calls are not hooked: Pydantic AI records them itself, as GenAI
``chat {model}`` spans, once instrumented (``Agent.instrument_all()`` or
``instrument=True``), and the report reads them. Its instrumentation also
makes an ``execute_tool {name}`` span of each tool call and an
``invoke_agent`` span of each run: ours are inside them, in the same trace,
and the report counts each call once (docs/report.md, "one call, one
record"), keeping ours, which has the queue and exec split.
"""

from __future__ import annotations

import functools

from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks import runs
from agent_otel.capture.frameworks.calls import (
    anyio_run_sync_hook,
    async_call,
    hook_event_loop,
    meta,
    unhook_event_loop,
)
from agent_otel.capture.patching import Patches

FRAMEWORK = "pydantic_ai"
_patches = Patches()


def instrument() -> None:
    from pydantic_ai import _utils
    from pydantic_ai.agent.abstract import AbstractAgent
    from pydantic_ai.toolsets.function import FunctionToolset

    _patches.wrap(FunctionToolset, "call_tool", _wrap_call_tool)
    _patches.wrap(_utils, "run_sync", anyio_run_sync_hook)
    _patches.apply(hook_event_loop, unhook_event_loop)
    _patches.wrap(AbstractAgent, "run", _wrap_agent_run)


def uninstrument() -> None:
    _patches.restore()


def _wrap_call_tool(original):
    @functools.wraps(original)
    async def call_tool(self, name, tool_args, ctx, tool, *args, **kwargs):
        if current_recorder() is None:
            return await original(self, name, tool_args, ctx, tool, *args, **kwargs)

        def describe():
            definition = tool.tool_def
            return meta(definition.name, definition.description), getattr(ctx, "tool_call_id", None)

        call_args = (self, name, tool_args, ctx, tool, *args)
        if getattr(tool, "is_async", True):
            return await async_call(FRAMEWORK, original, call_args, kwargs, describe, arguments=lambda: tool_args)
        # A sync function runs on a worker thread: the first submission made during the call.
        return await async_call(
            FRAMEWORK,
            original,
            call_args,
            kwargs,
            describe,
            thread_owner=None,
            thread_optional=True,
            arguments=lambda: tool_args,
        )

    return call_tool


def _wrap_agent_run(original):
    @functools.wraps(original)
    async def run(self, *args, **kwargs):
        return await runs.async_run(lambda: getattr(self, "name", None), self, original, (self, *args), kwargs)

    return run
