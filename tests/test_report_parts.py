"""The report's typed parts (``report.parts``): each part writes its own
JSON, ``report_json`` is theirs, and the table, the HTML page and the
Perfetto trace draw the parts, not numbers of their own."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agent_otel.report import html, parts, perfetto, table
from agent_otel.report.analysis import analyse, report_json
from agent_otel.report.parts import Part, Report, report_parts
from helpers.traces import RecordedRun, write_gpu_csv


@pytest.fixture
def analysis(tmp_path):
    """Two tools, two models, a GPU log with an idle stretch."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 8.0)
    run.model_call("gpt-x", 0.2, 0.9)
    run.model_call("gpt-y", 5.0, 5.2)
    run.tool_call("embed", 1.0, 1.0, 4.0, executor="gpu-pool", thread="gpu-pool_0")
    run.tool_call("search", 3.0, 3.5, 4.5, executor="io", thread="io_0")
    run.close()
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 2 if 20 < k <= 50 else 90) for k in range(80)])
    return analyse(
        [str(tmp_path / "traces.jsonl")],
        [str(tmp_path / "gpu.csv")],
        tz="UTC",
        idle_threshold=0.05,
        min_idle_s=0.1,
    )


def _parts(report: Part):
    """Every part inside ``report``, itself first."""
    yield report
    for field in dataclasses.fields(report):  # type: ignore[arg-type]
        value = getattr(report, field.name)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, Part):
                yield from _parts(item)


def test_the_reports_json_is_its_parts_json(analysis):
    report = report_parts(analysis)
    assert report_json(analysis) == report.to_json()
    assert list(report.to_json()) == [field.name for field in dataclasses.fields(Report)]
    assert report.tools and report.gpus and report.models  # the fixture reaches the sections below
    seen = set()
    for part in _parts(report):
        seen.add(type(part))
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, dataclasses.fields(part)[0].name, None)  # type: ignore[arg-type]
        written = part.to_json()
        json.dumps(written, allow_nan=False)  # plain JSON: lists, not tuples or parts
        if not isinstance(part, (parts.ModelServer, parts.ModelSplit)):  # these two flatten a Split
            assert list(written) == [field.name for field in dataclasses.fields(part)], type(part)  # type: ignore[arg-type]
    assert {parts.Window, parts.Tool, parts.Gpu, parts.Model, parts.Turns, parts.Executor, parts.Inputs} <= seen


def _changed(report: Report) -> Report:
    """The parts with numbers no analysis of the fixture gives."""
    tool = dataclasses.replace(report.tools[0], gpu_idle_blocked_s=987.0, calls=4321)
    gpu = dataclasses.replace(report.gpus[0], idle_s=654.0, simulated=True)
    model = dataclasses.replace(report.models[0], seconds=321.0)
    window = dataclasses.replace(report.window, start="2099-01-02T03:04:05.000000Z")
    inputs = dataclasses.replace(report.inputs, warnings=("a warning from the parts",), tool_calls=5555)
    return dataclasses.replace(
        report,
        tools=(tool, *report.tools[1:]),
        gpus=(gpu, *report.gpus[1:]),
        models=(model, *report.models[1:]),
        window=window,
        inputs=inputs,
    )


def test_the_table_draws_the_parts(analysis, monkeypatch):
    changed = _changed(report_parts(analysis))
    monkeypatch.setattr(table, "report_parts", lambda _: changed)
    text = table.render(analysis)
    tool_row = next(line for line in text.splitlines() if line.startswith(changed.tools[0].tool + " "))
    assert "987" in tool_row and "4321" in tool_row
    assert "654" in text and "(simulated)" in text and "321" in text
    assert "2099-01-02 03:04:05" in text and "5555 tool calls" in text
    assert "warning: a warning from the parts" in text


def test_the_html_page_draws_the_parts(analysis, monkeypatch):
    changed = _changed(report_parts(analysis))
    monkeypatch.setattr(html, "report_parts", lambda _: changed)
    page = html.render(analysis)
    assert ">987.0<" in page and ">4321<" in page and ">654.0<" in page and ">321.0<" in page
    assert "2099-01-02 03:04:05" in page and "5555 tool calls" in page
    assert "a warning from the parts" in page and "simulated GPU" in page
    data = json.loads(page.split('id="report-data">', 1)[1].split("</script>", 1)[0])
    assert data["lanes"][0]["blocked_s"] == 987.0  # the timeline's lanes too
    assert data["gpus"][0]["simulated"] is True
    assert data["models"]["lanes"][0]["seconds"] == 321.0


def test_the_perfetto_trace_draws_the_parts(analysis, monkeypatch):
    report = report_parts(analysis)
    changed = dataclasses.replace(_changed(report), models=report.models[::-1])
    monkeypatch.setattr(perfetto, "report_parts", lambda _: changed)
    trace = perfetto.trace_events(analysis)
    assert trace["otherData"]["window_start"] == "2099-01-02T03:04:05.000000Z"
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    models = [name for name in threads if name.startswith("gpt-")]
    assert models == [m.model for m in report.models[::-1]]  # the model tracks in the models part's order
    assert [m.model for m in report.models] != models
