"""Model calls and agent runs as GenAI spans, for agents nothing else traces.

Usage::

    with agent_otel.agent_span("support"):                   # one turn: invoke_agent support
        with agent_otel.model_span("llama-3-70b", provider="vllm") as call:
            for chunk in client.stream(prompt, headers=call.headers()):  # traceparent: the server's span joins
                call.first_chunk()                           # time to first token (once)
                ...
            call.usage(input_tokens=812, output_tokens=64)

A model call is a ``{operation} {model}`` span (kind CLIENT) per the
OpenTelemetry GenAI conventions: ``gen_ai.operation.name`` (``chat``,
``text_completion``, ``generate_content``), ``gen_ai.request.model``,
``gen_ai.provider.name`` when known, and, when reported,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.model``
and ``gen_ai.response.time_to_first_chunk`` (s). An agent run is an
``invoke_agent {name}`` span. They put the other half of the turn, the model
keeping the GPU busy, on the same timeline as the tool calls; the report
reads them, and the same spans from other instrumentations.

The framework hooks record model spans too (``ModelSpan.start`` /
``end``), governed by the ``model_spans`` setting: ``auto`` (the default)
records them unless another GenAI instrumentation is active in the process
(``peer_instrumentation()``: OpenInference, or OpenLLMetry's and the
OpenTelemetry contrib's GenAI instrumentations), ``on`` always, ``off``
never. ``model_span`` and ``agent_span`` are the application's own calls
and always record while instrumented. Without ``instrument()`` everything
here calls straight through.

The hooks also make one run of a framework's agent an ``invoke_agent``
span (``FrameworkRun``) where the application opened none around it: the
application's own ``agent_span`` wins, and a run inside another run's call
(a sub-agent run by a tool) is a run of its own, under that call.

Every model call recorded here, every peer instrumentation's model
span the process's tracer provider starts with its attributes
(``PeerModelSpans``), and, while a simulated GPU follows them, the model
calls a hook sees and a peer records (``FollowedModelCall``), is also
kept in ``model_calls`` (``ModelCallLog``): in flight, and the recent
finished ones (bounded). The live blame reads it (the model server's
share, docs/attribution.md), and a simulated GPU follows it: busy while a
model call is in flight (``ModelCallLog.follow``, docs/gpu.md).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
from contextvars import ContextVar, Token
from typing import Any, Callable, Literal, Optional

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from agent_otel.support import forks
from agent_otel.capture.current import current_recorder
from agent_otel.capture.outcomes import error_type_of
from agent_otel.support.clock import now_ns
from agent_otel.records import NS_PER_S, ModelCall
from agent_otel.semconv import (
    ERROR_TYPE,
    GEN_AI_AGENT_NAME,
    GEN_AI_OPERATION_CHAT,
    GEN_AI_OPERATION_INVOKE_AGENT,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_STREAM,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    MODEL_OPERATIONS,
    OPENINFERENCE_LLM,
    OPENINFERENCE_MODEL_NAME,
    OPENINFERENCE_SPAN_KIND,
    SCOPE_NAME,
    TRACELOOP_LLM,
    TRACELOOP_SPAN_KIND,
    agent_span_name,
    model_span_name,
)

MODEL_SPANS_MODES = ("auto", "on", "off")
_mode = "auto"  # the model_spans setting, set by instrument()

# Instrumentations that record model calls themselves: every OpenInference
# instrumentation, and these OpenLLMetry / OpenTelemetry contrib ones
# (``opentelemetry.instrumentation.{name}``).
_PEER_PREFIX = "openinference.instrumentation."
_PEER_MODULES = frozenset(
    f"opentelemetry.instrumentation.{name}"
    for name in (
        "langchain",
        "llamaindex",
        "openai_agents",
        "crewai",
        "haystack",
        "openai",
        "openai_v2",
        "anthropic",
        "bedrock",
        "vertexai",
        "google_genai",
        "google_generativeai",
        "cohere",
        "mistralai",
        "groq",
        "ollama",
        "together",
        "replicate",
        "transformers",
        "watsonx",
        "sagemaker",
        "alephalpha",
        "writer",
        "litellm",
    )
)


# Finished model calls kept for the live blame (a few hundred bytes each).
MAX_FINISHED_MODEL_CALLS = 4096
# Model calls in flight kept at most: a span whose end never comes (a hook
# that missed it) does not grow the table for ever.
MAX_MODEL_CALLS_IN_FLIGHT = 4096


class ModelCallLog:
    """The model calls of this process: in flight, by key, and the recent
    finished ones (at most ``MAX_FINISHED_MODEL_CALLS``, oldest dropped).

    ``follow(listener)``: ``listener(True)`` when a model call starts and
    ``listener(False)`` when one ends, from the thread that started or
    ended it (a simulated GPU's ``model_started`` / ``model_ended``).
    Thread-safe; survives ``os.fork()`` (a child starts with no call in
    flight: the parent's threads that made them are not there).
    """

    def __init__(self, max_finished: int = MAX_FINISHED_MODEL_CALLS):
        self._lock = threading.Lock()
        self._in_flight: dict[object, ModelCall] = {}
        self._finished: collections.deque[ModelCall] = collections.deque(maxlen=max_finished)
        self._listeners: list[Callable[[bool], None]] = []
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = {}

    def start(self, key: object, call: ModelCall) -> None:
        """A model call began (``call.end_ns`` 0)."""
        with self._lock:
            if len(self._in_flight) >= MAX_MODEL_CALLS_IN_FLIGHT:
                self._in_flight.pop(next(iter(self._in_flight)))
            self._in_flight[key] = call
            listeners = list(self._listeners)
        for listener in listeners:
            _tell(listener, True)

    def first_token(self, key: object, at_ns: int) -> None:
        with self._lock:
            call = self._in_flight.get(key)
            if call is not None and call.first_chunk_s is None:
                call.first_chunk_s = max(0, at_ns - call.start_ns) / NS_PER_S

    def end(self, key: object, end_ns: int) -> None:
        """A model call ended (one not started here, or dropped, is ignored)."""
        with self._lock:
            call = self._in_flight.pop(key, None)
            if call is None:
                return
            call.end_ns = max(end_ns, call.start_ns + 1)
            self._finished.append(call)
            listeners = list(self._listeners)
        for listener in listeners:
            _tell(listener, False)

    def overlapping(self, since_ns: int) -> list[ModelCall]:
        """Copies of the calls in flight now and of the finished ones that ended after ``since_ns``."""
        with self._lock:
            calls = [dataclasses.replace(call) for call in self._in_flight.values()]
            calls += [call for call in self._finished if call.end_ns > since_ns]
        return calls

    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def follow(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(True)`` at each model call's start, ``listener(False)`` at its end."""
        with self._lock:
            self._listeners.append(listener)

    def unfollow(self, listener: Callable[[bool], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


def _tell(listener: Callable[[bool], None], started: bool) -> None:
    try:
        listener(started)
    except Exception:  # a listener's fault never breaks the agent's model call
        pass


model_calls = ModelCallLog()


class PeerModelSpans:
    """Puts other instrumentations' model spans (OpenTelemetry GenAI
    ``chat`` / ``text_completion`` / ``generate_content`` spans,
    OpenInference and OpenLLMetry LLM spans) in ``model_calls`` while they
    are in flight, when ``enabled``. agent-otel's own model spans are there
    already.

    Fed by a span processor added to the tracer provider only where a
    simulated GPU follows the model calls (``watch_peers``). It acts on
    model spans only: a tool span, started with its attributes or without
    them (deferred, ``capture.sdk_span``), is never one, so that processor
    declares itself ``blind_to_tool_spans`` and the tool spans keep their
    fast path. (The processor, an SDK class, is made there: this module
    loads with OpenTelemetry's API alone.)
    """

    enabled = False

    def on_start(self, span) -> None:
        if not self.enabled:
            return
        try:
            model = _peer_model(span)
            if model is not None:
                context = span.get_span_context()
                start = getattr(span, "start_time", None) or now_ns()
                model_calls.start(
                    ("peer", context.trace_id, context.span_id),
                    ModelCall(model, start, 0, context.trace_id, context.span_id),
                )
        except Exception:
            pass

    def on_end(self, span) -> None:
        if not self.enabled:
            return
        try:
            context = span.get_span_context()
            model_calls.end(("peer", context.trace_id, context.span_id), span.end_time or now_ns())
        except Exception:
            pass


peer_model_spans = PeerModelSpans()
_watched: list[Any] = []  # the providers peer_model_spans was added to (each once)


def watch_peers(provider) -> None:
    """Feed ``peer_model_spans`` the spans of ``provider`` (an SDK
    ``TracerProvider``) through a span processor, once per provider."""
    if any(watched is provider for watched in _watched) or not hasattr(provider, "add_span_processor"):
        return
    from opentelemetry.sdk.trace import SpanProcessor  # instrument() has loaded the SDK

    class PeerModelSpanProcessor(SpanProcessor):
        """The SDK's span processor interface over ``peer_model_spans``."""

        blind_to_tool_spans = True
        peers = peer_model_spans

        def on_start(self, span, parent_context=None) -> None:
            peer_model_spans.on_start(span)

        def on_end(self, span) -> None:
            peer_model_spans.on_end(span)

    provider.add_span_processor(PeerModelSpanProcessor())
    _watched.append(provider)
    del _watched[:-8]  # a few providers at most (one per instrument() that made one)


# The peers' instrumentation scopes whose model calls a framework hook
# follows itself (``FollowedModelCall``): their model spans start with no
# attributes (OpenInference's and OpenLLMetry's LangChain ones), so the hook,
# which sees the same calls through the framework's callbacks, keeps them in
# ``model_calls`` instead; their spans are not kept a second time. Set by
# the hooks while instrumented.
hook_followed_scopes: set[str] = set()


def _peer_model(span) -> Optional[str]:
    """The model of a peer's model span, or None for any other span."""
    scope = getattr(span, "instrumentation_scope", None)
    if scope is not None and (scope.name == SCOPE_NAME or scope.name in hook_followed_scopes):
        return None  # agent-otel's own (ModelSpan has it), or one a hook follows
    attributes = span.attributes or {}
    operation = attributes.get(GEN_AI_OPERATION_NAME)
    kind = attributes.get(OPENINFERENCE_SPAN_KIND) or attributes.get(TRACELOOP_SPAN_KIND)
    if operation not in MODEL_OPERATIONS and kind not in (OPENINFERENCE_LLM, TRACELOOP_LLM):
        return None
    model = attributes.get(GEN_AI_REQUEST_MODEL) or attributes.get(OPENINFERENCE_MODEL_NAME)
    return str(model) if model else str(span.name)


def configure(mode: str) -> None:
    """Set the ``model_spans`` mode (``instrument()`` does)."""
    global _mode
    _mode = mode


def peer_instrumentation() -> Optional[str]:
    """The module of an active instrumentation that records model calls, or None.

    Found among the OpenTelemetry instrumentors (``BaseInstrumentor``
    subclasses, singletons) that are instrumented now, so a peer started
    after ``instrument()`` is noticed at the next model call.
    """
    base = _base_instrumentor()
    if base is None:
        return None
    pending = list(base.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        module = cls.__module__
        if not (
            module.startswith(_PEER_PREFIX) or module.rsplit(".", 1)[0] in _PEER_MODULES or module in _PEER_MODULES
        ):
            continue
        instance = cls.__dict__.get("_instance")
        if instance is not None and getattr(instance, "_is_instrumented_by_opentelemetry", False):
            return module
    return None


def _base_instrumentor():
    module = sys.modules.get("opentelemetry.instrumentation.instrumentor")
    return getattr(module, "BaseInstrumentor", None)


def hooks_record() -> bool:
    """Whether the framework hooks record model spans now."""
    if current_recorder() is None or _mode == "off":
        return False
    return _mode == "on" or peer_instrumentation() is None


def hooks_follow() -> bool:
    """Whether the framework hooks that see the model calls a peer records
    keep them in ``model_calls`` (``FollowedModelCall``): while a simulated
    GPU follows the peers' model calls (``peer_model_spans.enabled``), unless
    ``model_spans`` is ``off``."""
    return peer_model_spans.enabled and current_recorder() is not None and _mode != "off"


# Time to first token is the time to the first piece of output: text (or a
# refusal, or audio), or a piece of a tool call's arguments; a chunk or event
# that carries none (a chat completions stream's role-only first chunk and
# its usage-only last one, the chunk naming a tool before its arguments, the
# Responses API's response.created, in_progress, output_item.added, ...) is
# not it. The Responses API stream events that carry output:
RESPONSE_OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.mcp_call_arguments.delta",
        "response.code_interpreter_call_code.delta",
        "response.audio.delta",
        "response.audio.transcript.delta",
    }
)


def response_event_has_output(event: Any) -> bool:
    """Whether a Responses API stream event is a token of the answer: an output delta, not empty."""
    return getattr(event, "type", None) in RESPONSE_OUTPUT_DELTAS and bool(getattr(event, "delta", None))


class ModelSpan:
    """One model call's span, from ``start`` to ``end``.

    Not made current (the hooks start and end it from callbacks, where a
    context attached in one might never be detached); ``model_span`` makes
    it current.
    """

    __slots__ = ("span", "start_ns", "first_chunk_ns", "input_tokens", "output_tokens", "response_model", "loop")

    def __init__(self, span, start_ns: int):
        self.span = span
        self.start_ns = start_ns
        self.first_chunk_ns = 0
        self.input_tokens: Optional[int] = None
        self.output_tokens: Optional[int] = None
        self.response_model: Optional[str] = None
        # The asyncio loop the call was made on (None: none running): while it
        # is in flight, a block of that loop keeps it waiting (in_flight_on).
        asyncio = sys.modules.get("asyncio")
        self.loop = asyncio._get_running_loop() if asyncio is not None else None
        if self.loop is not None and len(_in_flight) < MAX_IN_FLIGHT:
            _in_flight[id(self)] = self

    @property
    def trace_id(self) -> int:
        return self.span.get_span_context().trace_id

    @property
    def span_id(self) -> int:
        return self.span.get_span_context().span_id

    @classmethod
    def start(
        cls,
        model: str,
        operation: str = GEN_AI_OPERATION_CHAT,
        provider: Optional[str] = None,
        stream: Optional[bool] = None,
        context=None,
    ) -> Optional["ModelSpan"]:
        """Start a model call's span (None when not instrumented)."""
        rec = current_recorder()
        if rec is None:
            return None
        model = str(model) if model else "unknown"
        attributes: dict[str, Any] = {GEN_AI_OPERATION_NAME: operation, GEN_AI_REQUEST_MODEL: model}
        if provider:
            attributes[GEN_AI_PROVIDER_NAME] = str(provider)
        if stream is not None:
            attributes[GEN_AI_REQUEST_STREAM] = bool(stream)
        start_ns = now_ns()
        span = rec.tracer.start_span(
            model_span_name(operation, model),
            context=context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=start_ns,
        )
        call = cls(span, start_ns)
        context = span.get_span_context()
        model_calls.start(id(call), ModelCall(model, start_ns, 0, context.trace_id, context.span_id, operation))
        return call

    def headers(self, carrier: Optional[dict] = None) -> dict:
        """This call's trace context as HTTP headers (``traceparent``, and
        ``tracestate`` when set; the process's propagators): put them on the
        request to the model server, whose own span of the request (vLLM's
        ``llm_request``) then joins this call in ``agent-otel report``
        (docs/model-servers.md). Adds them to ``carrier`` when given."""
        with forks.background_import():  # any thread's first call: a fork meanwhile waits (agent_otel.support.forks)
            from opentelemetry import propagate  # here: loading the propagators is for the calls that send headers

        carrier = {} if carrier is None else carrier
        propagate.inject(carrier, context=trace_api.set_span_in_context(self.span))
        return carrier

    def first_chunk(self) -> None:
        """The first chunk of a streamed answer that carries output (a token) arrived
        (later calls change nothing). The hooks call it for such chunks only."""
        if not self.first_chunk_ns:
            self.first_chunk_ns = max(now_ns(), self.start_ns)  # the timeline may have followed the wall clock back
            model_calls.first_token(id(self), self.first_chunk_ns)

    def usage(self, input_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> None:
        """The tokens the model reported using."""
        if isinstance(input_tokens, int) and not isinstance(input_tokens, bool) and input_tokens >= 0:
            self.input_tokens = input_tokens
        if isinstance(output_tokens, int) and not isinstance(output_tokens, bool) and output_tokens >= 0:
            self.output_tokens = output_tokens

    def end(self, exc: Optional[BaseException] = None, error: Optional[tuple[str, str]] = None) -> None:
        """End the call; ``exc`` is the exception it raised, ``error`` an (error.type, message)
        where the framework reports a failure without the exception object."""
        now = max(now_ns(), self.start_ns)  # the timeline may have followed the wall clock back
        span = self.span
        attributes: dict[str, Any] = {}
        if self.input_tokens is not None:
            attributes[GEN_AI_USAGE_INPUT_TOKENS] = self.input_tokens
        if self.output_tokens is not None:
            attributes[GEN_AI_USAGE_OUTPUT_TOKENS] = self.output_tokens
        if self.response_model:
            attributes[GEN_AI_RESPONSE_MODEL] = str(self.response_model)
        if self.first_chunk_ns:
            attributes[GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = (self.first_chunk_ns - self.start_ns) / 1e9
        if exc is not None:
            attributes[ERROR_TYPE] = error_type_of(exc)
            span.record_exception(exc, timestamp=now, escaped=True)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        elif error is not None:
            attributes[ERROR_TYPE] = error[0]
            span.set_status(Status(StatusCode.ERROR, error[1]))
        if attributes:
            span.set_attributes(attributes)
        span.end(end_time=now)
        model_calls.end(id(self), now)
        _in_flight.pop(id(self), None)


class FollowedModelCall:
    """A model call a framework hook sees and another instrumentation records
    the span of (``hooks_record()`` false): no span, only its place in
    ``model_calls`` while in flight, so a simulated GPU is busy while it
    generates (``hooks_follow()``). The same methods as ``ModelSpan``."""

    __slots__ = ("start_ns", "first_chunk_ns", "response_model")

    def __init__(self, start_ns: int):
        self.start_ns = start_ns
        self.first_chunk_ns = 0
        self.response_model: Optional[str] = None

    @classmethod
    def start(cls, model: str, operation: str = GEN_AI_OPERATION_CHAT) -> Optional["FollowedModelCall"]:
        """Start following a model call (None unless ``hooks_follow()``)."""
        if not hooks_follow():
            return None
        call = cls(now_ns())
        model_calls.start(
            id(call), ModelCall(str(model) if model else "unknown", call.start_ns, 0, operation=operation)
        )
        return call

    def first_chunk(self) -> None:
        if not self.first_chunk_ns:
            self.first_chunk_ns = max(now_ns(), self.start_ns)
            model_calls.first_token(id(self), self.first_chunk_ns)

    def usage(self, input_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> None:
        """(The peer's span records them.)"""

    def end(self, exc: Optional[BaseException] = None, error: Optional[tuple[str, str]] = None) -> None:
        model_calls.end(id(self), max(now_ns(), self.start_ns))


# The model calls in flight on an asyncio loop, by id (at most MAX_IN_FLIGHT:
# one a hook never ended stays until the process ends, or a fork).
_in_flight: dict[int, ModelSpan] = {}
MAX_IN_FLIGHT = 10_000


def in_flight_on(loop: Any) -> list[ModelSpan]:
    """The model calls made on ``loop`` and in flight now (the loop monitor links a block of it to them)."""
    return [call for call in list(_in_flight.values()) if call.loop is loop]


def _forget_in_flight_after_fork() -> None:
    _in_flight.clear()  # the parent's calls, not the child's


forks.after_fork_in_child(_forget_in_flight_after_fork)


class _Unrecorded:
    """What ``model_span`` yields when not instrumented: every method does nothing."""

    span = trace_api.INVALID_SPAN
    response_model = None

    def first_chunk(self) -> None:
        pass

    def headers(self, carrier: Optional[dict] = None) -> dict:
        return {} if carrier is None else carrier

    def usage(self, input_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> None:
        pass


_UNRECORDED = _Unrecorded()


class model_span:
    """One model call as a GenAI span, current while the block runs.

    ::

        with agent_otel.model_span("gpt-4o", provider="openai") as call:
            reply = client.chat(...)
            call.usage(input_tokens=reply.usage.prompt_tokens, output_tokens=reply.usage.completion_tokens)

    ``operation``: ``chat`` (default), ``text_completion`` or
    ``generate_content``. Yields the call: ``call.first_chunk()`` when a
    streamed answer's first chunk arrives, ``call.usage(input_tokens=,
    output_tokens=)``, ``call.response_model = ...``, ``call.headers()``
    (the ``traceparent`` to send to the model server). An exception is
    recorded (``error.type``) and passes through unchanged. Works with
    ``with`` and ``async with``.
    """

    __slots__ = ("_model", "_operation", "_provider", "_stream", "_call", "_token")

    def __init__(
        self,
        model: str,
        *,
        operation: str = GEN_AI_OPERATION_CHAT,
        provider: Optional[str] = None,
        stream: Optional[bool] = None,
    ):
        self._model = model
        self._operation = operation
        self._provider = provider
        self._stream = stream
        self._call: Optional[ModelSpan] = None
        self._token: Optional[Token[Context]] = None

    def __enter__(self):
        call = self._call = ModelSpan.start(self._model, self._operation, self._provider, self._stream)
        if call is None:
            return _UNRECORDED
        self._token = context_api.attach(trace_api.set_span_in_context(call.span))
        return call

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        call, self._call = self._call, None
        if call is not None:
            if self._token is not None:
                context_api.detach(self._token)
            call.end(exc)
        return False

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> Literal[False]:
        return self.__exit__(exc_type, exc, tb)


# The agent run whose span is current in this context, as (owner, span): the
# object a framework hook opened it for, or None for the application's agent_span.
_current_run: ContextVar[Optional[tuple[Any, Any]]] = ContextVar("agent_otel_agent_run", default=None)


class FrameworkRun:
    """One run of a framework's agent as an ``invoke_agent {name}`` span, for the hooks.

    ``start(name, owner)`` where a run of the agent or graph ``owner``
    begins; None when not instrumented, or when this run is already one
    (the run this hook opened for the same ``owner``: a graph's ``invoke``
    running its own ``stream``). Directly inside the application's own
    ``agent_span`` the run is that span (it wins: no span of its own). A run
    of another agent started inside a run (a sub-agent: inside a tool call,
    a subgraph in a node, a managed agent its manager calls) is a run of its
    own, a child of the span current there. ``enter()`` makes the span
    current (and ``exit(tokens)`` undoes it) while the framework's own code
    runs, so what it starts meanwhile is in the run's trace; ``end(exc)``
    ends it.
    """

    __slots__ = ("span", "owner", "own")

    def __init__(self, span: trace_api.Span, owner: Any, own: bool = True):
        self.span = span
        self.owner = owner
        self.own = own  # False: the application's agent_span, which this run is

    @classmethod
    def start(cls, name: Any, owner: Any) -> Optional["FrameworkRun"]:
        rec = current_recorder()
        if rec is None:
            return None
        try:
            run = _current_run.get()
            if run is not None:
                current = trace_api.get_current_span()
                if run[1] is current:
                    if run[0] is None:  # right inside the application's agent_span: the run is that span
                        return cls(current, owner, own=False)
                    if run[0] is owner:  # this very run, entered again
                        return None
            name = str(name) if name else "agent"
            span = rec.tracer.start_span(
                agent_span_name(name),
                attributes={GEN_AI_OPERATION_NAME: GEN_AI_OPERATION_INVOKE_AGENT, GEN_AI_AGENT_NAME: name},
                start_time=now_ns(),
            )
        except Exception:  # telemetry only: the run goes on untraced
            return None
        return cls(span, owner)

    def enter(self) -> tuple[Optional[Token[Context]], Token]:
        token = context_api.attach(trace_api.set_span_in_context(self.span)) if self.own else None
        return token, _current_run.set((self.owner, self.span))

    def exit(self, tokens: tuple[Optional[Token[Context]], Token]) -> None:
        try:
            _current_run.reset(tokens[1])
        except ValueError:  # (a token of another context: the framework's code switched contexts)
            pass
        if tokens[0] is not None:
            context_api.detach(tokens[0])

    def end(self, exc: Optional[BaseException] = None) -> None:
        if self.own:
            _end_run(self.span, exc)


def _end_run(span: trace_api.Span, exc: Optional[BaseException]) -> None:
    """End an agent run's span; ``exc``, the exception that ended the run, is recorded."""
    now = max(now_ns(), getattr(span, "start_time", None) or 0)  # as in ModelSpan.end
    if exc is not None and not isinstance(exc, GeneratorExit):  # (a consumer that stopped early is no error)
        span.set_attribute(ERROR_TYPE, error_type_of(exc))
        span.record_exception(exc, timestamp=now, escaped=True)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.end(end_time=now)


class agent_span:
    """One agent run (a turn, a request) as an ``invoke_agent {name}`` span, current while the block runs.

    ::

        with agent_otel.agent_span("support"):
            answer = agent.run(question)

    The report splits each such span's time into model, tool queue, tool
    exec and other time (docs/report.md). An exception is recorded and
    passes through unchanged.
    """

    __slots__ = ("_name", "_span", "_token", "_run_token")

    def __init__(self, name: str):
        self._name = str(name)
        self._span: Optional[trace_api.Span] = None
        self._token: Optional[Token[Context]] = None
        self._run_token: Optional[Token] = None

    def __enter__(self):
        rec = current_recorder()
        if rec is None:
            return trace_api.INVALID_SPAN
        span = self._span = rec.tracer.start_span(
            agent_span_name(self._name),
            attributes={GEN_AI_OPERATION_NAME: GEN_AI_OPERATION_INVOKE_AGENT, GEN_AI_AGENT_NAME: self._name},
            start_time=now_ns(),
        )
        self._token = context_api.attach(trace_api.set_span_in_context(span))
        self._run_token = _current_run.set((None, span))  # a framework's run inside is this one
        return span

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        span, self._span = self._span, None
        if span is not None:
            if self._run_token is not None:
                try:
                    _current_run.reset(self._run_token)
                except ValueError:
                    pass
                self._run_token = None
            if self._token is not None:
                context_api.detach(self._token)
            _end_run(span, exc)
        return False

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> Literal[False]:
        return self.__exit__(exc_type, exc, tb)
