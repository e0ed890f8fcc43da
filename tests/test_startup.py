"""What instrument() leaves for later, and that it still happens.

tests/test_imports.py checks which modules a default ``instrument()``
imports on the caller's thread; these check the deferred parts: a hook run
when a module is imported (``capture/on_import.py``), the event-loop
monitor hooking asyncio when the application imports it, the GPU search on
its own thread, and the Prometheus metrics made on first use (and counting
nothing, with one line, when prometheus_client is broken).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading

import pytest

import agent_otel
from agent_otel.wiring import instrumentation
from agent_otel.capture import on_import
from agent_otel.exporters.prometheus import Metrics
from agent_otel.semconv import LABEL_GPU, LABEL_KIND, METRIC_GPU_IDLE, METRIC_SPANS_DROPPED, SPAN_KIND_TOOL


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A module of our own, ``startup_probe``, importable and not imported yet."""
    (tmp_path / "startup_probe.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "startup_probe"
    sys.modules.pop("startup_probe", None)


def test_a_hook_runs_once_the_module_is_imported_and_it_keeps_its_loader(package):
    seen = []
    on_import.when_imported(package, lambda module: seen.append(module.VALUE))
    assert seen == [] and on_import.waiting(package)
    import startup_probe  # noqa: F401  (the import under test)

    assert seen == [42] and not on_import.waiting(package)
    module = sys.modules[package]
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert module.__spec__.loader is module.__loader__
    on_import.when_imported(package, lambda module: seen.append("now"))  # imported already: at once
    assert seen == [42, "now"]


def test_a_hook_that_raises_is_logged_and_the_import_goes_on(package, caplog):
    def broken(module):
        raise RuntimeError("hook bug")

    on_import.when_imported(package, broken)
    with caplog.at_level(logging.WARNING, logger="agent_otel"):
        import startup_probe

    assert startup_probe.VALUE == 42
    assert [r.getMessage() for r in caplog.records] == [
        "agent-otel: a hook run when startup_probe was imported failed (RuntimeError: hook bug)"
    ]


LATE_ASYNCIO = r"""
import json, sys, time
import agent_otel

handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), loop_block_threshold=0.05)
before = "asyncio" in sys.modules
import asyncio  # after instrument(): the loop monitor hooks it now


@agent_otel.tool
def slow():
    time.sleep(0.4)  # holds the event loop


async def main():
    slow()
    await asyncio.sleep(0.1)  # the loop runs again: the block is over


asyncio.run(main())
handle.pipeline.drain()
blocks = list(handle.loop_monitor.recent)
handle.shutdown(timeout_s=2)
print(json.dumps({"asyncio_before": before, "blocks": [[b.tool, b.seconds] for b in blocks]}))
"""


def test_the_loop_monitor_watches_loops_of_an_asyncio_imported_after_instrument(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", LATE_ASYNCIO], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["asyncio_before"] is False
    # The loop was watched: the tool's block is recorded (on a busy machine the
    # loop may also stall with no tool running; those blocks name no tool).
    slow = [seconds for tool, seconds in result["blocks"] if tool == "slow"]
    assert len(slow) == 1 and slow[0] >= 0.2, result["blocks"]
    assert {tool for tool, _ in result["blocks"]} <= {"slow", None}


@pytest.fixture
def held_gpu_search(monkeypatch):
    """``gpu="auto"`` whose search (opening NVML) waits for ``release`` and then finds a simulated GPU."""
    import agent_otel.attribution.wiring as wiring

    release, entered = threading.Event(), threading.Event()
    real = wiring.open_source

    def held(settings):
        entered.set()
        assert release.wait(30)
        return real(instrumentation.load_settings({"gpu": "simulated"}))

    monkeypatch.setattr(wiring, "open_source", held)
    yield release, entered
    release.set()


def test_auto_looks_for_the_gpu_after_instrument_returned(held_gpu_search):
    release, entered = held_gpu_search
    handle = agent_otel.instrument(traces_exporters="none", gpu="auto", frameworks=())
    try:
        assert entered.wait(30)
        assert handle.gpu_timeline is None  # instrument() returned while the search goes on
        release.set()
        timeline = handle.wait_for_gpu(30)
        assert timeline is not None and timeline.source.kind == "simulated"
        assert handle.gpu_timeline is timeline and timeline in handle.background
    finally:
        assert handle.shutdown(timeout_s=5) is True
    assert not [t for t in threading.enumerate() if t.name.startswith("agent-otel-gpu")]


def test_a_gpu_found_after_shutdown_is_stopped_not_left_sampling(held_gpu_search):
    release, entered = held_gpu_search
    handle = agent_otel.instrument(traces_exporters="none", gpu="auto", frameworks=())
    assert entered.wait(30)
    assert handle.shutdown(timeout_s=0.5) is False  # the search is still running: said so
    release.set()
    assert handle.wait_for_gpu(30) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("agent-otel-gpu")]


def test_metrics_import_prometheus_client_on_first_use(monkeypatch):
    metrics = Metrics()
    assert "registry" not in vars(metrics)
    metrics.gpu_idle.labels("0").inc(2.5)  # made now
    assert metrics.registry.get_sample_value(METRIC_GPU_IDLE, {LABEL_GPU: "0"}) == 2.5
    # every kind of dropped span shows at 0, as before
    assert metrics.registry.get_sample_value(METRIC_SPANS_DROPPED, {LABEL_KIND: SPAN_KIND_TOOL}) == 0


def test_a_broken_prometheus_client_counts_nothing_with_one_line(monkeypatch, caplog):
    for name in [m for m in sys.modules if m == "prometheus_client" or m.startswith("prometheus_client.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="agent_otel"):
        metrics.gpu_idle.labels("0").inc()
        metrics.dropped(SPAN_KIND_TOOL, 3)
        metrics.remedies.fallback("search")
        metrics.remedies.batch("search", 2, [0.1])
        with pytest.raises(ImportError):
            _ = metrics.registry
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "prometheus_client cannot be imported" in lines[0], lines


def test_asyncio_exceptions_are_still_cancellations_and_timeouts():
    import asyncio

    from agent_otel.capture.recorder import outcome_of
    from agent_otel.semconv import OUTCOME_CANCELLED, OUTCOME_ERROR, OUTCOME_TIMEOUT

    assert outcome_of(asyncio.CancelledError()) == OUTCOME_CANCELLED
    assert outcome_of(asyncio.TimeoutError()) == OUTCOME_TIMEOUT
    assert outcome_of(ValueError()) == OUTCOME_ERROR


def test_a_span_export_runs_with_instrumentation_suppressed(tmp_path):
    from opentelemetry.instrumentation.utils import is_instrumentation_enabled
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from agent_otel.exporters.batch import BatchSpanProcessor

    seen = []

    class Exporter(SpanExporter):
        def export(self, spans):
            seen.append(is_instrumentation_enabled())
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    processor = BatchSpanProcessor(Exporter(), interval_s=0.01)
    provider.add_span_processor(processor)
    with provider.get_tracer("test").start_as_current_span("one"):
        pass
    assert processor.force_flush(10_000)
    processor.shutdown(5)
    assert seen and not any(seen)  # an HTTP instrumentation does not trace the exporter's own requests
    assert is_instrumentation_enabled()


FORK_DURING_IMPORT = r"""
import os, sys, threading, time
from agent_otel.support import forks

sys.path.insert(0, sys.argv[1])
started = threading.Event()


def background():
    with forks.background_import():
        started.set()
        import slow_module  # takes 0.5 s


thread = threading.Thread(target=background)
thread.start()
started.wait()
time.sleep(0.1)  # the import is halfway
pid = os.fork()  # waits for it
if pid == 0:
    import slow_module  # in the child: would wait forever on the parent thread's module lock

    os._exit(0 if slow_module.DONE else 2)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    print("child hung")
thread.join()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is not available on this platform")
def test_a_fork_waits_for_an_import_on_a_background_thread(tmp_path):
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(0.5)\nDONE = True\n")
    done = subprocess.run(
        [sys.executable, "-c", FORK_DURING_IMPORT, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "child 0"
