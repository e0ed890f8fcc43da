"""Latency SLOs in the report: each tool's compliance from its calls' own
durations, in the JSON, the table and the HTML, the tools that break their
SLO first; ``--slo TOOL=SECONDS:OBJECTIVE``, repeatable, ``*`` for every tool."""

from __future__ import annotations

import json

import pytest

from agent_otel.commands.cli import main
from agent_otel.errors import ConfigError
from agent_otel.slo import Slo, Slos, parse_spec
from helpers.traces import RecordedRun


@pytest.fixture
def traces(tmp_path):
    """search: 20 calls, 0.1 s to 2.0 s (k x 0.1 s); lookup: 10 calls of 0.2 s; embed: 10 calls of 1.0 s."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    for k in range(1, 21):
        run.tool_call("search", 10.0 * k, 10.0 * k, 10.0 * k + 0.1 * k, executor="io")
    for k in range(10):
        run.tool_call("lookup", 5.0 + 10 * k, 5.0 + 10 * k, 5.2 + 10 * k, executor="direct")
        run.tool_call("embed", 7.0 + 10 * k, 7.0 + 10 * k, 8.0 + 10 * k, executor="direct")
    run.close()
    return tmp_path / "traces.jsonl"


def report(capsys, path, *slos: str) -> dict:
    argv = ["report", str(path), "--format", "json"]
    for spec in slos:
        argv += ["--slo", spec]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_by_default_every_tool_is_held_to_the_alert_rules_slo(capsys, traces):
    found = report(capsys, traces)
    slos = {s["tool"]: s for s in found["slos"]}
    # 95% within 0.8 s: search has 8 of 20 calls within (0.1 .. 0.8 s), embed none, lookup all
    assert slos["search"] == {
        "tool": "search",
        "threshold_s": 0.8,
        "objective": 0.95,
        "calls": 20,
        "within": 8,
        "over": 12,
        "compliance": 0.4,
        "budget_spent": 12.0,
        "met": False,
        "on_bucket_bound": True,
    }
    assert (slos["embed"]["compliance"], slos["embed"]["met"]) == (0.0, False)
    assert (slos["lookup"]["compliance"], slos["lookup"]["met"]) == (1.0, True)
    # breaking first, the furthest below its objective first
    assert [s["tool"] for s in found["slos"]] == ["embed", "search", "lookup"]
    # and on each tool's row
    assert {t["tool"]: t["slo"] for t in found["tools"]} == slos


def test_each_tool_can_have_its_own_slo_and_any_threshold(capsys, traces):
    found = report(capsys, traces, "search=1.5:0.75", "*=1.0:0.9", "lookup=0.15:0.5")
    slos = {s["tool"]: s for s in found["slos"]}
    # search within 1.5 s: 15 of 20 = 75%, exactly its objective: met (a call of exactly 1.5 s is within)
    assert (slos["search"]["within"], slos["search"]["compliance"], slos["search"]["met"]) == (15, 0.75, True)
    assert slos["search"]["on_bucket_bound"] is False  # 1.5 s: the alert rules could not measure it
    assert (slos["embed"]["threshold_s"], slos["embed"]["met"]) == (
        1.0,
        True,
    )  # the default '*': 1.0 s calls are within
    assert (slos["lookup"]["compliance"], slos["lookup"]["met"]) == (0.0, False)
    assert slos["lookup"]["budget_spent"] == 2.0
    assert [s["tool"] for s in found["slos"]] == ["lookup", "search", "embed"]


def test_the_table_lists_the_slos_breaking_first(capsys, traces):
    assert main(["report", str(traces), "--slo", "*=0.8:0.95", "--slo", "search=1.5:0.75"]) == 0
    text = capsys.readouterr().out
    section = text[text.index("Latency SLOs") :].split("\n\n")[0].splitlines()
    assert section[1].split() == ["TOOL", "SLO", "COMPLIANCE", "CALLS", "OVER", "BUDGET", "SPENT"]
    assert section[2].split() == ["embed", "95%", "within", "0.8", "s", "0.0%", "BREAKS", "10", "10", "2000%"]
    assert section[3].split()[:2] == ["search", "75%"] and "*" in section[3] and "met" in section[3]
    assert section[4].split()[0] == "lookup"
    assert "* not a bound of the duration histograms" in section[5]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("search", "TOOL=SECONDS:OBJECTIVE"),
        ("search=0.8", "TOOL=SECONDS:OBJECTIVE"),
        ("=0.8:0.95", "TOOL=SECONDS:OBJECTIVE"),
        ("search=fast:0.95", "TOOL=SECONDS:OBJECTIVE"),
        ("search=0:0.95", "a threshold of seconds above 0"),
        ("search=nan:0.95", "a threshold of seconds above 0"),
        ("search=0.8:95", "an objective strictly between 0 and 1"),
        ("search=0.8:1", "an objective strictly between 0 and 1"),
    ],
)
def test_a_malformed_slo_is_refused_naming_it(spec, expected, traces, capsys):
    with pytest.raises(ConfigError) as error:
        parse_spec(spec)
    assert repr(spec) in str(error.value) and expected in str(error.value)
    assert main(["report", str(traces), "--slo", spec]) == 2
    err = capsys.readouterr().err
    assert f"invalid value {spec!r} for --slo" in err and "Traceback" not in err


def test_a_tool_given_twice_is_refused():
    with pytest.raises(ConfigError, match="given twice"):
        Slos.parse(["search=1:0.9", "search=2:0.9"])
    with pytest.raises(ConfigError, match="given twice"):
        Slos.parse(["*=1:0.9", "*=2:0.9"])
    assert Slos.parse(["a=1:0.9"]).for_tool("b") == Slo(0.8, 0.95)


def test_the_html_shows_the_slos_breaking_first_in_chromium(tmp_path, traces):
    from helpers.browser import Elements, chromium, console_messages

    page = tmp_path / "report.html"
    assert main(["report", str(traces), "--slo", "*=0.8:0.95", "--slo", "search=1.5:0.75", "--html", str(page)]) == 0
    shot = tmp_path / "report-800.png"  # one Chromium run: the DOM, and a screenshot at 800 px
    result = chromium(tmp_path, page.as_uri(), "--dump-dom", f"--screenshot={shot}", width=800, height=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    assert console_messages(result) == []
    assert shot.stat().st_size > 10_000
    dom = Elements(result.stdout)
    (table,) = dom.where(id="slo-table")
    rows = [e for e in dom.found if e["tag"] == "tr" and "data-slo-tool" in e["attrs"]]
    assert [r["attrs"]["data-slo-tool"] for r in rows] == ["embed", "search", "lookup"]
    cells = [[c["text"] for c in dom.found[dom.found.index(r) + 1 :] if c["tag"] == "td"][:7] for r in rows]
    assert cells[0] == ["embed", "95% within 0.8 s", "0.0%", "breaks", "10", "10", "2000%"]
    assert cells[1] == ["search", "75% within 1.5 s *", "75.0%", "met", "20", "5", "100%"]
    assert rows[0]["attrs"].get("class") == "breaks" and "class" not in rows[1]["attrs"]
    assert any("not a bound of the duration histograms" in e["text"] for e in dom.found if e["tag"] == "p")
    # the ranked tools table is still the tools table
    tools = [e["attrs"]["data-tool"] for e in dom.found if e["tag"] == "tr" and "data-tool" in e["attrs"]]
    assert sorted(tools) == ["embed", "lookup", "search"]
