"""Instructions per call, counted by valgrind: what a change to the hot path
costs, whatever else the machine is doing.

On a shared machine wall and CPU time per call move by tens of percent from
one run to the next; the number of instructions the process executes does
not (valgrind's cachegrind counts them, every thread, the background
threads' metrics and span export included). Each variant runs twice under
cachegrind, with 0 and with N calls after the same set-up and warm-up; the
difference over N is its instructions per call. Repeat runs agree within
about 0.2 %.

Instructions are not time (a system call such as the thread CPU clock
counts as one; cache misses are free), so the goals stay in microseconds
(``bench/overhead.py``); this says which way a change moved and by how much.

    python bench/instructions.py [--calls N] [VARIANT ...]

Variants: span (a bare SDK span on a batching processor and a null
exporter), tool (``@agent_otel.tool`` on the same provider), submit_bare
(``ThreadPoolExecutor`` submit+result, not instrumented), submit (the same,
instrumented), submit_tool (a tool submitted, instrumented). Needs valgrind
(``apt-get install valgrind``); about a minute per variant.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

VARIANTS = ("span", "tool", "submit_bare", "submit", "submit_tool")


def run(variant: str, calls: int) -> None:
    """The workload, run under valgrind by ``count``."""
    import concurrent.futures as cf

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import agent_otel

    class Null(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(Null(), max_queue_size=1 << 20, max_export_batch_size=4096, schedule_delay_millis=200)
    )
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("bench")

    def work(x):
        return x

    handle = None
    if variant != "span" and variant != "submit_bare":
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    if variant == "span":

        def call():
            with tracer.start_as_current_span("execute_tool work"):
                work(1)

    elif variant == "tool":
        tool_work = agent_otel.tool(work)

        def call():
            tool_work(1)

    else:
        pool = cf.ThreadPoolExecutor(max_workers=1)
        fn = agent_otel.tool(work) if variant == "submit_tool" else work

        def call():
            pool.submit(fn, 1).result()

    for _ in range(200):  # warm up: caches, the tool's first calls
        call()
    for _ in range(calls):
        call()
    provider.force_flush()
    if handle is not None:
        handle.force_flush()


def instructions(variant: str, calls: int) -> int:
    done = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--run",
            variant,
            "--calls",
            str(calls),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run of {variant} failed: {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help=f"of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run(args.run, args.calls)
        return 0
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"no variant {', '.join(sorted(unknown))}; the variants: {', '.join(VARIANTS)}")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (on Debian: apt-get install valgrind)")
        return 2
    print(f"instructions per call, all threads, {args.calls} calls (valgrind cachegrind)")
    per_call = {}
    for variant in args.variants or VARIANTS:
        per_call[variant] = (instructions(variant, args.calls) - instructions(variant, 0)) / args.calls
        print(f"  {variant:12} {per_call[variant]:10,.0f}", flush=True)
    if "span" in per_call and "tool" in per_call:
        print(f"tool / span: {per_call['tool'] / per_call['span']:.3f}")
    if "submit_bare" in per_call and "submit" in per_call:
        print(f"submit / submit_bare: {per_call['submit'] / per_call['submit_bare']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
