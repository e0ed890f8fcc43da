"""What each remedy adds to a call, against a plain ``ThreadPoolExecutor`` submit.

Usage::

    .venv/bin/python bench/remedies.py [--calls N] [--rounds R] [--callers C]

One trivial function, called through each building block of
``agent_otel.remedies``, next to ``ThreadPoolExecutor.submit(...).result()``
on a pool of the same size, without and then with ``instrument()`` (spans go
to a null exporter through a batching processor, as in bench/overhead.py):

- plain submit: the baseline (1.00x);
- ``@tool`` submitted to that plain pool: the core's own cost, for scale;
- ``@tool(pool=...)``: a bounded tool pool (admission count, one thread hop);
- ``@tool(pool=..., timeout=, retries=, fallback=)``: the same plus the
  timeout wait and the retry/fallback bookkeeping;
- ``@tool(cache=True)`` on a hit: no thread hop at all;
- ``await tool.aio(...)``: a pool tool awaited from an event loop.

Batching is measured under concurrency (``--callers`` threads calling at
once), where it is meant to be used: the batched tool (``window_ms=1``,
``max_size`` = callers) against the same callers each submitting to a plain
pool.

Costs are CPU time of this process, all its threads together
(``time.process_time``): what a call costs the machine, and less disturbed
by other load than wall time, which on a busy machine is mostly waiting to
be scheduled. Variants run interleaved in rounds (a rotated order each
round), so drift hits all alike; each figure is the median and [min-max] of
the rounds, and each ratio is taken within a round. No goal is set for the
remedies: the figures are for scale.
"""

from __future__ import annotations

import argparse
import os
import asyncio
import concurrent.futures as cf
import statistics
import threading
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import agent_otel

WORKERS = 4


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def work(x):
    return x


def timed(fn, calls: int) -> float:
    """CPU seconds (all threads of this process) per call of ``fn()``, over ``calls`` calls."""
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls


def sequential_variants(plain_pool: cf.ThreadPoolExecutor) -> dict:
    plain_tool = agent_otel.tool(name="plain")(work)
    pooled = agent_otel.tool(name="pooled", pool="bench-io")(work)
    guarded = agent_otel.tool(name="guarded", pool="bench-io", timeout=5.0, retries=1, fallback=lambda x: None)(work)
    cached = agent_otel.tool(name="cached", cache=True)(work)
    cached(1)  # every timed call is a hit
    loop = asyncio.new_event_loop()
    return {
        "plain ThreadPoolExecutor submit": lambda: plain_pool.submit(work, 1).result(),
        "@tool submitted to that pool": lambda: plain_pool.submit(plain_tool, 1).result(),
        "@tool(pool=...)": lambda: pooled(1),
        "@tool(pool, timeout, retries, fallback)": lambda: guarded(1),
        "@tool(cache=True), a hit": lambda: cached(1),
        "await @tool(pool=...).aio()": lambda: loop.run_until_complete(pooled.aio(1)),
    }


def concurrent_per_call(call_one, callers: int, calls: int) -> float:
    """CPU seconds per call with ``callers`` threads each making ``calls // callers`` calls."""
    each = max(1, calls // callers)
    start_line = threading.Barrier(callers + 1)

    def caller():
        start_line.wait()
        for i in range(each):
            call_one(i)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    start_line.wait()
    started = time.process_time()
    for thread in threads:
        thread.join()
    return (time.process_time() - started) / (each * callers)


def concurrent_variants(plain_pool: cf.ThreadPoolExecutor, callers: int) -> dict:
    batched = agent_otel.batch(lambda items: items, name="batched", max_size=callers, window_ms=1, pool="bench-batch")
    return {
        "plain ThreadPoolExecutor submit": lambda i: plain_pool.submit(work, i).result(),
        "@batch(window_ms=1)": batched,
    }


def measure(variants: dict, run, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each variant, one per round; the variants in a rotated order each round."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            samples[name].append(run(variants[name]))
    return samples


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """``median [min-max]`` of ``values`` times ``scale``."""
    m, lo, hi = statistics.median(values) * scale, min(values) * scale, max(values) * scale
    return f"{m:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def print_table(title: str, off: dict[str, list[float]], on: dict[str, list[float]]) -> None:
    """µs per call and the ratio to the first variant (the plain submit) in the same round."""
    base_off, base_on = next(iter(off.values())), next(iter(on.values()))
    print(f"\n{title}: CPU µs per call, and x the plain submit in the same round; median [min-max]")
    print(f"  {'variant':42} {'not instrumented':>40} {'instrumented':>40}")
    for name in off:
        ratio_off = [v / b for v, b in zip(off[name], base_off)]
        ratio_on = [v / b for v, b in zip(on[name], base_on)]
        print(
            f"  {name:42} {spread(off[name], 1e6, 1):>22} {spread(ratio_off):>17}"
            f" {spread(on[name], 1e6, 1):>22} {spread(ratio_on):>17}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers for the batching table")
    args = parser.parse_args()

    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(
            NullExporter(), max_queue_size=1 << 20, max_export_batch_size=4096, schedule_delay_millis=200
        )
    )
    trace.set_tracer_provider(provider)
    agent_otel.pool("bench-io", workers=WORKERS, queue_limit=1024)
    agent_otel.pool("bench-batch", workers=WORKERS, queue_limit=1024)
    plain_pool = cf.ThreadPoolExecutor(WORKERS, thread_name_prefix="bench-plain")

    results = {}
    for phase in ("off", "on"):
        if phase == "on":
            agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
        sequential = sequential_variants(plain_pool)
        for variant in sequential.values():  # warm up: threads started, label children cached
            timed(variant, 200)
        results[phase] = (
            measure(sequential, lambda fn: timed(fn, args.calls), args.rounds),
            measure(
                concurrent_variants(plain_pool, args.callers),
                lambda fn: concurrent_per_call(fn, args.callers, args.calls),
                args.rounds,
            ),
        )
    agent_otel.uninstrument()
    plain_pool.shutdown()
    agent_otel.pools.shutdown()

    print(
        f"CPU time per call of the process, {args.rounds} interleaved rounds of {args.calls} calls per variant; "
        f"pools of {WORKERS} workers; the instrumented phase runs after the other (instrument() is process-wide); "
        f"load average {os.getloadavg()[0]:.1f} at the end. No goal is set for the remedies: the figures are for scale"
    )
    print_table("one caller at a time", results["off"][0], results["on"][0])
    print_table(f"{args.callers} callers at once", results["off"][1], results["on"][1])


if __name__ == "__main__":
    main()
