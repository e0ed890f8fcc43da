"""What the event-loop monitor costs at rest, measured side by side in one run.

An asyncio loop that waits (``await asyncio.sleep``) for ``--seconds``, under
``instrument()`` with the loop monitor on and off, in interleaved rounds:

- the loop thread's CPU time (the heartbeat runs there, every threshold / 2);
- the watchdog thread's own CPU clock (``agent-otel-loop-monitor``);
- the whole process's CPU time, on minus off.

And with no loop running at all (``time.sleep``): the process's CPU time,
on minus off (no heartbeat, and the watchdog thread is never started).

Goal: the monitor costs well under 1 % of one core at rest.

    python bench/loop_monitor.py [--seconds S] [--rounds R] [--threshold T]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time

import agent_otel

WATCHDOG = "agent-otel-loop-monitor"


def thread_cpu(name: str) -> float:
    """CPU seconds of the live thread called ``name`` (0 when there is none)."""
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def idle_loop(seconds: float) -> tuple[float, float, float]:
    """(loop thread CPU, watchdog CPU, process CPU) over an idle loop of ``seconds``."""

    async def wait() -> tuple[float, float]:
        watchdog = thread_cpu(WATCHDOG)
        start = time.thread_time()
        await asyncio.sleep(seconds)
        return time.thread_time() - start, thread_cpu(WATCHDOG) - watchdog

    process = time.process_time()
    loop_cpu, watchdog_cpu = asyncio.run(wait())
    return loop_cpu, watchdog_cpu, time.process_time() - process


def no_loop(seconds: float) -> float:
    process = time.process_time()
    time.sleep(seconds)
    return time.process_time() - process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threshold", type=float, default=0.1, help="loop_block_threshold (s)")
    args = parser.parse_args()
    loop = {True: [], False: []}
    bare = {True: [], False: []}
    for round_ in range(args.rounds):
        for on in (True, False) if round_ % 2 == 0 else (False, True):
            agent_otel.instrument(
                traces_exporters="none", gpu="off", frameworks=(), loop_monitor=on, loop_block_threshold=args.threshold
            )
            try:
                loop[on].append(idle_loop(args.seconds))
                bare[on].append(no_loop(args.seconds))
            finally:
                agent_otel.uninstrument()

    def pct(values) -> str:
        """median [min-max] of CPU seconds per round, as % of one core."""
        shares = [100 * value / args.seconds for value in values]
        return f"{statistics.median(shares):.3f} [{min(shares):.3f}-{max(shares):.3f}] %"

    print(
        f"\nCPU per second of wall time, % of one core; median [min-max] of {args.rounds} interleaved rounds "
        f"of {args.seconds:g} s; threshold {args.threshold:g} s (heartbeat every {args.threshold / 2:g} s); "
        f"load average {os.getloadavg()[0]:.1f} at the end\n"
    )
    print(f"{'idle asyncio loop':44} {'monitor on':>28} {'monitor off':>28}")
    for index, what in enumerate(("loop thread (heartbeats)", "watchdog thread", "whole process")):
        on = [sample[index] for sample in loop[True]]
        off = [sample[index] for sample in loop[False]]
        print(f"  {what:42} {pct(on):>28} {pct(off):>28}")
    process_delta = [a[2] - b[2] for a, b in zip(loop[True], loop[False])]
    monitor_own = [a[0] - b[0] + a[1] for a, b in zip(loop[True], loop[False])]
    print(f"  {'monitor: loop thread on - off, + watchdog':42} {pct(monitor_own):>28}   (goal: well under 1 %)")
    print(f"  {'process on - off (includes other threads noise)':42} {pct(process_delta):>28}")
    no_loop_delta = [a - b for a, b in zip(bare[True], bare[False])]
    print(f"\n{'no loop running: process on - off':44} {pct(no_loop_delta):>28}")
    median = statistics.median(monitor_own) / args.seconds
    print(
        f"\ngoal: monitor well under 1 % of one core at rest: {100 * median:.3f} % median, worst round "
        f"{100 * max(monitor_own) / args.seconds:.3f} % ({'met' if median < 0.01 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
