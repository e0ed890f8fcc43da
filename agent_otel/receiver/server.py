"""OTLP trace receivers, gRPC and HTTP/protobuf, in front of one consumer.

Usage::

    from agent_otel.receiver.server import Limits, OtlpReceiver, Outcome

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
  ``RESOURCE_EXHAUSTED`` / HTTP 413;
- HTTP only: another content type (OTLP/JSON) or content encoding: 415;
  no ``Content-Length``: 411; another path: 404; another method: 405;
- a request that did not arrive whole within ``Limits.request_timeout_s``
  of its first byte (headers and body): ``DEADLINE_EXCEEDED`` / HTTP 408,
  and its connection is closed;
- too many at once (``Limits.max_rpcs`` gRPC calls in progress), or more
  bytes than ``Limits.memory_bytes`` held for the requests being received
  and decoded: ``UNAVAILABLE`` / HTTP 503 with ``Retry-After``: the sender
  retries later.

**Slow and idle clients cost a socket, not a thread.** Both servers run on
one asyncio event loop (thread ``agent-otel-otlp``): a client that stalls
holds no worker, and is cut off at its deadline. Only a request received
whole is decoded and consumed, on a small pool of workers
(``agent-otel-otlp-decode``). An HTTP connection waiting for its next
request is closed after ``Limits.idle_timeout_s`` (gRPC:
``grpc.max_connection_idle_ms``, and ``grpc.server_handshake_timeout_ms``
for one that never speaks HTTP/2); at ``Limits.max_connections`` open HTTP
connections a new one takes the place of the one idle longest, or, when
none is idle, is closed at once (gRPC: ``grpc.max_allowed_incoming_connections``).

**Memory is bounded in bytes.** The bytes of every request being received
(HTTP: as they arrive; gRPC: ``max_request_bytes`` while its message is
read, as gRPC hands it over whole, then its size), and ``DECODE_FACTOR``
times them while it is decoded, are taken from one budget of
``Limits.memory_bytes``, of which requests being received may hold half;
what would go past it is refused (``memory``) and the sender retries. So
a gRPC call that stalls holds ``max_request_bytes`` of it until its
deadline: at the defaults (256 MiB, 4 MiB) 31 such calls leave room for
good ones. Memory given back returns to the system (``malloc_trim`` after
large requests, on glibc).

Nothing a sender does stops the receiver: every failure becomes one of
the statuses above (the consumer's own exceptions too, as ``INTERNAL`` /
500, logged once), and a client that goes away early is one debug line.
``on_refused(transport, reason)`` counts the requests refused whole. Both
servers bind to loopback unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gzip
import http
import logging
import os
import socket
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

import grpc
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from grpc import aio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agent_otel.config import DEFAULTS
from agent_otel.receiver import DEFAULT_GRPC_ENDPOINT, DEFAULT_HTTP_ENDPOINT, DEFAULT_MAX_REQUEST_BYTES

logger = logging.getLogger("agent_otel.receiver")

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
HTTP_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
# Workers that decode and consume requests received whole (the consumer is
# Python: more would only wait for the GIL).
DECODE_WORKERS = 2
# A request being decoded holds its protobuf message and the span objects
# made from it: up to about 3.2 times its bytes (measured on small tool
# spans, the densest case), taken from the budget as 4 times.
DECODE_FACTOR = 4
# HTTP: the longest request line or header line, and all header lines together.
MAX_HEADER_LINE = 8 * 1024
MAX_HEADERS_BYTES = 64 * 1024
# HTTP: how much of a body is read at a time, and what a connection buffers
# before it is read (asyncio stops reading the socket at twice that): the
# most a connection holds outside the byte budget.
HTTP_CHUNK = 64 * 1024
HTTP_BUFFER = 16 * 1024
# Once no request is held, after this many bytes were, the memory freed is
# given back to the system (glibc's malloc_trim).
TRIM_AFTER_BYTES = 8 * 1024 * 1024
# glibc: blocks of this size or more are mapped on their own, and so given
# back when freed (its default threshold grows with the blocks freed, up to
# 32 MiB: request bodies then stayed in the heap, 300 MB of them).
MMAP_THRESHOLD = 256 * 1024
# glibc: at most this many malloc arenas (its default is 8 per core): each
# receiver and decoder thread otherwise grows a heap of its own, which kept
# about 25 MB more over an hour's soak at 1,500 spans/s (docs/performance.md).
ARENA_MAX = 2

# Why a request was refused whole (the ``reason`` of on_refused).
MALFORMED = "malformed"
TOO_LARGE = "too_large"
UNSUPPORTED = "unsupported"
BUSY = "busy"
MEMORY = "memory"
TIMEOUT = "timeout"
INTERNAL = "internal"
REQUEST_REASONS = (MALFORMED, TOO_LARGE, UNSUPPORTED, BUSY, MEMORY, TIMEOUT, INTERNAL)


@dataclass(frozen=True)
class Limits:
    """What one client may take of the receiver; the defaults are the settings' (``agent_otel.config``)."""

    request_timeout_s: float = DEFAULTS.blame_request_timeout  # first byte to last, headers and body
    idle_timeout_s: float = DEFAULTS.blame_idle_timeout  # a connection waiting for its next request
    max_connections: int = DEFAULTS.blame_max_connections  # per transport
    max_rpcs: int = DEFAULTS.blame_max_rpcs  # gRPC calls in progress at once
    memory_bytes: int = DEFAULTS.blame_memory_limit  # requests being received and decoded, both transports


DEFAULT_LIMITS = Limits()


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


def _busy(message: str) -> _Refused:
    return _Refused(BUSY, 503, grpc.StatusCode.UNAVAILABLE, message)


def _out_of_memory(size: int, limit: int) -> _Refused:
    return _Refused(
        MEMORY,
        503,
        grpc.StatusCode.UNAVAILABLE,
        f"the blame service holds as many request bytes as it may ({limit}); {size} more must wait: retry later",
    )


def _timed_out(timeout_s: float) -> _Refused:
    return _Refused(
        TIMEOUT,
        408,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        f"the request did not arrive whole within {timeout_s:g} s of its start",
    )


def _response(outcome: Outcome) -> ExportTraceServiceResponse:
    if not outcome.rejected_spans and not outcome.error_message:
        return ExportTraceServiceResponse()
    return ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(
            rejected_spans=outcome.rejected_spans, error_message=outcome.error_message
        )
    )


class ByteBudget:
    """Bytes held for requests, up to ``limit``; ``take`` says whether they fit.

    Bytes being received may take half of it at most: requests received
    whole can always be decoded, however many clients are sending.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self.receiving = 0
        self._lock = threading.Lock()

    def take(self, size: int, receiving: bool = False) -> bool:
        with self._lock:
            if self.held + size > self.limit or (receiving and 2 * (self.receiving + size) > self.limit):
                return False
            self.held += size
            if receiving:
                self.receiving += size
            return True

    def give(self, size: int, receiving: bool = False) -> None:
        with self._lock:
            self.held -= size
            if receiving:
                self.receiving -= size


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
        limits: Limits = DEFAULT_LIMITS,
        on_refused: Callable[[str, str], None] = lambda transport, reason: None,
    ):
        self._consume = consume
        self.grpc_endpoint = grpc_endpoint
        self.http_endpoint = http_endpoint
        self.max_request_bytes = max_request_bytes
        self.limits = limits
        self.budget = ByteBudget(limits.memory_bytes)
        self._on_refused = on_refused
        self.grpc_port: Optional[int] = None
        self.http_port: Optional[int] = None
        self._logged: set[str] = set()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[ThreadPoolExecutor] = None
        self._grpc: Optional[aio.Server] = None
        self._http: Optional[asyncio.AbstractServer] = None
        self._rpcs = 0  # gRPC calls in progress (the loop's thread only)
        self._in_workers = 0  # requests on the workers (the loop's thread only)
        self._connections: dict[asyncio.StreamWriter, Optional[asyncio.Task]] = {}  # open HTTP connections
        self._idle: dict[asyncio.StreamWriter, None] = {}  # those waiting for a request, longest first
        self._to_trim = 0  # bytes held since memory was last given back
        self._stopped: Optional[asyncio.Event] = None
        self._grace_s = 1.0  # what shutdown gives the requests in progress

    # -- life ------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve. Raises ``OSError`` naming the endpoint when a
        port cannot be bound (in use, or no such address)."""
        started = threading.Event()
        failure: list[BaseException] = []
        tune_malloc()
        self._workers = ThreadPoolExecutor(DECODE_WORKERS, thread_name_prefix="agent-otel-otlp-decode")
        self._thread = threading.Thread(target=self._run, args=(started, failure), name="agent-otel-otlp", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._workers.shutdown(wait=False)
            raise failure[0]

    def shutdown(self, timeout_s: float = 1.0) -> bool:
        """Stop taking requests; those in progress get ``timeout_s`` to finish. True if they did."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        try:
            loop.call_soon_threadsafe(self._stop_soon, timeout_s)
        except RuntimeError:  # the loop is gone already
            pass
        thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        finished = not thread.is_alive()
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)
        self._loop = None
        return finished

    def _stop_soon(self, timeout_s: float) -> None:
        self._grace_s = timeout_s
        if self._stopped is not None:
            self._stopped.set()

    def _run(self, started: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # this thread's own
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(started, failure))
        except BaseException as exc:  # (a failure to bind is handed to start)
            if not started.is_set():
                failure.append(exc)
            else:
                self._log_once("the OTLP receiver's loop", exc)
        finally:
            started.set()
            try:
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.wait(left, timeout=1.0))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _serve(self, started: threading.Event, failure: list[BaseException]) -> None:
        self._stopped = asyncio.Event()
        try:
            if self.grpc_endpoint:
                await self._start_grpc(self.grpc_endpoint)
            if self.http_endpoint:
                await self._start_http(self.http_endpoint)
        except BaseException as exc:
            failure.append(exc)
            await self._close(0.0)
            return
        started.set()
        await self._stopped.wait()
        await self._close(self._grace_s)

    async def _close(self, grace_s: float) -> None:
        """No new connections or requests; those in progress get ``grace_s``, then are cut off."""
        deadline = time.monotonic() + grace_s
        if self._http is not None:
            self._http.close()
            for writer in list(self._idle):
                writer.transport.abort()
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
        while len(self._connections) > len(self._idle) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        tasks = [task for task in self._connections.values() if task is not None]
        for writer in list(self._connections):
            writer.transport.abort()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    # -- gRPC --------------------------------------------------------------

    async def _start_grpc(self, endpoint: str) -> None:
        limits = self.limits
        server = aio.server(
            # A backstop: the handler refuses (and counts) past max_rpcs itself.
            maximum_concurrent_rpcs=2 * limits.max_rpcs,
            # gRPC refuses a message over the limit itself (the handler
            # counts it). No SO_REUSEPORT: a second service on the same
            # port is an error, not a silent share.
            options=[
                ("grpc.max_receive_message_length", self.max_request_bytes),
                ("grpc.so_reuseport", 0),
                ("grpc.max_connection_idle_ms", round(limits.idle_timeout_s * 1000)),
                ("grpc.server_handshake_timeout_ms", round(limits.request_timeout_s * 1000)),
                ("grpc.max_allowed_incoming_connections", limits.max_connections),
                # A call's message comes in as the handler reads it, not
                # before: gRPC buffers 64 KiB of each call ahead at most
                # (its bandwidth probe would widen that to megabytes a call,
                # held outside the byte budget).
                ("grpc.http2.bdp_probe", 0),
                ("grpc.http2.lookahead_bytes", 64 * 1024),
            ],
        )
        # Export is served as a client stream of one message: the handler
        # reads it itself, with a deadline, so a call whose message never
        # comes holds no worker and ends at the deadline.
        handler = grpc.stream_unary_rpc_method_handler(
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
        await server.start()
        self._grpc, self.grpc_port = server, port

    async def _grpc_export(self, requests, context: aio.ServicerContext) -> ExportTraceServiceResponse:
        try:
            if self._rpcs >= self.limits.max_rpcs:
                raise _busy(f"{self._rpcs} OTLP/gRPC calls in progress, the most this receiver takes; retry later")
            self._rpcs += 1
            try:
                return await self._grpc_call(context)
            finally:
                self._rpcs -= 1
        except _Refused as refusal:
            self.refused("grpc", refusal)
            await context.abort(refusal.grpc_code, refusal.message)
            raise  # abort raises; this line is never reached

    async def _grpc_call(self, context: aio.ServicerContext) -> ExportTraceServiceResponse:
        # gRPC hands the message over whole: the most it may be is taken
        # before it is read, the rest given back once its size is known.
        held = limit = self.max_request_bytes
        if not self.budget.take(limit, receiving=True):
            raise _out_of_memory(limit, self.budget.limit)
        try:
            try:
                body = await asyncio.wait_for(context.read(), self.limits.request_timeout_s)
            except asyncio.TimeoutError:
                raise _timed_out(self.limits.request_timeout_s) from None
            if body is aio.EOF:  # what gRPC does with a message over grpc.max_receive_message_length
                raise _Refused(
                    TOO_LARGE,
                    413,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"no request message arrived (gRPC refuses one over this receiver's limit of {limit} bytes)",
                )
            self.budget.give(limit - len(body), receiving=True)
            held = len(body)
            return await self._handled(body, context.peer(), "grpc")
        finally:
            self._give(held, receiving=True)

    # -- HTTP --------------------------------------------------------------

    async def _start_http(self, endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            self._http = await asyncio.start_server(
                self._http_connection,
                host,
                int(port),
                family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                limit=HTTP_BUFFER,
                backlog=128,
            )
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot serve OTLP/HTTP on {endpoint}: {exc}") from None
        self.http_port = self._http.sockets[0].getsockname()[1]

    async def _http_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One HTTP connection: its requests one after another (HTTP/1.1 keep-alive)."""
        peer = writer.get_extra_info("peername")
        peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self._admit(writer):
            self.refused("http", _busy("too many connections"))
            writer.transport.abort()
            return
        try:
            keep_alive = True
            while keep_alive and not (self._stopped is not None and self._stopped.is_set()):
                self._idle[writer] = None
                try:
                    line = await asyncio.wait_for(reader.readline(), self.limits.idle_timeout_s)
                except asyncio.TimeoutError:
                    logger.debug("OTLP/HTTP %s: idle for %g s, closed", peer, self.limits.idle_timeout_s)
                    break
                finally:
                    self._idle.pop(writer, None)
                if not line.endswith(b"\n"):
                    break  # closed, or a request line too long: no request to answer
                keep_alive = await self._http_request(line, reader, writer, peer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            logger.debug("OTLP/HTTP %s: the connection ended early (%s)", peer, type(exc).__name__)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self._log_once("an OTLP/HTTP connection", exc)
        finally:
            self._connections.pop(writer, None)
            self._idle.pop(writer, None)
            writer.close()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """A place for a new connection: free, or the place of the connection idle longest."""
        if len(self._connections) >= self.limits.max_connections:
            if not self._idle:
                return False
            oldest = next(iter(self._idle))
            del self._idle[oldest]
            self._connections.pop(oldest, None)
            oldest.transport.abort()
        self._connections[writer] = asyncio.current_task()
        return True

    async def _http_request(
        self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> bool:
        """One request from its first line; False when the connection is to be closed."""
        deadline = time.monotonic() + self.limits.request_timeout_s
        held = 0
        try:
            try:
                method, target, version, headers = await _within(deadline, _head(line, reader))
                keep_alive = _keep_alive(version, headers)
                if target.split("?", 1)[0] != HTTP_PATH:
                    raise _Refused(
                        UNSUPPORTED,
                        404,
                        grpc.StatusCode.NOT_FOUND,
                        f"no such endpoint {target!r}: OTLP traces go to {HTTP_PATH}",
                    )
                if method != "POST":
                    raise _Refused(UNSUPPORTED, 405, grpc.StatusCode.UNIMPLEMENTED, f"{method} is not accepted: POST")
                size, encoding = self._body_size(headers)
                if headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = bytearray()
                while len(body) < size:
                    chunk = await _within(deadline, reader.read(min(HTTP_CHUNK, size - len(body))))
                    if not chunk:
                        raise ConnectionResetError(f"the body ended after {len(body)} of its {size} bytes")
                    if not self.budget.take(len(chunk), receiving=True):
                        raise _out_of_memory(size, self.budget.limit)
                    held += len(chunk)
                    body += chunk
            except asyncio.TimeoutError:
                raise _timed_out(self.limits.request_timeout_s) from None
            response = await self._handled(body, peer, "http", gzipped=encoding == "gzip")
            del body
        except _Refused as refusal:
            self.refused("http", refusal)
            # A body left unread (or half read) leaves the connection unusable:
            # answer, then read what the client still sends, briefly, so that
            # closing does not reset the connection before it reads the answer.
            await self._send(writer, refusal.http_status, _status_body(refusal), refusal=refusal)
            await _linger(reader, writer, self.max_request_bytes)
            return False
        finally:
            self._give(held, receiving=True)
        await self._send(writer, 200, response.SerializeToString(), keep_alive=keep_alive)
        return keep_alive

    def _body_size(self, headers: dict[str, str]) -> tuple[int, str]:
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != PROTOBUF:
            raise _Refused(
                UNSUPPORTED,
                415,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Content-Type {content_type or '(none)'!r} is not accepted: send {PROTOBUF} "
                "(OTLP/HTTP protobuf; OTLP/JSON is not accepted)",
            )
        encoding = (headers.get("content-encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise _Refused(
                UNSUPPORTED,
                415,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Content-Encoding {encoding!r} is not accepted: send gzip or none",
            )
        length = headers.get("content-length")
        if length is None or "transfer-encoding" in headers or not length.strip().isdigit():
            raise _Refused(
                MALFORMED,
                411,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Content-Length is missing or not a number ({length!r}), or the body is chunked",
            )
        size = int(length)
        if size > self.max_request_bytes:
            raise _too_large(size, self.max_request_bytes)
        return size, encoding

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        *,
        keep_alive: bool = True,
        refusal: Optional[_Refused] = None,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
            f"Content-Type: {PROTOBUF}",
            f"Content-Length: {len(body)}",
            "Server: agent-otel",
        ]
        if refusal is not None and refusal.http_status == 503:
            lines.append("Retry-After: 1")
        if refusal is not None or not keep_alive:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body)
        try:
            await asyncio.wait_for(writer.drain(), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionAbortedError("the client does not read its response") from None

    # -- one request, either transport ---------------------------------

    async def _handled(
        self, body: bytes | bytearray, peer: str, transport: str, gzipped: bool = False
    ) -> ExportTraceServiceResponse:
        """``handle`` on a worker, its memory taken from the budget there."""
        loop = asyncio.get_running_loop()
        self._in_workers += 1
        try:
            work = loop.run_in_executor(self._workers, self._decoded, body, peer, transport, gzipped)
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:  # the client went away: its body is held until the worker is done
                with contextlib.suppress(BaseException):
                    await work
                raise
        finally:
            self._in_workers -= 1

    def _decoded(self, body: bytes | bytearray, peer: str, transport: str, gzipped: bool) -> ExportTraceServiceResponse:
        held = 0
        try:
            if gzipped:
                if not self.budget.take(self.max_request_bytes):
                    raise _out_of_memory(self.max_request_bytes, self.budget.limit)
                held = self.max_request_bytes
                body = _gunzip(body, self.max_request_bytes)
                self.budget.give(held - len(body))  # what it did not grow to
                held = len(body)
            decoding = len(body) * DECODE_FACTOR
            if not self.budget.take(decoding):
                raise _out_of_memory(decoding, self.budget.limit)
            held += decoding
            return self.handle(body, peer, transport)
        finally:
            self._give(held)

    def handle(self, body: bytes | bytearray, peer: str, transport: str) -> ExportTraceServiceResponse:
        """Decode and consume one request body; raises ``_Refused``."""
        try:
            request = ExportTraceServiceRequest.FromString(body)  # type: ignore[arg-type]  # (a bytearray is read as is)
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

    def _give(self, size: int, receiving: bool = False) -> None:
        """Bytes a request held, given back (and, once none is held, to the system)."""
        if not size:
            return
        self.budget.give(size, receiving)
        self._to_trim += size
        if self._to_trim >= TRIM_AFTER_BYTES and not self.budget.held and _libc is not None:
            self._to_trim = 0
            try:
                self._workers.submit(_libc.malloc_trim, 0)  # type: ignore[union-attr]
            except (RuntimeError, AttributeError):  # shut down
                pass

    def _log_once(self, where: str, exc: BaseException) -> None:
        if where not in self._logged:
            self._logged.add(where)
            logger.warning(
                "OTLP receiver: %s raised %r (logged once; the request got an error status)", where, exc, exc_info=exc
            )


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, most: int) -> None:
    """After the last answer: up to 1 s and ``most`` bytes of what the client still sends, read and dropped."""
    if writer.can_write_eof():
        writer.write_eof()
    deadline = time.monotonic() + 1.0
    while most > 0:
        try:
            chunk = await _within(deadline, reader.read(HTTP_CHUNK))
        except asyncio.TimeoutError:
            return
        if not chunk:
            return
        most -= len(chunk)


async def _within(deadline: float, awaitable):
    """``awaitable``, or ``asyncio.TimeoutError`` at ``deadline`` (time.monotonic)."""
    return await asyncio.wait_for(awaitable, max(0.0, deadline - time.monotonic()))


async def _head(line: bytes, reader: asyncio.StreamReader) -> tuple[str, str, str, dict[str, str]]:
    """The request line and headers (names lowercased) of one HTTP request."""
    if len(line) > MAX_HEADER_LINE:
        raise _Refused(MALFORMED, 414, grpc.StatusCode.INVALID_ARGUMENT, "the request line is too long")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(MALFORMED, 400, grpc.StatusCode.INVALID_ARGUMENT, f"not an HTTP/1.x request line: {line[:80]!r}")
    headers: dict[str, str] = {}
    total = 0
    while True:
        header = await reader.readline()
        if not header.endswith(b"\n"):
            raise ConnectionResetError("the headers ended early")
        total += len(header)
        if total > MAX_HEADERS_BYTES:
            raise _Refused(MALFORMED, 431, grpc.StatusCode.INVALID_ARGUMENT, "the request headers are too large")
        if header in (b"\r\n", b"\n"):
            return parts[0], parts[1], parts[2], headers
        name, colon, value = header.decode("latin-1").partition(":")
        if not colon or not name.strip() or name[0] in " \t":
            raise _Refused(
                MALFORMED, 400, grpc.StatusCode.INVALID_ARGUMENT, f"a malformed header line: {header[:80]!r}"
            )
        headers[name.strip().lower()] = value.strip()


def _keep_alive(version: str, headers: dict[str, str]) -> bool:
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


def _too_large(size: int, limit: int) -> _Refused:
    return _Refused(
        TOO_LARGE,
        413,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"the request is {size} bytes, over this receiver's limit of {limit}",
    )


def _status_body(refusal: _Refused) -> bytes:
    code = _RPC_CODES.get(refusal.grpc_code, code_pb2.UNKNOWN)
    return status_pb2.Status(code=code, message=refusal.message).SerializeToString()


_RPC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND: code_pb2.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE: code_pb2.UNAVAILABLE,
    grpc.StatusCode.INTERNAL: code_pb2.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED: code_pb2.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED: code_pb2.UNIMPLEMENTED,
}


def _gunzip(body: bytes | bytearray, limit: int) -> bytes:
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


def _glibc() -> Optional[ctypes.CDLL]:
    """The C library where it is glibc (``mallopt``, ``malloc_trim``); None elsewhere."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


_libc = _glibc()
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_M_ARENA_MAX = -8


def tune_malloc() -> None:
    """Large blocks (request bodies, decoded messages) mapped on their own,
    so that freeing them gives their memory back (``MMAP_THRESHOLD``), and
    the threads' heaps kept few (``ARENA_MAX``). ``MALLOC_ARENA_MAX`` in the
    environment, where set, wins."""
    if _libc is not None:
        _libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        if "MALLOC_ARENA_MAX" not in os.environ:
            _libc.mallopt(_M_ARENA_MAX, ARENA_MAX)
