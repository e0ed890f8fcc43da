"""Text that is safe to hand to an exporter or to prometheus_client.

Tool names, call ids, pool names and exception messages come from outside:
MCP servers, model output, file names decoded with ``surrogateescape``.
A Python ``str`` may hold a lone surrogate (``"\\udcff"``) that UTF-8 cannot
encode: protobuf then fails the whole OTLP batch, and prometheus_client
answers every later scrape with HTTP 500. ``valid_text`` replaces such code
points with U+FFFD and caps the length, once, where the text enters.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
ELLIPSIS = "…"

# The longest label value agent-otel gives Prometheus, in characters.
LABEL_VALUE_LIMIT = 200
# The longest name (tool, pool, executor) it puts on a span.
NAME_LIMIT = 512


def valid_text(value: object, limit: int) -> str:
    """``value`` as a string UTF-8 can encode, at most ``limit`` characters.

    Cheap when there is nothing to do (ASCII within the limit). Lone
    surrogates become U+FFFD (a surrogate pair written as two code points,
    as JSON escapes give it, becomes the character it encodes); a longer
    text is cut and ends with "…".
    """
    text = value if isinstance(value, str) else str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if len(text) > limit:
        text = text[: max(limit - 1, 0)] + ELLIPSIS
    return text
