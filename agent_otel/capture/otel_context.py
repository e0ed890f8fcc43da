"""The current OpenTelemetry context on the hot path: read, set and reset
through the ``ContextVar`` the API keeps it in, found once through the
public API.

Why: ``opentelemetry.context.get_current``, ``attach`` and ``detach`` are
two Python calls each around one ``ContextVar`` method, and
``trace.set_span_in_context`` two more around a dict copy; a tool call makes
all four. Here they are the ``ContextVar``'s own methods (C) and one dict
copy.

What it relies on, checked once at import (``_find``): the API's runtime
context is its default, ``ContextVarsRuntimeContext``, keeping the current
``Context`` in a ``ContextVar`` (``_current_context``) that a public
``attach`` sets and a public ``get_current`` reads; and a ``Context`` holds
the current span under one key (``SPAN_KEY``, found with
``set_span_in_context`` and checked with ``get_current_span``). Where either
is not so (another runtime context chosen with ``OTEL_PYTHON_CONTEXT``, a
future API that keeps it otherwise) the public functions are used.
``tests/test_sdk_span.py`` checks that the installed API passes and that
both ways give the same contexts.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Callable, Optional

from opentelemetry import context as context_api
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, get_current_span, set_span_in_context


def _span_key() -> Optional[str]:
    """The key under which a ``Context`` holds the current span; None if it is not held that way."""
    context = set_span_in_context(INVALID_SPAN, Context())
    if len(context) != 1:
        return None
    key = next(iter(context))
    probe = NonRecordingSpan(INVALID_SPAN.get_span_context())
    return key if get_current_span(Context({key: probe})) is probe else None


def _find() -> Optional[ContextVar]:
    """The ``ContextVar`` that the public ``attach`` sets and ``get_current`` reads, or None."""
    runtime = getattr(context_api, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime) is not ContextVarsRuntimeContext or type(var) is not ContextVar:
        return None
    probe = Context({"agent-otel-probe": True})
    token = context_api.attach(probe)
    try:
        seen = var.get() is probe and context_api.get_current() is probe
    finally:
        context_api.detach(token)
    return var if seen and var.get() is not probe else None


SPAN_KEY: Optional[str] = _span_key()
CONTEXT_VAR: Optional[ContextVar] = _find()

# The current Context; make one current, returning a token for reset().
get_current: Callable[[], Context] = CONTEXT_VAR.get if CONTEXT_VAR is not None else context_api.get_current
attach: Callable[[Context], Token] = CONTEXT_VAR.set if CONTEXT_VAR is not None else context_api.attach
# Restore the context a token replaced; raises where the API's detach logs
# (callers catch, and call detach() for the API's log line).
reset: Callable[[Token], None] = CONTEXT_VAR.reset if CONTEXT_VAR is not None else context_api.detach
detach = context_api.detach


def with_span(span, context: Context) -> Context:
    """``set_span_in_context(span, context)``: a copy of ``context`` holding ``span``."""
    if SPAN_KEY is None:
        return set_span_in_context(span, context)
    values = context.copy()
    values[SPAN_KEY] = span
    return Context(values)


def current_span_in(context: Context):
    """``get_current_span(context)`` where that is a dict lookup; None when no span is set."""
    return context.get(SPAN_KEY) if SPAN_KEY is not None else get_current_span(context)
