"""What is fixed about a tool: its name, its span's start attributes, and how
a wrapped function tells the executor hook that it is a tool.

Shared by the plain wrappers (``wrappers.py``), the executor hook, the
framework hooks and the remedies, so none of them imports another's
internals.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

from opentelemetry.util.types import AttributeValue

from agent_otel.semconv import (
    AGENT_TOOL_EXECUTOR,
    AGENT_TOOL_OUTCOME,
    AGENT_TOOL_QUEUE_DURATION,
    EXECUTOR_DIRECT,
    GEN_AI_OPERATION_EXECUTE_TOOL,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_DESCRIPTION,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    OUTCOME_OK,
    TOOL_TYPE_FUNCTION,
    tool_span_name,
)
from agent_otel.text import NAME_LIMIT, valid_text

# The longest tool description put on a span, in characters.
DESCRIPTION_LIMIT = 4096

# Set on every wrapper that starts a tool call, so the executor hook can tell
# a submitted tool from other work. Holds the ``ToolMeta``, or a function
# (target) -> tool name where the name is known only from the instance.
TOOL_MARK = "__agent_otel_tool__"


class ToolMeta:
    """What is fixed about a tool: its name and the span attributes set at start."""

    __slots__ = ("name", "description", "tool_type", "span_name", "start_attributes", "direct_attributes")

    def __init__(self, name: str, description: Optional[str] = None, tool_type: str = TOOL_TYPE_FUNCTION):
        # Names come from anywhere (MCP servers, model output): made valid once, here.
        name = valid_text(name, NAME_LIMIT)
        description = valid_text(description, DESCRIPTION_LIMIT) if description else description
        tool_type = valid_text(tool_type, NAME_LIMIT)
        self.name = name
        self.description = description
        self.tool_type = tool_type
        self.span_name = tool_span_name(name)
        attributes: dict[str, AttributeValue] = {
            GEN_AI_OPERATION_NAME: GEN_AI_OPERATION_EXECUTE_TOOL,
            GEN_AI_TOOL_NAME: name,
            GEN_AI_TOOL_TYPE: tool_type,
        }
        if description:
            attributes[GEN_AI_TOOL_DESCRIPTION] = description
        self.start_attributes = attributes
        # A direct call's queue time, executor and (until an exception says
        # otherwise) outcome are known at start: set with the span, they
        # cost one attribute pass instead of two.
        self.direct_attributes: dict[str, AttributeValue] = {
            **attributes,
            AGENT_TOOL_QUEUE_DURATION: 0.0,
            AGENT_TOOL_EXECUTOR: EXECUTOR_DIRECT,
            AGENT_TOOL_OUTCOME: OUTCOME_OK,
        }


_META_CACHE: dict[tuple, ToolMeta] = {}
_META_CACHE_LIMIT = 10_000


def meta_for(name: str, description: Optional[str], tool_type: str) -> ToolMeta:
    """A cached ``ToolMeta`` (framework hooks and ``tool_span`` make one per call)."""
    key = (name, description, tool_type)
    meta = _META_CACHE.get(key)
    if meta is None:
        meta = ToolMeta(name, description, tool_type)
        if len(_META_CACHE) < _META_CACHE_LIMIT:
            _META_CACHE[key] = meta
    return meta


def name_of(fn: Callable) -> str:
    """A callable's name, through ``functools.partial``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def first_doc_line(fn: Callable) -> Optional[str]:
    doc = inspect.getdoc(fn) if not isinstance(fn, functools.partial) else inspect.getdoc(fn.func)
    return doc.strip().splitlines()[0] if doc and doc.strip() else None


def is_async_gen(fn: Callable) -> bool:
    # A callable object's kind is its __call__'s (not a test of callability).
    return inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(getattr(fn, "__call__", None))  # noqa: B004


def is_gen(fn: Callable) -> bool:
    return inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__call__", None))  # noqa: B004


def is_coroutine(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
