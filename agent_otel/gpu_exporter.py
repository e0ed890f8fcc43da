"""``agent-otel gpu-exporter``: the GPU timeline alone, for a GPU host.

When the agents run elsewhere (or in containers that cannot see NVML), run
this next to the GPU. It samples every GPU, exports window-level
``gpu.idle`` spans over OTLP (the standard ``OTEL_*`` variables say where)
and serves the GPU metrics on /metrics. Attribution to tool calls then
happens in ``agent-otel report`` over both processes' traces. It is
``instrument()`` with the tool and executor hooks left out, kept running
until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

import agent_otel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=None,
                        help="GPU source: nvml (default), simulated, replay:PATH [AGENT_OTEL_GPU]")
    parser.add_argument("--devices", default=None, help="comma list of GPU indexes or UUIDs (default: all)")
    parser.add_argument("--prometheus-port", default=None,
                        help="serve /metrics on this port (default 9400) [AGENT_OTEL_PROMETHEUS_PORT]")
    parser.add_argument("--prometheus-address", default=None,
                        help="address /metrics binds to (default 127.0.0.1) [AGENT_OTEL_PROMETHEUS_ADDRESS]")
    parser.add_argument("--poll-interval", default=None, help="seconds between reads [AGENT_OTEL_GPU_POLL_INTERVAL]")
    parser.add_argument("--idle-threshold", default=None,
                        help="utilization 0..1 at or below which a GPU is idle [AGENT_OTEL_GPU_IDLE_THRESHOLD]")
    parser.add_argument("--min-idle", default=None, help="seconds an idle window lasts at least [AGENT_OTEL_GPU_MIN_IDLE]")
    parser.add_argument("--traces-file", default=None, help="also write gpu.idle spans as OTLP/JSON lines")
    parser.add_argument("--duration", type=float, default=None, help="stop after this many seconds")


def run(args: argparse.Namespace) -> int:
    gpu = args.gpu or os.environ.get("AGENT_OTEL_GPU") or "nvml"
    port = args.prometheus_port
    if port is None and "AGENT_OTEL_PROMETHEUS_PORT" not in os.environ:
        port = 9400
    handle = agent_otel.instrument(
        os.environ.get("OTEL_SERVICE_NAME") or "agent-otel-gpu-exporter",
        traces_file=args.traces_file, prometheus_port=port, prometheus_address=args.prometheus_address,
        gpu=gpu, gpu_devices=args.devices, gpu_poll_interval=args.poll_interval,
        gpu_idle_threshold=args.idle_threshold, gpu_min_idle=args.min_idle,
        instrument_executors=False, frameworks=())
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    timeline = handle.gpu_timeline
    devices = timeline.source.devices() if timeline else []
    print(f"agent-otel gpu-exporter: sampling {len(devices)} GPU(s) via {gpu}: "
          + (", ".join(f"{d.index} {d.name}" for d in devices) or "none (see the log line above)"), flush=True)
    if handle.prometheus_url:
        print(f"agent-otel gpu-exporter: metrics at {handle.prometheus_url}", flush=True)
    try:
        stop.wait(args.duration)
    finally:
        handle.shutdown()
    return 0 if timeline else 1
