"""Generate the dashboards' JSON and the rules file from code.

    python -m dashboards                      # regenerate everything
    python -m dashboards --check              # fail if the committed files are stale
    python -m dashboards --slo-threshold 1 --slo-objective 0.99 \\
        --runbook-base https://example.com/agent-otel/docs/runbook.md
    python -m dashboards --slo embed=0.25:0.99 --slo web_search=2.5:0.9   # tools' own SLOs

The default SLO (``--slo-threshold``, ``--slo-objective``, or ``--slo
'*=SECONDS:OBJECTIVE'``) changes both the alert rules and the SLO panels, so
the two measure the same thing; a tool's own SLO (``--slo TOOL=...``)
changes the alert rules only (the panels show the default SLO).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from agent_otel.errors import AgentOtelError
from dashboards import executors, kubernetes, latency, pools, rules, tools_gpu
from agent_otel.slo import Slo, Slos
from dashboards.slo import DEFAULT_OBJECTIVE, DEFAULT_THRESHOLD_S, LatencySLO, ToolSLOs

HERE = Path(__file__).resolve().parent
JSON_DIR = HERE / "json"
RULES_FILE = HERE / "rules" / "agent-otel-rules.yml"
# The Kubernetes base: the same rules and dashboards as Prometheus Operator and Grafana sidecar objects.
KUBERNETES_DIR = HERE.parent / "deploy" / "kubernetes" / "base"


def dashboard_json(dashboard) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(dashboard.build()) + "\n"


def artefacts(slo: LatencySLO | ToolSLOs, runbook_base: str = rules.DEFAULT_RUNBOOK_BASE) -> dict[Path, str]:
    """Every generated file, by path, with its exact text."""
    default = slo.default if isinstance(slo, ToolSLOs) else slo
    dashboards = {
        "agent-tools-vs-gpu.json": dashboard_json(tools_gpu.build()),
        "tool-latency-and-slos.json": dashboard_json(latency.build(default)),
        "executors.json": dashboard_json(executors.build()),
        "gpu-pools.json": dashboard_json(pools.build()),
    }
    return {
        **{JSON_DIR / name: text for name, text in dashboards.items()},
        RULES_FILE: rules.render(slo, runbook_base),
        KUBERNETES_DIR / "prometheus-rule.yaml": kubernetes.prometheus_rule(slo, runbook_base),
        KUBERNETES_DIR / "grafana-dashboards.yaml": kubernetes.dashboard_config_maps(dashboards),
    }


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The paths whose committed text differs from ``files`` (or is missing)."""
    return [path for path, text in files.items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--slo-threshold",
        type=float,
        default=DEFAULT_THRESHOLD_S,
        metavar="SECONDS",
        help="latency SLO threshold; must be a histogram bucket boundary (default %(default)s)",
    )
    parser.add_argument(
        "--slo-objective",
        type=float,
        default=DEFAULT_OBJECTIVE,
        metavar="RATIO",
        help="share of calls that must finish within the threshold (default %(default)s)",
    )
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="TOOL=SECONDS:OBJECTIVE",
        help="a tool's own latency SLO, for the alert rules (repeatable; TOOL * sets the default); "
        "SECONDS must be a histogram bucket boundary",
    )
    parser.add_argument(
        "--runbook-base",
        default=rules.DEFAULT_RUNBOOK_BASE,
        metavar="URL",
        help="where docs/runbook.md is published, for the alerts' runbook_url (default %(default)s)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed file differs from what the code generates",
    )
    args = parser.parse_args(argv)
    try:
        LatencySLO(args.slo_threshold, args.slo_objective)  # the error names the option
        slo = ToolSLOs.from_slos(Slos.parse(args.slo, default=Slo(args.slo_threshold, args.slo_objective)))
    except AgentOtelError as exc:
        print(f"python -m dashboards: error: {exc}", file=sys.stderr)
        return 2
    files = artefacts(slo, args.runbook_base)
    stale = stale_files(files)
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(HERE.parent)} (run python -m dashboards)", file=sys.stderr)
        if stale:
            return 1
        names = ", ".join(str(path.relative_to(HERE.parent)) for path in files)
        print(f"checked {len(files)} files against the code that generates them, all current: {names}")
        return 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0
