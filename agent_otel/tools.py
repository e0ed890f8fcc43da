"""``@tool`` and ``tool_span``: one ``execute_tool`` span per tool call.

The wrappers keep everything a framework reads from a function (signature,
``__wrapped__``, ``__doc__``, ``__name__``, annotations, and whether it is a
coroutine or generator function), pass exceptions through as the same
object, and call straight through when ``instrument()`` has not been called.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, overload

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel import recorder as _recorder
from agent_otel.recorder import ActiveCall, ToolMeta

F = TypeVar("F", bound=Callable[..., Any])

# Set on every wrapper that starts a tool call, so the executor hook can tell
# a submitted tool from other work. Holds a function (target) -> tool name.
TOOL_MARK = "__agent_otel_tool__"


def _name_of(fn: Callable) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _first_doc_line(fn: Callable) -> Optional[str]:
    doc = inspect.getdoc(fn) if not isinstance(fn, functools.partial) else inspect.getdoc(fn.func)
    return doc.strip().splitlines()[0] if doc and doc.strip() else None


def _is_async_gen(fn: Callable) -> bool:
    return inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(getattr(fn, "__call__", None))


def _is_gen(fn: Callable) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__call__", None))


def _is_coroutine(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


@overload
def tool(fn: F) -> F: ...
@overload
def tool(*, name: Optional[str] = None, description: Optional[str] = None,
         tool_type: str = "function", pool: Optional[str] = None, timeout: Optional[float] = None,
         retries: int = 0, retry_interval: float = 0.1, fallback: Optional[Callable] = None,
         cache: Any = None) -> Callable[[F], F]: ...


def tool(fn=None, *, name=None, description=None, tool_type="function",
         pool=None, timeout=None, retries=0, retry_interval=0.1, fallback=None, cache=None):
    """Trace every call of ``fn`` as an ``execute_tool {name}`` span.

    Works on functions, coroutine functions, generators, async generators,
    methods, callable objects and ``functools.partial``. The name defaults to
    the function's ``__name__`` and the description to the first line of its
    docstring.

    ``pool``, ``timeout``, ``retries``, ``retry_interval``, ``fallback`` and
    ``cache`` add the remedies of ``agent_otel.remedies`` (docs/remedies.md);
    without them the wrapper is the plain one below.
    """
    options = dict(name=name, description=description, tool_type=tool_type, pool=pool, timeout=timeout,
                   retries=retries, retry_interval=retry_interval, fallback=fallback, cache=cache)
    if fn is None:
        return lambda f: tool(f, **options)
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(tool(fn.__func__, **options))
    meta = ToolMeta(name or _name_of(fn), description or _first_doc_line(fn), tool_type)
    if pool is not None or timeout is not None or retries or fallback is not None or cache:
        from agent_otel.remedies.policy import wrap  # imported here: remedies import this module

        wrapper = wrap(fn, meta, pool=pool, timeout=timeout, retries=retries, retry_interval=retry_interval,
                       fallback=fallback, cache=cache)
    elif _is_async_gen(fn):
        wrapper = _wrap_async_generator(fn, meta)
    elif _is_gen(fn):
        wrapper = _wrap_generator(fn, meta)
    elif _is_coroutine(fn):
        wrapper = _wrap_coroutine(fn, meta)
    else:
        wrapper = _wrap_function(fn, meta)
    functools.update_wrapper(wrapper, fn)
    if isinstance(fn, functools.partial) or not hasattr(fn, "__name__"):
        wrapper.__name__ = wrapper.__qualname__ = _name_of(fn)
    setattr(wrapper, TOOL_MARK, meta)
    return wrapper


def _record_arguments(rec, active: ActiveCall, args, kwargs) -> None:
    if rec.record_arguments:
        rec.record_payload(active.span, "gen_ai.tool.call.arguments", {"args": args, "kwargs": kwargs})


def _wrap_function(fn, meta: ToolMeta):
    def wrapper(*args, **kwargs):
        rec = _recorder.current
        if rec is None:
            return fn(*args, **kwargs)
        active = rec.begin(meta)
        _record_arguments(rec, active, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            rec.end(active, exc)
            raise
        if rec.record_results:
            rec.record_payload(active.span, "gen_ai.tool.call.result", result)
        rec.end(active)
        return result

    return wrapper


def _wrap_coroutine(fn, meta: ToolMeta):
    async def wrapper(*args, **kwargs):
        rec = _recorder.current
        if rec is None:
            return await fn(*args, **kwargs)
        active = rec.begin(meta)
        _record_arguments(rec, active, args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            rec.end(active, exc)
            raise
        if rec.record_results:
            rec.record_payload(active.span, "gen_ai.tool.call.result", result)
        rec.end(active)
        return result

    return wrapper


def _wrap_generator(fn, meta: ToolMeta):
    # The span covers the whole iteration; it is the current span only while
    # the generator's own code runs, never while the consumer's code does.
    def wrapper(*args, **kwargs):
        rec = _recorder.current
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
        rec = _recorder.current
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
            if active is not None:
                rec.end(active, exc)
            raise
        if active is not None:
            rec.end(active)

    return wrapper


_META_CACHE: dict[tuple, ToolMeta] = {}
_META_CACHE_LIMIT = 10_000


def _meta_for(name: str, description: Optional[str], tool_type: str) -> ToolMeta:
    key = (name, description, tool_type)
    meta = _META_CACHE.get(key)
    if meta is None:
        meta = ToolMeta(name, description, tool_type)
        if len(_META_CACHE) < _META_CACHE_LIMIT:
            _META_CACHE[key] = meta
    return meta


class tool_span:
    """The context-manager form of ``@tool``, for code that runs a tool inline.

    ::

        with agent_otel.tool_span("web_search", call_id=call.id) as span:
            result = search(query)

    Works with ``with`` and ``async with``; yields the span (a non-recording
    one when not instrumented). Exceptions pass through unchanged.
    """

    __slots__ = ("_meta", "_call_id", "_recorder", "_active")

    def __init__(self, name: str, *, call_id: Optional[str] = None,
                 description: Optional[str] = None, tool_type: str = "function"):
        self._meta = _meta_for(name, description, tool_type)
        self._call_id = call_id
        self._recorder = None
        self._active: Optional[ActiveCall] = None

    def __enter__(self):
        rec = self._recorder = _recorder.current
        if rec is None:
            return trace_api.INVALID_SPAN
        self._active = rec.begin(self._meta, self._call_id)
        return self._active.span

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._active is not None:
            active, self._active = self._active, None
            self._recorder.end(active, exc)
        return False

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        return self.__exit__(exc_type, exc, tb)
