"""``@agent_otel.tool``: the public decorator.

It names the tool and picks the wrapper: the plain one of
``agent_otel.capture.wrappers`` (one ``execute_tool`` span per call), or,
when a remedy option is given (``agent_otel.remedies.options``), the
remedy wrapper of ``agent_otel.remedies.policy``, which records the same
span.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, TypeVar, overload

from agent_otel.capture.meta import ToolMeta, first_doc_line, name_of
from agent_otel.capture.wrappers import tool_span, wrap
from agent_otel.remedies import options as remedy_options
from agent_otel.semconv import TOOL_TYPE_FUNCTION

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["tool", "tool_span"]


# What type checkers read. The remedy options are declared once, in
# agent_otel/remedies/options.py; tests/test_tool_options.py holds this
# overload equal to that declaration.
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


def tool(fn=None, *, name=None, description=None, tool_type=TOOL_TYPE_FUNCTION, **remedies):
    """Trace every call of ``fn`` as an ``execute_tool {name}`` span.

    Works on functions, coroutine functions, generators, async generators,
    methods, callable objects and ``functools.partial``. The name defaults to
    the function's ``__name__`` and the description to the first line of its
    docstring.

    The remedy options (the keywords after ``tool_type``; docs/remedies.md
    has their table) add the remedies of ``agent_otel.remedies``; without
    them the wrapper is the plain one.

    Decorating loads OpenTelemetry's API only, so a library can decorate its
    tools at import time; the calls are recorded once the application calls
    ``instrument()``, and run straight through until then.
    """
    for key in remedies:
        if key not in remedy_options.OPTIONS:
            raise TypeError(f"tool() got an unexpected keyword argument {key!r}")
    values = {**remedy_options.DEFAULTS, **remedies}
    if fn is None:
        return lambda f: _decorate(f, name, description, tool_type, values)
    return _decorate(fn, name, description, tool_type, values)


def _decorate(fn, name, description, tool_type, values):
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(_decorate(fn.__func__, name, description, tool_type, values))
    meta = ToolMeta(name or name_of(fn), description or first_doc_line(fn), tool_type)
    if remedy_options.wanted(values):
        from agent_otel.remedies import policy  # (here: a plain tool loads no pools, no cache)

        return policy.wrap(fn, meta, values)
    return wrap(fn, meta)


# The signature it always had, from the declaration (help(), IDEs, frameworks that read it).
tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("description", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("tool_type", inspect.Parameter.KEYWORD_ONLY, default=TOOL_TYPE_FUNCTION),
        *(
            inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default)
            for option in remedy_options.REMEDY_OPTIONS
        ),
    ]
)
