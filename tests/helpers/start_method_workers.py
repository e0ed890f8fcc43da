"""multiprocessing workers that instrument themselves, run under one start method.

``python start_method_workers.py METHOD TRACES`` starts, under METHOD (fork,
spawn or forkserver), workers that each call ``agent_otel.instrument()``
themselves and write to the traces file TRACES:

- a short worker (400 tool calls at once, then it returns: under fork and
  forkserver multiprocessing ends it with ``os._exit``);
- a long worker (400 calls over several export intervals, so some of its
  spans leave while it runs and the rest at its exit);
- a ``Pool`` of one (its initializer instruments it in ``self`` mode), used
  in a ``with`` block, whose end terminates the worker (SIGTERM) once the
  400 calls are answered;
- one worker that makes 100 calls and waits to be terminated
  (``Process.terminate()``, SIGTERM).

It prints one JSON line: the exit codes of the workers.
"""

import json
import multiprocessing
import sys
import time

import agent_otel

TRACES = sys.argv[2] if __name__ == "__main__" else None


def instrument(traces):
    agent_otel.instrument(
        service_name="worker",
        traces_file=traces,
        traces_exporters="none",
        gpu="off",
        frameworks=(),
        export_interval=0.1,
    )


@agent_otel.tool
def short_tool(i):
    return i


@agent_otel.tool
def long_tool(i):
    return i


@agent_otel.tool
def pool_tool(i):
    return i


@agent_otel.tool
def terminated_tool(i):
    return i


def short_worker(traces, calls):
    instrument(traces)
    for i in range(calls):
        short_tool(i)


def long_worker(traces, calls):
    instrument(traces)
    for i in range(calls):
        long_tool(i)
        time.sleep(0.0015)  # 400 calls: over half a second, five export intervals


def terminated_worker(traces, calls, ready):
    instrument(traces)
    for i in range(calls):
        terminated_tool(i)
    ready.set()
    time.sleep(600)  # until terminated


def main(method, traces):
    context = multiprocessing.get_context(method)
    workers = [context.Process(target=short_worker, args=(traces, 400))]
    workers += [context.Process(target=long_worker, args=(traces, 400))]
    ready = context.Event()
    terminated = context.Process(target=terminated_worker, args=(traces, 100, ready))
    for worker in [*workers, terminated]:
        worker.start()
    with context.Pool(1, initializer=instrument, initargs=(traces,)) as pool:
        answered = pool.map(pool_tool, range(400), chunksize=10)
    ready.wait(120)
    terminated.terminate()
    for worker in [*workers, terminated]:
        worker.join(120)
    print(
        json.dumps(
            {
                "exit_codes": [w.exitcode for w in workers],
                "terminated": terminated.exitcode,
                "pool": answered == list(range(400)),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], TRACES)
