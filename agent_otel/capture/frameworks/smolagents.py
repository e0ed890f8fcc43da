"""smolagents: every ``Tool.__call__`` is an ``execute_tool`` span.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["smolagents"])

Hooked:

- ``smolagents.tools.Tool.__call__``: how both agent kinds run a tool (the
  ``ToolCallingAgent`` directly, the ``CodeAgent`` from the model's code).
- ``smolagents.agents.ThreadPoolExecutor``: a ``ToolCallingAgent`` given
  several tool calls in one step runs them on a pool of
  ``max_tool_threads`` workers. The hook's pool marks each submitted call,
  so its span starts at submission and queue time is real.

Name and description come from the ``Tool``. smolagents does not pass the
model's tool call id down to the tool, so spans carry none.
"""

from __future__ import annotations

import contextvars
import functools

from agent_otel.capture import recorder as _recorder
from agent_otel.capture.frameworks.calls import MarkedWork, meta, sync_call
from agent_otel.capture.frameworks.instrumentor import FrameworkInstrumentor
from agent_otel.capture.patching import Patches

FRAMEWORK = "smolagents"
_patches = Patches()


def instrument() -> None:
    from smolagents import agents
    from smolagents.tools import Tool

    _patches.wrap(Tool, "__call__", _wrap_call)
    _patches.wrap(agents, "ThreadPoolExecutor", _tool_call_pool)


def uninstrument() -> None:
    _patches.restore()


def _wrap_call(original):
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        return sync_call(FRAMEWORK, original, (self, *args), kwargs,
                         lambda: (meta(self.name, self.description), None))

    return __call__


def _tool_call_pool(pool_class):
    from smolagents.memory import ToolCall

    class ToolCallPool(pool_class):
        """The agent's pool, submitting each tool call as a marked work item."""

        def submit(self, fn, /, *args, **kwargs):
            # smolagents submits (context.run, process_single_tool_call, tool_call).
            if (_recorder.current is not None and isinstance(getattr(fn, "__self__", None), contextvars.Context)
                    and len(args) == 2 and isinstance(args[1], ToolCall)):
                return super().submit(functools.partial(fn, MarkedWork(args[0], args[1].name), args[1]),
                                      **kwargs)
            return super().submit(fn, *args, **kwargs)

    ToolCallPool.__name__ = ToolCallPool.__qualname__ = pool_class.__name__
    return ToolCallPool


class SmolagentsInstrumentor(FrameworkInstrumentor):
    """``opentelemetry-instrument`` entry point ``agent_otel_smolagents``."""

    framework = FRAMEWORK
    requirement = "smolagents >= 1.26, < 2"
    module = "smolagents"
