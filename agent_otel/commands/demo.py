"""``agent-otel demo``: the toolkit's main job on a small agent, no services needed.

Usage::

    agent-otel demo [--out DIR] [--seconds S]
    agent-otel demo --serve [--scenario alternate] [--prometheus-port 9464] [--duration S]

Runs the demo agent (``agent_otel.demo.agent``) twice under
``instrument()``, as commonly written and fixed, writes each run's traces
as OTLP/JSON lines (DIR/baseline.jsonl, DIR/fixed.jsonl), the GPU samples
it saw (DIR/baseline-gpu.csv, DIR/fixed-gpu.csv) and its HTML timeline,
and prints the report of each run and a comparison. Every number printed
comes from the two reports, which ``agent-otel report RUN.jsonl --gpu-log
RUN-gpu.csv`` would print from the same files.

``--serve`` runs a scenario continuously under one ``instrument()`` instead
(metrics on /metrics, spans to OTLP per the standard ``OTEL_*``
variables) until SIGINT or SIGTERM, or ``--duration`` seconds.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from agent_otel import config
from agent_otel.support import host
from agent_otel.demo import gpu as demo_gpu
from agent_otel.demo.runs import SCENARIOS, gpu_name, run_scenario
from agent_otel.errors import AgentOtelError, ConfigError
from agent_otel.wiring.instrumentation import Instrumentation, start
from agent_otel.wiring.instrumentation import current as current_instrumentation
from agent_otel.report import html, table
from agent_otel.report.analysis import Analysis, analyse
from agent_otel.report.parts import Report, report_parts

SERVICE_NAME = "agent-otel-demo"
DEFAULT_OUT = "agent-otel-demo"
SERVE_SCENARIOS = ("baseline", "fixed", "alternate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where the traces and HTML timelines go (default: ./{DEFAULT_OUT})",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="length of each run; with --serve, of each scenario's turn (default: 10)",
    )
    parser.add_argument(
        "--conversations",
        type=int,
        default=8,
        metavar="N",
        help="concurrent conversations sharing the GPU (default: 8)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=7,
        metavar="N",
        help="seed of the scripted tool latencies; the same seed gives both runs the same ones (default: 7)",
    )
    parser.add_argument(
        "--gpu",
        choices=demo_gpu.CHOICES,
        default="auto",
        help="auto: a real NVIDIA GPU when NVML finds one and torch can use CUDA, else the "
        "simulated GPU (default: auto)",
    )
    serve = parser.add_argument_group("continuous mode (for a Prometheus/Grafana stack)")
    serve.add_argument(
        "--serve",
        action="store_true",
        help="run continuously under one instrument() until SIGINT/SIGTERM; writes no files",
    )
    serve.add_argument(
        "--scenario",
        choices=SERVE_SCENARIOS,
        default="baseline",
        help="with --serve: which scenario to run, or both in turn (default: baseline)",
    )
    serve.add_argument("--duration", type=float, metavar="S", help="with --serve: stop after S seconds")
    config.add_argument(serve, "--prometheus-port", "prometheus_port", metavar="PORT")


def run(args: argparse.Namespace) -> int:
    _validate(args)
    if current_instrumentation() is not None:
        raise AgentOtelError("the demo needs its own instrument(); call agent_otel.uninstrument() first")
    gpu = demo_gpu.choose(args.gpu)
    if args.serve:
        return _serve(args, gpu)
    return _demo(args, gpu)


def _validate(args: argparse.Namespace) -> None:
    if not (0 < args.seconds <= 3600):
        raise ConfigError("--seconds", args.seconds, "seconds, more than 0 and at most 3600")
    if not 1 <= args.conversations <= 64:
        raise ConfigError("--conversations", args.conversations, "a whole number from 1 to 64")
    if args.duration is not None and not (0 < args.duration < math.inf):
        raise ConfigError("--duration", args.duration, "seconds, more than 0")
    if not args.serve:
        for option, value, default in (
            ("--scenario", args.scenario, "baseline"),
            ("--duration", args.duration, None),
            ("--prometheus-port", args.prometheus_port, None),
        ):
            if value != default:
                raise ConfigError(option, value, "to be given only with --serve")
    if args.prometheus_port is not None:
        config.parse("prometheus_port", args.prometheus_port, "--prometheus-port")


def _instrument(gpu: demo_gpu.GpuChoice, defaults: Optional[dict] = None, **arguments) -> Instrumentation:
    """``instrument()`` for the demo: its GPU and ``arguments`` first, then the user's
    environment (OTEL_*, AGENT_OTEL_*), then the demo's ``defaults`` (it names itself);
    no framework hooks (the demo agent uses none)."""
    settings = config.load_settings(
        {**gpu.settings, **arguments, "frameworks": ()}, defaults={"service_name": SERVICE_NAME, **(defaults or {})}
    )
    return start(settings)


# ---------------------------------------------------------------- the two recorded runs


def _demo(args: argparse.Namespace, gpu: demo_gpu.GpuChoice) -> int:
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", args.out, f"a directory it can create ({exc.strerror})") from None
    width, colour = table.terminal_style(sys.stdout)
    _say(
        f"agent-otel demo: {args.conversations} conversations share one GPU; the agent runs twice with the same "
        f"scripted tool latencies (seed {args.seed}), starting new turns for {args.seconds:g} s each; the turns "
        "then in flight finish, so each run lasts a few seconds longer (said after it)."
    )
    reports = {}
    for number, scenario in enumerate(SCENARIOS.values(), start=1):
        _say("")
        _say(f"== Run {number} of {len(SCENARIOS)}: {scenario.name} ({scenario.title}) ==")
        _say(f"   {scenario.description}")
        traces = out / f"{scenario.name}.jsonl"
        analysis = _record(scenario, traces, gpu, args)
        _say(f"   traced {analysis.seconds:.1f} s: new turns for {args.seconds:g} s, then the turns in flight finished")
        page = out / f"{scenario.name}.html"
        _write(page, html.render(analysis))
        _say("")
        _say(table.render(analysis, width=width, colour=colour), end="")
        reports[scenario.name] = report_parts(analysis)
    _say("")
    _say(comparison(reports["baseline"], reports["fixed"]), end="")
    _say("")
    for name in SCENARIOS:
        _say(f"{name}: traces {out / (name + '.jsonl')}, HTML timeline {out / (name + '.html')}")
    _say(
        f"Read them again with: {host.command()} report {out / 'baseline.jsonl'} "
        f"--gpu-log {out / 'baseline-gpu.csv'} --html report.html"
    )
    return 0


def _record(scenario, traces: Path, gpu: demo_gpu.GpuChoice, args: argparse.Namespace) -> Analysis:
    """Run ``scenario`` under its own ``instrument()``, writing its spans to ``traces``; return its report."""
    try:
        traces.unlink(missing_ok=True)  # the file exporter appends
    except OSError as exc:
        raise ConfigError("--out", args.out, f"a directory whose files it can replace ({exc.strerror})") from None
    # Spans go to the file; to an OTLP endpoint too only when OTEL_TRACES_EXPORTER asks for it.
    gpu_log = traces.with_name(traces.stem + "-gpu.csv")
    handle = _instrument(gpu, {"traces_exporters": ("none",)}, traces_file=str(traces), gpu_log_file=str(gpu_log))
    try:
        _say(f"   GPU: {gpu.describe(gpu_name(handle))}; running...", flush=True)
        run_scenario(
            scenario,
            handle,
            gpu,
            seconds=args.seconds,
            conversations=args.conversations,
            seed=args.seed,
            stop=threading.Event(),
        )
    finally:
        handle.shutdown()
    if not traces.exists():
        raise AgentOtelError(f"no spans were written to {traces} (is OTEL_SDK_DISABLED set?)")
    # The samples the run saw give the report the utilization curve; the
    # idle windows found in them are the ones the live gpu.idle spans show.
    return analyse(
        [str(traces)],
        [str(gpu_log)] if gpu_log.exists() else [],
        idle_threshold=handle.settings.gpu_idle_threshold,
        min_idle_s=handle.settings.gpu_min_idle,
    )


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError("--out", str(path.parent), f"a writable directory ({exc.strerror})") from None


def _say(text: str, end: str = "\n", flush: bool = False) -> None:
    sys.stdout.write(text + end)
    if flush:
        sys.stdout.flush()


# ---------------------------------------------------------------- the comparison


@dataclass
class RunTotals:
    """The numbers the comparison shows, all taken from one run's report (its parts: report.parts)."""

    seconds: float
    calls: int
    idle_s: float
    blocked_s: float
    unattributed_s: float
    loop_blocked_s: float = 0.0  # event loops blocked (asyncio.loop.blocked spans)
    tools: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # blocked, queue, exec

    @classmethod
    def of(cls, report: Report) -> "RunTotals":
        gpus = report.gpus
        return cls(
            seconds=report.window.seconds,
            calls=sum(tool.calls for tool in report.tools),
            idle_s=sum(g.idle_s for g in gpus),
            blocked_s=sum(g.idle_blocked_s for g in gpus),
            unattributed_s=sum(g.idle_unattributed_s for g in gpus),
            loop_blocked_s=sum(loop.blocked_s for loop in report.event_loops),
            tools={
                tool.tool: (tool.gpu_idle_blocked_s, tool.gpu_idle_blocked_queue_s, tool.gpu_idle_blocked_exec_s)
                for tool in report.tools
            },
        )

    @property
    def busy_ratio(self) -> float:
        return 1.0 - self.idle_s / self.seconds if self.seconds else 0.0

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


def comparison(baseline_report: Report, fixed_report: Report) -> str:
    """The closing table: baseline against fixed, from the two reports' parts."""
    base, fixed = RunTotals.of(baseline_report), RunTotals.of(fixed_report)
    label_width, value_width = 40, 22
    lines = [
        "Baseline versus fixed (from the two reports)",
        f"{'':{label_width}}{'baseline':>{value_width}}{'fixed':>{value_width}}",
    ]

    def row(label: str, baseline_value: str, fixed_value: str) -> None:
        lines.append(f"{label:{label_width}}{baseline_value:>{value_width}}{fixed_value:>{value_width}}")

    row("run length (s)", f"{base.seconds:.1f}", f"{fixed.seconds:.1f}")
    row("tool calls served", str(base.calls), str(fixed.calls))
    row("tool calls per second", f"{base.calls_per_s:.1f}", f"{fixed.calls_per_s:.1f}")
    row("GPU not idle (share of the run)", f"{base.busy_ratio:.0%}", f"{fixed.busy_ratio:.0%}")
    row("GPU idle (s)", f"{base.idle_s:.1f}", f"{fixed.idle_s:.1f}")
    row("  blocked by tool calls (s)", f"{base.blocked_s:.1f}", f"{fixed.blocked_s:.1f}")
    row("  with no tool call in flight (s)", f"{base.unattributed_s:.1f}", f"{fixed.unattributed_s:.1f}")
    row("event loop blocked (s)", f"{base.loop_blocked_s:.1f}", f"{fixed.loop_blocked_s:.1f}")
    lines.append("GPU idle blocked by each tool (s): total (queue + exec)")
    for tool in sorted(set(base.tools) | set(fixed.tools), key=lambda name: -base.tools.get(name, (0.0,))[0]):
        row(f"  {tool}", _blocked(base.tools.get(tool)), _blocked(fixed.tools.get(tool)))
    lines.append("")
    lines.append(_verdict(base, fixed))
    return "\n".join(lines) + "\n"


def _blocked(values) -> str:
    if values is None:
        return "-"
    blocked, queue, exec_ = values
    return f"{blocked:.1f} ({queue:.1f} + {exec_:.1f})"


def _verdict(base: RunTotals, fixed: RunTotals) -> str:
    if not base.tools:
        return "The baseline run made no tool calls: nothing to compare."
    top = max(base.tools, key=lambda name: base.tools[name][0])
    blocked, queue, exec_ = base.tools[top]
    text = (
        f"In the baseline the GPU waited longest on {top}: {blocked:.1f} s "
        f"({queue:.1f} s queued for a worker, {exec_:.1f} s executing). "
    )
    removed = base.blocked_s - fixed.blocked_s
    if base.blocked_s > 0 and removed > 0:
        text += (
            f"The fix removed {removed:.1f} s of GPU idle time blocked by tool calls "
            f"({removed / base.blocked_s:.0%} of the baseline's {base.blocked_s:.1f} s)"
        )
    else:
        text += f"The fix did not reduce the GPU idle time blocked by tool calls ({fixed.blocked_s:.1f} s)"
    if base.calls_per_s > 0:
        text += f" and served {fixed.calls_per_s / base.calls_per_s:.1f}x the tool calls per second."
    else:
        text += "."
    return text


# ---------------------------------------------------------------- continuous mode


def _serve(args: argparse.Namespace, gpu: demo_gpu.GpuChoice) -> int:
    stop = threading.Event()
    restore = _stop_on_signals(stop)
    handle = _instrument(gpu, prometheus_port=args.prometheus_port)
    try:
        metrics = handle.prometheus_url or "not served (set --prometheus-port or AGENT_OTEL_PROMETHEUS_PORT)"
        _say(
            f"agent-otel demo --serve: scenario {args.scenario}, {args.conversations} conversations, "
            f"GPU: {gpu.describe(gpu_name(handle))}",
            flush=True,
        )
        _say(f"metrics: {metrics}", flush=True)
        deadline = time.monotonic() + args.duration if args.duration else math.inf
        names = ["baseline", "fixed"] if args.scenario == "alternate" else [args.scenario]
        turn = 0
        while not stop.is_set() and time.monotonic() < deadline:
            scenario = SCENARIOS[names[turn % len(names)]]
            seconds = min(args.seconds, deadline - time.monotonic())
            run_scenario(
                scenario,
                handle,
                gpu,
                seconds=seconds,
                conversations=args.conversations,
                seed=args.seed + turn,
                stop=stop,
            )
            turn += 1
    finally:
        handle.shutdown()
        restore()
    _say("agent-otel demo --serve: stopped", flush=True)
    return 0


def _stop_on_signals(stop: threading.Event):
    """Make SIGINT and SIGTERM set ``stop``; return what undoes that."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach only the main thread; --duration still stops it
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler)

    return restore
