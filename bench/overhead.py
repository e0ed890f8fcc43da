"""What a traced tool call costs, measured side by side in one run.

Prints per-call costs and ratios for the same trivial function:

- bare call;
- a bare OpenTelemetry SDK span around it (``start_as_current_span``), on
  the same tracer provider and span processor as every traced variant;
- the same SDK span written by hand with what a tool span must carry (the
  contract's seven attributes, the exec duration set at the end);
- ``@agent_otel.tool`` with ``instrument()`` (span, queue and exec time, and
  the finished record handed to the metrics thread);
- OpenLLMetry's ``@tool`` (traceloop-sdk) and OpenInference's
  ``OITracer.tool``, when installed (``pip install -e '.[bench]'``);
- ``ThreadPoolExecutor`` submit + result, with and without instrumentation.

Goals: a tool call at most 1.15x a bare SDK span; instrumented submit+result
at most 1.25x uninstrumented. Variants run interleaved in rounds, so drift
in machine load hits all of them alike; the median round is reported.

    python bench/overhead.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import agent_otel


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def setup_provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            NullExporter(), max_queue_size=1 << 20, max_export_batch_size=4096, schedule_delay_millis=200
        )
    )
    trace.set_tracer_provider(provider)
    return provider


def work(x):
    return x


def timed(fn, calls: int, flush=None) -> float:
    """Seconds per call of ``fn()``, over ``calls`` calls.

    ``flush`` (exporting the spans those calls made) is timed too: a span's
    cost includes its export, which otherwise lands on whatever runs next.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    if flush is not None:
        flush()
    cpu_times.append((time.process_time() - cpu_start) / calls)
    return (time.perf_counter() - start) / calls


# CPU seconds per call of the last timed() runs (every thread of the process:
# the worker, the export and pipeline threads too), read next to the wall time.
cpu_times: list[float] = []


SUBMIT_VARIANTS = (
    "submit+result, uninstrumented",
    "submit+result, instrumented",
    "submit+result of a tool, instrumented",
)


def competitor_variants(provider):
    """The peers' @tool decorators on the same provider, where installed."""
    variants = {}
    try:
        from openinference.instrumentation import OITracer, TraceConfig

        oi_tracer = OITracer(provider.get_tracer("openinference-bench"), config=TraceConfig())
        oi_work = oi_tracer.tool(work)
        variants["OpenInference OITracer.tool"] = lambda: oi_work(1)
    except ImportError as exc:
        print(f"  (OpenInference not installed: {exc.name}; pip install -e '.[bench]')")
    try:
        from traceloop.sdk.decorators import tool as traceloop_tool
        from traceloop.sdk.tracing.tracing import TracerWrapper

        # OpenLLMetry's decorators trace only once Traceloop.init() has made
        # its TracerWrapper; point that at the same provider rather than
        # letting it build an exporter of its own.
        TracerWrapper.verbose = False
        wrapper = object.__new__(TracerWrapper)
        wrapper._TracerWrapper__tracer_provider = provider
        wrapper._TracerWrapper__spans_processor = None
        TracerWrapper.instance = wrapper
        tl_work = traceloop_tool(name="work")(work)
        tl_work(1)
        variants["OpenLLMetry @tool"] = lambda: tl_work(1)
    except Exception as exc:  # noqa: BLE001 - a peer we cannot set up is reported, not fatal
        print(f"  (OpenLLMetry not measured: {type(exc).__name__}: {exc})")
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    provider = setup_provider()
    tracer = provider.get_tracer("bench")

    def bare_span():
        with tracer.start_as_current_span("execute_tool work"):
            work(1)

    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "work",
        "gen_ai.tool.type": "function",
        "agent.tool.queue.duration": 0.0,
        "agent.tool.executor": "direct",
        "agent.tool.outcome": "ok",
    }

    def hand_written_span():
        with tracer.start_as_current_span("execute_tool work", attributes=attributes) as span:
            start = time.perf_counter_ns()
            work(1)
            span.set_attribute("agent.tool.exec.duration", (time.perf_counter_ns() - start) / 1e9)

    tool_work = agent_otel.tool(work)
    variants = {
        "bare call": lambda: work(1),
        "bare SDK span": bare_span,
        "SDK span with the tool span's attributes": hand_written_span,
        "@agent_otel.tool": lambda: tool_work(1),
    }
    variants.update(competitor_variants(provider))

    pool = cf.ThreadPoolExecutor(max_workers=1)
    submit_calls = max(args.calls // 10, 500)

    results: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in SUBMIT_VARIANTS}
    results["submit+result, uninstrumented"] = []
    results["submit+result, instrumented"] = []
    results["submit+result of a tool, instrumented"] = []
    flush = provider.force_flush
    for _round in range(args.rounds):
        results["submit+result, uninstrumented"].append(timed(lambda: pool.submit(work, 1).result(), submit_calls))
        cpu["submit+result, uninstrumented"].append(cpu_times[-1])
        handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
        for name, fn in variants.items():
            results[name].append(timed(fn, args.calls, flush))
        handle.force_flush()
        results["submit+result, instrumented"].append(timed(lambda: pool.submit(work, 1).result(), submit_calls))
        cpu["submit+result, instrumented"].append(cpu_times[-1])
        results["submit+result of a tool, instrumented"].append(
            timed(lambda: pool.submit(tool_work, 1).result(), submit_calls, flush)
        )
        cpu["submit+result of a tool, instrumented"].append(cpu_times[-1])
        agent_otel.uninstrument()
        # "bare call" and "bare SDK span" do not depend on instrument(); the
        # peers' decorators run while it is active too, as they would in an
        # agent that uses both.

    median = {name: statistics.median(values) for name, values in results.items()}
    span = median["bare SDK span"]
    submit = median["submit+result, uninstrumented"]
    print(
        f"\nPer-call cost, median of {args.rounds} interleaved rounds "
        f"({args.calls} calls each; {submit_calls} for submit+result)\n"
    )
    print(f"{'variant':46} {'us/call':>9} {'x bare span':>12}")
    for name in variants:
        print(f"{name:46} {median[name] * 1e6:9.2f} {median[name] / span:12.2f}")
    hand = median["SDK span with the tool span's attributes"]
    print(
        f"\n@agent_otel.tool vs the same span written by hand: {median['@agent_otel.tool'] / hand:.2f}x "
        "(what the toolkit adds beyond the data it must record: in-flight table, finished record, "
        "metrics on the pipeline thread)"
    )
    cpu_median = {name: statistics.median(values) for name, values in cpu.items()}
    cpu_submit = cpu_median["submit+result, uninstrumented"]
    print(f"\n{'variant':42} {'us/call':>9} {'x uninstr.':>12} {'CPU us/call':>12} {'x uninstr.':>12}")
    for name in SUBMIT_VARIANTS:
        print(
            f"{name:42} {median[name] * 1e6:9.2f} {median[name] / submit:12.2f} "
            f"{cpu_median[name] * 1e6:12.2f} {cpu_median[name] / cpu_submit:12.2f}"
        )
    print(
        "(a submit+result round trip waits for the worker thread to wake: on an idle machine that "
        "wake-up dominates the wall time; the CPU columns show the work itself)"
    )
    tool_ratio = median["@agent_otel.tool"] / span
    submit_ratio = median["submit+result, instrumented"] / submit
    print(
        f"\ngoal: @agent_otel.tool <= 1.15x bare span: {tool_ratio:.2f}x ({'met' if tool_ratio <= 1.15 else 'NOT met'})"
    )
    cpu_ratio = cpu_median["submit+result, instrumented"] / cpu_submit
    print(
        f"goal: instrumented submit+result <= 1.25x: {submit_ratio:.2f}x wall "
        f"({'met' if submit_ratio <= 1.25 else 'NOT met'}), {cpu_ratio:.2f}x CPU "
        f"({'met' if cpu_ratio <= 1.25 else 'NOT met'})"
    )
    pool.shutdown()
    provider.shutdown()


if __name__ == "__main__":
    main()
