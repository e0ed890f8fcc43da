"""CPU seconds of each stage of one report, in one process (``analyse`` with
its stages wrapped in timers), and how many cyclic collections ran.

    PYTHONPATH=. python bench/report_stages.py FILE [FILE...] [--rounds N]

Each FILE is reported ``--rounds`` times, files interleaved; per stage the
median [min-max] over the rounds. The wrapped stages: the read, ordering
the calls, the statistics' columns, the attribution (the generator
consumed), the tools' statistics, the turns, the recommendations; "other"
is the rest of ``analyse``. Then a JSON report of the last round is made
(``report_json``), timed as "json".
"""

from __future__ import annotations

import argparse
import gc
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


def _timed(name: str, fn: Callable, spent: dict[str, float]) -> Callable:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        result = fn(*args, **kwargs)
        if name == "attribution":
            result = iter(list(result))
        spent[name] = spent.get(name, 0.0) + time.process_time() - t0
        return result

    return wrapper


def one(path: str) -> dict[str, float]:
    spent: dict[str, float] = {}
    originals = {attr: getattr(an, attr) for attr in STAGES.values()}
    for name, attr in STAGES.items():
        setattr(an, attr, _timed(name, originals[attr], spent))
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
    finally:
        for attr, fn in originals.items():
            setattr(an, attr, fn)
    spent["other"] = spent["all"] - sum(spent[name] for name in STAGES if name in spent)
    spent["gc collections"] = sum(s["collections"] for s in gc.get_stats()) - collections
    del analysis
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {path: [] for path in args.files}
    for _ in range(args.rounds):
        for path in args.files:
            runs[path].append(one(path))
    for path, rounds in runs.items():
        print(f"{path}: CPU s per stage, median [min-max] of {len(rounds)} rounds")
        for name in [*STAGES, "other", "all", "json", "gc collections"]:
            values = [r.get(name, 0.0) for r in rounds]
            print(f"  {name:16} {statistics.median(values):8.3f} [{min(values):.3f}-{max(values):.3f}]")


if __name__ == "__main__":
    main()
