"""``agent-otel report``: which tool blocked the GPU, queue versus exec, and what to change.

Usage::

    agent-otel report traces.jsonl [--gpu-log gpu.log] [--format json]
                      [--html report.html] [--perfetto trace.json]
                      [--slo TOOL=SECONDS:OBJECTIVE ...]

Reads OTLP/JSON trace files (the toolkit's own or a Collector file
exporter's; plain, gzip or zstd; ``-`` for standard input) and,
optionally, ``nvidia-smi`` GPU logs; prints a table (or the JSON of
docs/report.md), with each tool's compliance with its latency SLO
(``--slo``; 95% within 0.8 s by default, the alert rules' default), and
writes the HTML timeline and the Perfetto trace when asked, saying on
stderr where. A malformed or empty input stops it with
one line naming the file and line, and exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from typing import Optional, TextIO

# The report uses numpy's arrays, not its linear algebra: no BLAS thread pool
# (OpenBLAS starts one thread per core when numpy is imported: 0.08 CPU-s for
# nothing). Set before the analysis imports numpy; a value already set wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from agent_otel import config  # noqa: E402 (after the variable above)
from agent_otel.errors import ConfigError, InputError
from agent_otel.spans.otlp_json import input_name
from agent_otel.support.inputs import STDIN
from agent_otel.support.prices import parse_prices
from agent_otel.report import html, perfetto, table
from agent_otel.report.analysis import EDGES, EDGES_SPANS, Analysis, analyse
from agent_otel.report.parts import report_parts
from agent_otel.report.progress import Progress
from agent_otel.slo import Slos


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces",
        nargs="+",
        metavar="TRACES.jsonl",
        help="OTLP/JSON lines files (toolkit or Collector file exporter; plain, gzip or zstd), or - for standard input",
    )
    parser.add_argument(
        "--gpu-log",
        action="append",
        default=[],
        metavar="LOG",
        help="nvidia-smi dmon -o DT or --query-gpu=timestamp,index,utilization.gpu --format=csv output (repeatable); "
        "without one, GPU idle comes from the gpu.idle spans in the traces",
    )
    parser.add_argument(
        "--tz", metavar="ZONE", help="IANA time zone of the GPU log's times (default: local time); only with --gpu-log"
    )
    parser.add_argument(
        "--gpu-pool",
        metavar="POOL",
        help="the GPU pool (agent.gpu.pool) the --gpu-log GPUs serve: their idle time is blamed on that pool's "
        "tool calls only (default: the calls of processes that declared no pool); only with --gpu-log",
    )
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="TOOL=SECONDS:OBJECTIVE",
        help="a tool's latency SLO: OBJECTIVE of its calls within SECONDS, from each call's duration (repeatable; "
        "TOOL * for every tool without its own; default '*=0.8:0.95', the alert rules' default)",
    )
    parser.add_argument(
        "--gpu-edges",
        choices=EDGES,
        default=EDGES_SPANS,
        help="where the idle windows read from a --gpu-log start and end: 'spans' moves an edge within one sample "
        "period of a model call's start or end to it (docs/attribution.md, edges from the spans); 'samples' keeps "
        "the samples' own, as the GPU data alone says (default: spans)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML timeline to FILE")
    parser.add_argument(
        "--perfetto", metavar="FILE", help="write Chrome trace-event JSON (Perfetto, chrome://tracing) to FILE"
    )
    # The same settings as instrument()'s, for the idle windows found in a GPU log.
    for option, name, metavar in IDLE_OPTIONS:
        config.add_argument(parser, option, name, metavar=metavar, environment=False)
    config.add_argument(parser, "--gpu-hour-price", "gpu_hour_price", metavar="PRICES")


# option, setting, metavar
IDLE_OPTIONS = (("--idle-threshold", "gpu_idle_threshold", "R"), ("--min-idle", "gpu_min_idle", "S"))


def run(args: argparse.Namespace) -> int:
    idle = {
        name: getattr(config.DEFAULTS, name)
        if getattr(args, name) is None
        else config.parse(name, getattr(args, name), option)
        for option, name, _ in IDLE_OPTIONS
    }
    if args.tz is not None and not args.gpu_log:
        raise ConfigError(
            "--tz", args.tz, "--gpu-log as well: the zone is that of a GPU log's times (traces carry UTC)"
        )
    if args.gpu_pool is not None and not args.gpu_log:
        raise ConfigError(
            "--gpu-pool",
            args.gpu_pool,
            "--gpu-log as well: it names the pool of a GPU log's GPUs (gpu.idle spans carry their own)",
        )
    slos = Slos.parse(args.slo)
    prices = parse_prices(_setting("gpu_hour_price", args.gpu_hour_price, "--gpu-hour-price"))
    if [*args.traces, *args.gpu_log].count(STDIN) > 1:
        raise ConfigError("-", STDIN, "standard input (-) given once, for one input")
    progress = Progress(args.traces)
    try:
        analysis = analyse(
            args.traces,
            args.gpu_log,
            tz=args.tz,
            idle_threshold=idle["gpu_idle_threshold"],
            min_idle_s=idle["gpu_min_idle"],
            progress=progress,
            gpu_pool=(args.gpu_pool or "").strip(),
            slos=slos,
            call_ids=bool(args.html or args.perfetto),  # only they show a call's id
            turns=bool(args.html or args.perfetto),  # and draw every turn
            records=bool(args.html or args.perfetto),  # and every call, with its share of the blame
            edges=args.gpu_edges,
            prices=prices,
        )
    finally:
        progress.finish()
    _require_spans(analysis, args.traces)
    gc.freeze()  # the records live until exit: later collections need not scan them
    if args.html:
        _write(args.html, "--html", html.render(analysis), "HTML timeline")
    if args.perfetto:
        _write(
            args.perfetto,
            "--perfetto",
            json.dumps(perfetto.trace_events(analysis), separators=(",", ":")),
            "Perfetto trace",
        )
    if args.format == "json":
        report = report_parts(analysis)
        # The table shows its warnings; JSON read by a program would hide them from the person running it.
        for warning in report.inputs.warnings:
            _print(f"agent-otel report: warning: {table.visible(warning)}\n", sys.stderr)
        _print(json.dumps(report.to_json(), indent=2) + "\n", sys.stdout)
    else:
        width, colour = table.terminal_style(sys.stdout)
        _print(table.render(analysis, width=width, colour=colour), sys.stdout)
    return 0


def _setting(name: str, given: object, option: str) -> Optional[str]:
    """A text setting from its option, else its environment variable, else none; checked, naming where."""
    if given is not None:
        return config.parse(name, given, option)
    for variable in config.SETTINGS[name].declaration.env:
        value = os.environ.get(variable, "").strip()
        if value:
            return config.parse(name, value, variable, from_environment=True)
    return None


def _require_spans(analysis: Analysis, paths: list[str]) -> None:
    """No spans at all is an error: there is nothing to report."""
    if analysis.span_count or analysis.duplicate_spans:
        return
    first = analysis.first_skipped
    if first is not None:  # every span was left out: the first one's problem is the error
        more = analysis.skipped_spans - 1
        raise InputError(*first[:2], first[2] + (f" ({more} more span(s) left out)" if more else ""))
    names = [input_name(path) for path in paths]
    if len(analysis.empty_inputs) == len(names):
        raise InputError(", ".join(names), None, "empty input: no spans to report")
    raise InputError(", ".join(names), None, "no trace spans in the input (only other OTLP signals, or none)")


def _print(text: str, stream: TextIO) -> None:
    """Write text the stream's encoding may not hold (a lone surrogate in a
    file name) as escapes, not as an error."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def _write(path: str, option: str, text: str, what: str) -> None:
    try:
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
    except OSError as exc:
        raise ConfigError(option, path, f"a writable file path ({exc.strerror})") from None
    size = os.path.getsize(path)
    _print(f"agent-otel report: wrote the {what} to {path} ({size / 1e6:.1f} MB)\n", sys.stderr)
