"""``agent-otel gpu-exporter``: the GPU timeline of a GPU host, and the
blame service of its GPU pool.

When the agents run elsewhere (or in containers that cannot see NVML), run
this next to the GPU. ``--model-server URL`` reads a serving engine's own
metrics too (beside NVML, or alone with ``--gpu model_server``: a managed
endpoint whose host you cannot run on; docs/model-servers.md). It samples every GPU, exports window-level
``gpu.idle`` spans over OTLP (the standard ``OTEL_*`` variables say where)
and serves the GPU metrics on /metrics.

With ``--pool`` (or ``AGENT_OTEL_GPU_POOL``) it is the **blame service** of
that GPU pool (``agent_otel.commands.blame_service``): it also receives the tool
spans of every agent of the pool over OTLP (``--otlp-grpc``,
``--otlp-http``) and blames the GPUs' idle time on them, a watermark late,
with the live path's engine: one process per GPU host samples and blames,
so no GPU is sampled twice and no idle second is blamed twice. Without a
pool, attribution happens in ``agent-otel report`` over both processes'
traces.

It is ``instrument()`` with the tool and executor hooks left out, kept
running until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Optional

from agent_otel import config
from agent_otel.attribution.service import DEFAULT_WATERMARK_S
from agent_otel.errors import ConfigError
from agent_otel.wiring.instrumentation import declared_gpu_pool, start
from agent_otel.receiver import DEFAULT_GRPC_ENDPOINT, DEFAULT_HTTP_ENDPOINT, DEFAULT_MAX_REQUEST_BYTES
from agent_otel.semconv import GPU_SOURCE_NVML

# Where the exporter differs from instrument(): it samples NVML (a GPU host
# without one is a mistake worth a non-zero exit), serves /metrics on the
# port DCGM's exporter leaves free, names itself, and hooks no tool calls.
# The environment variables still win over these.
DEFAULTS = {"gpu": GPU_SOURCE_NVML, "prometheus_port": 9400, "service_name": "agent-otel-gpu-exporter"}
FIXED = {"instrument_executors": False, "frameworks": ()}

# option -> (the setting it sets, metavar)
OPTIONS = {
    "--gpu": ("gpu", "SOURCE"),
    "--devices": ("gpu_devices", "LIST"),
    "--model-server": ("model_server_metrics", "URL"),
    "--prometheus-port": ("prometheus_port", "PORT"),
    "--prometheus-address": ("prometheus_address", "ADDRESS"),
    "--poll-interval": ("gpu_poll_interval", "S"),
    "--idle-threshold": ("gpu_idle_threshold", "R"),
    "--min-idle": ("gpu_min_idle", "S"),
    "--traces-file": ("traces_file", "FILE"),
}
# The blame service's limits (with --pool).
SERVICE_OPTIONS = {
    "--memory-limit": ("blame_memory_limit", "BYTES"),
    "--request-timeout": ("blame_request_timeout", "S"),
    "--idle-timeout": ("blame_idle_timeout", "S"),
    "--max-connections": ("blame_max_connections", "N"),
    "--max-rpcs": ("blame_max_rpcs", "N"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option, (name, metavar) in OPTIONS.items():
        config.add_argument(parser, option, name, default=DEFAULTS.get(name), metavar=metavar)
    service = parser.add_argument_group("blame service (with --pool)")
    service.add_argument(
        "--pool",
        dest="gpu_pool",
        default=None,
        metavar="POOL",
        help="be the blame service of this GPU pool (agent.gpu.pool, the value its agents declare): "
        "receive their tool spans and blame this host's GPUs on them [AGENT_OTEL_GPU_POOL]",
    )
    service.add_argument(
        "--otlp-grpc",
        default=DEFAULT_GRPC_ENDPOINT,
        metavar="HOST:PORT",
        help=f"receive tool spans over OTLP/gRPC here; 'off' for none (default: {DEFAULT_GRPC_ENDPOINT})",
    )
    service.add_argument(
        "--otlp-http",
        default=DEFAULT_HTTP_ENDPOINT,
        metavar="HOST:PORT",
        help="receive tool spans over OTLP/HTTP (protobuf, POST /v1/traces) here; 'off' for none "
        f"(default: {DEFAULT_HTTP_ENDPOINT})",
    )
    service.add_argument(
        "--watermark",
        type=float,
        default=DEFAULT_WATERMARK_S,
        metavar="S",
        help="blame GPU time this many seconds late, once the spans of the calls in flight then "
        "have arrived: at least the agents' export interval + the Collector's batching + the "
        f"longest tool call to blame in full (default: {DEFAULT_WATERMARK_S:g})",
    )
    service.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="N",
        help=f"largest OTLP request taken, decompressed (default: {DEFAULT_MAX_REQUEST_BYTES})",
    )
    for option, (name, metavar) in SERVICE_OPTIONS.items():
        config.add_argument(service, option, name, metavar=metavar)
    parser.add_argument("--duration", type=float, default=None, metavar="S", help="stop after this many seconds")


def run(args: argparse.Namespace) -> int:
    given = {
        name: config.parse(name, getattr(args, name), option)
        for option, (name, _) in [*OPTIONS.items(), *SERVICE_OPTIONS.items(), ("--pool", ("gpu_pool", "POOL"))]
        if getattr(args, name) is not None
    }
    settings = config.load_settings({**given, **FIXED}, defaults=DEFAULTS)
    pool = declared_gpu_pool(settings)
    service = None
    if pool:
        if not 1024 <= args.max_request_bytes <= 1 << 30:
            raise ConfigError(
                "--max-request-bytes", args.max_request_bytes, "a number of bytes from 1024 to 1073741824"
            )
        from agent_otel.commands.blame_service import start_blame_service  # gRPC and protobuf: only for a pool

        try:
            handle, service = start_blame_service(
                settings,
                watermark_s=args.watermark,
                max_request_bytes=args.max_request_bytes,
                grpc_endpoint=None if args.otlp_grpc == "off" else args.otlp_grpc,
                http_endpoint=None if args.otlp_http == "off" else args.otlp_http,
            )
        except OSError as exc:
            raise ConfigError("--otlp-grpc/--otlp-http", str(exc), "free local addresses") from None
    else:
        handle = start(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    timeline = handle.wait_for_gpu()  # --gpu auto looks for it on a thread of its own
    devices = timeline.source.devices() if timeline else []
    print(
        f"agent-otel gpu-exporter: sampling {len(devices)} GPU(s) via {settings.gpu}: "
        + (", ".join(f"{d.index} {d.name}" for d in devices) or "none (see the log line above)"),
        flush=True,
    )
    if handle.prometheus_url:
        print(f"agent-otel gpu-exporter: metrics at {handle.prometheus_url}", flush=True)
    if service is not None:
        receiver = service.receiver
        endpoints = [
            f"OTLP/gRPC on {_host(receiver.grpc_endpoint)}:{receiver.grpc_port}" if receiver.grpc_port else "",
            f"OTLP/HTTP on {_host(receiver.http_endpoint)}:{receiver.http_port}" if receiver.http_port else "",
        ]
        print(
            f"agent-otel gpu-exporter: blame service of GPU pool {pool!r}: "
            + ", ".join(e for e in endpoints if e)
            + f"; watermark {args.watermark:g} s",
            flush=True,
        )
    try:
        stop.wait(args.duration)
    finally:
        handle.shutdown()
    return 0 if timeline else 1


def _host(endpoint: Optional[str]) -> str:
    """The host of a ``host:port`` endpoint."""
    return (endpoint or "").rsplit(":", 1)[0]
