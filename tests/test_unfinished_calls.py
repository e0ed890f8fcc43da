"""Calls still running when agent-otel shuts down: a stall going on as the
agent stops (a restart, an exit) is in the traces, with the GPU idle time it
held, and the calls themselves carry on untouched."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from opentelemetry import trace

import agent_otel
from agent_otel.commands.cli import main

UNFINISHED = "agent.tool.unfinished"


@pytest.mark.parametrize("deferred", [False, True], ids=["default", "deferred_spans"])
def test_a_call_running_at_shutdown_is_exported_as_it_stands(spans, caplog, deferred):
    handle = agent_otel.instrument(
        service_name="test-agent", traces_exporters="none", gpu="off", frameworks=(), deferred_spans=deferred
    )
    release, started = threading.Event(), threading.Event()
    outcome = {}

    @agent_otel.tool
    def stuck(x):
        """Waits for the test."""
        started.set()
        release.wait(30)
        return x * 2

    def run():
        try:
            outcome["value"] = stuck(21)
        except BaseException as exc:  # pragma: no cover - the assertion below says what
            outcome["error"] = exc
        outcome["span after"] = trace.get_current_span()

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(10)
    time.sleep(0.2)
    with caplog.at_level(logging.WARNING):
        agent_otel.uninstrument()
        (span,) = spans.tools("stuck")
        release.set()
        worker.join(10)
    attributes = dict(span.attributes)
    assert attributes[UNFINISHED] is True
    assert attributes["agent.tool.outcome"] == "cancelled"
    assert attributes["gen_ai.tool.name"] == "stuck"
    assert attributes["gen_ai.tool.description"] == "Waits for the test."
    assert attributes["agent.tool.executor"] == "direct"
    assert 0.15 <= attributes["agent.tool.exec.duration"] <= 10
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(attributes["agent.tool.exec.duration"], abs=1e-6)
    # The call itself: its value, its context, and no second span or warning when it ends.
    assert outcome == {"value": 42, "span after": trace.INVALID_SPAN}
    assert len(spans.tools("stuck")) == 1
    assert not [r for r in caplog.records if "ended span" in r.getMessage()], caplog.text
    assert handle.recorder.inflight == {}


def test_a_call_still_queued_gets_no_span_and_its_exception_passes_through(spans):
    agent_otel.instrument(service_name="test-agent", traces_exporters="none", gpu="off", frameworks=())
    from concurrent.futures import ThreadPoolExecutor

    release, started = threading.Event(), threading.Event()

    @agent_otel.tool
    def holds_the_worker():
        started.set()
        release.wait(30)
        raise KeyError("the user's own error")

    @agent_otel.tool
    def waits_for_a_worker():
        return 1

    pool = ThreadPoolExecutor(max_workers=1)
    running = pool.submit(holds_the_worker)
    queued = pool.submit(waits_for_a_worker)
    assert started.wait(10)
    agent_otel.uninstrument()
    release.set()
    with pytest.raises(KeyError, match="the user's own error"):
        running.result(10)
    assert queued.result(10) == 1
    pool.shutdown()
    (span,) = spans.tools("holds_the_worker")
    assert span.attributes[UNFINISHED] is True
    assert span.attributes["agent.tool.executor"].startswith("ThreadPoolExecutor")
    # Queued at shutdown: no span was started, so none is made up (and the
    # call, run after shutdown, is not recorded).
    assert spans.tools("waits_for_a_worker") == []


def test_the_report_blames_a_stall_still_going_on_when_the_agent_stopped(tmp_path, capsys):
    traces = tmp_path / "traces.jsonl"
    agent_otel.instrument(
        service_name="test-agent", traces_file=str(traces), traces_exporters="none", gpu="simulated", frameworks=()
    )
    release = threading.Event()

    @agent_otel.tool
    def stuck():
        release.wait(30)

    worker = threading.Thread(target=stuck)
    worker.start()
    time.sleep(1.0)
    agent_otel.uninstrument()  # as at exit: the simulated GPU idled the whole time, stuck still running
    release.set()
    worker.join(10)
    assert main(["report", str(traces), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (tool,) = report["tools"]
    assert tool["tool"] == "stuck"
    (gpu,) = report["gpus"]
    assert gpu["idle_s"] > 0.5
    assert tool["gpu_idle_blocked_s"] == pytest.approx(gpu["idle_s"], rel=0.05)
    assert tool["gpu_idle_blocked_s"] == pytest.approx(tool["gpu_idle_blocked_live_s"], rel=0.05)
    assert [w for w in report["inputs"]["warnings"] if "still running" in w] == [
        "stuck: 1 call was still running when its agent shut down (agent.tool.unfinished): its span, "
        "its duration and the GPU idle time blamed on it end there"
    ]
