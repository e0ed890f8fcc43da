"""Receiving spans over OTLP, for the blame service of a GPU pool.

``server`` serves the OTLP trace endpoints (gRPC and HTTP/protobuf) with
the OTLP error statuses; ``decode`` turns a received request into tool
calls with the report's own span reader. ``agent-otel gpu-exporter --pool``
puts them in front of the blame engine (``agent_otel.attribution.service``).
"""
