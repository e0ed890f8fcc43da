"""Reliability trials: load, soak, faults and fork, with the figures that show they held.

Each trial runs in a fresh interpreter (its own tracer provider, its own
threads) and reports what happened; nothing is asserted here, the figures
are printed for docs/performance.md (the tests hold the behaviour):

- **load**: many threads call tools as fast as they can; every call is
  accounted for: spans in the traces file plus spans dropped (by kind)
  equals calls made;
- **soak**: a steady agent with a simulated GPU going idle and busy, so
  idle windows make derived spans too; RSS sampled over time;
- **faults**: an OTLP/HTTP endpoint answering 500 (requests it received,
  lines on stderr), the traces file on a full disk (``/dev/full``), and an
  export queue too small for the GPU's derived spans (which kind was lost);
- **fork**: forks while four threads make tool calls (and a scrape thread,
  and a model keeping the simulated GPU busy 20 ms in 50); children that
  hung (killed after a timeout), and the children's spans exported.
- **idle-agent**: the long run on a GPU that never works: ``instrument()``
  with the simulated GPU idle the whole time (one idle window from start to
  end) and ~1,500 calls a second through ``@agent_otel.tool`` (each 60 ms,
  ~90 in flight), spans encoded to ``/dev/null``; RSS, the shares the
  engine holds and the horizon's calls, sampled over the run. The figure:
  RSS growth after the first minute.
- **idle-service**: the same for a GPU pool's blame service: a real
  ``agent-otel gpu-exporter --pool`` process (simulated GPU, always idle)
  fed ~1,500 tool spans a second over OTLP/gRPC (``bench/blame_service.py``'s
  spans, 150 a request); its RSS, held calls and dropped calls.

    python bench/reliability.py                 # the first four trials, about three minutes on 2 cores
    python bench/reliability.py --quick         # smaller numbers, under a minute
    python bench/reliability.py --trial fork    # one trial
    python bench/reliability.py --trial idle-agent --trial idle-service --seconds 3600   # the 1-hour soak
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

TRIALS = ("load", "soak", "faults", "fork", "idle-agent", "idle-service")
DEFAULT_TRIALS = TRIALS[:4]

COMMON = r"""
import http.server, json, os, signal, sys, threading, time
import agent_otel

def rss_mb(pid="self", field="VmRSS"):
    # RssAnon: the heap alone, without the shared libraries' pages as they are touched (RssFile)
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")

def spans_in(path):
    counts = {}
    with open(path) as lines:
        for line in lines:
            for resource in json.loads(line)["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    for span in scope["spans"]:
                        counts[span["name"]] = counts.get(span["name"], 0) + 1
    return counts

def dropped(handle):
    value = handle.metrics.registry.get_sample_value
    return {kind: int(value("agent_otel_spans_dropped_total", {"kind": kind}) or 0)
            for kind in ("tool", "derived", "other")}

ARGS = json.loads(sys.argv[1])
TMP = ARGS["tmp"]

def progress(**figures):
    # One line of figures while a long trial runs (run_trial echoes it to stderr).
    print("progress " + json.dumps(figures), flush=True)

def soak_figures(samples, first_s=60.0):
    # RSS growth after the first minute: from the last sample at or before
    # first_s to the largest and to the last sample after it; and the same of RssAnon.
    base = [s for s in samples if s[0] <= first_s]
    after = [s for s in samples if s[0] > first_s]
    if not base or not after:
        return {}
    rss = [s[1] for s in after]
    anon = [s[2] for s in after]
    return {"rss_at_first_s": base[-1][1], "rss_max_after": max(rss), "rss_last": rss[-1],
            "growth_max_mb": round(max(rss) - base[-1][1], 1), "growth_last_mb": round(rss[-1] - base[-1][1], 1),
            "anon_growth_max_mb": round(max(anon) - base[-1][2], 1)}
"""

IDLE_AGENT = r"""
handle = agent_otel.instrument(service_name="idle-soak", traces_file=os.devnull, traces_exporters="none",
                               gpu="simulated", frameworks=())
engine = handle.gpu_timeline.engine
CALL_S = ARGS["call_s"]

@agent_otel.tool
def search(i):
    time.sleep(CALL_S)
    return i

seconds, rate, threads = ARGS["seconds"], ARGS["rate"], ARGS["threads"]
stop = threading.Event()
calls = [0] * threads
def work(slot):
    period = threads / rate  # each thread's share of the rate
    due = time.monotonic() + slot * period / threads
    while not stop.is_set():
        search(slot)
        calls[slot] += 1
        due += period
        wait = due - time.monotonic()
        if wait > 0:
            stop.wait(wait)
        elif wait < -1.0:  # starved for a while: no burst to catch up
            due = time.monotonic()
workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
for worker in workers:
    worker.start()
samples, started = [], time.monotonic()
while True:
    t = time.monotonic() - started
    shares = sum(len(window.shares) for window in list(engine._open.values()))
    rss = round(rss_mb(), 1)
    anon = round(rss_mb(field="RssAnon"), 1)
    samples.append((round(t, 1), rss, anon))
    progress(t=round(t), rss_mb=rss, anon_mb=anon, calls=sum(calls),
             shares_held=shares, horizon_calls=len(engine.horizon), open_windows=len(engine.open_windows()))
    if t >= seconds:
        break
    time.sleep(min(ARGS["every"], max(0.0, seconds - t)))
stop.set()
for worker in workers:
    worker.join()
took = time.monotonic() - started
idle = handle.metrics.registry.get_sample_value("agent_gpu_idle_seconds_total", {"gpu": "0"}) or 0.0
ok = handle.shutdown(timeout_s=60)
print(json.dumps({"seconds": round(took), "calls": sum(calls), "calls_per_s": round(sum(calls) / took),
                  "idle_s": round(idle, 1), "shutdown": ok, "dropped": dropped(handle), "samples": samples,
                  **soak_figures(samples)}))
"""

IDLE_SERVICE = r"""
import random, re, urllib.request
sys.path.insert(0, ARGS["repo"])
import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from bench.blame_service import GRPC_SERVICE, request_of, start_service

def scrape(url):
    values = {}
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        for name in ("agent_otel_blame_calls", "agent_otel_blame_calls_dropped_total",
                     "agent_gpu_idle_seconds_total", "agent_otel_refused_spans_total", "agent_otel_late_spans_total"):
            if line.startswith(name + " ") or line.startswith(name + "{"):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values

seconds, rate, per_request = ARGS["seconds"], ARGS["rate"], ARGS["per_request"]
process, endpoint, metrics_url = start_service(watermark_s=30.0)
rng = random.Random(7)
sent, refused, serial = 0, 0, 1
samples, started = [], time.monotonic()
next_sample = started
try:
    with grpc.insecure_channel(endpoint) as channel:
        export = channel.unary_unary(f"/{GRPC_SERVICE}/Export", request_serializer=None,
                                     response_deserializer=ExportTraceServiceResponse.FromString)
        period = per_request / rate
        due = time.monotonic()
        while True:
            now = time.monotonic()
            t = now - started
            if now >= next_sample:
                rss = round(rss_mb(process.pid), 1)
                anon = round(rss_mb(process.pid, "RssAnon"), 1)
                samples.append((round(t, 1), rss, anon))
                figures = scrape(metrics_url)
                progress(t=round(t), rss_mb=rss, anon_mb=anon, sent=sent,
                         held=figures.get("agent_otel_blame_calls"),
                         dropped=figures.get("agent_otel_blame_calls_dropped_total"),
                         late=figures.get("agent_otel_late_spans_total"),
                         idle_s=figures.get("agent_gpu_idle_seconds_total"))
                next_sample += ARGS["every"]
                if t >= seconds:
                    break
            if now < due:
                time.sleep(min(due - now, max(0.0, next_sample - now)))
                continue
            body = request_of(10, per_request, rng, serial)
            serial += per_request
            response = export(body, timeout=30)
            refused += response.partial_success.rejected_spans
            sent += per_request
            due += period
            if due < time.monotonic() - 1.0:  # starved: no burst to catch up
                due = time.monotonic()
    took = time.monotonic() - started
    final = scrape(metrics_url)
finally:
    process.terminate()
    process.wait(timeout=60)
print(json.dumps({"seconds": round(took), "spans": sent, "spans_per_s": round(sent / took), "refused": refused,
                  "held": final.get("agent_otel_blame_calls"),
                  "dropped": final.get("agent_otel_blame_calls_dropped_total"),
                  "idle_s": final.get("agent_gpu_idle_seconds_total"), "samples": samples,
                  **soak_figures(samples)}))
"""

LOAD = r"""
traces = os.path.join(TMP, "load.jsonl")
handle = agent_otel.instrument(service_name="load", traces_file=traces, traces_exporters="none", gpu="off",
                               frameworks=())

@agent_otel.tool
def search(i):
    return i

threads, per_thread = ARGS["threads"], ARGS["calls"]
rss = [round(rss_mb(), 1)]
def work():
    for i in range(per_thread):
        search(i)
started = time.monotonic()
workers = [threading.Thread(target=work) for _ in range(threads)]
for worker in workers:
    worker.start()
while any(worker.is_alive() for worker in workers):
    time.sleep(0.5)
    rss.append(round(rss_mb(), 1))
elapsed = time.monotonic() - started
ok = handle.shutdown(timeout_s=60)
handle.pipeline.drain()
counted = handle.metrics.registry.get_sample_value("agent_tool_calls_total", {"tool": "search", "outcome": "ok"})
print(json.dumps({"calls": threads * per_thread, "calls_per_s": round(threads * per_thread / elapsed),
                  "metrics_counted": int(counted), "exported": spans_in(traces).get("execute_tool search", 0),
                  "dropped": dropped(handle), "shutdown": ok, "rss_mb": rss}))
"""

SOAK = r"""
traces = os.path.join(TMP, "soak.jsonl")
handle = agent_otel.instrument(service_name="soak", traces_file=traces, traces_exporters="none",
                               gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.05, frameworks=(),
                               export_interval=0.5)
gpu = handle.gpu_timeline.source

@agent_otel.tool
def search(i):
    time.sleep(0.0005)
    return i

seconds = ARGS["seconds"]
stop = threading.Event()
calls = [0, 0, 0, 0]
def work(slot):
    while not stop.is_set():
        search(slot)
        calls[slot] += 1
def model():
    while not stop.is_set():
        gpu.run_kernel(0.05)
        time.sleep(0.15)   # the GPU idles while the tools run
workers = [threading.Thread(target=work, args=(i,)) for i in range(4)] + [threading.Thread(target=model)]
for worker in workers:
    worker.start()
rss, started = [], time.monotonic()
while time.monotonic() - started < seconds:
    rss.append(round(rss_mb(), 1))
    time.sleep(seconds / 10)
stop.set()
for worker in workers:
    worker.join()
ok = handle.shutdown(timeout_s=60)
counts = spans_in(traces)
print(json.dumps({"seconds": seconds, "calls": sum(calls), "exported": counts.get("execute_tool search", 0),
                  "gpu_idle_spans": counts.get("gpu.idle", 0), "dropped": dropped(handle), "shutdown": ok,
                  "rss_mb": rss}))
"""

FAULTS = r"""
import contextlib, io, logging, socket

class Refusing(http.server.BaseHTTPRequestHandler):
    posts = 0
    def do_POST(self):
        Refusing.posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(500)
        self.end_headers()
    def log_message(self, *args):
        pass

# Every agent-otel line on stderr, as a user would see it (the last-resort handler).
lines = []
class Counting(logging.Handler):
    def emit(self, record):
        lines.append((record.name, record.getMessage()))
logging.getLogger().addHandler(Counting())

@agent_otel.tool
def search(i):
    return i

def run_for(seconds):
    calls, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        search(calls)
        calls += 1
        time.sleep(0.0002)
    return calls

# 1. An OTLP/HTTP endpoint that answers 500.
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
threading.Thread(target=server.serve_forever, daemon=True).start()
handle = agent_otel.instrument(service_name="faults", otlp_endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1/traces",
                               otlp_protocol="http/protobuf", gpu="off", frameworks=(), export_interval=0.05,
                               export_batch_size=64)
calls = run_for(ARGS["seconds"])
handle.shutdown(timeout_s=2)
handle.pipeline.drain()
otlp = {"seconds": ARGS["seconds"], "calls": calls, "posts": Refusing.posts, "lines": len(lines),
        "dropped": dropped(handle)}
server.shutdown()

# 2. The traces file on a full disk.
lines.clear()
handle = agent_otel.instrument(service_name="faults", traces_file="/dev/full", traces_exporters="none",
                               gpu="off", frameworks=(), export_interval=0.05, export_batch_size=64)
calls = run_for(ARGS["seconds"])
handle.shutdown(timeout_s=5)
handle.pipeline.drain()
disk = {"seconds": ARGS["seconds"], "calls": calls, "lines": len(lines), "dropped": dropped(handle)}

# 3. An export queue too small for the GPU's derived spans.
lines.clear()
traces = os.path.join(TMP, "faults.jsonl")
handle = agent_otel.instrument(service_name="faults", traces_file=traces, traces_exporters="none",
                               gpu="simulated", gpu_poll_interval=0.05, gpu_min_idle=0.05, frameworks=(),
                               max_queue_size=256, export_batch_size=256, export_interval=2.0)
gpu = handle.gpu_timeline.source
stop = threading.Event()
def model():
    # Idle stretches longer than the simulated GPU's sample period (1/6 s, like NVML's), so
    # windows close and their per-call children compete with the tool spans for the queue.
    while not stop.is_set():
        gpu.run_kernel(0.02)
        time.sleep(0.3)
driver = threading.Thread(target=model)
driver.start()
calls = run_for(ARGS["seconds"])
stop.set()
driver.join()
handle.shutdown(timeout_s=10)
handle.pipeline.drain()
counts = spans_in(traces)
queue = {"seconds": ARGS["seconds"], "calls": calls, "exported_tool_spans": counts.get("execute_tool search", 0),
         "exported_gpu_idle_spans": counts.get("gpu.idle", 0), "dropped": dropped(handle), "lines": len(lines)}
print(json.dumps({"otlp_500": otlp, "full_disk": disk, "small_queue": queue}))
"""

FORK = r"""
from concurrent.futures import ThreadPoolExecutor
from prometheus_client import generate_latest
traces = os.path.join(TMP, "fork.jsonl")
handle = agent_otel.instrument(service_name="fork", traces_file=traces, traces_exporters="none",
                               gpu="simulated", gpu_poll_interval=0.01, frameworks=(), export_batch_size=8,
                               export_interval=0.05, prometheus_port=0)

@agent_otel.tool
def parent_tool(x):
    return x

@agent_otel.tool
def child_tool(x):
    return x

stop = threading.Event()
def call_tools(slot):
    pool = ThreadPoolExecutor(2, thread_name_prefix=f"pool{slot}")
    while not stop.is_set():
        parent_tool(slot)
        pool.submit(parent_tool, slot).result()
    pool.shutdown()
def scrape():
    while not stop.is_set():
        generate_latest(handle.metrics.registry)
def model():
    gpu = handle.gpu_timeline.source
    while not stop.is_set():
        gpu.run_kernel(0.02)
        time.sleep(0.03)
threads = [threading.Thread(target=call_tools, args=(i,)) for i in range(4)]
threads += [threading.Thread(target=scrape), threading.Thread(target=model)]
for thread in threads:
    thread.start()
time.sleep(0.3)

outcomes, child_s = {}, []
for number in range(ARGS["forks"]):
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child_tool(number)
            text = generate_latest(handle.metrics.registry).decode()
            code = 0 if handle.shutdown(timeout_s=5.0) and "child_tool" in text else 3
        finally:
            os._exit(code)
    deadline, outcome = time.monotonic() + 20.0, "hang"
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            outcome = "ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"
            break
        time.sleep(0.002)
    if outcome == "hang":
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    child_s.append(time.monotonic() - started)
stop.set()
for thread in threads:
    thread.join()
ok = handle.shutdown(timeout_s=30)
child_s.sort()
print(json.dumps({"forks": ARGS["forks"], "outcomes": outcomes, "hangs": outcomes.get("hang", 0),
                  "child_spans_exported": spans_in(traces).get("execute_tool child_tool", 0),
                  "child_p50_s": round(child_s[len(child_s) // 2], 3), "child_max_s": round(child_s[-1], 3),
                  "parent_shutdown": ok}))
"""

CODE = {
    "load": LOAD,
    "soak": SOAK,
    "faults": FAULTS,
    "fork": FORK,
    "idle-agent": IDLE_AGENT,
    "idle-service": IDLE_SERVICE,
}


def run_trial(name: str, arguments: dict) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(COMMON + CODE[name]), json.dumps(arguments)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    assert process.stdout is not None and process.stderr is not None
    for line in process.stdout:  # a long trial's progress as it comes
        if line.startswith("progress "):
            print(f"[{name}] {line[len('progress ') :].strip()}", file=sys.stderr, flush=True)
        else:
            lines.append(line)
    stderr = process.stderr.read()
    process.wait()
    took = time.monotonic() - started
    if process.returncode != 0 or not lines:
        raise SystemExit(f"trial {name} failed:\n{stderr}")
    return json.loads(lines[-1]), took


def idle_summary(name: str, figures: dict) -> str:
    """The soak's figure: RSS growth after the first minute."""
    what = (
        f"{figures['calls']:,} tool calls ({figures['calls_per_s']:,}/s), shutdown {figures['shutdown']}"
        if name == "idle-agent"
        else f"{figures['spans']:,} spans sent ({figures['spans_per_s']:,}/s), {figures['refused']} refused, "
        f"held at the end {figures['held']:,.0f}, dropped {figures['dropped']:,.0f}"
    )
    rss = [round(sample[1]) for sample in figures["samples"]]
    step = max(1, len(rss) // 20)
    return (
        f"{figures['seconds']} s with the GPU idle throughout ({figures['idle_s'] or 0:.0f} s idle counted): {what}\n"
        f"RSS MB: at 60 s {figures.get('rss_at_first_s')}, max after {figures.get('rss_max_after')}, "
        f"last {figures.get('rss_last')}: growth after the first minute {figures.get('growth_max_mb')} MB "
        f"(max), {figures.get('growth_last_mb')} MB (last); of the heap alone (RssAnon) "
        f"{figures.get('anon_growth_max_mb')} MB (max)\n"
        f"RSS MB over the run: {' '.join(map(str, rss[::step]))}"
    )


def spark(values: list) -> str:
    return " ".join(f"{v:.0f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trial", choices=TRIALS, action="append", help="run only these trials (repeatable)")
    parser.add_argument("--quick", action="store_true", help="smaller numbers, for a check in under a minute")
    parser.add_argument("--seconds", type=float, default=None, help="how long the idle-* soaks run (default 300)")
    parser.add_argument("--rate", type=float, default=1500.0, help="tool calls (spans) a second in the idle-* soaks")
    args = parser.parse_args()
    quick = args.quick
    soak_s = args.seconds or (90 if quick else 300)
    every = 5.0 if soak_s <= 600 else 30.0
    sizes = {
        "load": {"threads": 16, "calls": 2_000 if quick else 20_000},
        "soak": {"seconds": 10 if quick else 60},
        "faults": {"seconds": 2 if quick else 5},
        "fork": {"forks": 20 if quick else 200},
        "idle-agent": {"seconds": soak_s, "rate": args.rate, "threads": 120, "call_s": 0.06, "every": every},
        "idle-service": {
            "seconds": soak_s,
            "rate": args.rate,
            "per_request": 150,
            "every": every,
            "repo": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        },
    }
    with tempfile.TemporaryDirectory(prefix="agent-otel-reliability-") as tmp:
        for name in args.trial or DEFAULT_TRIALS:
            figures, took = run_trial(name, {**sizes[name], "tmp": tmp})
            print(f"\n== {name} ({took:.0f} s)")
            if name == "load":
                d = figures["dropped"]
                print(
                    f"calls made {figures['calls']:,} from 16 threads ({figures['calls_per_s']:,}/s); "
                    f"counted in metrics {figures['metrics_counted']:,}; spans exported {figures['exported']:,}; "
                    f"dropped tool {d['tool']:,}, derived {d['derived']:,}, other {d['other']:,}; "
                    f"exported + dropped = calls: {figures['exported'] + d['tool'] == figures['calls']}; "
                    f"shutdown {figures['shutdown']}"
                )
                print(f"RSS MB every 0.5 s: {spark(figures['rss_mb'])}")
            elif name == "soak":
                d = figures["dropped"]
                print(
                    f"{figures['seconds']} s, calls made {figures['calls']:,}; spans exported "
                    f"{figures['exported']:,} tool, {figures['gpu_idle_spans']:,} gpu.idle; dropped tool "
                    f"{d['tool']}, derived {d['derived']}, other {d['other']}; exported + dropped = calls: "
                    f"{figures['exported'] + d['tool'] == figures['calls']}; shutdown {figures['shutdown']}"
                )
                print(f"RSS MB at every tenth of the run: {spark(figures['rss_mb'])}")
            elif name == "faults":
                o, f, q = figures["otlp_500"], figures["full_disk"], figures["small_queue"]
                print(
                    f"OTLP/HTTP answering 500, {o['seconds']} s: {o['calls']:,} calls, {o['posts']} POSTs "
                    f"received, {o['lines']} log line(s); dropped tool {o['dropped']['tool']:,}"
                )
                print(
                    f"traces file on a full disk, {f['seconds']} s: {f['calls']:,} calls, {f['lines']} log "
                    f"line(s); dropped tool {f['dropped']['tool']:,}"
                )
                print(
                    f"queue of 256 with the GPU idling, {q['seconds']} s: {q['calls']:,} calls; exported "
                    f"{q['exported_tool_spans']:,} tool spans, {q['exported_gpu_idle_spans']:,} gpu.idle; dropped "
                    f"tool {q['dropped']['tool']:,}, derived {q['dropped']['derived']:,}, other "
                    f"{q['dropped']['other']:,}; {q['lines']} log line(s)"
                )
            elif name in ("idle-agent", "idle-service"):
                print(idle_summary(name, figures))
            else:
                print(
                    f"{figures['forks']} forks while 4 threads call tools: {figures['outcomes']}; hangs "
                    f"{figures['hangs']}; child spans exported {figures['child_spans_exported']} of "
                    f"{figures['forks']}; child run p50 {figures['child_p50_s']} s, max {figures['child_max_s']} s; "
                    f"parent shutdown {figures['parent_shutdown']}"
                )


if __name__ == "__main__":
    main()
