"""Span decoding: exported and received spans -> the toolkit's records.

One home for reading spans, beside the contract (``semconv``, ``records``)
it reads, used by the offline report (``report.reader``) and the blame
service (``receiver.decode``) alike:

- ``otlp_json``: OTLP/JSON lines read back (msgspec's typed decoder);
- ``protobuf``: a received protobuf span in the same shape;
- ``decode``: ``SpanReader``, one span -> its record, and one record per call;
- ``peers``: the spans several instrumentations made of one call, merged;
- ``calls``: the tool calls as columns (``CallTable``);
- ``ids``: span ids in bulk, in numpy, for the joins.

Nothing here is imported by ``instrument()``.
"""
