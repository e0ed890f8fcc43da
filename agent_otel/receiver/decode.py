"""A received ``ExportTraceServiceRequest`` -> tool calls, as the report reads them.

A span becomes a record in one place, ``agent_otel.spans``
(``spans.decode.SpanReader``): which spans are tool calls, when a call
started executing, its outcome, a call seen from two sides (MCP client and
server) counted once. The report reads its files through it too, so a tool
call means the same thing live and offline. Each protobuf span is given to
it in the OTLP/JSON shape it reads (``spans.protobuf``).

Model-call spans (the ``chat`` / ``text_completion`` / ``generate_content``
spans, OpenInference's and OpenLLMetry's LLM spans) are taken too, as
``ModelCall`` records: the model server's share of the blame
(docs/attribution.md). Spans that are neither, and spans with a field the
reader cannot read, are refused one by one (the sender hears how many, and
why, in the OTLP partial success): one bad span costs that span, never its
request. Why (the ``reason`` label of ``agent_otel_refused_spans_total``):
``not_a_tool_span`` (neither a tool nor a model call), ``out_of_range`` (a
number outside its range, e.g. a duration of 1e300 s), ``wrong_type`` (a
value of another type than its attribute's) or ``malformed`` (any other
broken field: ids, times). A span sent twice counts once.

Every text a call keeps (its tool, executor, call id, exception type,
thread, pool) is cut to ``text.NAME_LIMIT`` characters where it enters
(``spans.protobuf``): a sender cannot make the service hold more per call than that.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agent_otel.records import ModelCall, ToolCall
from agent_otel.semconv import GEN_AI_OPERATION_EXECUTE_TOOL, GEN_AI_OPERATION_NAME
from agent_otel.spans.decode import SpanReader
from agent_otel.spans.otlp_json import MALFORMED, OUT_OF_RANGE, WRONG_TYPE, SpanFormatError
from agent_otel.spans.protobuf import gpu_pool, span_of
from agent_otel.support.text import valid_text

logger = logging.getLogger("agent_otel.receiver")

# Why a span was refused (the ``reason`` label of agent_otel_refused_spans_total).
NOT_A_TOOL_SPAN = "not_a_tool_span"
MALFORMED_SPAN = MALFORMED
SPAN_REASONS = (NOT_A_TOOL_SPAN, OUT_OF_RANGE, WRONG_TYPE, MALFORMED)
# The example of a reason the sender hears back, in characters at most.
EXAMPLE_LIMIT = 300


@dataclass
class Decoded:
    """The tool calls of one request, and the spans refused, by reason
    (with one example message per reason)."""

    calls: list[ToolCall] = field(default_factory=list)
    models: list[ModelCall] = field(default_factory=list)
    refused: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    duplicates: int = 0

    def refuse(self, reason: str, message: str, count: int = 1) -> None:
        self.refused[reason] += count
        if reason not in self.examples:
            self.examples[reason] = valid_text(message, EXAMPLE_LIMIT)


def tool_calls(request: ExportTraceServiceRequest) -> Decoded:
    """The tool calls in ``request``, each with the GPU pool of its resource."""
    decoded = Decoded()
    reader = SpanReader()
    data = reader.data
    data.calls.keep()  # the records themselves, to hand to the attribution service
    for resource_spans in request.resource_spans:
        pool = gpu_pool(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    decoded.refuse(
                        MALFORMED_SPAN,
                        f"span {_short_name(span.name)!r} has a {len(span.trace_id)}-byte "
                        f"trace_id and a {len(span.span_id)}-byte span_id (OTLP: 16 and 8)",
                    )
                    continue
                calls, duplicates, models = len(data.calls), data.duplicate_count, len(data.model_calls)
                peers = data.peer_tool_spans  # (a peer's tool span may be set aside, not yet a row: spans.peers)
                try:
                    reader.add(span_of(span), 0, pool)
                except SpanFormatError as exc:
                    message = str(exc)
                    if not message.startswith("span "):
                        message = f"span {_short_name(span.name)!r}: {message}"
                    decoded.refuse(exc.reason, message)
                    continue
                except Exception as exc:  # a bug the fuzz tests missed: this span only, not the request
                    _log_once(exc)
                    decoded.refuse(
                        MALFORMED_SPAN, f"span {_short_name(span.name)!r}: unreadable ({type(exc).__name__})"
                    )
                    continue
                if data.duplicate_count > duplicates:
                    decoded.duplicates += 1
                elif len(data.calls) == calls and len(data.model_calls) == models and data.peer_tool_spans == peers:
                    decoded.refuse(
                        NOT_A_TOOL_SPAN,
                        f"span {_short_name(span.name)!r} has no {GEN_AI_OPERATION_NAME}={GEN_AI_OPERATION_EXECUTE_TOOL} "
                        "and is no model call",
                    )
    before = data.duplicate_count
    reader.finish()  # a call seen from two sides counts once
    decoded.duplicates += data.duplicate_count - before
    decoded.calls = data.calls.keep()
    decoded.models = data.model_calls
    return decoded


def _short_name(name: str) -> str:
    """A span's name for a message: printable, and short."""
    return valid_text(name, 80)


_logged = False


def _log_once(exc: Exception) -> None:
    global _logged
    if not _logged:
        _logged = True
        logger.warning("blame service: reading a span raised %r (logged once; the span was refused)", exc, exc_info=exc)
