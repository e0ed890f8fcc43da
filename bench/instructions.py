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

background and background_bare: the background's work per tool call in
``bench/overhead.py`` part 3's scenario (turns of 0.5 s of model on a
simulated GPU, then 1,000 calls in 0.5 s while it idles), on a virtual
clock in one thread: the pipeline's drain every 0.25 s and the GPU
timeline's poll every 0.5 s (blame, counters, ``gpu.idle`` spans), the
same code the pipeline and sampler threads run. background_bare is the
same loop with nothing drained or blamed (the calls made, the GPU
polled); the difference is the background's instructions per call.

encode: the traces file's encoder (``exporters/otlp_json_file.py``'s
``encode_spans_json``) per tool span, on 5,120 real tool spans made
before the count (``bench/encode.py``'s), encoded in batches of 512 (the
batching processor's default; ``--calls`` is the number of spans). Run
with ``PYTHONPATH`` at another checkout, it counts that checkout's encoder.

export and export_null: the span export thread's whole work per tool span
(``run_export``): the same kind of spans through agent-otel's batching
processor in bursts of 512, taken, encoded, written to a traces file and
freed (``export``), or taken and freed by an exporter that does nothing
(``export_null``); with encode, the three split the thread's work (the
write's system call is not counted). Runs vary by about 5 %.

``--frameworks`` counts the framework hooks' goal (#12: the hook adds no
more than one bare span's cost to a tool call) the same way, for every
call of ``bench/frameworks.py`` whose framework is installed: the call
with agent-otel instrumented and the framework not hooked (plain), inside
a bare span, inside an ``@agent_otel.tool`` function, and hooked; it
prints (hooked - plain) / (span - plain), the goal beside it. The heap
made before the counted calls is frozen (``gc.freeze``), so the counts
do not carry the collector's scans of the framework's modules; every
count runs with ``PYTHONHASHSEED=0``, and the counted calls with a
switch interval longer than the run, so the background threads' timer
wake-ups do not fall between them (their work is done at the flush).

    python bench/instructions.py --frameworks [--calls N] [--only TEXT] [--jobs J]

``--deferred`` counts the instrumented variants (``tool``, ``submit_tool``)
and, with ``--frameworks``, ``@agent_otel.tool`` and the hook again with
``deferred_spans`` on, the pipeline's thread stopped after the warm-up:
``:deferred`` whole (the spans built at the flush), ``:hot`` the hot path
alone (the spans dropped before the flush); their difference is the
pipeline's work of building one span.

    python bench/instructions.py --deferred span tool submit_tool
    python bench/instructions.py --frameworks --deferred [--only TEXT]
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

VARIANTS = (
    "span",
    "tool",
    "submit_bare",
    "submit",
    "submit_tool",
    "background_bare",
    "background",
    "encode",
    "export",
    "export_null",
)
DEFERRED_VARIANTS = ("tool", "submit_tool")  # counted again with --deferred


def run_background(calls: int, bare: bool) -> None:
    """The background's work for ``calls`` calls (whole turns of 1,000), after one turn of warm-up."""
    import collections

    from opentelemetry.sdk.trace import TracerProvider

    from agent_otel.attribution.live import LiveTimeline
    from agent_otel.exporters.prometheus import Metrics
    from agent_otel.gpu.simulated import SimulatedGpu
    from agent_otel.wiring.pipeline import Pipeline
    from agent_otel.records import NS_PER_S, ToolCall

    now = [1_700_000_000 * NS_PER_S]

    class Recorder:  # the recorder's two tables, as the hot path fills them
        inflight: dict = {}
        finished: collections.deque = collections.deque()
        spans: collections.deque = collections.deque()

    gpu = SimulatedGpu(clock=lambda: now[0])
    recorder, metrics = Recorder(), Metrics()
    pipeline = Pipeline(recorder, None, metrics)  # type: ignore[arg-type]
    tracer = TracerProvider().get_tracer("bench")
    timeline = LiveTimeline(gpu, tracer=tracer, metrics=metrics, recorder=recorder, pipeline=pipeline)
    due = {"drain": now[0] + NS_PER_S // 4, "poll": now[0] + NS_PER_S // 2}

    def advance(to: int) -> None:
        while min(due.values()) <= to:
            what = min(due, key=due.__getitem__)
            now[0] = due[what]
            if what == "drain":
                recorder.finished.clear() if bare else pipeline.drain()
                due["drain"] += NS_PER_S // 4
            else:
                samples = gpu.poll()
                if not bare:
                    timeline.on_samples(samples)
                due["poll"] += NS_PER_S // 2
        now[0] = to

    def turn() -> None:
        with gpu.busy():
            advance(now[0] + NS_PER_S // 2)
        start = now[0]
        for i in range(1000):
            advance(start + i * NS_PER_S // 2000)
            call = ToolCall("search", "direct", now[0], now[0], trace_id=i + 1, span_id=i + 1)
            recorder.inflight[id(call)] = call
            call.end_ns = now[0] + 2000
            recorder.finished.append(call)
            del recorder.inflight[id(call)]
        advance(start + NS_PER_S // 2)

    turn()
    for _ in range(calls // 1000):
        turn()


def run_encode(calls: int) -> None:
    """``calls`` tool spans encoded for the traces file, in batches of 512, after one batch of warm-up."""
    sys.path.insert(0, str(Path(__file__).parent))
    from encode import BATCH, tool_spans  # bench/encode.py: the same spans

    from agent_otel.exporters.otlp_json_file import encode_spans_json

    spans = tool_spans(ENCODE_SPANS)
    batches = [spans[i : i + BATCH] for i in range(0, len(spans), BATCH)]
    encode_spans_json(batches[0])  # imports msgspec, fills the encoder's caches
    gc.collect()
    gc.freeze()  # the collector's scans of the set-up's heap are not the encoder's
    for number in range(calls // BATCH):
        encode_spans_json(batches[number % len(batches)])


def run_export(variant: str, calls: int) -> None:
    """``calls`` tool spans through agent-otel's batching processor: what its export thread does per span.

    The spans (real tool spans, ``bench/encode.py``'s, made before the
    count and referenced by nothing else) go through ``on_end`` in bursts
    of 512, the batch size, each of which wakes the export thread, which
    takes the burst as one batch, writes it to a traces file (``export``)
    or to an exporter that does nothing (``export_null``: the difference is
    the encoding; the write's system call is not counted, valgrind counts
    no kernel instructions) and frees the spans. The process ends without
    tearing its heap down, so a run of 0 calls frees nothing either.
    """
    import tempfile
    from collections import deque

    sys.path.insert(0, str(Path(__file__).parent))
    from encode import BATCH, tool_spans  # bench/encode.py: the same spans

    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from agent_otel.exporters.batch import BatchSpanProcessor
    from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

    class Null(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    spans = deque(tool_spans(EXPORT_SPANS + BATCH))
    if variant == "export_null":
        exporter: SpanExporter = Null()
    else:
        exporter = OtlpJsonFileExporter(os.path.join(tempfile.mkdtemp(), "traces.jsonl"))
    # No timer: only the bursts wake the export thread (under valgrind a run
    # lasts long enough for a timer to fall anywhere, with a partial batch).
    processor = BatchSpanProcessor(exporter, batch_size=BATCH, interval_s=3600.0)
    # The export thread runs only when this one waits: each burst is one
    # wake-up and one batch, whatever valgrind's pace.
    sys.setswitchinterval(1000.0)

    def burst() -> None:
        for _ in range(BATCH):
            processor.on_end(spans.popleft())
        time.sleep(0.01)

    burst()  # warm up: imports msgspec, fills the encoder's caches
    gc.collect()
    gc.freeze()
    for _ in range(calls // BATCH):
        burst()
    processor.force_flush()
    sys.stdout.flush()
    os._exit(0)  # no teardown: the spans left are not freed in any run


def _deferred_mode(mode: str) -> None:
    """Set the ``deferred_spans`` setting for ``mode`` (see ``DEFERRED_MODES``) before ``instrument()``."""
    if mode in ("deferred", "hot"):
        os.environ["AGENT_OTEL_DEFERRED_SPANS"] = "true"


def _pipeline_still(mode: str, handle) -> None:
    """With deferred_spans on: stop the pipeline's thread after the warm-up, so
    the counted calls' spans are built at the flush (mode "deferred") or
    never ("hot"), not by that thread whenever it got the GIL meanwhile."""
    if mode in DEFERRED_MODES and handle is not None:
        handle.pipeline.shutdown(10.0)  # drains what the warm-up left; drain() still works after


def _discard_deferred(mode: str, handle) -> None:
    """In mode "hot": drop the deferred calls' spans before the flush would build them."""
    if mode == "hot" and handle is not None:
        handle.recorder.spans.clear()


def run(variant: str, calls: int) -> None:
    """The workload, run under valgrind by ``count``."""
    variant, _, mode = variant.partition(":")
    _deferred_mode(mode)
    if variant.startswith("background"):
        run_background(calls, bare=variant == "background_bare")
        return
    if variant == "encode":
        run_encode(calls)
        return
    if variant.startswith("export"):
        run_export(variant, calls)
        return
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
    _pipeline_still(mode, handle)
    for _ in range(calls):
        call()
    _discard_deferred(mode, handle)
    provider.force_flush()
    if handle is not None:
        handle.force_flush()


ENCODE_SPANS = 5120  # the tool spans made for encode, whatever the number encoded
EXPORT_SPANS = 5120  # the tool spans made for export (and one batch of warm-up), whatever the number exported

FRAMEWORK_MODES = ("plain", "span", "tool", "hook")
# --deferred: the instrumented variants and modes again with deferred_spans on,
# counted whole ("deferred": the hot path and the pipeline's building of the
# spans at the flush) and without the building ("hot": the spans dropped
# before the flush, so the count is the hot path's alone).
DEFERRED_MODES = ("deferred", "hot")


def run_framework(label: str, mode: str, calls: int) -> None:
    """One call of ``bench/frameworks.py`` (by label) in ``mode``, under valgrind by ``count``."""
    mode, _, deferred = mode.partition(":")
    _deferred_mode(deferred)
    sys.path.insert(0, str(Path(__file__).parent))
    import frameworks as bench  # bench/frameworks.py: the same calls, made the same way

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import agent_otel
    from agent_otel.capture.frameworks import instrument_frameworks

    (case,) = [case for case in bench.CASES if case[0] == label]
    _, framework, _, make, _ = case
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(bench.DropSpans(), max_queue_size=1 << 20))
    trace.set_tracer_provider(provider)
    tracer = provider.get_tracer("bench")
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=[])
    plain = bench.bare_function() if make is None else make()
    if mode == "span":

        def call():
            with tracer.start_as_current_span("bare"):
                plain()

    elif mode == "tool":
        call = agent_otel.tool(lambda: plain())
    elif mode == "hook":
        if framework is None:
            call = bench.bare_tool()
        else:
            instrument_frameworks((framework,))
            call = plain
    else:
        call = plain
    for _ in range(50):  # warm up: lazy imports, caches, the first calls
        call()
    # The framework's modules are a large heap made at import: a collection
    # of the oldest generation that falls inside the counted calls or not
    # moves a run by tens of thousands of instructions per call. Frozen, the
    # collector scans only what the calls themselves keep.
    gc.collect()
    gc.freeze()
    # The background threads (span export, the pipeline) wake on timers, and
    # under valgrind a call takes milliseconds: how often they took the GIL
    # between calls, and what each wake-up cost, moved a run by thousands of
    # instructions per call. With a switch interval longer than the run they
    # run only when this thread blocks (a loop waiting on a worker) and at
    # the flush below, which does their per-call work (export, metrics) once.
    sys.setswitchinterval(1000.0)
    _pipeline_still(deferred, handle)
    for _ in range(calls):
        call()
    _discard_deferred(deferred, handle)
    provider.force_flush()
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
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dicts and sets, so the same probes, in every run
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run of {variant} failed: {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help=f"of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument(
        "--calls",
        type=int,
        default=3000,
        help="(background: rounded down to whole turns of 1,000; encode: spans, to whole batches of 512)",
    )
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--frameworks", action="store_true", help="the framework hooks against a bare span")
    parser.add_argument("--only", metavar="TEXT", help="with --frameworks: only the calls whose label contains TEXT")
    parser.add_argument("--jobs", type=int, default=4, help="with --frameworks: valgrind runs at once")
    parser.add_argument(
        "--deferred",
        action="store_true",
        help="also count the instrumented variants (and hooks) with deferred_spans on: whole, and the hot path alone",
    )
    args = parser.parse_args()
    if args.run:
        if "|" in args.run:
            label, mode = args.run.rsplit("|", 1)
            run_framework(label, mode, args.calls)
        else:
            run(args.run, args.calls)
        return 0
    if args.frameworks:
        return frameworks(args.calls, args.only, args.jobs, args.deferred)
    variants = list(args.variants or VARIANTS)
    if args.deferred:
        variants += [f"{v}:{mode}" for v in variants if v in DEFERRED_VARIANTS for mode in DEFERRED_MODES]
    unknown = {v.partition(":")[0] for v in variants} - set(VARIANTS)
    unknown |= {v for v in variants if v.partition(":")[2] not in ("", *DEFERRED_MODES)}
    if unknown:
        parser.error(f"no variant {', '.join(sorted(unknown))}; the variants: {', '.join(VARIANTS)}")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (on Debian: apt-get install valgrind)")
        return 2
    print(f"instructions per call, all threads, {args.calls} calls (valgrind cachegrind)")
    per_call = {}
    for variant in variants:
        calls = args.calls // 512 * 512 if variant.startswith(("encode", "export")) else args.calls  # whole batches
        per_call[variant] = (instructions(variant, calls) - instructions(variant, 0)) / calls
        print(f"  {variant:20} {per_call[variant]:10,.0f}", flush=True)
    for tool in ("tool", "tool:deferred", "tool:hot"):
        if "span" in per_call and tool in per_call:
            print(f"{tool} / span: {per_call[tool] / per_call['span']:.3f}")
    for variant in DEFERRED_VARIANTS:
        if f"{variant}:deferred" in per_call and f"{variant}:hot" in per_call:
            moved = per_call[f"{variant}:deferred"] - per_call[f"{variant}:hot"]
            print(f"{variant}: the pipeline's building of a deferred span: {moved:,.0f}")
    if "submit_bare" in per_call and "submit" in per_call:
        print(f"submit / submit_bare: {per_call['submit'] / per_call['submit_bare']:.3f}")
    if "background_bare" in per_call and "background" in per_call:
        print(f"background work per call: {per_call['background'] - per_call['background_bare']:,.0f}")
    return 0


def frameworks(calls: int, only: Optional[str], jobs: int, deferred: bool = False) -> int:
    """Per framework call: instructions per call in each mode, and the hook in bare spans
    (with ``deferred``, a second line: @tool and the hook with deferred_spans on)."""
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (on Debian: apt-get install valgrind)")
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    import frameworks as bench

    print(f"instructions per tool call, all threads, {calls} calls (valgrind cachegrind); cost = mode - plain")
    print(
        f"{'call':30} {'plain':>10} {'span':>9} {'@tool':>9} {'hook':>9} {'hook / span':>12} {'goal':>7}  "
        f"{'@tool / span':>12} {'(hook-@tool) / span':>20}"
    )
    for label, _framework, module, _make, _count in bench.CASES:
        if only and only not in label:
            continue
        if not bench._installed(module):
            print(f"{label:30} (not installed)")
            continue
        modes = FRAMEWORK_MODES + (("tool:hot", "hook:hot", "hook:deferred") if deferred else ())
        # Counts do not depend on the machine's load: the runs go side by side.
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            counts = {(mode, n): pool.submit(instructions, f"{label}|{mode}", n) for mode in modes for n in (0, calls)}
            per_call = {mode: (counts[mode, calls].result() - counts[mode, 0].result()) / calls for mode in modes}
        span, tool, hook = (per_call[mode] - per_call["plain"] for mode in ("span", "tool", "hook"))
        ratio = hook / span
        print(
            f"{label:30} {per_call['plain']:10,.0f} {span:+9,.0f} {tool:+9,.0f} {hook:+9,.0f} {ratio:12.3f} "
            f"{'met' if ratio <= bench.GOAL_RATIO else 'NOT MET':>7}  {tool / span:12.3f} {(hook - tool) / span:20.3f}",
            flush=True,
        )
        if deferred:
            # The same columns, deferred_spans on, the hot path alone; then the
            # hook counted whole (the pipeline's building of the span included).
            tool, hook = (per_call[mode] - per_call["plain"] for mode in ("tool:hot", "hook:hot"))
            whole = (per_call["hook:deferred"] - per_call["plain"]) / span
            print(
                f"{'  deferred, hot path':30} {'':10} {'':9} {tool:+9,.0f} {hook:+9,.0f} {hook / span:12.3f} "
                f"{'met' if hook / span <= bench.GOAL_RATIO else 'NOT MET':>7}  {tool / span:12.3f} "
                f"{(hook - tool) / span:20.3f}   whole (with the build): {whole:.3f}",
                flush=True,
            )
    print(f"goal: the hook adds no more than one bare span's cost (hook / span <= {bench.GOAL_RATIO:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
