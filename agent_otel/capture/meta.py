"""What is fixed about a tool: its name, its span's start attributes, and how
a wrapped function tells the executor hook that it is a tool.

Shared by the plain wrappers (``wrappers.py``), the executor hook, the
framework hooks and the remedies, so none of them imports another's
internals.
"""

from __future__ import annotations

import functools
import inspect
from time import thread_time_ns
from typing import Callable, Optional

from opentelemetry.util.types import AttributeValue

from agent_otel.semconv import (
    GEN_AI_OPERATION_EXECUTE_TOOL,
    GEN_AI_OPERATION_NAME,
    GEN_AI_TOOL_DESCRIPTION,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    TOOL_TYPE_FUNCTION,
    tool_span_name,
)
from agent_otel.support.text import NAME_LIMIT, valid_text

# The longest tool description put on a span, in characters.
DESCRIPTION_LIMIT = 4096

# Set on every wrapper that starts a tool call, so the executor hook can tell
# a submitted tool from other work. Holds the ``ToolMeta``, or a function
# (target) -> tool name where the name is known only from the instance.
TOOL_MARK = "__agent_otel_tool__"


# CPU time per call (agent.tool.exec.cpu_time) takes two reads of the
# thread's CPU clock: system calls (Linux serves no thread CPU clock from the
# vDSO) of 0.3-1 us each, as much as the rest of a short call's bookkeeping.
# So it is measured on every call of a tool whose last measured call took
# CPU_SHORT_NS or more, and on one in CPU_SAMPLE of the calls of a tool whose
# calls are shorter (and on the next call after any unmeasured call that
# turned out long). Short calls carry little of a tool's time, so its CPU
# share (sum of CPU over sum of exec) hardly changes; see docs/telemetry.md.
CPU_SHORT_NS = 1_000_000
CPU_SAMPLE = 16


def cpu_clock(meta: "ToolMeta") -> Optional[int]:
    """The thread's CPU clock now, when this call of ``meta``'s tool is one
    whose CPU time is measured (see CPU_SAMPLE); else None. The caller hands
    ``thread_time_ns() - clock`` (or None) to ``Recorder.end``, which counts
    the calls towards the next measured one."""
    skip = meta.cpu_skip
    if skip:
        meta.cpu_skip = skip - 1
        return None
    return thread_time_ns()


# The attributes a tool span starts with.
START_ATTRIBUTES: dict[str, AttributeValue] = {GEN_AI_OPERATION_NAME: GEN_AI_OPERATION_EXECUTE_TOOL}


class ToolMeta:
    """What is fixed about a tool: its name and the attributes every span of it carries."""

    __slots__ = (
        "name",
        "description",
        "tool_type",
        "span_name",
        "start_attributes",
        "end_attributes",
        "attributes",
        "text_bound",
        "cpu_skip",
    )

    def __init__(self, name: str, description: Optional[str] = None, tool_type: str = TOOL_TYPE_FUNCTION):
        # Names come from anywhere (MCP servers, model output): made valid once, here.
        name = valid_text(name, NAME_LIMIT)
        description = valid_text(description, DESCRIPTION_LIMIT) if description else description
        tool_type = valid_text(tool_type, NAME_LIMIT)
        self.name = name
        self.description = description
        self.tool_type = tool_type
        self.span_name = tool_span_name(name)
        # What samplers and span processors' on_start see, beside the span's
        # name (execute_tool {tool}): each costs the SDK a validation pass at
        # start. The rest (the GenAI attributes that name the tool, and the
        # agent.* ones) goes on when the call ends, written directly
        # (Recorder.end, sdk_span.add); all of them (``attributes``) where
        # nothing reads a span's attributes at its start
        # (sdk_span.StartAttributes).
        self.start_attributes: dict[str, AttributeValue] = START_ATTRIBUTES
        attributes: dict[str, AttributeValue] = {GEN_AI_TOOL_NAME: name, GEN_AI_TOOL_TYPE: tool_type}
        if description:
            attributes[GEN_AI_TOOL_DESCRIPTION] = description
        self.end_attributes = attributes
        self.attributes: dict[str, AttributeValue] = {**START_ATTRIBUTES, **attributes}
        # The longest text a span of this tool gets at its end from
        # agent-otel (names, executors and call ids are cut to NAME_LIMIT):
        # see sdk_span.add.
        self.text_bound = max(NAME_LIMIT, len(description or ""))
        # Calls left before the next one whose CPU time is measured
        # (cpu_clock); 0: measure the next one.
        self.cpu_skip = 0


_META_CACHE: dict[tuple, ToolMeta] = {}
_META_CACHE_LIMIT = 10_000


def meta_for(name: str, description: Optional[str] = None, tool_type: str = TOOL_TYPE_FUNCTION) -> ToolMeta:
    """A cached ``ToolMeta`` (framework hooks and ``tool_span`` make one per call); an
    empty description is none."""
    key = (name, description or None, tool_type)
    meta = _META_CACHE.get(key)
    if meta is None:
        meta = ToolMeta(name, description or None, tool_type)
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
