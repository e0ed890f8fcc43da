"""What an exception means for a call: its ``agent.tool.outcome`` and its
``error.type``. Shared by the recorder, the model and agent spans and the
remedies; light (no OpenTelemetry), so the span helpers load without the SDK.
"""

from __future__ import annotations

import concurrent.futures
import sys

from agent_otel.semconv import OUTCOME_CANCELLED, OUTCOME_ERROR, OUTCOME_TIMEOUT
from agent_otel.support.text import NAME_LIMIT, valid_text

# Exceptions that mean "the call ran out of time" or "was cancelled", whichever
# module raised them (one class from Python 3.11 on, up to three before).
# asyncio's are read from asyncio once it is imported (none of its exceptions
# exists before): instrument() does not import asyncio.
TIMEOUT_ERRORS = tuple({TimeoutError, concurrent.futures.TimeoutError})
CANCELLED_ERRORS = (concurrent.futures.CancelledError, GeneratorExit)


def outcome_of(exc: BaseException) -> str:
    asyncio = sys.modules.get("asyncio")
    if isinstance(exc, CANCELLED_ERRORS) or isinstance(exc, getattr(asyncio, "CancelledError", ())):
        return OUTCOME_CANCELLED
    if isinstance(exc, TIMEOUT_ERRORS) or isinstance(exc, getattr(asyncio, "TimeoutError", ())):
        return OUTCOME_TIMEOUT
    return OUTCOME_ERROR


def error_type_of(exc: BaseException) -> str:
    """The exception's type as ``error.type`` names it, cut to ``NAME_LIMIT``
    (a class made at run time may have any name; only a failed call pays the check)."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return name if len(name) <= NAME_LIMIT and name.isascii() else valid_text(name, NAME_LIMIT)
