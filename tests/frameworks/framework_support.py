"""Helpers for the framework hook tests: the real frameworks, no network.

A framework in the ``frameworks`` extra that is not installed skips its
tests with the reason on a user's machine and fails them under CI=true,
where ``.ci/run`` installs the extra.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import os
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
# Frameworks whose tests must run here, installed or not (.ci/run sets it in
# the venv it builds for CrewAI): missing, they fail instead of skipping.
REQUIRED = {name.strip() for name in os.environ.get("AGENT_OTEL_REQUIRED_FRAMEWORKS", "").split(",") if name.strip()}

# framework -> whether the `frameworks` extra installs it (CI must then have it).
INSTALLED_BY_EXTRA = {
    "langchain": True,
    "openai_agents": True,
    "llamaindex": True,
    "mcp": True,
    "smolagents": True,
    "crewai": False,
    "pydantic_ai": True,
}


def require_framework(name: str, module: str):
    """Import ``module`` or skip (fail under CI for frameworks in the extra)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        not_installed(name, f"{module} is not installed ({exc})")


def require_installed(name: str, package: str) -> None:
    """Skip (fail under CI for frameworks in the extra) unless the top-level
    ``package`` is installed, without importing it: for tests that use the
    framework only in a process they start."""
    if importlib.util.find_spec(package) is None:
        not_installed(name, f"{package} is not installed")


def not_installed(name: str, message: str) -> NoReturn:
    how = (
        "pip install -e '.[frameworks]'"
        if INSTALLED_BY_EXTRA[name]
        else f"not in the frameworks extra: pip install {name}"
    )
    if (IN_CI and INSTALLED_BY_EXTRA[name]) or name in REQUIRED:
        pytest.fail(f"{message}; {how}")
    pytest.skip(f"{message}; {how}", allow_module_level=True)


def framework_fixture(name: str, module: str):
    """A module-scoped, autouse fixture: ``module`` imported (or the tests skipped, see
    ``require_framework``) before the test module's first test runs, not when it is collected.

    Under pytest-xdist every worker collects (imports) every test module, and a
    framework takes a second or more to import; imported by this fixture, only the
    worker that runs the framework's tests pays for it. The tests import what
    they use of the framework (or of the tools and scripted models made with it,
    in a module of their own beside the tests) in their bodies.
    """

    @pytest.fixture(scope="module", autouse=True)
    def framework():
        return require_framework(name, module)

    return framework


def run_with_one_worker(coroutine_function):
    """Run an async agent on a loop whose default executor has one worker named ``tools``.

    One worker makes queueing certain: sync tools handed to the executor
    wait for each other, so their queue times are known lower bounds.
    """

    async def main():
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tools")
        asyncio.get_running_loop().set_default_executor(pool)
        return await coroutine_function()

    return asyncio.run(main())


# What asyncio's default executor is made with when the loop creates it.
ASYNCIO_DEFAULT_WORKERS = min(32, (os.cpu_count() or 1) + 4)


def timing(span) -> tuple[float, float]:
    """(queue seconds, exec seconds) of a tool span."""
    return span.attributes["agent.tool.queue.duration"], span.attributes["agent.tool.exec.duration"]


def by_exec_start(spans) -> list:
    """Tool spans in the order their calls began to execute (the span starts at the request)."""
    return sorted(spans, key=lambda s: s.start_time + timing(s)[0] * 1e9)


def least_wait_s(spans, span, position: int, sleep_s: float) -> float:
    """The least queue time of the ``position``-th call to execute (``by_exec_start``)
    of calls that shared one worker: the calls before it ran ``sleep_s`` each after
    the first was requested, less however much later than the first it was requested
    itself (on a loaded machine the requests are not all at the same instant, and
    then the order of execution is not the order of queue times)."""
    first_request = min(s.start_time for s in spans)
    return position * sleep_s * 0.95 - (span.start_time - first_request) / 1e9


def assert_queued_one_after_another(spans, sleep_s: float) -> None:
    """Spans of calls that shared one worker: each waited for all before it."""
    ordered = by_exec_start(spans)
    for position, span in enumerate(ordered):
        queue_s, exec_s = timing(span)
        assert exec_s >= sleep_s * 0.95, (span.name, exec_s)
        assert queue_s >= least_wait_s(ordered, span, position, sleep_s), (position, queue_s)
        assert queue_s < position * sleep_s + 3.0
        assert span.attributes["agent.tool.executor"] == "tools"
        assert span.attributes["agent.executor.max_workers"] == 1  # the report's MAX WORKERS
        assert span.attributes["agent.tool.outcome"] == "ok"
        # The span starts at submission: its duration is queue plus exec.
        duration_s = (span.end_time - span.start_time) / 1e9
        assert abs(duration_s - (queue_s + exec_s)) < 0.005
        exec_start = [e for e in span.events if e.name == "exec.start"]
        assert len(exec_start) == 1
        assert abs((exec_start[0].timestamp - span.start_time) / 1e9 - queue_s) < 0.005


def agent_otel_spans(spans, name: str):
    """The tool spans agent-otel made for ``name`` (the MCP SDK makes its own
    server-side span with the same GenAI attributes)."""
    return [s for s in spans.tools(name) if s.instrumentation_scope.name == "agent_otel"]


def report_json(traces) -> dict:
    """``agent-otel report TRACES --format json``, read back."""
    import io
    import json
    from contextlib import redirect_stdout

    from agent_otel.commands.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["report", str(traces), "--format", "json"]) == 0
    return json.loads(out.getvalue())


def assert_one_turn_as_engineered(report: dict, spans, agent: str, model_calls: int, tool_calls: int) -> None:
    """The run is one turn, made from its one ``invoke_agent {agent}`` span, and
    its parts are the time its model calls and tool calls took (the fake
    model's and tools' own spans: the engineered truth); the model calls one
    after another, and the tool calls outside them."""
    runs = spans.runs()
    assert len(runs) == 1, [(s.name, s.instrumentation_scope.name, dict(s.attributes)) for s in runs]
    (run,) = runs
    assert run.name == f"invoke_agent {agent}"
    models, tools = spans.models(), spans.tools()
    assert (len(models), len(tools)) == (model_calls, tool_calls)
    for span in models + tools:  # in the run's trace, within it
        assert span.context.trace_id == run.context.trace_id, span.name
        assert run.start_time <= span.start_time <= span.end_time <= run.end_time, span.name
    turns = report["turns"]
    assert (turns["count"], turns["from_agent_spans"]) == (1, 1)
    (turn,) = turns["slowest"]
    assert (turn["name"], turn["tool_calls"], turn["model_calls"]) == (agent, tool_calls, model_calls)
    assert turn["seconds"] == pytest.approx((run.end_time - run.start_time) / 1e9, abs=2e-6)
    models_s = sum(s.end_time - s.start_time for s in models) / 1e9
    if not turn["client_cpu_s"]:
        assert turn["model_s"] == pytest.approx(models_s, abs=1e-5)
    else:  # a scripted model that blocks the event loop (a sync fake) has that time as client CPU
        assert turn["model_s"] <= models_s + 1e-5 <= turn["model_s"] + turn["client_cpu_s"] + 2e-5
    ordered = sorted(tools, key=lambda s: s.start_time)
    if all(a.end_time <= b.start_time for a, b in zip(ordered, ordered[1:])):  # one after another
        assert turn["tool_queue_s"] == pytest.approx(sum(timing(s)[0] for s in tools), abs=1e-5)
        assert turn["tool_exec_s"] == pytest.approx(sum(timing(s)[1] for s in tools), abs=1e-5)
    else:  # side by side: the time some call was in flight (report.md: the phase of the one finishing last)
        in_flight, reach = 0, 0
        for span in ordered:
            start = max(span.start_time, reach)
            if span.end_time > start:
                in_flight += span.end_time - start
                reach = span.end_time
        assert turn["tool_queue_s"] + turn["tool_exec_s"] == pytest.approx(in_flight / 1e9, abs=1e-5)
    parts = turn["client_cpu_s"] + turn["model_s"] + turn["tool_queue_s"] + turn["tool_exec_s"] + turn["other_s"]
    assert parts == pytest.approx(turn["seconds"], abs=1e-5)
