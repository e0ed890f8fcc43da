"""OTLP trace receivers, gRPC and HTTP/protobuf, in front of one consumer.

Usage::

    from agent_otel.receiver.server import OtlpReceiver, Outcome

    def consume(request, peer, transport):  # an ExportTraceServiceRequest; "grpc" or "http"
        ...
        return Outcome(rejected_spans=0)

    receiver = OtlpReceiver(consume, grpc_endpoint="127.0.0.1:4317", http_endpoint="127.0.0.1:4318")
    receiver.start()
    ...
    receiver.shutdown()

The wire formats and statuses are OTLP's (opentelemetry-proto's
``ExportTraceServiceRequest`` and ``ExportTraceServiceResponse``, with the
generated gRPC service name):

- a request whose spans were all taken: OK / HTTP 200 and an empty
  response; some refused: OK / 200 with ``partial_success`` (how many, and
  why, in ``error_message``): the sender must not retry them;
- a body that is not an ``ExportTraceServiceRequest`` (malformed
  protobuf, bad gzip): ``INVALID_ARGUMENT`` / HTTP 400, with a
  ``google.rpc.Status`` naming the problem;
- a body over ``max_request_bytes`` (after gzip decompression too):
  ``RESOURCE_EXHAUSTED`` / HTTP 413 (over twice the limit, gRPC's own
  transport refuses it before the receiver sees it: not counted);
- HTTP only: another content type (OTLP/JSON) or content encoding: 415;
  no ``Content-Length``: 411; another path: 404; too many requests at
  once: 503 with ``Retry-After`` (retryable).

Nothing a sender does stops the receiver: every request is handled on its
own thread and every failure becomes one of the statuses above (the
consumer's own exceptions too, as ``INTERNAL`` / 500, logged once).
``on_refused(transport, reason)`` counts the requests refused whole.
Both servers bind to loopback unless told otherwise.
"""

from __future__ import annotations

import gzip
import http.server
import logging
import socket
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

import grpc
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agent_otel.receiver import DEFAULT_GRPC_ENDPOINT, DEFAULT_HTTP_ENDPOINT, DEFAULT_MAX_REQUEST_BYTES

logger = logging.getLogger("agent_otel.receiver")

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
HTTP_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
# HTTP requests read at once; more wait briefly, then get 503 (retryable).
MAX_CONCURRENT_HTTP = 8
GRPC_WORKERS = 4

# Why a request was refused whole (the ``reason`` of on_refused).
MALFORMED = "malformed"
TOO_LARGE = "too_large"
UNSUPPORTED = "unsupported"
BUSY = "busy"
INTERNAL = "internal"


@dataclass
class Outcome:
    """What the consumer did with one request's spans."""

    rejected_spans: int = 0
    error_message: str = ""


Consumer = Callable[[ExportTraceServiceRequest, str, str], Outcome]


class _Refused(Exception):
    """A request refused whole; ``reason`` is one of the constants above."""

    def __init__(self, reason: str, http_status: int, grpc_code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.reason = reason
        self.http_status = http_status
        self.grpc_code = grpc_code
        self.message = message


def _response(outcome: Outcome) -> ExportTraceServiceResponse:
    if not outcome.rejected_spans and not outcome.error_message:
        return ExportTraceServiceResponse()
    return ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(
            rejected_spans=outcome.rejected_spans, error_message=outcome.error_message
        )
    )


class OtlpReceiver:
    """The OTLP trace endpoints; see the module docstring.

    ``grpc_endpoint`` and ``http_endpoint`` are ``host:port`` (port 0: any
    free port, see ``grpc_port`` and ``http_port`` after ``start``); None
    leaves that transport off.
    """

    def __init__(
        self,
        consume: Consumer,
        *,
        grpc_endpoint: Optional[str] = DEFAULT_GRPC_ENDPOINT,
        http_endpoint: Optional[str] = DEFAULT_HTTP_ENDPOINT,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        on_refused: Callable[[str, str], None] = lambda transport, reason: None,
    ):
        self._consume = consume
        self.grpc_endpoint = grpc_endpoint
        self.http_endpoint = http_endpoint
        self.max_request_bytes = max_request_bytes
        self._on_refused = on_refused
        self.grpc_port: Optional[int] = None
        self.http_port: Optional[int] = None
        self._grpc: Optional[grpc.Server] = None
        self._http: Optional[_HttpServer] = None
        self._http_thread: Optional[threading.Thread] = None
        self._logged: set[str] = set()

    # -- life ------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve. Raises ``OSError`` naming the endpoint when a
        port cannot be bound (in use, or no such address)."""
        try:
            if self.grpc_endpoint:
                self._start_grpc(self.grpc_endpoint)
            if self.http_endpoint:
                self._start_http(self.http_endpoint)
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self, timeout_s: float = 1.0) -> bool:
        """Stop taking requests; those in progress get ``timeout_s`` to finish. True if they did."""
        finished = True
        if self._grpc is not None:
            finished = self._grpc.stop(timeout_s).wait(timeout_s + 1.0)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        return bool(finished)

    def _start_grpc(self, endpoint: str) -> None:
        server = grpc.server(
            ThreadPoolExecutor(GRPC_WORKERS, thread_name_prefix="agent-otel-otlp-grpc"),
            # gRPC refuses past twice the limit itself; up to there the
            # handler refuses (and counts) what is over it. No SO_REUSEPORT:
            # a second service on the same port is an error, not a silent share.
            options=[("grpc.max_receive_message_length", 2 * self.max_request_bytes), ("grpc.so_reuseport", 0)],
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self._grpc_export,
            request_deserializer=None,  # the raw bytes: a malformed body is ours to answer
            response_serializer=ExportTraceServiceResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": handler}),))
        try:
            port = server.add_insecure_port(endpoint)
        except RuntimeError as exc:  # grpc raises RuntimeError when it cannot bind
            raise OSError(f"cannot serve OTLP/gRPC on {endpoint}: {exc}") from None
        if not port:
            raise OSError(f"cannot serve OTLP/gRPC on {endpoint}: the address is in use or not local")
        server.start()
        self._grpc, self.grpc_port = server, port

    def _start_http(self, endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        try:
            server = _HttpServer((host.strip("[]") or "127.0.0.1", int(port)), self)
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot serve OTLP/HTTP on {endpoint}: {exc}") from None
        self._http, self.http_port = server, server.server_address[1]
        self._http_thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="agent-otel-otlp-http", daemon=True
        )
        self._http_thread.start()

    # -- one request, either transport ---------------------------------

    def handle(self, body: bytes, peer: str, transport: str) -> ExportTraceServiceResponse:
        """Decode and consume one request body; raises ``_Refused``."""
        try:
            request = ExportTraceServiceRequest.FromString(body)
        except DecodeError as exc:
            raise _Refused(
                MALFORMED,
                400,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the body is not an OTLP ExportTraceServiceRequest (protobuf): {exc}",
            ) from None
        try:
            outcome = self._consume(request, peer, transport)
        except Exception as exc:
            self._log_once("consume", exc)
            raise _Refused(
                INTERNAL,
                500,
                grpc.StatusCode.INTERNAL,
                f"the blame service failed on this request ({type(exc).__name__})",
            ) from None
        return _response(outcome)

    def refused(self, transport: str, refusal: _Refused) -> None:
        try:
            self._on_refused(transport, refusal.reason)
        except Exception as exc:
            self._log_once("on_refused", exc)

    def _grpc_export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        try:
            if len(body) > self.max_request_bytes:
                raise _Refused(
                    TOO_LARGE,
                    413,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request is {len(body)} bytes, over this receiver's limit of {self.max_request_bytes}",
                )
            return self.handle(body, context.peer(), "grpc")
        except _Refused as refusal:
            self.refused("grpc", refusal)
            context.abort(refusal.grpc_code, refusal.message)
            raise  # abort raises; this line is never reached

    def _log_once(self, where: str, exc: Exception) -> None:
        if where not in self._logged:
            self._logged.add(where)
            logger.warning(
                "OTLP receiver: %s raised %r (logged once; the request got an error status)", where, exc, exc_info=exc
            )


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], receiver: OtlpReceiver):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.receiver = receiver
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT_HTTP)
        super().__init__(address, _HttpHandler)


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporters expect
    server_version = "agent-otel"
    error_content_type = "text/plain"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        logger.debug("OTLP/HTTP %s: " + format, self.client_address[0], *args)

    def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        receiver = self.server.receiver
        if self.path.split("?", 1)[0] != HTTP_PATH:
            return self._refuse(
                _Refused(
                    UNSUPPORTED,
                    404,
                    grpc.StatusCode.NOT_FOUND,
                    f"no such endpoint {self.path!r}: OTLP traces go to {HTTP_PATH}",
                )
            )
        if not self.server.slots.acquire(timeout=1.0):
            return self._refuse(
                _Refused(BUSY, 503, grpc.StatusCode.UNAVAILABLE, "too many requests at once; retry later"),
                retry_after=1,
            )
        try:
            body = self._body(receiver.max_request_bytes)
            response = receiver.handle(body, f"{self.client_address[0]}:{self.client_address[1]}", "http")
        except _Refused as refusal:
            return self._refuse(refusal)
        finally:
            self.server.slots.release()
        self._send(200, response.SerializeToString())

    def _body(self, limit: int) -> bytes:
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type != PROTOBUF:
            self.close_connection = True
            raise _Refused(
                UNSUPPORTED,
                415,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Content-Type {content_type or '(none)'!r} is not accepted: send {PROTOBUF} "
                "(OTLP/HTTP protobuf; OTLP/JSON is not accepted)",
            )
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            self.close_connection = True
            raise _Refused(
                UNSUPPORTED,
                415,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Content-Encoding {encoding!r} is not accepted: send gzip or none",
            )
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            raise _Refused(
                MALFORMED,
                411,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Content-Length is missing or not a number ({length!r})",
            )
        size = int(length)
        if size > limit:
            self.close_connection = True  # the body stays unread: the connection cannot be reused
            raise _Refused(
                TOO_LARGE,
                413,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the request is {size} bytes, over this receiver's limit of {limit}",
            )
        body = self.rfile.read(size)
        if len(body) < size:
            self.close_connection = True
            raise _Refused(
                MALFORMED,
                400,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the body ended after {len(body)} of its {size} bytes",
            )
        if encoding == "gzip":
            body = _gunzip(body, limit)
        return body

    def _refuse(self, refusal: _Refused, retry_after: Optional[int] = None) -> None:
        self.server.receiver.refused("http", refusal)
        status = status_pb2.Status(code=_RPC_CODES.get(refusal.grpc_code, code_pb2.UNKNOWN), message=refusal.message)
        headers = {"Retry-After": str(retry_after)} if retry_after else {}
        self._send(refusal.http_status, status.SerializeToString(), headers)

    def _send(self, status: int, body: bytes, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", PROTOBUF)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


_RPC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND: code_pb2.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE: code_pb2.UNAVAILABLE,
    grpc.StatusCode.INTERNAL: code_pb2.INTERNAL,
}


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing one that grows past ``limit``."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
        if len(data) > limit or inflater.unconsumed_tail:
            raise _Refused(
                TOO_LARGE,
                413,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the request decompresses to over this receiver's limit of {limit} bytes",
            )
        if not inflater.eof:
            raise zlib.error("the gzip data is cut off")
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise _Refused(MALFORMED, 400, grpc.StatusCode.INVALID_ARGUMENT, f"the gzip body is malformed: {exc}") from None
    return data
