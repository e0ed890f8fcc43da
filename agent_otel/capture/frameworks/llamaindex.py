"""LlamaIndex (``llama-index-core``): ``FunctionTool`` calls as spans.

Usage::

    agent_otel.instrument()   # or instrument(frameworks=["llamaindex"])

Hooked, in ``llama_index.core.tools.function_tool``:

- ``FunctionTool.call`` (and so ``__call__``): a sync call.
- ``FunctionTool.acall``: how LlamaIndex's workflow agents run every tool.
  A tool made from a sync function runs on the event loop's default
  executor (``sync_to_async``): the span starts at ``acall`` and exec starts
  when a worker picks the function up.

Model calls: an event handler on LlamaIndex's root instrumentation
dispatcher turns each LLM chat or completion call (``LLMChatStartEvent`` to
``LLMChatEndEvent``, the completion events alike) into a GenAI model span
``chat {model}`` / ``text_completion {model}``: the model name from the
LLM's payload (``model``, else its class name), token usage from the
response where the provider reports it, time to first token when it
streams (the first in-progress event with a text delta or a tool call's
arguments), and an error when the call's dispatcher span is dropped. An LLM
method that calls another of the same LLM (``achat`` running ``chat``) is
one call. Only while ``agent_otel.capture.models.hooks_record()`` (the
``model_spans`` setting).

Agent runs: ``run`` of a workflow agent (``BaseWorkflowAgent``:
``FunctionAgent``, ``ReActAgent``, ``CodeActAgent``) and of an
``AgentWorkflow`` starts the run in the background and returns its handler;
the run, until the handler's result is ready, is one ``invoke_agent {agent
name}`` span (``runs``) unless the application opened its own ``agent_span``
around it. The span is current while ``run`` starts the workflow's tasks, so
their tool and model calls are in its trace.

Name and description come from the tool's ``ToolMetadata``. LlamaIndex does
not pass the model's tool call id down to the tool, so spans carry none.
"""

from __future__ import annotations

import functools

from agent_otel.capture import models
from agent_otel.capture.current import current_recorder
from agent_otel.capture.frameworks import runs
from agent_otel.capture.frameworks.calls import (
    async_call,
    hook_event_loop,
    meta,
    positional,
    sync_call,
    unhook_event_loop,
)
from agent_otel.capture.patching import Patches, self_switching
from agent_otel.semconv import ERROR_TYPE_OTHER, GEN_AI_OPERATION_CHAT, GEN_AI_OPERATION_TEXT_COMPLETION

FRAMEWORK = "llamaindex"
_patches = Patches()


def instrument() -> None:
    from llama_index.core.tools.function_tool import FunctionTool

    _patches.wrap(FunctionTool, "call", _wrap_call)
    _patches.wrap(FunctionTool, "acall", _wrap_acall)
    _patches.apply(hook_event_loop, unhook_event_loop)
    _patches.apply(_add_model_call_handler, _remove_model_call_handler)
    from llama_index.core.agent.workflow import AgentWorkflow, BaseWorkflowAgent

    for agent_class in (BaseWorkflowAgent, AgentWorkflow):
        _patches.wrap(agent_class, "run", _wrap_agent_run)


def uninstrument() -> None:
    _patches.restore()


def _agent_name(agent) -> str:
    name = getattr(agent, "name", None)
    if not isinstance(name, str) or not name:
        root = getattr(agent, "root_agent", None)  # an AgentWorkflow: named by the agent it starts with
        name = root if isinstance(root, str) and root else type(agent).__name__
    return name


def _wrap_agent_run(original):
    @functools.wraps(original)
    def run(self, *args, **kwargs):
        return runs.started_run(
            lambda: _agent_name(self), self, original, (self, *args), kwargs, lambda handler: handler._result_task
        )

    return run


def _carries_output(response) -> bool:
    """Whether a streamed response is a token of the answer: a text delta, or a
    tool call's arguments (``models.RESPONSE_OUTPUT_DELTAS`` says why)."""
    if getattr(response, "delta", None):
        return True
    message = getattr(response, "message", None)
    for block in getattr(message, "blocks", None) or ():
        if getattr(block, "tool_kwargs", None):
            return True
    calls = (getattr(message, "additional_kwargs", None) or {}).get("tool_calls") or ()
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else getattr(call, "function", None)
        arguments = function.get("arguments") if isinstance(function, dict) else getattr(function, "arguments", None)
        if arguments:
            return True
    return False


def _describe(tool):
    return lambda: (meta(tool.metadata.get_name(), tool.metadata.description), None)


def _runs_in_thread(tool) -> bool:
    """Whether the tool's async form is LlamaIndex's thread hand-off of its sync function."""
    async_fn = getattr(tool, "_async_fn", None)
    return getattr(async_fn, "__qualname__", "").startswith("sync_to_async.")


def _raw_output(result):
    """What the function returned (LlamaIndex wraps it in a ToolOutput)."""
    return getattr(result, "raw_output", result)


def _wrap_call(original):
    @functools.wraps(original)
    def call(self, *args, **kwargs):
        if call.agent_otel_inactive or current_recorder() is None:  # type: ignore[attr-defined]  # self_switching
            return original(self, *args, **kwargs)
        # The closures are made here, not by _describe and positional: a Python call fewer each (the hot path).
        return sync_call(
            FRAMEWORK,
            original,
            (self, *args),
            kwargs,
            lambda: (meta(self.metadata.get_name(), self.metadata.description), None),
            None,
            lambda: {"args": args, "kwargs": kwargs},
            _raw_output,
        )

    return self_switching(call)


def _wrap_acall(original):
    @functools.wraps(original)
    async def acall(self, *args, **kwargs):
        if current_recorder() is not None and _runs_in_thread(self):
            return await async_call(
                FRAMEWORK,
                original,
                (self, *args),
                kwargs,
                _describe(self),
                thread_owner=self._fn,
                arguments=positional((self, *args), kwargs),
                result_of=_raw_output,
            )
        return await async_call(
            FRAMEWORK,
            original,
            (self, *args),
            kwargs,
            _describe(self),
            arguments=positional((self, *args), kwargs),
            result_of=_raw_output,
        )

    return acall


# ---- model calls -------------------------------------------------------------

_model_call_handler = None  # while hooked: the handler on the root dispatcher


def _add_model_call_handler() -> None:
    global _model_call_handler
    from llama_index.core.instrumentation import get_dispatcher

    _model_call_handler = _model_call_handler_class()()
    get_dispatcher().add_event_handler(_model_call_handler)


def _remove_model_call_handler() -> None:
    global _model_call_handler
    from llama_index.core.instrumentation import get_dispatcher

    dispatcher = get_dispatcher()
    dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not _model_call_handler]
    _model_call_handler = None


def _model_call_handler_class():
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.llm import (
        LLMChatEndEvent,
        LLMChatInProgressEvent,
        LLMChatStartEvent,
        LLMCompletionEndEvent,
        LLMCompletionInProgressEvent,
        LLMCompletionStartEvent,
    )
    from llama_index.core.instrumentation.events.exception import ExceptionEvent
    from llama_index.core.instrumentation.events.span import SpanDropEvent

    starts = {LLMChatStartEvent: GEN_AI_OPERATION_CHAT, LLMCompletionStartEvent: GEN_AI_OPERATION_TEXT_COMPLETION}
    progress = (LLMChatInProgressEvent, LLMCompletionInProgressEvent)
    ends = (LLMChatEndEvent, LLMCompletionEndEvent)

    class ModelCalls(BaseEventHandler):
        """Each LLM call as a model span, keyed by the span id LlamaIndex gives its events."""

        @classmethod
        def class_name(cls) -> str:
            return "AgentOtelModelCalls"

        def handle(self, event, **kwargs) -> None:
            kind = type(event)
            operation = starts.get(kind)
            if operation is not None:
                _start(event, operation)
            elif kind in progress:
                entry = _open_calls.get(event.span_id)
                if entry is not None and entry[0] is not None and not entry[0].first_chunk_ns:
                    if _carries_output(getattr(event, "response", None)):
                        entry[0].first_chunk()
            elif kind in ends:
                entry = _open_calls.pop(event.span_id, None)
                if entry is not None and entry[0] is not None:
                    try:
                        _read_usage(entry[0], event.response)
                    finally:
                        entry[0].end()
            elif kind is ExceptionEvent or kind is SpanDropEvent:
                # A streamed call's failure comes with its exception; a call's
                # dropped span with the error's text only.
                entry = _open_calls.pop(event.span_id, None)
                if entry is not None and entry[0] is not None:
                    if kind is ExceptionEvent:
                        entry[0].end(event.exception)
                    else:
                        entry[0].end(error=(ERROR_TYPE_OTHER, event.err_str))

    return ModelCalls


# span id -> (ModelSpan or None for a nested call of the same LLM, caller key)
_open_calls: dict = {}


def _caller() -> tuple:
    """The thread and asyncio task making a call: a call starting while the same
    caller has one of the same LLM open is that call's inner method."""
    import asyncio
    import threading

    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), id(task)


def _start(event, operation: str) -> None:
    if not models.hooks_record():
        return
    payload = event.model_dict or {}
    model = payload.get("model") or payload.get("model_name")
    if not model or model == "unknown":  # LLMMetadata's default
        model = payload.get("class_name") or "unknown"
    caller = (_caller(), model)
    if any(entry[1] == caller for entry in _open_calls.values()):
        _open_calls[event.span_id] = (None, caller)  # the same call, one method further in
        return
    call = models.ModelSpan.start(model, operation)
    if call is not None:
        _open_calls[event.span_id] = (call, caller)


def _read_usage(call, response) -> None:
    """Token usage, where the LLM integration reports it (OpenAI's puts it in additional_kwargs)."""
    if response is None:
        return
    extra = getattr(response, "additional_kwargs", None) or {}
    raw = getattr(response, "raw", None)
    usage = raw.get("usage") if isinstance(raw, dict) else getattr(raw, "usage", None)
    if "prompt_tokens" in extra or "completion_tokens" in extra:
        call.usage(extra.get("prompt_tokens"), extra.get("completion_tokens"))
    elif usage is not None:
        get = usage.get if isinstance(usage, dict) else lambda key: getattr(usage, key, None)
        call.usage(get("prompt_tokens") or get("input_tokens"), get("completion_tokens") or get("output_tokens"))
