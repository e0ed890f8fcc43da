"""``@agent_otel.tool``: the public decorator.

It names the tool and picks the wrapper: the plain one of
``agent_otel.capture.wrappers`` (one ``execute_tool`` span per call), or,
when a remedy option is given (``pool``, ``timeout``, ``retries``,
``fallback``, ``cache``), the remedy wrapper of
``agent_otel.remedies.policy``, which records the same span.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar, overload

from agent_otel.capture.meta import ToolMeta, first_doc_line, name_of
from agent_otel.capture.wrappers import tool_span, wrap
from agent_otel.remedies import policy
from agent_otel.semconv import TOOL_TYPE_FUNCTION

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["tool", "tool_span"]


@overload
def tool(fn: F) -> F: ...
@overload
def tool(
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    tool_type: str = TOOL_TYPE_FUNCTION,
    pool: Optional[str] = None,
    timeout: Optional[float] = None,
    retries: int = 0,
    retry_interval: float = 0.1,
    fallback: Optional[Callable] = None,
    cache: Any = None,
) -> Callable[[F], F]: ...


def tool(
    fn=None,
    *,
    name=None,
    description=None,
    tool_type=TOOL_TYPE_FUNCTION,
    pool=None,
    timeout=None,
    retries=0,
    retry_interval=0.1,
    fallback=None,
    cache=None,
):
    """Trace every call of ``fn`` as an ``execute_tool {name}`` span.

    Works on functions, coroutine functions, generators, async generators,
    methods, callable objects and ``functools.partial``. The name defaults to
    the function's ``__name__`` and the description to the first line of its
    docstring.

    ``pool``, ``timeout``, ``retries``, ``retry_interval``, ``fallback`` and
    ``cache`` add the remedies of ``agent_otel.remedies`` (docs/remedies.md);
    without them the wrapper is the plain one.
    """
    options = dict(
        name=name,
        description=description,
        tool_type=tool_type,
        pool=pool,
        timeout=timeout,
        retries=retries,
        retry_interval=retry_interval,
        fallback=fallback,
        cache=cache,
    )
    if fn is None:
        return lambda f: tool(f, **options)
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(tool(fn.__func__, **options))
    meta = ToolMeta(name or name_of(fn), description or first_doc_line(fn), tool_type)
    if pool is not None or timeout is not None or retries or fallback is not None or cache:
        return policy.wrap(
            fn,
            meta,
            pool=pool,
            timeout=timeout,
            retries=retries,
            retry_interval=retry_interval,
            fallback=fallback,
            cache=cache,
        )
    return wrap(fn, meta)
