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
- ``langgraph.pregel._executor.get_executor_for_config``, the pool of
  ``max_concurrency`` workers a sync graph runs the tasks of one step on
  (``langchain_core.runnables.config.get_executor_for_config`` as LangGraph's
  runner imported it): a task that is one tool call (what
  ``create_react_agent``'s default version sends each tool call as, through
  ``Send``) is marked at submission, and the ``ToolNode`` inside it hands
  that queued call on to its own worker, so the call's span starts when the
  runner submitted the task and its queue time is the wait for a worker.

Agent runs: ``langgraph.pregel.Pregel.stream`` / ``astream`` (a compiled
graph's ``invoke`` / ``ainvoke`` run through them): each run of a graph is
an ``invoke_agent {graph name}`` span (``runs``) unless the application
opened its own ``agent_span`` around it; a subgraph's run nests in its parent's.

Model calls: ``generate`` / ``agenerate`` / ``stream`` / ``astream`` of
``BaseChatModel`` and ``BaseLLM`` (every ``invoke``, ``batch`` and graph
node's model call goes through one of them) make a callback handler part of
the model run's callback manager, through
``langchain_core.tracers.context.register_configure_hook`` (as LangSmith's
tracer is) and a context variable set only while a model call starts, so
tool and chain runs pay nothing for it. It records each chat model or LLM
call as a GenAI model span (``chat {model}`` / ``text_completion {model}``): the model name
from LangChain's ``ls_model_name`` metadata or the invocation parameters
(else the model's class name), ``gen_ai.provider.name`` from
``ls_provider``, token usage from the message's ``usage_metadata`` or the
provider's ``token_usage``, time to first token when the answer streams
(the first chunk with text or a piece of a tool call's arguments: not the
role-only chunk a chat completions stream opens with, nor a Responses API
event before the output).
Only while ``agent_otel.capture.models.hooks_record()`` (the
``model_spans`` setting). When a peer records them instead (OpenInference's
or OpenLLMetry's LangChain instrumentation, whose model spans start with
no attributes) and a simulated GPU follows the model calls
(``models.hooks_follow()``), the handler keeps each call in
``models.model_calls`` while it is in flight, with no span
(``models.FollowedModelCall``), so the simulated GPU is busy while it
generates.

With OpenInference's LangChain instrumentation active and no span current,
a tool's span is made a child of OpenInference's span for the LangChain run
it runs in (OpenInference does not make its spans current), so it is in the
same trace as OpenInference's spans of that run.

Name, description and tool call id come from the tool and the ``ToolCall``.
A ``ToolException`` that the tool handles itself (``handle_tool_error``)
returns a ``ToolMessage`` with status "error": the span's outcome is then
``error`` with ``error.type`` ``tool_error``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from concurrent.futures import Executor
from typing import Any, Optional, Union

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel.capture import models
from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks.calls import (
    CarriedWork,
    MarkedWork,
    async_call,
    current_handoff,
    handed_off_here,
    hook_event_loop,
    meta,
    sync_call,
    unhook_event_loop,
)
from agent_otel.capture.frameworks import runs
from agent_otel.capture.patching import Patches, importable, self_switching
from agent_otel.semconv import GEN_AI_OPERATION_CHAT, GEN_AI_OPERATION_TEXT_COMPLETION

FRAMEWORK = "langchain"
# OpenInference's LangChain instrumentation, whose run spans our tool spans join (_peer_parent).
OPENINFERENCE_LANGCHAIN = "openinference.instrumentation.langchain"
# The peers' LangChain instrumentations, whose model calls the handler follows (FollowedModelCall).
PEER_SCOPES = (OPENINFERENCE_LANGCHAIN, "opentelemetry.instrumentation.langchain")
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
    if importable("langgraph.pregel._executor"):
        from langgraph.pregel import _executor as pregel_executor

        if hasattr(pregel_executor, "get_executor_for_config"):
            _patches.wrap(pregel_executor, "get_executor_for_config", _wrap_runner_executor_for_config)
    if importable("langgraph.pregel"):
        from langgraph.pregel import Pregel

        _patches.wrap(Pregel, "stream", _wrap_graph_stream)
        _patches.wrap(Pregel, "astream", _wrap_graph_astream)
    _patches.apply(hook_event_loop, unhook_event_loop)
    _patches.apply(_add_model_call_handler, _remove_model_call_handler)
    from langchain_core.language_models import BaseChatModel, BaseLLM

    for model_class in (BaseChatModel, BaseLLM):
        _patches.wrap(model_class, "generate", _wrap_model_call)
        _patches.wrap(model_class, "agenerate", _wrap_async_model_call)
        _patches.wrap(model_class, "stream", _wrap_model_stream)
        _patches.wrap(model_class, "astream", _wrap_async_model_stream)


def uninstrument() -> None:
    _patches.restore()


def _describe(tool, call_id: Optional[str]):
    return lambda: (meta(tool.name, tool.description), call_id)


def _content(result: Any) -> Any:
    """What a tool returned: a ToolMessage's content, else the value."""
    if getattr(result, "type", None) == "tool" and hasattr(result, "content"):
        return result.content
    return result


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


def _peer_parent():
    """OpenInference's span of the LangChain run a tool runs in, when its LangChain
    instrumentation is active and no span is current.

    OpenInference keeps its spans by run id and never makes them current, so
    without this the tool's span would start a trace of its own, apart from
    the run's. (OpenLLMetry makes its spans current: nothing to do.)
    """
    module = sys.modules.get(OPENINFERENCE_LANGCHAIN)
    if module is None or trace_api.get_current_span().get_span_context().is_valid:
        return None
    try:
        instrumentor = vars(module.LangChainInstrumentor).get("_instance")  # a singleton, once made
        if not getattr(instrumentor, "_is_instrumented_by_opentelemetry", False):
            return None
        span = module.get_current_span()
    except Exception:
        return None
    return span if span is not None and span.get_span_context().is_valid else None


def _wrap_run(original):
    @functools.wraps(original)
    def run(self, tool_input, *args, **kwargs):
        if (
            run.agent_otel_inactive  # type: ignore[attr-defined]  # set by self_switching
            or current_recorder() is None
            or (current_handoff() is not None and handed_off_here(self))
        ):
            # An inactive patch, not instrumented, or the worker side of a
            # hooked ainvoke / arun (its span is the call's): straight through.
            return original(self, tool_input, *args, **kwargs)
        call_id = kwargs.get("tool_call_id")
        # The closures are made here, not by helpers: one Python call fewer each (the hot path).
        describe = lambda: (meta(self.name, self.description), call_id)  # noqa: E731
        arguments = lambda: tool_input  # noqa: E731
        if sys.modules.get(OPENINFERENCE_LANGCHAIN) is None:  # no OpenInference parent to join (_peer_parent)
            return sync_call(
                FRAMEWORK, original, (self, tool_input, *args), kwargs, describe, _failed, arguments, _content
            )
        parent = _peer_parent()
        token = None if parent is None else context_api.attach(trace_api.set_span_in_context(parent))
        try:
            return sync_call(
                FRAMEWORK, original, (self, tool_input, *args), kwargs, describe, _failed, arguments, _content
            )
        finally:
            if token is not None:
                context_api.detach(token)

    return self_switching(run)


def _wrap_arun(original):
    @functools.wraps(original)
    async def arun(self, tool_input, *args, **kwargs):
        describe = _describe(self, kwargs.get("tool_call_id"))
        if current_recorder() is None:
            return await original(self, tool_input, *args, **kwargs)
        thread = {"thread_owner": self} if _runs_in_thread(self) else {}
        parent = _peer_parent()
        token = context_api.attach(trace_api.set_span_in_context(parent)) if parent is not None else None
        try:
            return await async_call(
                FRAMEWORK,
                original,
                (self, tool_input, *args),
                kwargs,
                describe,
                _failed,
                arguments=lambda: tool_input,
                result_of=_content,
                **thread,
            )
        finally:
            if token is not None:
                context_api.detach(token)

    return arun


def _wrap_ainvoke(original):
    # Only the no-coroutine case is a tool run here: with a coroutine,
    # ainvoke goes on to BaseTool.arun, which is hooked itself.
    @functools.wraps(original)
    async def ainvoke(self, input, config=None, **kwargs):
        if current_recorder() is None or getattr(self, "coroutine", None) is not None:
            return await original(self, input, config, **kwargs)
        tool_call = isinstance(input, dict) and input.get("type") == "tool_call"
        call_id = input.get("id") if tool_call else None
        parent = _peer_parent()
        token = context_api.attach(trace_api.set_span_in_context(parent)) if parent is not None else None
        try:
            return await async_call(
                FRAMEWORK,
                original,
                (self, input, config),
                kwargs,
                _describe(self, call_id),
                _failed,
                thread_owner=self,
                arguments=lambda: input.get("args") if tool_call else input,
                result_of=_content,
            )
        finally:
            if token is not None:
                context_api.detach(token)

    return ainvoke


class _Submitter(Executor):
    """A pool of LangGraph's, as the code that submits to it sees it: other attributes are the pool's."""

    def __init__(self, executor: Executor):
        self._executor = executor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._executor, name)


class _ToolCallSubmitter(_Submitter):
    """What a sync ToolNode submits through: each tool call as a marked work item.

    A ToolNode running inside a runner task that was submitted as this very
    tool call (``_TaskSubmitter``) hands that queued call on to its worker
    instead, so the call's queue time starts at the runner's submission.
    """

    def submit(self, fn, /, *args, **kwargs):
        call = args[0] if args else None
        if current_recorder() is not None and isinstance(call, dict) and isinstance(call.get("name"), str):
            carried = CarriedWork.take(call["name"])
            fn = MarkedWork(fn, call["name"]) if carried is None else CarriedWork(fn, carried)
        return self._executor.submit(fn, *args, **kwargs)


class _TaskSubmitter(_Submitter):
    """What LangGraph's sync runner submits a step's tasks through: a task
    that is one tool call (a ``Send`` of a ``ToolCall``, as the default
    ``create_react_agent`` sends each) as a marked work item."""

    def submit(self, fn, /, *args, **kwargs):
        if current_recorder() is not None:
            name = _task_tool_name(args)
            if name is not None:
                fn = MarkedWork(fn, name)
        return self._executor.submit(fn, *args, **kwargs)


def _task_tool_name(args: tuple) -> Optional[str]:
    """The tool a submitted runner task calls, when its input is one tool call.

    The runner submits ``(ctx.run, run_with_retry, task, ...)`` (behind
    ``next_tick`` for a deferred task); the task's input is a
    ``ToolCallWithContext`` (``create_react_agent``'s ``Send``) or a
    ``ToolCall``.
    """
    for arg in args[:3]:
        value = getattr(arg, "input", None)
        if not isinstance(value, dict) or not hasattr(arg, "proc"):
            continue
        if value.get("__type") == "tool_call_with_context":
            value = value.get("tool_call")
            if not isinstance(value, dict):
                return None
        elif value.get("type") != "tool_call":
            return None
        name = value.get("name")
        return name if isinstance(name, str) else None
    return None


def _wrap_runner_executor_for_config(original):
    @contextlib.contextmanager
    @functools.wraps(original)
    def get_executor_for_config(config):
        with original(config) as executor:
            yield _TaskSubmitter(executor)

    return get_executor_for_config


def _wrap_get_executor_for_config(original):
    @contextlib.contextmanager
    @functools.wraps(original)
    def get_executor_for_config(config):
        with original(config) as executor:
            yield _ToolCallSubmitter(executor)

    return get_executor_for_config


# ---- agent runs --------------------------------------------------------------


def _wrap_graph_stream(original):
    @functools.wraps(original)
    def stream(self, *args, **kwargs):  # a generator function, as the original
        return (yield from runs.stream_run(lambda: self.name, self, lambda: original(self, *args, **kwargs)))

    return stream


def _wrap_graph_astream(original):
    @functools.wraps(original)
    async def astream(self, *args, **kwargs):  # an async generator function, as the original
        chunks = runs.astream_run(lambda: self.name, self, lambda: original(self, *args, **kwargs))
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    return astream


# ---- model calls -------------------------------------------------------------

# What our configure hook adds to the callback manager being configured:
# the handler while a model call starts (_model_call_handler), else None.
_model_calls_var: contextvars.ContextVar = contextvars.ContextVar("agent_otel_model_calls", default=None)
_handler = None  # the handler, while hooked


def _add_model_call_handler() -> None:
    global _handler
    from langchain_core.tracers import context

    _handler = _model_call_handler_class()()
    context.register_configure_hook(_model_calls_var, True)
    models.hook_followed_scopes.update(PEER_SCOPES)


def _remove_model_call_handler() -> None:
    global _handler
    from langchain_core.tracers import context

    context._configure_hooks[:] = [hook for hook in context._configure_hooks if hook[0] is not _model_calls_var]
    models.hook_followed_scopes.difference_update(PEER_SCOPES)
    _handler = None


def _model_call_handler():
    """The handler to add to a model call's run now, or None."""
    if _handler is None:
        return None
    return _handler if models.hooks_record() or models.hooks_follow() else None


def _wrap_model_call(original):
    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        handler = _model_call_handler()
        if handler is None:
            return original(self, *args, **kwargs)
        token = _model_calls_var.set(handler)
        try:
            return original(self, *args, **kwargs)
        finally:
            _model_calls_var.reset(token)

    return generate


def _wrap_async_model_call(original):
    @functools.wraps(original)
    async def agenerate(self, *args, **kwargs):
        handler = _model_call_handler()
        if handler is None:
            return await original(self, *args, **kwargs)
        token = _model_calls_var.set(handler)
        try:
            return await original(self, *args, **kwargs)
        finally:
            _model_calls_var.reset(token)

    return agenerate


def _wrap_model_stream(original):
    # The variable is set only while the stream's own code runs (its first
    # step configures the run), never while the consumer's code does.
    @functools.wraps(original)
    def stream(self, *args, **kwargs):
        handler = _model_call_handler()
        chunks = original(self, *args, **kwargs)
        if handler is None:
            return (yield from chunks)
        try:
            while True:
                token = _model_calls_var.set(handler)
                try:
                    chunk = next(chunks)
                except StopIteration:
                    return
                finally:
                    _model_calls_var.reset(token)
                yield chunk
        finally:
            chunks.close()

    return stream


def _wrap_async_model_stream(original):
    @functools.wraps(original)
    async def astream(self, *args, **kwargs):
        handler = _model_call_handler()
        chunks = original(self, *args, **kwargs)
        try:
            while True:
                token = _model_calls_var.set(handler) if handler is not None else None
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    if token is not None:
                        _model_calls_var.reset(token)
                yield chunk
        finally:
            await chunks.aclose()

    return astream


def _model_call_handler_class():
    from langchain_core.callbacks import BaseCallbackHandler

    class ModelCalls(BaseCallbackHandler):
        """Each chat model and LLM call of a run as a model span (or followed,
        ``models.FollowedModelCall``); ignores every other event."""

        run_inline = True  # called in the caller's context, also from async code
        raise_error = False
        ignore_chain = ignore_agent = ignore_retriever = ignore_retry = ignore_custom_event = True

        def __init__(self):
            self.calls: dict = {}  # run id -> ModelSpan

        def on_chat_model_start(self, serialized, messages, *, run_id, metadata=None, **kwargs):
            self._start(run_id, GEN_AI_OPERATION_CHAT, serialized, metadata, kwargs)

        def on_llm_start(self, serialized, prompts, *, run_id, metadata=None, **kwargs):
            self._start(run_id, GEN_AI_OPERATION_TEXT_COMPLETION, serialized, metadata, kwargs)

        def on_llm_new_token(self, token, *, run_id, chunk=None, **kwargs):
            call = self.calls.get(run_id)
            if call is not None and not call.first_chunk_ns and _carries_output(token, chunk):
                call.first_chunk()

        def on_llm_end(self, response, *, run_id, **kwargs):
            call = self.calls.pop(run_id, None)
            if call is not None:
                try:
                    _read_usage(call, response)
                finally:
                    call.end()

        def on_llm_error(self, error, *, run_id, **kwargs):
            call = self.calls.pop(run_id, None)
            if call is not None:
                call.end(error if isinstance(error, BaseException) else None)

        def _start(self, run_id, operation, serialized, metadata, kwargs):
            record = models.hooks_record()
            if not record and not models.hooks_follow():
                return
            metadata = metadata or {}
            params = kwargs.get("invocation_params") or {}
            model = (
                metadata.get("ls_model_name")
                or params.get("model")
                or params.get("model_name")
                or params.get("model_id")
                or (serialized or {}).get("name")
                or ((serialized or {}).get("id") or ["unknown"])[-1]
            )
            call: Optional[Union[models.ModelSpan, models.FollowedModelCall]]
            if record:
                call = models.ModelSpan.start(model, operation, metadata.get("ls_provider"))
            else:
                call = models.FollowedModelCall.start(model, operation)
            if call is not None:
                self.calls[run_id] = call

    return ModelCalls


def _carries_output(token: Any, chunk: Any) -> bool:
    """Whether a streamed chunk is a token of the answer: text, or a piece of a
    tool call's arguments (``models.RESPONSE_OUTPUT_DELTAS`` says why).

    Chat models stream chunks that carry none too (the role, the tool's name
    before its arguments, a Responses API event before the output, the usage
    at the end): they are not the first token.
    """
    message = getattr(chunk, "message", None)
    if not isinstance(token, str):  # content blocks (the Responses API's): their text
        token = getattr(message, "text", None)
        if callable(token):  # (a method before langchain-core 1)
            token = token()
    if token and isinstance(token, str):
        return True
    return any(piece.get("args") for piece in getattr(message, "tool_call_chunks", None) or ())


def _read_usage(call, response) -> None:
    """Token usage and the answering model, from an ``LLMResult``."""
    generations = getattr(response, "generations", None) or [[]]
    first = generations[0][0] if generations and generations[0] else None
    message = getattr(first, "message", None)
    usage = getattr(message, "usage_metadata", None)
    llm_output = getattr(response, "llm_output", None) or {}
    if usage:
        call.usage(usage.get("input_tokens"), usage.get("output_tokens"))
    else:
        token_usage = llm_output.get("token_usage") or {}
        call.usage(token_usage.get("prompt_tokens"), token_usage.get("completion_tokens"))
    call.response_model = (getattr(message, "response_metadata", None) or {}).get("model_name") or llm_output.get(
        "model_name"
    )
