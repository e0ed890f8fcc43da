"""What encoding a tool span to OTLP/JSON costs the export thread.

The spans are real: ``@agent_otel.tool`` calls under ``instrument()`` (no
GPU, no frameworks) on a provider with a resource, kept in memory. Each
round encodes them in batches of 512 (the batching processor's default)
with ``exporters/otlp_json_file.py``'s ``encode_spans_json`` and, with
``--baseline PATH`` (another checkout, or that file itself), with the
baseline's, in a rotated order; the figure is the median [min-max] µs per
span over the rounds (the process's CPU time), and the ratio of the two in
each round. Both outputs are checked to be the same JSON value first.

    python bench/encode.py [--rounds R] [--spans N] [--baseline PATH]

For the figure in docs/performance.md, the baseline was the encoder before
this bench (``git show <commit>:exporters/otlp_json_file.py > /tmp/old.py``).

``--cold``: before each timing, 64 MB are written (twice this machine's last
level cache), so the spans are read from memory, as the export thread finds
them after they waited in the queue; the warm figure is still measured
beside it, in the same rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

BATCH = 512


def tool_spans(count: int) -> list:
    import agent_otel

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())

    @agent_otel.tool
    def web_search(query: str) -> str:
        return query.upper()

    for number in range(count):
        web_search(f"query {number}")
    handle.shutdown(timeout_s=2)
    spans = [span for span in memory.get_finished_spans() if span.name.startswith("execute_tool")]
    assert len(spans) == count, f"{len(spans)} tool spans of {count}"
    return spans


def load_encoder(path: str) -> Callable:
    file = Path(path)
    if file.is_dir():
        file = file / "exporters" / "otlp_json_file.py"
    spec = importlib.util.spec_from_file_location("baseline_otlp_json_file", file)
    assert spec and spec.loader, f"cannot load {file}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.encode_spans_json


EVICT = bytearray(64 * 1024 * 1024)


def evict_caches() -> None:
    EVICT[:] = bytes(len(EVICT))  # every cache line of 64 MB written


def per_span(encode: Callable, batches: list, spans: int, cold: bool = False) -> float:
    if cold:
        evict_caches()
    start = time.process_time()
    for batch in batches:
        encode(batch)
    return (time.process_time() - start) / spans


def figure(values: list[float], scale: float = 1e6, digits: int = 1) -> str:
    return f"{statistics.median(values) * scale:.{digits}f} [{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--spans", type=int, default=5120)
    parser.add_argument("--baseline", help="another checkout (or its exporters/otlp_json_file.py)")
    parser.add_argument("--cold", action="store_true", help="also with the caches emptied before each timing")
    args = parser.parse_args()

    from agent_otel.exporters.otlp_json_file import encode_spans_json

    spans = tool_spans(args.spans)
    batches = [spans[i : i + BATCH] for i in range(0, len(spans), BATCH)]
    encoders = {"this checkout": encode_spans_json}
    if args.baseline:
        encoders["baseline"] = load_encoder(args.baseline)
        for batch in batches:  # the same content, or the figures mean nothing
            assert json.loads(encoders["baseline"](batch)) == json.loads(encode_spans_json(batch))
    if args.cold:
        encoders.update({f"{name}, cold": encoder for name, encoder in encoders.items()})
    names = list(encoders)
    for name in names:  # warm up
        per_span(encoders[name], batches[:1], BATCH)
    times: dict[str, list[float]] = {name: [] for name in names}
    print(f"load average {os.getloadavg()[0]:.1f} at the start; {len(spans)} tool spans in batches of {BATCH}")
    for number in range(args.rounds):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            times[name].append(per_span(encoders[name], batches, len(spans), cold=name.endswith(", cold")))
    print(f"\nµs per tool span (CPU), median [min-max] of {args.rounds} interleaved rounds")
    for name in names:
        print(f"  {name:<22} {figure(times[name])}")
    if args.baseline:
        ratios = [new / old for new, old in zip(times["this checkout"], times["baseline"])]
        print(f"  ratio this checkout / baseline, per round: {figure(ratios, 1, 3)}")
        if args.cold:
            ratios = [new / old for new, old in zip(times["this checkout, cold"], times["baseline, cold"])]
            print(f"  the same, cold: {figure(ratios, 1, 3)}")
    if args.cold:
        extra = [cold - warm for cold, warm in zip(times["this checkout, cold"], times["this checkout"])]
        print(f"  cold - warm, this checkout, per round: {figure(extra)} µs")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
