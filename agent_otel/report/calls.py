"""The tool calls the reader keeps: ``CallTable``, which lives with the span
decoding in ``agent_otel.spans.calls`` (the blame service builds one too)."""

from __future__ import annotations

from agent_otel.spans.calls import CallTable

__all__ = ["CallTable"]
