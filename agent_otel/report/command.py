"""``agent-otel report``: which tool blocked the GPU, queue versus exec, and what to change.

Usage::

    agent-otel report traces.jsonl [--gpu-log gpu.log] [--format json]
                      [--html report.html] [--perfetto trace.json]

Reads OTLP/JSON trace files (the toolkit's own or a Collector file
exporter's) and, optionally, ``nvidia-smi`` GPU logs; prints a table (or
the JSON of docs/report.md) and writes the HTML timeline and the Perfetto
trace when asked. A malformed input stops it with one line naming the file
and line, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from agent_otel.config import Settings
from agent_otel.errors import ConfigError
from agent_otel.report import html, perfetto, table
from agent_otel.report.analysis import analyse, report_json
from agent_otel.report.progress import Progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", metavar="TRACES.jsonl", help="OTLP/JSON lines files (toolkit or Collector file exporter)")
    parser.add_argument(
        "--gpu-log",
        action="append",
        default=[],
        metavar="LOG",
        help="nvidia-smi dmon -o DT or --query-gpu=timestamp,index,utilization.gpu --format=csv output (repeatable); "
        "without one, GPU idle comes from the gpu.idle spans in the traces",
    )
    parser.add_argument("--tz", metavar="ZONE", help="IANA time zone of the GPU log's times (default: local time)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML timeline to FILE")
    parser.add_argument("--perfetto", metavar="FILE", help="write Chrome trace-event JSON (Perfetto, chrome://tracing) to FILE")
    parser.add_argument(
        "--idle-threshold",
        type=float,
        default=Settings.gpu_idle_threshold,
        metavar="R",
        help=f"GPU utilization ratio at or below which a GPU log sample is idle (default: {Settings.gpu_idle_threshold})",
    )
    parser.add_argument(
        "--min-idle",
        type=float,
        default=Settings.gpu_min_idle,
        metavar="S",
        help=f"shortest idle stretch in a GPU log that counts, in seconds (default: {Settings.gpu_min_idle})",
    )


def run(args: argparse.Namespace) -> int:
    if not 0.0 <= args.idle_threshold <= 1.0:
        raise ConfigError("--idle-threshold", args.idle_threshold, "a utilization ratio from 0 to 1")
    if not 0.0 < args.min_idle <= 3600.0:
        raise ConfigError("--min-idle", args.min_idle, "seconds, more than 0 and at most 3600")
    progress = Progress(args.traces)
    try:
        analysis = analyse(
            args.traces,
            args.gpu_log,
            tz=args.tz,
            idle_threshold=args.idle_threshold,
            min_idle_s=args.min_idle,
            progress=progress,
        )
    finally:
        progress.finish()
    if args.html:
        _write(args.html, "--html", html.render(analysis))
    if args.perfetto:
        _write(args.perfetto, "--perfetto", json.dumps(perfetto.trace_events(analysis), separators=(",", ":")))
    if args.format == "json":
        json.dump(report_json(analysis), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        width, colour = table.terminal_style(sys.stdout)
        sys.stdout.write(table.render(analysis, width=width, colour=colour))
    return 0


def _write(path: str, option: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise ConfigError(option, path, f"a writable file path ({exc.strerror})") from None
