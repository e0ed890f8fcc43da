"""A live instrumented process that makes every metric of the contract move.

    python tests/helpers/contract_workload.py

On a simulated GPU (clearly named so), it runs plain tool calls, calls
through a ThreadPoolExecutor, a sync tool that blocks an asyncio loop, and the remedies (a bounded pool that
rejects, a timeout with a retry and a fallback, a result cache that
evicts, a batched tool); scrapes its own /metrics twice, once while a
tool call sits in the queue and one runs (so the in-flight gauge has
samples), and once at the end; and prints both scrapes (OpenMetrics)
separated by a line "----".
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import agent_otel
from agent_otel.capture.models import model_calls
from model_server import FakeModelServer, vllm_v1  # tests/helpers, beside this script

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def scrape(url: str) -> str:
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def main() -> None:
    # Requests queued and the KV cache half full: the server stalls while the tools run.
    model_server = FakeModelServer(vllm_v1(running=0, waiting=2, kv=0.45, prompt=10, generation=10))
    handle = agent_otel.instrument(
        service_name="contract-workload",
        prometheus_port=0,
        gpu="simulated",
        gpu_poll_interval=0.05,
        gpu_min_idle=0.2,
        gpu_hour_price="2.5",  # the cost panels' agent_gpu_hour_price
        # a stand-in vLLM /metrics beside the simulated GPU: the model server's metrics and panels
        model_server_metrics=model_server.url,
        traces_exporters="none",
        frameworks=(),
    )
    assert handle.prometheus_url is not None and handle.gpu_timeline is not None
    gpu = handle.gpu_timeline.source
    release = threading.Event()

    @agent_otel.tool
    def search(query: str) -> str:
        time.sleep(0.01)
        return query

    @agent_otel.tool
    def blocked_until_released() -> None:
        release.wait(10)

    @agent_otel.tool
    def flaky() -> None:
        raise ConnectionError("refused")

    agent_otel.pool("io", workers=1, queue_limit=0)
    agent_otel.pool("quotes", workers=2)

    @agent_otel.tool(pool="quotes", timeout=0.05, retries=1, fallback=lambda: "cached")
    def slow_quote() -> str:
        time.sleep(0.3)
        return "fresh"

    @agent_otel.tool(pool="io")
    def pooled() -> str:
        time.sleep(0.2)
        return "ok"

    @agent_otel.tool(cache=agent_otel.ResultCache(max_entries=1))
    def rate(currency: str) -> float:
        return 1.0

    @agent_otel.batch(max_size=4, window_ms=5)
    def embed(texts: list[str]) -> list[int]:
        return [len(t) for t in texts]

    @agent_otel.tool
    def parse(text: str) -> str:
        time.sleep(0.25)  # sync, called from a coroutine: it blocks the event loop
        return text

    async def agent_loop() -> None:
        parse("doc")  # a blocked loop: asyncio.loop.blocked, blocked seconds by tool
        await asyncio.to_thread(release.wait, 10)  # the loop stays watched (its lag gauge) until the end

    loop_thread = threading.Thread(target=asyncio.run, args=(agent_loop(),), name="agent-loop")
    loop_thread.start()
    gpu.run_kernel(0.1)  # the model thinks; then the GPU waits for the tools
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tools") as executor:
        running = executor.submit(blocked_until_released)
        queued = executor.submit(search, "q")  # waits behind it: the queue phase
        time.sleep(0.3)
        during = scrape(handle.prometheus_url)
        release.set()
        running.result(), queued.result()
    loop_thread.join()
    search("direct")
    try:
        flaky()
    except ConnectionError:
        pass
    answer = slow_quote()  # times out twice (its workers are abandoned), then the fallback answers
    assert answer == "cached", answer
    pooled_call = threading.Thread(target=pooled)
    pooled_call.start()
    time.sleep(0.05)
    try:
        pooled()  # the one worker is busy and nothing may queue: rejected
    except agent_otel.PoolFullError:
        pass
    pooled_call.join()
    rate("EUR"), rate("EUR"), rate("USD")  # a miss, a hit, and an eviction
    threads = [threading.Thread(target=embed, args=(f"text {i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # A model served elsewhere than this GPU: its call is in flight while the
    # GPU idles (the model server's share, and the contradiction gauge).
    model_calls.unfollow(gpu.model_call)
    with agent_otel.model_span("remote-llm") as call:
        time.sleep(0.3)
        call.first_chunk()
        time.sleep(0.2)
    model_calls.follow(gpu.model_call)
    time.sleep(0.4)  # nothing in flight: unattributed idle
    gpu.run_kernel(0.1)  # the model answers: the idle window closes
    time.sleep(0.2)  # the sampler sees it
    after = scrape(handle.prometheus_url)
    print(during)
    print("----")
    print(after)
    handle.shutdown()


if __name__ == "__main__":
    main()
