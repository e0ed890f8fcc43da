"""Where spans go when ``instrument()`` is called with nothing else said.

The rule (docs/telemetry.md, "Where spans go"):

1. ``traces_exporters`` given (argument or ``OTEL_TRACES_EXPORTER``):
   exactly those, as OpenTelemetry does. ``otlp`` sends to the endpoint
   configured, or to the SDK's default (localhost), whether or not anything
   listens there; ``shutdown_timeout`` bounds the wait for it at exit.
2. Otherwise OTLP is used when an endpoint is configured: ``otlp_endpoint``,
   or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``.
3. Otherwise OTLP is used when a Collector accepts a connection on the
   default endpoint (localhost:4317 for gRPC, 4318 for HTTP) as
   ``instrument()`` runs: the compose stack, or a Collector on the host.
4. Otherwise nothing is sent over the network. Unless ``traces_file`` says
   where, spans go to a file of their own,
   ``./agent-otel-traces/<service>-<time>-<pid>.jsonl`` (the temporary
   directory if the current one is not writable), capped at 100 MB, and one
   line at exit says where it is and how to open it.

Why: the first run, a script with no services, must cost nothing at exit
and leave something to look at; a deployment that configures an endpoint
(the compose file does, with ``OTEL_EXPORTER_OTLP_ENDPOINT``) gets exactly
OpenTelemetry's behaviour; and a Collector on localhost is found the way
OpenTelemetry's default endpoint would find it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from agent_otel.support.host import command

logger = logging.getLogger("agent_otel")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DEFAULT_PORTS = {"grpc": 4317, "http/protobuf": 4318}
DEFAULT_DIRECTORY = "agent-otel-traces"
# The file agent-otel chose itself stops growing here (a service left
# running with no endpoint must not fill its disk); later spans are dropped
# and counted.
DEFAULT_FILE_LIMIT_BYTES = 100 * 1024 * 1024
PROBE_TIMEOUT_S = 0.2


@dataclass(frozen=True)
class Plan:
    """Which exporters to make, and the file agent-otel picked (None: the user's, or none)."""

    exporters: tuple[str, ...]  # "otlp", "console"
    default_file: Optional[str] = None
    reason: str = ""  # why OTLP is off, for the line at exit


def plan(settings, environ: Optional[Mapping[str, str]] = None) -> Plan:
    """Apply the rule above to ``settings``."""
    environ = os.environ if environ is None else environ
    if settings.traces_exporters is not None:
        return Plan(tuple(name for name in settings.traces_exporters if name != "none"))
    if settings.otlp_endpoint or any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES):
        return Plan(("otlp",))
    port = DEFAULT_PORTS[settings.otlp_protocol]
    if collector_answers("localhost", port):
        return Plan(("otlp",))
    reason = f"no OTLP endpoint is set and no Collector answers on localhost:{port}"
    if settings.traces_file:
        return Plan((), reason=reason)
    path = default_traces_path(settings.service_name)
    if path is None:
        import tempfile

        logger.warning(
            "agent-otel: %s, and no directory to write traces to (the current one and %s are "
            "not writable): spans are not kept; set traces_file or an OTLP endpoint",
            reason,
            tempfile.gettempdir(),
        )
    return Plan((), default_file=path, reason=reason)


# What gRPC says when the other side of a TLS connection does not speak TLS
# ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: ...
# WRONG_VERSION_NUMBER" against a plain-text receiver).
_TLS_FAILURE = re.compile(r"handshake failed|WRONG_VERSION_NUMBER|SSL_ERROR|TSI_PROTOCOL_FAILURE", re.IGNORECASE)


def grpc_tls_advice(settings, environ: Optional[Mapping[str, str]] = None) -> Optional[Callable[[str], str]]:
    """When the OTLP/gRPC exporter will open TLS: what to add to an export
    failure that is a failed TLS handshake (how to write the endpoint); None
    when it speaks plain text or the protocol is HTTP.

    The exporter decides as OpenTelemetry says: ``http://`` is plain text;
    ``https://`` and an endpoint without a scheme (``host:4317``) are TLS
    unless ``OTEL_EXPORTER_OTLP_TRACES_INSECURE``/``OTEL_EXPORTER_OTLP_INSECURE``
    is true. A plain-text receiver (the blame service, a Collector as
    shipped) then fails every export in the handshake.
    """
    environ = os.environ if environ is None else environ
    if settings.otlp_protocol != "grpc":
        return None
    endpoint = (
        settings.otlp_endpoint
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or "http://localhost:4317"
    )
    scheme, _, rest = endpoint.partition("://")
    if not rest:
        scheme, rest = "", endpoint
    if scheme.lower() == "http":
        return None
    if scheme.lower() != "https":
        for name in ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"):
            value = environ.get(name)
            if value is not None:
                if value.strip().lower() == "true":
                    return None
                break
    address = rest.split("/", 1)[0]
    how = "https:// means TLS" if scheme.lower() == "https" else "an endpoint without http:// means TLS"
    advice = (
        f"; the TLS handshake with {address} failed: the receiver speaks plain text? For gRPC, {how}: "
        f"write http://{address} for a receiver without TLS (the blame service, a Collector as shipped), "
        f"or keep TLS and give the receiver a certificate"
    )

    def advise(failure: str) -> str:
        return advice if _TLS_FAILURE.search(failure) else ""

    return advise


def collector_answers(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` (refused at once when nothing listens)."""
    # An ASCII name goes to the resolver as bytes: as text, the socket module
    # would load the IDNA codec (unicodedata, stringprep) to encode it.
    address = host.encode("ascii") if host.isascii() else host
    try:
        # (getaddrinfo takes bytes as well; typeshed lists str only)
        with socket.create_connection((address, port), timeout=timeout_s):  # type: ignore[arg-type]
            return True
    except OSError:
        return False


def default_traces_path(service_name: Optional[str]) -> Optional[str]:
    """``agent-otel-traces/<service>-<time>-<pid>.jsonl`` in the first writable of
    the current directory and the temporary one; None if neither is."""
    service = re.sub(r"[^A-Za-z0-9._-]+", "_", service_name or "unknown_service")[:64]
    name = f"{service}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"
    for base in _base_directories():
        directory = os.path.join(base, DEFAULT_DIRECTORY)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            path = os.path.join(directory, name)
            return os.path.relpath(path) if base == os.getcwd() else path
    return None


def _base_directories():
    """Where the default traces file may go: the current directory, then the
    temporary one (``tempfile`` is imported only when the first is not writable)."""
    yield os.getcwd()
    import tempfile

    yield tempfile.gettempdir()


def default_gpu_log(plan_: Plan) -> Optional[tuple[str, int]]:
    """``(path, max_bytes)`` of the GPU log written beside the traces file
    agent-otel chose (``<file>-gpu.csv``, when a GPU is sampled and
    ``gpu_log_file`` names none): with it the report sees the GPU's
    utilization, dips that are not idle included. None without that file."""
    if plan_.default_file is None:
        return None
    return os.path.splitext(plan_.default_file)[0] + "-gpu.csv", DEFAULT_FILE_LIMIT_BYTES


def exit_line(plan_: Plan) -> Optional[str]:
    """The one line said at exit when spans went to the file agent-otel chose; None if it holds none."""
    path = plan_.default_file
    if path is None:
        return None
    try:
        if os.path.getsize(path) == 0:
            return None
    except OSError:
        return None
    html = os.path.splitext(path)[0] + ".html"
    gpu_log = default_gpu_log(plan_)
    if gpu_log is not None and _has_samples(gpu_log[0]):
        return (
            f"agent-otel: {plan_.reason}, so the traces are in {path} and the GPU's samples in {gpu_log[0]}; "
            f"to see them: {command()} report {path} --gpu-log {gpu_log[0]} --html {html}"
        )
    return (
        f"agent-otel: {plan_.reason}, so the traces are in {path}; to see them: {command()} report {path} --html {html}"
    )


def _has_samples(path: str) -> bool:
    """Whether a GPU log holds a sample line after its header."""
    try:
        with open(path, "rb") as log:
            return len(log.read(4096).splitlines()) > 1
    except OSError:
        return False
