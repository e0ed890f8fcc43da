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

Model calls: ``generate`` and ``generate_stream`` of ``smolagents.models.Model``
and of every subclass that overrides them (each model class does; ones
defined later too) become GenAI model spans ``chat {model_id}`` with the
token usage the model reports and, when streamed, the time to the first
token (the first delta with content or a tool call's arguments). A model method calling another of the same model is one call. Only
while ``agent_otel.capture.models.hooks_record()`` (the ``model_spans``
setting).

Agent runs: ``MultiStepAgent.run`` (also a managed agent's run, which its
manager calls) is one ``invoke_agent {agent name}`` span (``runs``) unless
the application opened its own ``agent_span`` around it; with
``stream=True``, from the first step to the last. A managed agent's run
nests in its manager's.

Name and description come from the ``Tool``. smolagents does not pass the
model's tool call id down to the tool, so spans carry none.
"""

from __future__ import annotations

import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel.capture import models
from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks import runs
from agent_otel.capture.frameworks.calls import MarkedWork, meta, sync_call
from agent_otel.capture.patching import Patches, self_switching

FRAMEWORK = "smolagents"
_patches = Patches()


def instrument() -> None:
    from smolagents import agents
    from smolagents.tools import Tool

    _patches.wrap(Tool, "__call__", _wrap_call)
    _patches.wrap(agents, "ThreadPoolExecutor", _tool_call_pool)
    from smolagents.models import Model

    _patches.wrap_overrides(Model, "generate", _wrap_generate)
    _patches.wrap_overrides(Model, "generate_stream", _wrap_generate_stream)
    from smolagents.agents import MultiStepAgent

    _patches.wrap(MultiStepAgent, "run", _wrap_agent_run)


def uninstrument() -> None:
    _patches.restore()


def _carries_output(delta) -> bool:
    """Whether a stream delta is a token of the answer: content, or a tool call's
    arguments (``models.RESPONSE_OUTPUT_DELTAS`` says why); a delta with only
    the usage is not."""
    if getattr(delta, "content", None):
        return True
    for call in getattr(delta, "tool_calls", None) or ():
        if getattr(getattr(call, "function", None), "arguments", None):
            return True
    return False


def _agent_name(agent) -> str:
    return getattr(agent, "name", None) or type(agent).__name__


def _wrap_agent_run(original):
    @functools.wraps(original)
    def run(self, *args, **kwargs):
        stream = kwargs.get("stream", args[1] if len(args) > 1 else False)
        if stream:  # the steps as a generator: the run is its iteration
            return runs.stream_run(lambda: _agent_name(self), self, lambda: original(self, *args, **kwargs))
        return runs.sync_run(lambda: _agent_name(self), self, original, (self, *args), kwargs)

    return run


def _wrap_call(original):
    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        if __call__.agent_otel_inactive or current_recorder() is None:  # type: ignore[attr-defined]  # self_switching
            return original(self, *args, **kwargs)
        return sync_call(
            FRAMEWORK,
            original,
            (self, *args),
            kwargs,
            lambda: (meta(self.name, self.description), None),
            arguments=lambda: {
                "args": args,
                "kwargs": {key: value for key, value in kwargs.items() if key != "sanitize_inputs_outputs"},
            },
        )

    return self_switching(__call__)


def _tool_call_pool(pool_class: type[ThreadPoolExecutor]) -> type[ThreadPoolExecutor]:
    from smolagents.memory import ToolCall

    class ToolCallPool(pool_class):  # type: ignore[valid-type,misc]  # the framework's own pool class
        """The agent's pool, submitting each tool call as a marked work item."""

        def submit(self, fn, /, *args, **kwargs):
            # smolagents submits (context.run, process_single_tool_call, tool_call).
            if (
                current_recorder() is not None
                and isinstance(getattr(fn, "__self__", None), contextvars.Context)
                and len(args) == 2
                and isinstance(args[1], ToolCall)
            ):
                return super().submit(functools.partial(fn, MarkedWork(args[0], args[1].name), args[1]), **kwargs)
            return super().submit(fn, *args, **kwargs)

    ToolCallPool.__name__ = ToolCallPool.__qualname__ = pool_class.__name__
    return ToolCallPool


# ---- model calls -------------------------------------------------------------

# The model whose call is being recorded in this context: its inner calls are the same call.
_in_model_call: contextvars.ContextVar = contextvars.ContextVar("agent_otel_smolagents_model", default=None)


def _start_model_call(model):
    if _in_model_call.get() is model or not models.hooks_record():
        return None
    name = getattr(model, "model_id", None)
    return models.ModelSpan.start(name if isinstance(name, str) and name else type(model).__name__)


def _wrap_generate(original):
    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        call = _start_model_call(self)
        if call is None:
            return original(self, *args, **kwargs)
        inner = _in_model_call.set(self)
        token = context_api.attach(trace_api.set_span_in_context(call.span))
        try:
            message = original(self, *args, **kwargs)
        except BaseException as exc:
            context_api.detach(token)
            _in_model_call.reset(inner)
            call.end(exc)
            raise
        context_api.detach(token)
        _in_model_call.reset(inner)
        usage = getattr(message, "token_usage", None)
        if usage is not None:
            call.usage(getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None))
        call.end()
        return message

    return generate


def _wrap_generate_stream(original):
    @functools.wraps(original)
    def generate_stream(self, *args, **kwargs):
        call = _start_model_call(self)
        if call is None:
            return (yield from original(self, *args, **kwargs))
        input_tokens = output_tokens = 0
        reported = False
        deltas = original(self, *args, **kwargs)
        try:
            while True:
                inner = _in_model_call.set(self)  # only while the model's own code runs
                try:
                    delta = next(deltas)
                except StopIteration:
                    break
                finally:
                    _in_model_call.reset(inner)
                if not call.first_chunk_ns and _carries_output(delta):
                    call.first_chunk()
                usage = getattr(delta, "token_usage", None)
                if usage is not None:
                    reported = True
                    input_tokens += getattr(usage, "input_tokens", 0) or 0
                    output_tokens += getattr(usage, "output_tokens", 0) or 0
                yield delta
        except BaseException as exc:
            deltas.close()
            call.end(None if isinstance(exc, GeneratorExit) else exc)
            raise
        if reported:
            call.usage(input_tokens, output_tokens)
        call.end()

    return generate_stream
