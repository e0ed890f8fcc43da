"""A small instrumented agent for the end-to-end Prometheus test.

    python tests/helpers/agent_workload.py --port 9464 --seconds 60

It serves the toolkit's /metrics on 127.0.0.1:PORT and, until stopped (or
``--seconds`` pass), runs rounds of tool calls through a two-worker pool:
two fast searches (well within the 0.8 s SLO), then two slow page fetches
(over it) that fill both workers while a flaky tool, which raises, waits
in the queue behind them. Each round starts with a "model step" that keeps
the simulated GPU busy; the GPU then idles while the tools run or queue
(blamed on them) and during a pause with nothing in flight
(unattributed), except while a summary from a model served on another
host is in flight (the model server's share), until the next model step
closes the idle window. Beside
it, an asyncio loop on its own thread parses for 0.15 s now and then with
a sync call (no tool): its loop is blocked, by `unknown`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait

import agent_otel
from agent_otel.capture.models import model_calls
from model_server import FakeModelServer, vllm_v1  # tests/helpers, beside this script

SLOW_FETCH_S = 0.9
SEARCH_S = 0.05
MODEL_STEP_S = 0.4
PAUSE_S = 0.6
REMOTE_MODEL_S = 0.25  # inside the pause: a model call whose server is not this GPU
BLOCK_S = 0.15


@agent_otel.tool
def fetch_page(url: str) -> str:
    time.sleep(SLOW_FETCH_S)
    return f"<html>{url}</html>"


@agent_otel.tool
def search(query: str) -> list[str]:
    time.sleep(SEARCH_S)
    return [query]


@agent_otel.tool
def flaky_lookup(key: str) -> str:
    time.sleep(0.02)
    raise ConnectionError(f"upstream refused {key}")


def run_round(pool: ThreadPoolExecutor) -> None:
    futures = [
        *(pool.submit(search, f"query {i}") for i in range(2)),
        pool.submit(fetch_page, "https://example.invalid/a"),
        pool.submit(fetch_page, "https://example.invalid/b"),
        pool.submit(flaky_lookup, "k"),
    ]
    wait(futures)


def event_loop_agent(stop: list, deadline: float) -> None:
    """An asyncio loop blocked 0.15 s every 0.5 s by sync code that is no tool."""

    async def agent() -> None:
        while not stop and time.monotonic() < deadline:
            time.sleep(BLOCK_S)  # e.g. a sync parse in a coroutine: the loop runs nothing else
            await asyncio.sleep(0.5)

    asyncio.run(agent())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this long at the latest")
    args = parser.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    # Requests queued and the KV cache half full: the server stalls while the tools run.
    model_server = FakeModelServer(vllm_v1(running=0, waiting=2, kv=0.45, prompt=10, generation=10))
    handle = agent_otel.instrument(
        service_name="e2e-agent",
        prometheus_port=args.port,
        gpu="simulated",
        gpu_hour_price="2.5",  # the cost panels
        # a stand-in vLLM /metrics beside the simulated GPU: the model server's metrics and panels
        model_server_metrics=model_server.url,
        traces_exporters="none",
        frameworks=(),
    )
    if handle.prometheus_url is None:
        print(f"agent_workload: /metrics is not served on port {args.port}", file=sys.stderr)
        return 1
    print(handle.prometheus_url, flush=True)
    # The simulated GPU source, driven by the fake model steps.
    gpu = handle.gpu_timeline.source if handle.gpu_timeline is not None else None
    if gpu is not None:
        # This GPU is driven by the model steps alone: the summaries' model runs elsewhere.
        model_calls.unfollow(gpu.model_call)
    deadline = time.monotonic() + args.seconds
    loop_thread = threading.Thread(target=event_loop_agent, args=(stop, deadline), name="agent-loop", daemon=True)
    loop_thread.start()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tools") as pool:
        while not stop and time.monotonic() < deadline:
            if gpu is not None:
                gpu.run_kernel(MODEL_STEP_S)
            run_round(pool)
            with agent_otel.model_span("remote-summarizer"):
                time.sleep(REMOTE_MODEL_S)
            time.sleep(PAUSE_S - REMOTE_MODEL_S)
    loop_thread.join(2.0)
    agent_otel.uninstrument()
    return 0


if __name__ == "__main__":
    sys.exit(main())
