"""OpenAI Agents SDK (``openai-agents``, module ``agents``): function tools as spans.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["openai_agents"])

Hooked, in ``agents.tool`` and ``agents.run_internal.tool_execution``:

- ``_invoke_function_tool_with_metadata``: where the runner (and the
  realtime session, through ``invoke_function_tool``) runs a
  ``FunctionTool``'s ``on_invoke_tool`` with its ``ToolContext``. Name and
  description come from the ``FunctionTool``, the call id from
  ``ToolContext.tool_call_id``. The SDK runs a sync ``@function_tool`` with
  ``asyncio.to_thread``: the span starts when the runner invokes the tool,
  and exec starts when a worker of the default executor picks it up.
- ``maybe_invoke_function_tool_failure_error_function``: by default the SDK
  turns a tool's exception into an error message for the model; the hook
  notes the exception so the span still records it (outcome ``error``,
  ``error.type`` the exception's class). The model sees the same message.
- ``get_response_with_retry`` / ``stream_response_with_retry`` (as
  ``agents.run_internal.run_loop`` calls them): one model call each, a
  GenAI model span ``chat {model}`` with the model's name (its ``model``
  attribute, else its class), ``gen_ai.provider.name`` ``openai`` for the
  SDK's OpenAI models, token usage when the response reports any, and, when
  streamed, the time to the first token: the first stream event that
  carries output (an output text, refusal or tool-call argument delta; the
  SDK gives a chat completions model's chunks as the same events), not
  ``response.created`` or the other events before it. Only while
  ``agent_otel.capture.models.hooks_record()`` (the ``model_spans``
  setting).
- ``agents.run.AgentRunner.run``, what ``Runner.run`` and ``Runner.run_sync``
  run, and ``run_streamed`` (until its run loop's task is done): one run is an ``invoke_agent {starting agent's name}`` span
  (``runs``) unless the application opened its own ``agent_span`` around
  it; a run inside a tool call (``Agent.as_tool``) nests under that call.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Optional

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel.capture import models
from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks import runs
from agent_otel.capture.frameworks.calls import async_call, hook_event_loop, meta, unhook_event_loop
from agent_otel.capture.patching import Patches, self_switching

FRAMEWORK = "openai_agents"
# The SDK's attribute on the on_invoke_tool of a sync @function_tool.
SYNC_TOOL_MARKER = "__agents_sync_function_tool__"
_patches = Patches()


class _HandledError:
    """The exception the SDK turned into a message during one tool call."""

    __slots__ = ("error",)

    def __init__(self):
        self.error: Optional[BaseException] = None


_handled: contextvars.ContextVar[Optional[_HandledError]] = contextvars.ContextVar(
    "agent_otel_openai_handled_error", default=None
)


def instrument() -> None:
    from agents import tool as tool_module
    from agents.run_internal import tool_execution

    _patches.wrap(tool_module, "_invoke_function_tool_with_metadata", _wrap_invoke)
    _patches.wrap(tool_execution, "_invoke_function_tool_with_metadata", _wrap_invoke)
    _patches.wrap(tool_module, "maybe_invoke_function_tool_failure_error_function", _wrap_failure_function)
    _patches.apply(hook_event_loop, unhook_event_loop)
    from agents.run_internal import run_loop

    _patches.wrap(run_loop, "get_response_with_retry", _wrap_get_response)
    _patches.wrap(run_loop, "stream_response_with_retry", _wrap_stream_response)
    from agents.run import AgentRunner

    _patches.wrap(AgentRunner, "run", _wrap_runner_run)
    _patches.wrap(AgentRunner, "run_streamed", _wrap_runner_run_streamed)


def uninstrument() -> None:
    _patches.restore()


def _wrap_runner_run(original):
    @functools.wraps(original)
    async def run(self, *args, **kwargs):
        agent = args[0] if args else kwargs.get("starting_agent")
        return await runs.async_run(lambda: getattr(agent, "name", None), agent, original, (self, *args), kwargs)

    return run


def _wrap_runner_run_streamed(original):
    @functools.wraps(original)
    def run_streamed(self, *args, **kwargs):
        agent = args[0] if args else kwargs.get("starting_agent")
        return runs.started_run(
            lambda: getattr(agent, "name", None),
            agent,
            original,
            (self, *args),
            kwargs,
            lambda result: result.run_loop_task,
        )

    return run_streamed


def _wrap_invoke(original):
    @functools.wraps(original)
    async def _invoke_function_tool_with_metadata(*args, **kwargs):
        function_tool = kwargs.get("function_tool")
        if (
            _invoke_function_tool_with_metadata.agent_otel_inactive  # type: ignore[attr-defined]  # self_switching
            or current_recorder() is None
            or function_tool is None
        ):
            return await original(*args, **kwargs)
        context = kwargs.get("context")

        def describe():
            return meta(function_tool.name, function_tool.description), getattr(context, "tool_call_id", None)

        handled = _HandledError()
        token = _handled.set(handled)
        try:

            def arguments():
                return kwargs.get("arguments")

            if getattr(function_tool.on_invoke_tool, SYNC_TOOL_MARKER, False):
                return await async_call(
                    FRAMEWORK,
                    original,
                    args,
                    kwargs,
                    describe,
                    lambda _: handled.error,
                    thread_owner=getattr(function_tool, "__wrapped__", None),
                    arguments=arguments,
                    result_of=_output,
                )
            return await async_call(
                FRAMEWORK,
                original,
                args,
                kwargs,
                describe,
                lambda _: handled.error,
                arguments=arguments,
                result_of=_output,
            )
        finally:
            _handled.reset(token)

    return self_switching(_invoke_function_tool_with_metadata)


def _output(result):
    """What the tool returned (the SDK wraps it with metadata)."""
    return getattr(result, "output", result)


def _wrap_failure_function(original):
    @functools.wraps(original)
    async def maybe_invoke_function_tool_failure_error_function(*args, **kwargs):
        handled = _handled.get()
        error = kwargs.get("error")
        if handled is not None and handled.error is None and isinstance(error, BaseException):
            handled.error = error
        return await original(*args, **kwargs)

    return maybe_invoke_function_tool_failure_error_function


# ---- model calls -------------------------------------------------------------


def _start_model_call(kwargs):
    """A model call's span, for the model the runner asks (the owner of its retry-advice method)."""
    if not models.hooks_record():
        return None
    model = getattr(kwargs.get("get_retry_advice"), "__self__", None)
    name = getattr(model, "model", None)
    provider = "openai" if type(model).__module__.startswith("agents.models.openai") else None
    return models.ModelSpan.start(name if isinstance(name, str) and name else type(model).__name__, provider=provider)


def _read_usage(call, usage) -> None:
    if usage is not None and (
        getattr(usage, "requests", None)
        or getattr(usage, "input_tokens", None)
        or getattr(usage, "output_tokens", None)
    ):
        call.usage(getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None))


def _wrap_get_response(original):
    @functools.wraps(original)
    async def get_response_with_retry(*args, **kwargs):
        call = _start_model_call(kwargs)
        if call is None:
            return await original(*args, **kwargs)
        token = context_api.attach(trace_api.set_span_in_context(call.span))
        try:
            response = await original(*args, **kwargs)
        except BaseException as exc:
            context_api.detach(token)
            call.end(exc)
            raise
        context_api.detach(token)
        try:
            _read_usage(call, getattr(response, "usage", None))
        finally:
            call.end()
        return response

    return get_response_with_retry


def _wrap_stream_response(original):
    @functools.wraps(original)
    async def stream_response_with_retry(*args, **kwargs):
        call = _start_model_call(kwargs)
        if call is None:
            async for event in original(*args, **kwargs):
                yield event
            return
        try:
            async for event in original(*args, **kwargs):
                if not call.first_chunk_ns and models.response_event_has_output(event):
                    call.first_chunk()  # the first token: text or a tool call's arguments, not response.created
                if getattr(event, "type", None) == "response.completed":
                    response = getattr(event, "response", None)
                    _read_usage(call, getattr(response, "usage", None))
                    call.response_model = getattr(response, "model", None)
                yield event
        except BaseException as exc:
            call.end(None if isinstance(exc, GeneratorExit) else exc)
            raise
        call.end()

    return stream_response_with_retry
