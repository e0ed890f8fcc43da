"""``agent-otel report``: exported traces (and GPU logs) in, which tool call
left the GPU idle, queue versus exec, and what to change, out.

``reader`` turns OTLP/JSON spans into the pipeline's records, ``analysis``
runs the shared attribution and builds the report's JSON, and ``table``,
``html`` and ``perfetto`` render it.
"""
