"""How fast and how lean ``agent-otel report`` is, next to the parse floor.

Usage::

    .venv/bin/python bench/report.py            # 10k, 100k and 1M spans (about 15 minutes on 2 cores)
    .venv/bin/python bench/report.py --quick    # 10k and 100k spans, fewer rounds (a smoke run)

The workload is what agent-otel writes for an agent: per turn an agent span
(a framework's), two tool calls (one direct, one queued in a pool, with its
``exec.start`` event) and, every other turn, a window-level ``gpu.idle``
span with a per-tool ``gpu.idle`` child under a tool span; 512 spans per
line, as the batch span processor exports them. Tool spans are about half
of all spans.

Each variant runs in a process of its own, after its imports (the
report's, about 0.2 CPU-seconds once per run, are printed apart), and reports
its CPU time (``time.process_time``: other load on the machine disturbs it
less than wall-clock time) and its peak resident memory (``ru_maxrss``).
Rounds are interleaved (every variant once per round, in a rotating
order) and each figure is the median of the rounds, with min and max.

- ``json.loads``: a plain loop of the standard library's ``json.loads``
  over the file's lines, the floor the report is held to;
- ``orjson.loads``: the same with orjson, the report's parser for lines
  its typed decoder refuses;
- ``msgspec typed``: the same with the report's typed decoder
  (``exporters.otlp_json.decode_traces``, then each span decoded by
  ``typed_resource_spans``: msgspec structs of only the fields the report
  reads), the parse the report starts from;
- ``report``: ``agent-otel report FILE --format json`` (read, attribute,
  every statistic, the JSON on stdout), as a user runs it.

Then the same at 100k and 1M spans on other shapes of traces
(``SHAPES``): a trace per call, a trace per turn of 8 calls, one trace for
everything; every tool call with a unique call id; model spans, and the
spans of peer instrumentations (OpenInference's tool and LLM spans) beside
ours; 1 and 100 spans a line; a window-level ``gpu.idle`` span per 50
calls. Each shape's goal is the same: the report within 2x the
``json.loads`` floor, at most 300 MB per million spans, and the cost per
span from 100k to 1M flat (``--shapes-only`` runs just these).

Then: a 65 MB GPU log (``--query-gpu`` csv, 2M samples) with the 10k-span
traces, and ``/dev/zero`` as traces and ``/dev/urandom`` as a GPU log, each
with its peak memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import orjson

from agent_otel.config import DEFAULTS
from agent_otel.semconv import (
    AGENT_TOOL_PHASE,
    GPU_IDLE_BLOCKED_DURATION,
    GPU_IDLE_BLOCKED_DURATIONS,
    GPU_IDLE_BLOCKED_PHASES,
    GPU_IDLE_BLOCKED_TOOLS,
    PHASE_EXEC,
    SPAN_EXECUTE_TOOL_PREFIX,
)

T0 = 1_772_442_000_000_000_000  # 2026-03-02T09:00:00Z
PER_LINE = 512
TOOLS = [f"tool_{i:02d}" for i in range(20)]
RESOURCE = {
    "attributes": [
        {"key": "service.name", "value": {"stringValue": "research-agent"}},
        {"key": "telemetry.sdk.language", "value": {"stringValue": "python"}},
        {"key": "telemetry.sdk.name", "value": {"stringValue": "opentelemetry"}},
        {"key": "telemetry.sdk.version", "value": {"stringValue": "1.45.2"}},
    ]
}
SCOPE = {"name": "agent_otel", "version": "0.1.0"}

# Goals (issue 15 item 1, issue 16 item 5)
GOAL_RATIO = 2.0  # report / json.loads
GOAL_GROWTH = 1.10  # cost per span at 1M / at 100k
GOAL_MB_1M = 300.0
GOAL_MB_GPU_LOG = 200.0
GOAL_MB_HOSTILE = 1024.0
# A share of an idle window gets a link and a child gpu.idle span from this size up (the default).
SHARE_MIN_S = DEFAULTS.gpu_idle_share_min


# ---------------------------------------------------------------- the workload


def _s(key: str, value: str) -> dict:
    return {"key": key, "value": {"stringValue": value}}


def _d(key: str, value: float) -> dict:
    return {"key": key, "value": {"doubleValue": value}}


def _i(key: str, value: int) -> dict:
    return {"key": key, "value": {"intValue": str(value)}}


def _array(key: str, kind: str, values: list) -> dict:
    return {"key": key, "value": {"arrayValue": {"values": [{kind: value} for value in values]}}}


def _span(
    rng: random.Random, trace: str, parent: str, name: str, start: int, end: int, attributes: list, events=()
) -> dict:
    span = {
        "traceId": trace,
        "spanId": f"{rng.getrandbits(64):016x}",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": attributes,
        "flags": 256,
        "status": {},
    }
    if parent:
        span["parentSpanId"] = parent
    if events:
        span["events"] = list(events)
    return span


def spans_of_turns(rng: random.Random):
    """Spans in the order a batch processor exports them (children first)."""
    t = T0
    turn = 0
    while True:
        turn += 1
        trace = f"{rng.getrandbits(128):032x}"
        agent_id = f"{rng.getrandbits(64):016x}"
        begin = t
        calls = []
        for kind in ("direct", "pool"):
            tool = rng.choice(TOOLS)
            submit = t + rng.randrange(1_000_000, 50_000_000)
            queue = 0 if kind == "direct" else rng.randrange(0, 400_000_000)
            start = submit + queue
            end = start + rng.randrange(20_000_000, 2_000_000_000)
            attributes = [
                _s("gen_ai.operation.name", "execute_tool"),
                _s("gen_ai.tool.name", tool),
                _s("gen_ai.tool.type", "function"),
                _s("gen_ai.tool.call.id", f"call_{rng.getrandbits(96):024x}"),
                _d("agent.tool.queue.duration", queue / 1e9),
                _s("agent.tool.executor", "direct" if kind == "direct" else "io"),
                _s("agent.tool.outcome", "ok"),
                _d("agent.tool.exec.duration", (end - start) / 1e9),
            ]
            events = ()
            if kind == "pool":
                attributes.append(_i("agent.executor.max_workers", 8))
                events = ({"timeUnixNano": str(start), "name": "exec.start"},)
            span = _span(rng, trace, agent_id, f"execute_tool {tool}", submit, end, attributes, events)
            calls.append(span)
            t = max(t, end) if kind == "direct" else t
        finish = max(int(c["endTimeUnixNano"]) for c in calls) + rng.randrange(1_000_000, 300_000_000)
        yield from calls
        if turn % 2 == 0:  # the GPU waited on this turn's tools
            call = calls[0]
            a, b = int(call["startTimeUnixNano"]), int(call["endTimeUnixNano"])
            window_trace = f"{rng.getrandbits(128):032x}"
            window = _span(
                rng,
                window_trace,
                "",
                "gpu.idle",
                a,
                b,
                [
                    _i("gpu.index", 0),
                    _s("gpu.uuid", "GPU-8f3c1f7e-5d2a-4b6e-9c1d-2f4e6a8b0c1d"),
                    _d("gpu.idle.duration", (b - a) / 1e9),
                    _d("gpu.utilization.avg", 0.03),
                    _s("gpu.idle.blocked_by", call["name"][len("execute_tool ") :]),
                    _d("gpu.idle.unattributed_duration", 0.0),
                    # the live path's per-tool totals, every share (attribution/live.py)
                    _array(GPU_IDLE_BLOCKED_TOOLS, "stringValue", [call["name"][len(SPAN_EXECUTE_TOOL_PREFIX) :]]),
                    _array(GPU_IDLE_BLOCKED_PHASES, "stringValue", [PHASE_EXEC]),
                    _array(GPU_IDLE_BLOCKED_DURATIONS, "doubleValue", [(b - a) / 1e9]),
                ],
            )
            shown = (b - a) / 1e9 >= SHARE_MIN_S
            if shown:  # a link to the call, and a child span under it
                window["links"] = [
                    {
                        "traceId": trace,
                        "spanId": call["spanId"],
                        "attributes": [_d(GPU_IDLE_BLOCKED_DURATION, (b - a) / 1e9), _s(AGENT_TOOL_PHASE, PHASE_EXEC)],
                    }
                ]
            yield window
            if shown:
                yield _span(
                    rng,
                    trace,
                    call["spanId"],
                    "gpu.idle",
                    a,
                    b,
                    [
                        _i("gpu.index", 0),
                        _d(GPU_IDLE_BLOCKED_DURATION, (b - a) / 1e9),
                        _s(AGENT_TOOL_PHASE, PHASE_EXEC),
                    ],
                )
        yield _span(
            rng,
            trace,
            "",
            "invoke_agent research",
            begin,
            finish,
            [
                _s("gen_ai.operation.name", "invoke_agent"),
                _s("gen_ai.agent.name", "research"),
            ],
        )
        t = finish


def write_traces(path: str, count: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    spans = spans_of_turns(rng)
    with open(path, "wb") as out:
        for first in range(0, count, PER_LINE):
            batch = [next(spans) for _ in range(min(PER_LINE, count - first))]
            request = {"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"scope": SCOPE, "spans": batch}]}]}
            out.write(orjson.dumps(request) + b"\n")


# ---------------------------------------------------------------- other shapes of traces

# name -> (how spans share traces: "call", "turn" (8 calls) or "one"; peers' spans beside ours; spans a line)
SHAPES = {
    "trace per call, 1 span a line": ("call", False, 1),
    "turn of 8, 100 a line": ("turn", False, 100),
    "turn of 8 with peers' spans, 100 a line": ("turn", True, 100),
    "one trace, 100 a line": ("one", False, 100),
    "one trace with peers' spans, 1 span a line": ("one", True, 1),
}
TURN_CALLS = 8
IDLE_EVERY = 50  # a window-level gpu.idle span per this many calls
AGENT_SPAN = "invoke_agent research"  # the span that closes each turn


def shape_spans(rng: random.Random, traces: str, peers: bool):
    """Spans of turns of 8 tool calls, each turn a model call, then the
    calls (direct and pooled, each with a unique call id), then its agent
    span; ``traces``: a trace per call, per turn, or one for everything;
    ``peers``: an OpenInference TOOL span beside each tool call and an LLM
    span under each model call (one call each, for the report)."""
    t = T0
    one = f"{rng.getrandbits(128):032x}"
    root = f"{rng.getrandbits(64):016x}"
    calls = 0
    while True:
        turn_trace = one if traces == "one" else f"{rng.getrandbits(128):032x}"
        agent_id = f"{rng.getrandbits(64):016x}"
        begin = t
        model_trace = f"{rng.getrandbits(128):032x}" if traces == "call" else turn_trace
        model_end = t + rng.randrange(100_000_000, 600_000_000)
        model = _span(
            rng,
            model_trace,
            "" if traces == "call" else agent_id,
            "chat llama-3-70b",
            t,
            model_end,
            [
                _s("gen_ai.operation.name", "chat"),
                _s("gen_ai.request.model", "llama-3-70b"),
                _i("gen_ai.usage.input_tokens", rng.randrange(200, 4000)),
                _i("gen_ai.usage.output_tokens", rng.randrange(10, 400)),
            ],
        )
        yield model
        if peers:
            yield _span(
                rng,
                model_trace,
                model["spanId"],
                "ChatOpenAI",
                t + 1_000_000,
                model_end - 1_000_000,
                [_s("openinference.span.kind", "LLM"), _s("llm.model_name", "llama-3-70b")],
            )
        t = model_end
        last = t
        for k in range(TURN_CALLS):
            pooled = k % 2 == 1
            tool = rng.choice(TOOLS)
            trace = f"{rng.getrandbits(128):032x}" if traces == "call" else turn_trace
            submit = t + rng.randrange(100_000, 5_000_000)
            queue = rng.randrange(0, 200_000_000) if pooled else 0
            start = submit + queue
            end = start + rng.randrange(5_000_000, 800_000_000)
            attributes = [
                _s("gen_ai.operation.name", "execute_tool"),
                _s("gen_ai.tool.name", tool),
                _s("gen_ai.tool.type", "function"),
                _s("gen_ai.tool.call.id", f"call_{rng.getrandbits(96):024x}"),
                _d("agent.tool.queue.duration", queue / 1e9),
                _s("agent.tool.executor", "io" if pooled else "direct"),
                _s("agent.tool.outcome", "ok"),
                _d("agent.tool.exec.duration", (end - start) / 1e9),
            ]
            events = ()
            if pooled:
                attributes.append(_i("agent.executor.max_workers", 8))
                events = ({"timeUnixNano": str(start), "name": "exec.start"},)
            parent = "" if traces == "call" else agent_id
            call = _span(rng, trace, parent, f"execute_tool {tool}", submit, end, attributes, events)
            yield call
            if peers:
                yield _span(
                    rng,
                    trace,
                    parent,
                    tool,
                    start + 500_000,
                    end - 500_000,
                    [_s("openinference.span.kind", "TOOL"), _s("tool.name", tool)],
                )
            calls += 1
            if calls % IDLE_EVERY == 0:  # the GPU waited on this call: a window of its own trace
                yield _span(
                    rng,
                    f"{rng.getrandbits(128):032x}",
                    "",
                    "gpu.idle",
                    start,
                    end,
                    [
                        _i("gpu.index", 0),
                        _s("gpu.uuid", "GPU-8f3c1f7e-5d2a-4b6e-9c1d-2f4e6a8b0c1d"),
                        _d("gpu.idle.duration", (end - start) / 1e9),
                        _d("gpu.utilization.avg", 0.03),
                        _d("gpu.idle.unattributed_duration", 0.0),
                        _array(GPU_IDLE_BLOCKED_TOOLS, "stringValue", [tool]),
                        _array(GPU_IDLE_BLOCKED_PHASES, "stringValue", [PHASE_EXEC]),
                        _array(GPU_IDLE_BLOCKED_DURATIONS, "doubleValue", [(end - start) / 1e9]),
                    ],
                )
            last = max(last, end)
            t = end if not pooled else t + rng.randrange(1_000_000, 50_000_000)
        finish = last + rng.randrange(1_000_000, 100_000_000)
        if traces != "call":
            yield _span(
                rng,
                turn_trace,
                root if traces == "one" else "",
                AGENT_SPAN,
                begin,
                finish,
                [_s("gen_ai.operation.name", "invoke_agent"), _s("gen_ai.agent.name", "research")],
            )
        t = finish


def write_shape(path: str, count: int, shape: str, seed: int = 3) -> None:
    """``count`` spans of a shape of ``SHAPES``; with one trace, its root span last."""
    traces, peers, per_line = SHAPES[shape]
    rng = random.Random(seed)
    body = count - 1 if traces == "one" else count
    spans = _whole_turns(shape_spans(rng, traces, peers), body, traces)
    last_end = T0
    with open(path, "wb") as out:
        for first in range(0, body, per_line):
            batch = list(itertools.islice(spans, min(per_line, body - first)))
            last_end = max(last_end, *(int(span["endTimeUnixNano"]) for span in batch))
            request = {"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"scope": SCOPE, "spans": batch}]}]}
            out.write(orjson.dumps(request) + b"\n")
        if traces == "one":  # the root every turn's agent span hangs from
            first_span = json.loads(open(path, "rb").readline())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
            root_span = {
                "traceId": first_span["traceId"],
                "spanId": _root_of(first_span, path),
                "name": "session",
                "kind": 1,
                "startTimeUnixNano": str(T0),
                "endTimeUnixNano": str(last_end),
                "attributes": [],
                "status": {},
            }
            request = {
                "resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"scope": SCOPE, "spans": [root_span]}]}]
            }
            out.write(orjson.dumps(request) + b"\n")


def _whole_turns(spans, count: int, traces: str):
    """The first ``count`` spans, the turns whole: the last turn that does
    not fit is cut short of calls, not of its agent span (which comes last
    in a turn), so every call lies in its turn's agent span. (Cut anywhere,
    one trace of a whole session would end in calls outside any agent span,
    and the report would take the trace as one turn from its root.)"""
    if traces == "call":  # no agent spans
        yield from (next(spans) for _ in range(count))
        return
    turn: list[dict] = []
    for span in spans:
        if count <= 0:
            return
        turn.append(span)
        if span["name"] != AGENT_SPAN:
            continue
        if len(turn) > count:
            turn = [*turn[: count - 1], turn[-1]]
        yield from turn
        count -= len(turn)
        turn = []


def _root_of(first_span: dict, path: str) -> str:
    """The parent id the agent spans of a one-trace file name (the root's id)."""
    with open(path, "rb") as lines:
        for line in lines:
            for span in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]:
                if span["name"] == AGENT_SPAN:
                    return span["parentSpanId"]
    raise ValueError("no agent span in the shape")


def run_shapes(sizes: list[int], rounds: dict[int, int], directory: str) -> bool:
    """Each shape at each size: the report against json.loads, side by side in one run."""
    print()
    print("Shapes of traces: report against json.loads at each size; median [min-max] over interleaved rounds.")
    print(
        f"{'shape':<44} {'spans':>9} {'MB':>5} {'json.loads µs/span':>20} {'report µs/span':>20} "
        f"{'report / json.loads':>20} {'peak MB':>14} {'MB per 1M spans':>16}"
    )
    ok = True
    for shape in SHAPES:
        per_size = {}
        peaks: dict[int, float] = {}
        paths = {size: os.path.join(directory, f"shape-{size}.jsonl") for size in sizes}
        for size, path in paths.items():
            write_shape(path, size, shape)
        # the sizes' rounds interleaved too: the machine's speed drifts over
        # minutes (json.loads per span moved 13 % between the two sizes of one
        # shape once), and the growth compares the sizes
        every: dict[int, dict[str, list[dict]]] = {size: {"json.loads": [], "report": []} for size in sizes}
        for number in range(max(rounds[size] for size in sizes)):
            for size in sizes if number % 2 == 0 else sizes[::-1]:
                if number >= rounds[size]:
                    continue
                for variant in ["json.loads", "report"] if number % 2 == 0 else ["report", "json.loads"]:
                    args = [paths[size]] if variant != "report" else [paths[size], "--format", "json"]
                    every[size][variant].append(measure(variant, *args))
        for size in sizes:
            path, runs = paths[size], every[size]
            megabytes = os.path.getsize(path) / 1e6
            os.remove(path)
            assert all(r["exit"] == 0 for r in runs["report"]), runs["report"][0]["stderr"]
            ratios = [r["cpu_s"] / j["cpu_s"] for r, j in zip(runs["report"], runs["json.loads"])]
            peak = [r["peak_mb"] for r in runs["report"]]
            per_span = [r["cpu_s"] / size * 1e6 for r in runs["report"]]
            per_million = [p / size * 1e6 for p in peak]  # at 1M: the peak itself
            per_size[size] = (statistics.median(per_span), statistics.median(per_million), statistics.median(ratios))
            peaks[size] = statistics.median(peak)
            print(
                f"{shape:<44} {size:>9} {megabytes:>5.0f} "
                f"{spread([j['cpu_s'] / size * 1e6 for j in runs['json.loads']]):>20} {spread(per_span):>20} "
                f"{spread(ratios):>20} {spread(peak, '{:.0f}'):>14} "
                f"{spread(per_million, '{:.0f}') if size >= 1_000_000 else '-':>16}",
                flush=True,
            )
            met = per_size[size][2] <= GOAL_RATIO and (size < 1_000_000 or statistics.median(peak) <= GOAL_MB_1M)
            ok = ok and met
        if len(sizes) > 1:
            small, large = min(sizes), max(sizes)
            growth = per_size[large][0] / per_size[small][0]
            memory = (peaks[large] - peaks[small]) / (large - small) * 1e6  # MB per 1M spans more
            met = growth <= GOAL_GROWTH
            ok = ok and met
            print(
                f"{'':<44} cost per span {large} / {small}: {growth:.2f} (goal <= {GOAL_GROWTH:.2f}: "
                f"{'met' if met else 'NOT MET'}); peak memory grows {memory:.0f} MB per 1M spans"
            )
    return ok


def write_gpu_log(path: str, megabytes: float) -> int:
    """A ``--query-gpu=timestamp,index,utilization.gpu --format=csv`` log of
    about ``megabytes`` MB: 8 GPUs sampled every 200 ms. Returns its samples."""
    rng = random.Random(2)
    samples = 0
    with open(path, "w", encoding="ascii") as out:
        out.write("timestamp, index, utilization.gpu [%]\n")
        t = T0 // 1_000_000  # ms
        size = 0
        while size < megabytes * 1e6:
            stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(t // 1000)) + f".{t % 1000:03d}"
            lines = "".join(f"{stamp}, {gpu}, {rng.choice((0, 3, 45, 90, 97))} %\n" for gpu in range(8))
            out.write(lines)
            size += len(lines)
            samples += 8
            t += 200
    return samples


# ---------------------------------------------------------------- one measurement, in a process of its own


def child(variant: str, args: list[str]) -> None:
    """Run one variant after its imports; print its CPU seconds and peak RSS as JSON."""
    if variant == "start-up":
        start = time.process_time()
        from agent_otel.commands.cli import build_parser

        build_parser("report")
        print(json.dumps({"cpu_s": time.process_time() - start, "peak_mb": 0, "exit": 0}))
        return
    if variant in ("json.loads", "orjson.loads", "msgspec typed"):
        if variant == "msgspec typed":
            from agent_otel.spans.otlp_json import decode_traces, typed_resource_spans

            def loads(line: bytes) -> None:
                for _resource, _count, spans in typed_resource_spans(decode_traces(line)):
                    for _span in spans:
                        pass
        else:
            loads = json.loads if variant == "json.loads" else orjson.loads
        start = time.process_time()
        with open(args[0], "rb") as lines:
            for line in lines:
                loads(line)
        seconds = time.process_time() - start
        exit_code = 0
    else:
        from agent_otel.commands.cli import build_parser, main

        build_parser("report")  # its imports, timed apart (start-up)
        sys.stdout = open(os.devnull, "w")
        start = time.process_time()
        exit_code = main(["report", *args])
        seconds = time.process_time() - start
        sys.stdout = sys.__stdout__
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"cpu_s": seconds, "peak_mb": peak, "exit": exit_code}))


def measure(variant: str, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--child", variant, *args], capture_output=True, text=True, timeout=1800
    )
    if result.returncode != 0 and not result.stdout.strip():
        raise RuntimeError(f"{variant} failed: {result.stderr}")
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "stderr": result.stderr.strip()}


# ---------------------------------------------------------------- the run


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def run_scaling(sizes: list[int], rounds: dict[int, int], directory: str) -> dict[int, dict]:
    variants = ["json.loads", "orjson.loads", "msgspec typed", "report"]
    results: dict[int, dict] = {}
    print("Report time and memory against the parse floor; each figure: median [min-max] over interleaved rounds.")
    print(
        f"{'spans':>9} {'file MB':>8} {'rounds':>6}  {'json.loads µs/span':>22} {'orjson.loads µs/span':>22} "
        f"{'msgspec typed µs/span':>22} "
        f"{'report µs/span':>22} {'report / json.loads':>22} {'goal':>6} {'report peak MB':>22}"
    )
    for size in sizes:
        path = os.path.join(directory, f"traces-{size}.jsonl")
        write_traces(path, size)
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for number in range(rounds[size]):
            order = variants[number % len(variants) :] + variants[: number % len(variants)]
            for variant in order:
                args = [path] if variant != "report" else [path, "--format", "json"]
                runs[variant].append(measure(variant, *args))
        per_span = {v: [r["cpu_s"] / size * 1e6 for r in runs[v]] for v in variants}
        ratios = [r["cpu_s"] / j["cpu_s"] for r, j in zip(runs["report"], runs["json.loads"])]
        peak = [r["peak_mb"] for r in runs["report"]]
        results[size] = {"per_span": per_span, "ratios": ratios, "peak": peak}
        print(
            f"{size:>9} {os.path.getsize(path) / 1e6:>8.0f} {rounds[size]:>6}  "
            f"{spread(per_span['json.loads']):>22} {spread(per_span['orjson.loads']):>22} "
            f"{spread(per_span['msgspec typed']):>22} "
            f"{spread(per_span['report']):>22} {spread(ratios):>22} {'<= ' + str(GOAL_RATIO):>6} "
            f"{spread(peak, '{:.0f}'):>22}"
        )
        if size != max(sizes):
            os.remove(path)
    return results


def run_growth(results: dict[int, dict]) -> bool:
    ok = True
    if 100_000 in results and 1_000_000 in results:
        at_100k = statistics.median(results[100_000]["per_span"]["report"])
        at_1m = statistics.median(results[1_000_000]["per_span"]["report"])
        growth = at_1m / at_100k
        ok = growth <= GOAL_GROWTH
        print(f"cost per span, 1M / 100k: {growth:.3f} (goal <= {GOAL_GROWTH:.2f}: {'met' if ok else 'NOT MET'})")
        peak = statistics.median(results[1_000_000]["peak"])
        met = peak < GOAL_MB_1M
        ok = ok and met
        print(
            f"peak memory at 1M spans: {spread(results[1_000_000]['peak'], '{:.0f}')} MB "
            f"(goal < {GOAL_MB_1M:.0f} MB: {'met' if met else 'NOT MET'})"
        )
    for size, result in results.items():
        met = statistics.median(result["ratios"]) <= GOAL_RATIO
        ok = ok and met
        print(
            f"report / json.loads at {size} spans: {statistics.median(result['ratios']):.2f} "
            f"(goal <= {GOAL_RATIO}: {'met' if met else 'NOT MET'})"
        )
    return ok


def run_inputs(directory: str, megabytes: float) -> bool:
    traces = os.path.join(directory, "traces-10k.jsonl")
    write_traces(traces, 10_000)
    log = os.path.join(directory, "gpu.csv")
    samples = write_gpu_log(log, megabytes)
    ok = True
    print()
    startup = [measure("start-up")["cpu_s"] for _ in range(3)]
    print(
        f"Start-up of agent-otel report (its imports, once per run, not in the figures above): {spread(startup)} CPU s"
    )
    print()
    print("Large and hostile inputs (one run each): peak memory of the report process")
    runs = [
        (
            f"10k spans + a {os.path.getsize(log) / 1e6:.0f} MB GPU log ({samples / 1e6:.1f}M samples)",
            [traces, "--gpu-log", log, "--tz", "UTC", "--format", "json"],
            0,
            GOAL_MB_GPU_LOG,
        ),
        ("/dev/zero as traces", ["/dev/zero"], 2, GOAL_MB_HOSTILE),
        ("/dev/urandom as a GPU log", [traces, "--gpu-log", "/dev/urandom"], 2, GOAL_MB_HOSTILE),
    ]
    for label, args, expected_exit, goal in runs:
        result = measure("report", *args)
        met = result["exit"] == expected_exit and result["peak_mb"] < goal
        ok = ok and met
        said = f"; said: {result['stderr']}" if expected_exit else ""
        print(
            f"  {label}: exit {result['exit']}, {result['cpu_s']:.2f} CPU s, peak {result['peak_mb']:.0f} MB "
            f"(goal: exit {expected_exit}, < {goal:.0f} MB: {'met' if met else 'NOT MET'}){said}"
        )
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k spans, 3 rounds")
    parser.add_argument("--gpu-log-mb", type=float, default=65.0, help="size of the large GPU log (default 65)")
    parser.add_argument("--shapes-only", action="store_true", help="only the shapes of traces (100k and 1M spans)")
    parser.add_argument(
        "--rounds-1m", type=int, default=3, help="rounds of each shape at 1M spans (default 3; 1 on a loaded machine)"
    )
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1:])
        return 0
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    rounds = {10_000: 3 if args.quick else 7, 100_000: 3 if args.quick else 5, 1_000_000: 3}
    import msgspec

    print(
        f"python {sys.version.split()[0]}, msgspec {msgspec.__version__}, orjson {orjson.__version__}, "
        f"{os.cpu_count()} CPUs; "
        f"{'quick run' if args.quick else 'full run'}; CPU seconds per process, after its imports"
    )
    shape_sizes = [10_000, 100_000] if args.quick else [100_000, 1_000_000]
    shape_rounds = {10_000: 3, 100_000: 3, 1_000_000: args.rounds_1m}
    with tempfile.TemporaryDirectory(prefix="agent-otel-bench-report-") as directory:
        if args.shapes_only:
            ok = run_shapes(shape_sizes, shape_rounds, directory)
        else:
            results = run_scaling(sizes, rounds, directory)
            ok = run_growth(results)
            ok = run_shapes(shape_sizes, shape_rounds, directory) and ok
            ok = run_inputs(directory, args.gpu_log_mb) and ok
    print(f"\nall goals met: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
