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
import signal
import threading

from agent_otel import config
from agent_otel.instrumentation import start

# Where the exporter differs from instrument(): it samples NVML (a GPU host
# without one is a mistake worth a non-zero exit), serves /metrics on the
# port DCGM's exporter leaves free, names itself, and hooks no tool calls.
# The environment variables still win over these.
DEFAULTS = {"gpu": "nvml", "prometheus_port": 9400, "service_name": "agent-otel-gpu-exporter"}
FIXED = {"instrument_executors": False, "frameworks": ()}

# option -> (the setting it sets, metavar)
OPTIONS = {
    "--gpu": ("gpu", "SOURCE"),
    "--devices": ("gpu_devices", "LIST"),
    "--prometheus-port": ("prometheus_port", "PORT"),
    "--prometheus-address": ("prometheus_address", "ADDRESS"),
    "--poll-interval": ("gpu_poll_interval", "S"),
    "--idle-threshold": ("gpu_idle_threshold", "R"),
    "--min-idle": ("gpu_min_idle", "S"),
    "--traces-file": ("traces_file", "FILE"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option, (name, metavar) in OPTIONS.items():
        config.add_argument(parser, option, name, default=DEFAULTS.get(name), metavar=metavar)
    parser.add_argument("--duration", type=float, default=None, metavar="S", help="stop after this many seconds")


def run(args: argparse.Namespace) -> int:
    given = {name: config.parse(name, getattr(args, name), option)
             for option, (name, _) in OPTIONS.items() if getattr(args, name) is not None}
    settings = config.load_settings({**given, **FIXED}, defaults=DEFAULTS)
    handle = start(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    timeline = handle.gpu_timeline
    devices = timeline.source.devices() if timeline else []
    print(f"agent-otel gpu-exporter: sampling {len(devices)} GPU(s) via {settings.gpu}: "
          + (", ".join(f"{d.index} {d.name}" for d in devices) or "none (see the log line above)"), flush=True)
    if handle.prometheus_url:
        print(f"agent-otel gpu-exporter: metrics at {handle.prometheus_url}", flush=True)
    try:
        stop.wait(args.duration)
    finally:
        handle.shutdown()
    return 0 if timeline else 1
