"""Receiving spans over OTLP, for the blame service of a GPU pool.

``server`` serves the OTLP trace endpoints (gRPC and HTTP/protobuf) with
the OTLP error statuses; ``decode`` turns a received request into tool
calls with the report's own span reader. ``agent-otel gpu-exporter --pool``
puts them in front of the blame engine (``agent_otel.attribution.service``).
"""

# Where the blame service listens by default (localhost: bind elsewhere only
# when told), and the largest request it takes: here, where the command line
# reads them without loading gRPC.
DEFAULT_GRPC_ENDPOINT = "127.0.0.1:4317"
DEFAULT_HTTP_ENDPOINT = "127.0.0.1:4318"
# The OpenTelemetry Collector's default gRPC limit (max_recv_msg_size_mib: 4).
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
