"""CPU seconds of each stage of one report, in one process (``analyse`` with
its stages wrapped in timers), and how many cyclic collections ran.

    PYTHONPATH=. python bench/report_stages.py FILE [FILE...] [--rounds N]

Each FILE is reported ``--rounds`` times, files interleaved; per stage the
median [min-max] over the rounds. The wrapped stages: the read, ordering
the calls, the statistics' columns, the attribution (the generator
consumed), the tools' statistics, the turns, the recommendations; "other"
is the rest of ``analyse``. Then a JSON report of the last round is made
(``report_json``), timed as "json".

``--turns-again N``: after each round, the turns found N more times on
the same inputs (in the same process, the heap as the report left it):
CPU µs per turn of each, the first being the report's own.
``--dicts``: ns per lookup in a dict of 25k and of 250k random 128-bit int
keys (the trace ids of 100k and 1M spans), in insertion order, the keys
made one after another or spread among other ints.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from typing import Any, Callable

from agent_otel.report import analysis as an

STAGES = {
    "read": "read_traces",
    "order": "_by_submit",
    "columns": "CallColumns",
    "in_windows": "_in_windows",
    "attribution": "_attribute",
    "tool_stats": "_tool_stats",
    "turns": "find_turns",
    "recommendations": "recommend",
}


def _timed(name: str, fn: Callable, spent: dict[str, float], inputs: dict[str, tuple]) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inputs[name] = (args, kwargs)
        t0 = time.process_time()
        result = fn(*args, **kwargs)
        if name == "attribution":
            result = iter(list(result))
        spent[name] = spent.get(name, 0.0) + time.process_time() - t0
        return result

    return wrapper


def one(path: str, turns_again: int) -> dict[str, float]:
    spent: dict[str, float] = {}
    inputs: dict[str, tuple] = {}
    originals = {attr: getattr(an, attr) for attr in STAGES.values()}
    for name, attr in STAGES.items():
        setattr(an, attr, _timed(name, originals[attr], spent, inputs))
    collections = sum(s["collections"] for s in gc.get_stats())
    try:
        t0 = time.process_time()
        analysis = an.analyse(
            [path], [], idle_threshold=0.1, min_idle_s=0.5, call_ids=False, turns=False, records=False
        )
        spent["all"] = time.process_time() - t0
        t0 = time.process_time()
        an.report_json(analysis)
        spent["json"] = time.process_time() - t0
        count = analysis.turn_totals.count or 1  # (a trace per call has no turns)
        spent["turns µs/turn"] = spent["turns"] / count * 1e6
        args, kwargs = inputs["turns"]
        for again in range(turns_again):
            with an.paused_gc():
                t0 = time.process_time()
                originals["find_turns"](*args, **kwargs)
                spent[f"turns again {again + 1} µs/turn"] = (time.process_time() - t0) / count * 1e6
        del args, kwargs, inputs
    finally:
        for attr, fn in originals.items():
            setattr(an, attr, fn)
    spent["other"] = spent["all"] - sum(spent[name] for name in STAGES if name in spent)
    spent["gc collections"] = sum(s["collections"] for s in gc.get_stats()) - collections
    del analysis
    return spent


def lookup_ns(count: int, spread: bool) -> float:
    """ns per lookup, median of 5 passes, in a dict of ``count`` random 128-bit int keys."""
    rng = random.Random(1)
    keys: list[int] = []
    others: list[int] = []
    for _ in range(count):
        keys.append(rng.getrandbits(128))
        if spread:
            others.extend(rng.getrandbits(128) for _ in range(9))
    table = {key: row for row, key in enumerate(keys)}
    passes = []
    for _ in range(5):
        t0 = time.process_time()
        for key in keys:
            table[key]
        passes.append((time.process_time() - t0) / count * 1e9)
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="*")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns-again", type=int, default=0)
    parser.add_argument("--dicts", action="store_true")
    args = parser.parse_args()
    if args.dicts:
        for spread in (False, True):
            for count in (25_000, 250_000):
                where = "spread among other ints" if spread else "made one after another"
                print(f"dict of {count} keys, {where}: {lookup_ns(count, spread):.1f} ns/lookup")
    runs: dict[str, list[dict[str, float]]] = {path: [] for path in args.files}
    for _ in range(args.rounds):
        for path in args.files:
            runs[path].append(one(path, args.turns_again))
    for path, rounds in runs.items():
        print(f"{path}: CPU s per stage, median [min-max] of {len(rounds)} rounds")
        names = [*STAGES, "other", "all", "json", "gc collections", "turns µs/turn"]
        names += [f"turns again {again + 1} µs/turn" for again in range(args.turns_again)]
        for name in names:
            values = [r.get(name, 0.0) for r in rounds]
            print(f"  {name:24} {statistics.median(values):8.3f} [{min(values):.3f}-{max(values):.3f}]")


if __name__ == "__main__":
    main()
