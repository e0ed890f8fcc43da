"""The plain tool wrappers: one ``execute_tool`` span per call.

``wrap(fn, meta)`` picks the wrapper for the kind of callable (function,
coroutine function, generator, async generator); ``tool_span`` is the
context-manager form. The wrappers keep everything a framework reads from a
function (signature, ``__wrapped__``, ``__doc__``, ``__name__``,
annotations, and whether it is a coroutine or generator function), pass
exceptions through as the same object, and call straight through when
``instrument()`` has not been called. The public ``agent_otel.tool``
decorator (``agent_otel/capture/wrappers.py``) adds the remedies on top.
"""

from __future__ import annotations

import functools
import sys
from time import thread_time_ns
from typing import TYPE_CHECKING, Callable, Literal, Optional

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel.capture.current import current_recorder
from agent_otel.capture import stacks
from agent_otel.capture.meta import (
    TOOL_MARK,
    ToolMeta,
    cpu_clock,
    is_async_gen,
    is_coroutine,
    is_gen,
    meta_for,
    name_of,
)
from agent_otel.semconv import GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_RESULT, TOOL_TYPE_FUNCTION

if TYPE_CHECKING:
    # Only the type checker: the recorder loads OpenTelemetry's SDK, and a
    # library decorates its tools with only the API loaded (instrument()
    # loads the SDK and installs the recorder these wrappers ask for).
    from agent_otel.capture.recorder import ActiveCall, Recorder


def wrap(fn: Callable, meta: ToolMeta) -> Callable:
    """The plain wrapper of ``fn`` for its kind, marked as a tool, with ``fn``'s metadata."""
    if is_async_gen(fn):
        wrapper = _wrap_async_generator(fn, meta)
    elif is_gen(fn):
        wrapper = _wrap_generator(fn, meta)
    elif is_coroutine(fn):
        wrapper = _wrap_coroutine(fn, meta)
    else:
        wrapper = _wrap_function(fn, meta)
    return finish_wrapper(wrapper, fn, meta)


def finish_wrapper(wrapper: Callable, fn: Callable, meta: ToolMeta) -> Callable:
    """Give ``wrapper`` the metadata of ``fn`` and the tool mark."""
    functools.update_wrapper(wrapper, fn)
    if isinstance(fn, functools.partial) or not hasattr(fn, "__name__"):
        wrapper.__name__ = wrapper.__qualname__ = name_of(fn)
    setattr(wrapper, TOOL_MARK, meta)
    return wrapper


def _record_arguments(rec, active: ActiveCall, args, kwargs) -> None:
    # Only the layer that owns the span records (a hooked framework running
    # this tool records the input it gave it).
    if rec.record_arguments and active.call is not None:
        rec.record_payload(active.span, GEN_AI_TOOL_CALL_ARGUMENTS, {"args": args, "kwargs": kwargs})


def _wrap_function(fn, meta: ToolMeta):
    # A sync tool runs on one thread from start to end: that thread's CPU
    # clock over the call is the call's CPU time (agent.tool.exec.cpu_time),
    # read on the calls meta.cpu_clock picks (inlined: the hot path).
    def wrapper(*args, **kwargs):
        rec = current_recorder()
        if rec is None:
            return fn(*args, **kwargs)
        active = rec.begin(meta)
        if rec.record_arguments:
            _record_arguments(rec, active, args, kwargs)
        skip = meta.cpu_skip
        if skip:
            meta.cpu_skip = skip - 1
            cpu = None
        else:
            cpu = thread_time_ns()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            rec.end(active, exc, None if cpu is None else thread_time_ns() - cpu)
            raise
        if cpu is not None:
            cpu = thread_time_ns() - cpu
        if rec.record_results and active.call is not None:
            rec.record_payload(active.span, GEN_AI_TOOL_CALL_RESULT, result)
        rec.end(active, None, cpu)
        return result

    return wrapper


def _wrap_coroutine(fn, meta: ToolMeta):
    async def wrapper(*args, **kwargs):
        rec = current_recorder()
        if rec is None:
            return await fn(*args, **kwargs)
        active = rec.begin(meta)
        _record_arguments(rec, active, args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            rec.end(active, exc)
            raise
        if rec.record_results and active.call is not None:
            rec.record_payload(active.span, GEN_AI_TOOL_CALL_RESULT, result)
        rec.end(active)
        return result

    return wrapper


def _wrap_generator(fn, meta: ToolMeta):
    # The span covers the whole iteration; it is the current span only while
    # the generator's own code runs, never while the consumer's code does.
    def wrapper(*args, **kwargs):
        rec = current_recorder()
        if rec is None:
            return (yield from fn(*args, **kwargs))
        active = rec.begin(meta, attach=False)
        _record_arguments(rec, active, args, kwargs)
        span_context = trace_api.set_span_in_context(active.span)
        try:
            generator = fn(*args, **kwargs)
            method, value = generator.send, None
            while True:
                token = context_api.attach(span_context)
                try:
                    item = method(value)
                except StopIteration as stop:
                    result = stop.value
                    break
                finally:
                    context_api.detach(token)
                try:
                    value = yield item
                    method = generator.send
                except GeneratorExit:
                    generator.close()
                    raise
                except BaseException as thrown:
                    method, value = generator.throw, thrown
        except BaseException as exc:
            rec.end(active, exc)
            raise
        rec.end(active)
        return result

    return wrapper


def _wrap_async_generator(fn, meta: ToolMeta):
    # As _wrap_generator, but an async generator cannot ``yield from``: the
    # loop forwards values, exceptions and close by hand, so it serves the
    # uninstrumented call too (``async for`` alone would drop ``asend``
    # values and leave the inner generator unclosed on ``aclose``).
    async def wrapper(*args, **kwargs):
        rec = current_recorder()
        active = span_context = None
        if rec is not None:
            active = rec.begin(meta, attach=False)
            _record_arguments(rec, active, args, kwargs)
            span_context = trace_api.set_span_in_context(active.span)
        try:
            generator = fn(*args, **kwargs)
            method, value = generator.asend, None
            while True:
                token = context_api.attach(span_context) if span_context is not None else None
                try:
                    item = await method(value)
                except StopAsyncIteration:
                    break
                finally:
                    if token is not None:
                        context_api.detach(token)
                try:
                    value = yield item
                    method = generator.asend
                except GeneratorExit:
                    await generator.aclose()
                    raise
                except BaseException as thrown:
                    method, value = generator.athrow, thrown
        except BaseException as exc:
            if active is not None and rec is not None:
                rec.end(active, exc)
            raise
        if active is not None and rec is not None:
            rec.end(active)

    return wrapper


# The loop monitor finds the calls these wrappers run in their ``active`` local.
stacks.register(stacks.inner_code(_wrap_function), sync=True)
for _wrap in (_wrap_coroutine, _wrap_generator, _wrap_async_generator):
    stacks.register(stacks.inner_code(_wrap))


class tool_span:
    """The context-manager form of ``@tool``, for code that runs a tool inline.

    ::

        with agent_otel.tool_span("web_search", call_id=call.id) as span:
            result = search(query)

    Works with ``with`` and ``async with``; yields the span (a non-recording
    one when not instrumented). Exceptions pass through unchanged. A plain
    ``with`` outside any running event loop runs on one thread, and its CPU
    time is recorded; ``async with``, or ``with`` in a coroutine, may let
    other coroutines run on the thread meanwhile, and is not.
    """

    __slots__ = ("_meta", "_call_id", "_recorder", "_active", "_cpu", "_frame")

    def __init__(
        self,
        name: str,
        *,
        call_id: Optional[str] = None,
        description: Optional[str] = None,
        tool_type: str = TOOL_TYPE_FUNCTION,
    ):
        self._meta = meta_for(name, description, tool_type)
        self._call_id = call_id
        self._recorder: Optional[Recorder] = None
        self._active: Optional[ActiveCall] = None
        self._cpu: Optional[int] = None
        self._frame = 0

    def __enter__(self):
        span = self._enter()
        if self._active is not None:
            # Outside a running event loop (asyncio's, read without importing
            # asyncio: no loop runs before something imports it).
            asyncio = sys.modules.get("asyncio")
            if asyncio is None or asyncio._get_running_loop() is None:
                self._cpu = cpu_clock(self._meta)
        return span

    def _enter(self):
        rec = self._recorder = current_recorder()
        if rec is None:
            return trace_api.INVALID_SPAN
        self._active = rec.begin(self._meta, self._call_id)
        # The block runs in the caller's frame (of __enter__ or __aenter__):
        # the loop monitor finds the call there.
        frame = sys._getframe(2)
        self._frame = id(frame)
        stacks.enter_inline(frame, self._active)
        return self._active.span

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if self._active is not None and self._recorder is not None:
            active, self._active = self._active, None
            cpu, self._cpu = self._cpu, None
            stacks.exit_inline(self._frame)
            self._recorder.end(active, exc, None if cpu is None else thread_time_ns() - cpu)
        return False

    async def __aenter__(self):
        return self._enter()

    async def __aexit__(self, exc_type, exc, tb) -> Literal[False]:
        return self.__exit__(exc_type, exc, tb)
