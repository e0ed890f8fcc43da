"""The one place agent-otel writes into an OpenTelemetry SDK span directly.

Why: the SDK validates and copies every attribute set through its API, in a
locked pass over a new mapping: most of what a tool call adds to a bare
span. The attributes a tool span gets when its call ends
(``agent.tool.queue.duration``, ``exec.duration``, ``exec.cpu_time``,
``executor``, ``outcome``, ``agent.executor.max_workers``,
``gen_ai.tool.call.id``) are floats and ints agent-otel just computed, or
names it validated once (``text.valid_text``): validating them again on
every call buys nothing. ``add(span, attributes, longest_text)`` puts them
in the span's attribute store with one ``dict.update``; everything else
about the span (its start attributes, which samplers and ``on_start`` see,
its events, status, end) goes through the public API.

What it touches, and when: an SDK ``Span``'s ``_attributes`` (an
``opentelemetry.attributes.BoundedAttributes``, the SDK's public class) and
that mapping's ``_dict``, ``maxlen``, ``max_value_len`` and ``_immutable``,
and the span's ``_end_time``.
Only

- on spans of a class checked once to hold exactly that (``_probe``); any
  other span (another SDK, a non-recording span, a future SDK that stores
  attributes differently) gets ``span.set_attributes``;
- while the span is recording (not ended, the store still mutable), by the thread
  that owns the call, before it ends the span;
- while the store has room for every new key under its count limit
  (``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``), and only with values the SDK would
  store unchanged: floats, ints, and strings no longer than its value length
  limit (``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``). Otherwise the public call
  applies the limits as the SDK does (dropping, counting, truncating).

``tests/test_sdk_span.py`` checks that a span written through here exports
exactly what the public calls would give, limits included, and that the
installed SDK passes the probe (an SDK upgrade that moves the store fails
that test rather than slowing every call down unnoticed).
"""

from __future__ import annotations

import types
from typing import Mapping, Optional

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ConcurrentMultiSpanProcessor, SynchronousMultiSpanProcessor, Tracer
from opentelemetry.sdk.trace.sampling import ParentBased, ParentBasedTraceIdRatio, StaticSampler, TraceIdRatioBased
from opentelemetry.util.types import AttributeValue

# span class -> whether its attribute store is the one described above.
_PROBED: dict[type, bool] = {}


def _probe(span) -> bool:
    store = getattr(span, "_attributes", None)
    ok = (
        type(store) is BoundedAttributes
        and type(getattr(store, "_dict", None)) is dict
        and hasattr(store, "maxlen")
        and hasattr(store, "max_value_len")
        and hasattr(store, "_immutable")
        and hasattr(span, "_end_time")
        and callable(getattr(span, "set_attributes", None))
    )
    _PROBED[type(span)] = ok
    return ok


def fast(span) -> bool:
    """Whether ``add`` writes ``span``'s store directly (else it calls ``set_attributes``)."""
    known = _PROBED.get(type(span))
    return _probe(span) if known is None else known


def add(span, attributes: Mapping[str, AttributeValue], longest_text: int) -> None:
    """Set ``attributes`` on the recording ``span`` as ``span.set_attributes``
    would: attributes agent-otel made (floats, ints, valid strings of at most
    ``longest_text`` characters)."""
    known = _PROBED.get(type(span))
    if known is None:
        known = _probe(span)
    if known:
        store = span._attributes
        values = store._dict
        limit = store.max_value_len
        maxlen = store.maxlen
        if (
            span._end_time is None
            and not store._immutable
            and (limit is None or longest_text <= limit)
            and (maxlen is None or len(values) + len(attributes) <= maxlen)
        ):
            values.update(attributes)
            return
    span.set_attributes(attributes)


# ------------------------------------------------------------------ attributes at start


def _empty(self, span, parent_context=None):
    pass


def _empty_documented(self, span, parent_context=None):
    """A docstring and nothing else."""


def _does_nothing(method) -> bool:
    """Whether ``method`` (a bound ``on_start``) is a plain function whose body
    is ``pass`` or a docstring alone: compiled to the same bytecode as one of
    those here, by the running interpreter, returning None."""
    function = getattr(method, "__func__", None)
    code = getattr(function, "__code__", None)
    if type(function) is not types.FunctionType or code is None:
        return False
    for reference in (_empty.__code__, _empty_documented.__code__):
        if (
            code.co_code == reference.co_code
            and code.co_consts[-1] is None
            and len(code.co_consts) == len(reference.co_consts)
        ):
            return True
    return False


# The SDK's samplers, which decide without reading a span's attributes (the
# ones given to start_span come back in their SamplingResult unread).
PARENT_BASED_DELEGATES = (
    "_root",
    "_remote_parent_sampled",
    "_remote_parent_not_sampled",
    "_local_parent_sampled",
    "_local_parent_not_sampled",
)


def _sampler_ignores_attributes(sampler) -> bool:
    kind = type(sampler)
    if kind is StaticSampler or kind is TraceIdRatioBased:
        return True
    if kind is ParentBased or kind is ParentBasedTraceIdRatio:
        return all(_sampler_ignores_attributes(getattr(sampler, name, None)) for name in PARENT_BASED_DELEGATES)
    return False


class StartAttributes:
    """The attributes a tool span starts with: ``attributes``, or None where
    nothing could read them then.

    A span's start attributes are read by its tracer's sampler (the
    ``attributes`` of ``should_sample``) and by its span processors'
    ``on_start``; validating them is a pass over a new mapping in the SDK
    (about 2 µs for one attribute here, half of a tool call's budget over a
    bare span). Where the tracer is the SDK's, its sampler one of the SDK's
    (which decide without reading them: ``ALWAYS_ON``, ``ALWAYS_OFF``,
    ``TraceIdRatioBased``, ``ParentBased`` over those) and every span
    processor's ``on_start`` does nothing (``pass`` or a docstring alone: the
    SDK's and agent-otel's batch and simple processors; or agent-otel's own
    processor declares ``blind_to_tool_spans``: it acts on other spans only,
    whatever a tool span starts with), nothing can tell
    whether the span started with them; ``get()`` is then None, and the
    caller writes them with the attributes of the span's end (``add``),
    before any ``on_end`` (and ``_on_ending``) sees the span. Otherwise
    ``get()`` is ``attributes``, passed to ``start_span``.

    The processors are those of the tracer's provider (its
    ``SynchronousMultiSpanProcessor`` or ``ConcurrentMultiSpanProcessor``,
    whose ``_span_processors`` tuple is replaced when one is added); they are
    checked again whenever that tuple changes. Any other tracer, sampler or
    processor holder: ``attributes`` on every span.
    """

    __slots__ = ("attributes", "_holder", "_state")

    def __init__(self, tracer, attributes: Mapping[str, AttributeValue]):
        self.attributes = attributes
        holder = getattr(tracer, "span_processor", None)
        known = (
            type(tracer) is Tracer
            and type(holder) in (SynchronousMultiSpanProcessor, ConcurrentMultiSpanProcessor)
            and type(getattr(holder, "_span_processors", None)) is tuple
            and _sampler_ignores_attributes(getattr(tracer, "sampler", None))
        )
        self._holder = holder if known else None
        # (the processors last checked, what get() returns for them): one
        # tuple, replaced whole, so a thread never pairs one with the other's.
        self._state: tuple[Optional[tuple], Optional[Mapping[str, AttributeValue]]] = (None, attributes)

    def get(self) -> Optional[Mapping[str, AttributeValue]]:
        """The attributes to start a span with: None where nothing reads them at start."""
        holder = self._holder
        if holder is None:
            return self.attributes
        processors = holder._span_processors
        checked, start = self._state
        if processors is not checked:
            blind = all(
                getattr(processor, "blind_to_tool_spans", False) is True
                or _does_nothing(getattr(processor, "on_start", None))
                for processor in processors
            )
            start = None if blind else self.attributes
            self._state = (processors, start)
        return start
