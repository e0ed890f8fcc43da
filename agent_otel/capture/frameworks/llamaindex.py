"""LlamaIndex (``llama-index-core``): ``FunctionTool`` calls as spans.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["llamaindex"])

Hooked, in ``llama_index.core.tools.function_tool``:

- ``FunctionTool.call`` (and so ``__call__``): a sync call.
- ``FunctionTool.acall``: how LlamaIndex's workflow agents run every tool.
  A tool made from a sync function runs on the event loop's default
  executor (``sync_to_async``): the span starts at ``acall`` and exec starts
  when a worker picks the function up.

Name and description come from the tool's ``ToolMetadata``. LlamaIndex does
not pass the model's tool call id down to the tool, so spans carry none.
"""

from __future__ import annotations

import functools

from agent_otel.capture import recorder as _recorder
from agent_otel.capture.frameworks.calls import async_call, hook_event_loop, meta, sync_call, unhook_event_loop
from agent_otel.capture.frameworks.instrumentor import FrameworkInstrumentor
from agent_otel.capture.patching import Patches

FRAMEWORK = "llamaindex"
_patches = Patches()


def instrument() -> None:
    from llama_index.core.tools.function_tool import FunctionTool

    _patches.wrap(FunctionTool, "call", _wrap_call)
    _patches.wrap(FunctionTool, "acall", _wrap_acall)
    _patches.apply(hook_event_loop, unhook_event_loop)


def uninstrument() -> None:
    _patches.restore()


def _describe(tool):
    return lambda: (meta(tool.metadata.get_name(), tool.metadata.description), None)


def _runs_in_thread(tool) -> bool:
    """Whether the tool's async form is LlamaIndex's thread hand-off of its sync function."""
    async_fn = getattr(tool, "_async_fn", None)
    return getattr(async_fn, "__qualname__", "").startswith("sync_to_async.")


def _wrap_call(original):
    @functools.wraps(original)
    def call(self, *args, **kwargs):
        return sync_call(FRAMEWORK, original, (self, *args), kwargs, _describe(self))

    return call


def _wrap_acall(original):
    @functools.wraps(original)
    async def acall(self, *args, **kwargs):
        if _recorder.current is not None and _runs_in_thread(self):
            return await async_call(FRAMEWORK, original, (self, *args), kwargs, _describe(self),
                                    thread_owner=self._fn)
        return await async_call(FRAMEWORK, original, (self, *args), kwargs, _describe(self))

    return acall


class LlamaIndexInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_llamaindex``."""

    framework = FRAMEWORK
    requirement = "llama-index-core >= 0.14.25, < 0.15"
    module = "llama_index.core"
