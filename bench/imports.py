"""What a library pays to import ``@agent_otel.tool``, beside OpenTelemetry's API.

A library that decorates its tools depends on OpenTelemetry's API only;
the application chooses the SDK (``instrument()`` loads it). Each round
starts fresh interpreters, in turn, that time one statement (CPU and
wall time around it: the interpreter's own start-up is the same for all
and left out), with every module's compiled code cached as an installed
package has it:

- ``api``: ``import opentelemetry.trace``, the API alone;
- ``tool``: ``import agent_otel; agent_otel.tool``, the decorator;
- ``helpers``: the decorator, ``tool_span``, ``model_span`` and ``agent_span``;
- ``sdk``: ``import opentelemetry.sdk.trace``, what an SDK import costs (for scale).

It prints each one's CPU and wall time (the least of the rounds, the
median, the most), the ratio of ``tool`` to ``api`` (the least over the
least, the least disturbed by other work; and per round, median and range),
and whether a module of ``opentelemetry.sdk`` was loaded. The goal (issue 30): no SDK module, and
``tool`` at most 1.5x ``api``.

    python bench/imports.py [--rounds N] [--against CHECKOUT]

``--against`` adds ``tool`` and ``helpers`` imported from another checkout
(``PYTHONPATH``), e.g. main's, side by side. The interpreters run with
``-P`` (the current directory is not on the path): the others import the
installed package, or ``PYTHONPATH``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

VARIANTS = {
    "api": "import opentelemetry.trace",
    "tool": "import agent_otel; agent_otel.tool",
    "helpers": "import agent_otel; agent_otel.tool, agent_otel.tool_span, agent_otel.model_span, agent_otel.agent_span",
    "sdk": "import opentelemetry.sdk.trace",
}

PROBE = """
import sys, time
t, c = time.perf_counter(), time.process_time()
{statement}
elapsed, cpu = time.perf_counter() - t, time.process_time() - c
import json
sdk = sorted(m for m in sys.modules if m == "opentelemetry.sdk" or m.startswith("opentelemetry.sdk."))
ours = sorted(m for m in sys.modules if m == "agent_otel" or m.startswith("agent_otel."))
print(json.dumps({{"ms": elapsed * 1000, "cpu_ms": cpu * 1000, "sdk": sdk, "ours": ours, "modules": len(sys.modules)}}))
"""


# Compiled modules cached here for every variant alike, written by a first
# round that is not counted: what an installed package has, whatever
# PYTHONDONTWRITEBYTECODE says and wherever the checkouts are.
PYCACHE = os.path.join(tempfile.gettempdir(), "agent-otel-bench-imports-pycache")


def measure(statement: str, pythonpath: str | None) -> dict:
    env = dict(os.environ, PYTHONPYCACHEPREFIX=PYCACHE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, "-P", "-c", PROBE.format(statement=statement)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--against", metavar="CHECKOUT", help="also import the decorator from this checkout")
    args = parser.parse_args(argv)
    runs: list[tuple[str, str, str | None]] = [(name, statement, None) for name, statement in VARIANTS.items()]
    if args.against:
        for name in ("tool", "helpers"):
            runs.append((f"{name} (--against)", VARIANTS[name], os.path.abspath(args.against)))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in runs}
    for _, statement, path in runs:
        measure(statement, path)  # writes the compiled modules
    for _ in range(args.rounds):
        for name, statement, path in runs:  # in turn: a change of load hits every variant alike
            results[name].append(measure(statement, path))
    print(f"import time, ms: min / median [max] of {args.rounds} rounds, each a fresh interpreter; CPU and wall")
    for name, rounds in results.items():
        cpu, wall = [r["cpu_ms"] for r in rounds], [r["ms"] for r in rounds]
        last = rounds[-1]
        print(
            f"  {name:20} CPU {min(cpu):6.1f} / {statistics.median(cpu):6.1f} [{max(cpu):6.1f}]"
            f"   wall {min(wall):6.1f} / {statistics.median(wall):6.1f} [{max(wall):6.1f}]"
            f"   modules {last['modules']:4}, agent_otel's {len(last['ours']):3}, opentelemetry.sdk's {len(last['sdk'])}"
        )
    api = results["api"]
    for name in results:
        if name.startswith(("tool", "helpers")):
            cpu = [r["cpu_ms"] / a["cpu_ms"] for r, a in zip(results[name], api)]
            best = min(r["cpu_ms"] for r in results[name]) / min(a["cpu_ms"] for a in api)
            wall = min(r["ms"] for r in results[name]) / min(a["ms"] for a in api)
            print(
                f"{name} / api: CPU {best:.2f}x min over min, per round {statistics.median(cpu):.2f}x"
                f" [{min(cpu):.2f}-{max(cpu):.2f}]; wall {wall:.2f}x min over min"
                + ("   (goal <= 1.5x, no SDK module)" if name == "tool" else "")
            )
    sdk_loaded = {name: rounds[-1]["sdk"] for name, rounds in results.items() if rounds[-1]["sdk"]}
    for name, modules in sdk_loaded.items():
        print(f"{name} loaded {len(modules)} opentelemetry.sdk modules: {', '.join(modules[:5])}, ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
