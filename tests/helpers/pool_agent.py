"""An agent of a GPU pool, for the multi-process test (tests/test_pools_e2e.py).

    python tests/helpers/pool_agent.py --name agent-1 --pool POOL --port 9464 --traces agent-1.jsonl \\
        [--hang-at EPOCH_S --release FILE] [--quiet-from EPOCH_S --quiet-to EPOCH_S] [--stop-at EPOCH_S]

It declares the GPU pool, serves /metrics on 127.0.0.1:PORT, exports its
spans over OTLP (``OTEL_EXPORTER_OTLP_*`` say where and how) and to a trace
file, and runs rounds of tool calls with seeded random lengths: two on a
two-worker pool (so calls queue) and one direct. After each round it
flushes its spans and prints ``exported N`` (N: tool calls so far), then
``calling`` as the next round starts. ``--hang-at``: at that moment one
call (``hung_tool``) hangs until the file ``--release`` exists (a tool
stuck on a dead upstream); ``--quiet-from``/``--quiet-to``: no calls
then, so the stall is the pool's only call in flight.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor, wait

import agent_otel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--traces", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-at", type=float)
    parser.add_argument("--release")
    parser.add_argument("--quiet-from", type=float)
    parser.add_argument("--quiet-to", type=float)
    parser.add_argument("--stop-at", type=float, required=True)
    parser.add_argument("--sequential", action="store_true", help="direct calls only, one at a time")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    handle = agent_otel.instrument(
        service_name=args.name,
        gpu_pool=args.pool,
        prometheus_port=args.port,
        traces_file=args.traces,
        frameworks=(),
        export_interval=0.1,
    )
    if handle.prometheus_url is None:
        print(f"{args.name}: /metrics is not served on port {args.port}", file=sys.stderr)
        return 1

    @agent_otel.tool
    def search(seconds: float) -> None:
        time.sleep(seconds)

    @agent_otel.tool
    def fetch_page(seconds: float) -> None:
        time.sleep(seconds)

    @agent_otel.tool
    def sql(seconds: float) -> None:
        time.sleep(seconds)

    @agent_otel.tool
    def hung_tool() -> None:
        while not os.path.exists(args.release):
            time.sleep(0.05)

    calls = 0
    print("ready", flush=True)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tools") as pool:
        while time.time() < args.stop_at:
            now = time.time()
            if args.hang_at is not None and now >= args.hang_at:
                args.hang_at = None
                print("hanging", flush=True)
                hung_tool()
                calls += 1
                print("released", flush=True)
            elif args.quiet_from is not None and args.quiet_from <= now < args.quiet_to:
                time.sleep(0.05)
                continue
            else:
                print("calling", flush=True)
                if args.sequential:
                    rng.choice((search, sql))(rng.uniform(0.1, 0.4))
                    calls += 1
                else:
                    futures = [pool.submit(rng.choice((search, fetch_page)), rng.uniform(0.1, 0.6)) for _ in range(3)]
                    sql(rng.uniform(0.05, 0.3))
                    wait(futures)
                    calls += 4
            handle.force_flush()
            print(f"exported {calls}", flush=True)
            time.sleep(rng.uniform(0.05, 0.3))
    handle.shutdown()
    print(f"done {calls}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
