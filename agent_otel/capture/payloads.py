"""The text a tool call's span carries about its data, and how it is made safe.

Four kinds of text leave the process from a tool call: its arguments and
result (only when ``record_arguments`` / ``record_results`` opt in), and,
when it fails, the exception's message and stack trace and the span's
status description. Each goes through the same steps, in
``Recorder.text``: the user's ``redact(attribute, text)`` hook, then
``valid_text`` (UTF-8, capped). A hook that raises gives
``<redaction failed>``, never the text it was given.

``record_exception_messages`` (default on) decides whether the message is
recorded at all. Off, an error records the exception's type and its stack
frames, and every message line (of the exception and of the ones it was
raised from) is left out: ``exception_text`` below.

The attribute names the hook receives: ``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``, ``exception.message``,
``exception.stacktrace`` and ``otel.status_description``.
"""

from __future__ import annotations

import sys
import traceback
from typing import Optional

from agent_otel.support.text import valid_text

STATUS_DESCRIPTION = "otel.status_description"  # the name redact() sees for a span's status description
REDACTION_FAILED = "<redaction failed>"
UNREPRESENTABLE = "<unrepresentable>"
# A stack trace keeps its end (the innermost frames and the exception) within this.
STACKTRACE_LIMIT = 16 * 1024

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def message_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a user's __str__ that fails must not fail the tool
        return UNREPRESENTABLE


def qualified_name(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def exception_text(exc: BaseException, with_messages: bool) -> str:
    """The stack trace as Python prints it; without messages, each exception of
    the chain is named by its type only (no message, no notes)."""
    if with_messages:
        try:
            return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:
            with_messages = False
    chain: list[tuple[BaseException, str]] = []  # newest first, with how it relates to the next
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        following: Optional[BaseException]
        if current.__cause__ is not None:
            following, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            following, link = current.__context__, _CONTEXT
        else:
            following, link = None, ""
        chain.append((current, link))
        current = following
    parts: list[str] = []
    for each, link in reversed(chain):  # the oldest first, as Python prints them
        if parts:
            parts.append(link)
        if each.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(each.__traceback__))
        parts.append(qualified_name(each) + "\n")
    return "".join(parts)


def keep_end(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, keeping its end (where a stack trace says most)."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def redacted(redact, attribute: str, text: str, limit: int) -> str:
    """``text`` through the user's hook, made valid, and cut after ``limit``
    characters (an ellipsis marks the cut)."""
    if redact is not None:
        try:
            text = redact(attribute, text)
        except Exception:
            return REDACTION_FAILED
        if not isinstance(text, str):
            text = REDACTION_FAILED if text is None else str(text)
    text = valid_text(text, sys.maxsize)
    return text if len(text) <= limit else text[:limit] + "…"
