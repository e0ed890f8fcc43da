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

from typing import Mapping

from opentelemetry.attributes import BoundedAttributes
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
