"""Shared test fixtures.

OpenTelemetry lets a process set its global tracer provider once, so the
test session sets one SDK provider with an in-memory exporter, as an
application that configured OpenTelemetry itself would. ``instrument()``
then reuses it (the documented behaviour) and every test reads the spans it
made from ``spans``. Behaviour that needs agent-otel's own provider (OTLP,
console, shutdown bounds) is tested in subprocesses.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agent_otel


def _bytecode_outside_the_tree() -> None:
    """Keep bytecode, outside the source tree, where the environment forbids writing it.

    With PYTHONDONTWRITEBYTECODE set (this project's development and CI
    machines set it), nothing is cached: each of the suite's workers
    assertion-rewrites every test module (about 3 CPU-s each) and each of
    the ~60 Python subprocesses the tests start compiles agent_otel again.
    Here the session writes bytecode under a directory of the system's
    temporary folder instead (PYTHONPYCACHEPREFIX, which the workers and
    subprocesses inherit), so that the source tree stays as the variable
    asked and the work is done once. A prefix the user set is kept.
    """
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = os.path.join(tempfile.gettempdir(), f"agent-otel-tests-pycache-{os.getuid()}")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


_bytecode_outside_the_tree()

IN_CI = os.environ.get("CI", "").lower() == "true"

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
trace.set_tracer_provider(_PROVIDER)


def require_tool(name: str, package: str | None = None) -> str:
    """The path of an external program a test needs.

    Skips with the reason on a user's machine; fails under CI, where a skip
    would hide that the test never ran.
    """
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (on Debian: apt-get install {package or name}); .ci/run installs it"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


class Spans:
    """The spans finished during one test."""

    def __init__(self, exporter: InMemorySpanExporter):
        self._exporter = exporter

    def all(self):
        return list(self._exporter.get_finished_spans())

    def tools(self, name: str | None = None):
        found = [s for s in self.all() if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
        if name is not None:
            found = [s for s in found if s.attributes.get("gen_ai.tool.name") == name]
        return found

    def models(self, model: str | None = None):
        """Model-call spans (chat, text_completion, generate_content), of one model if named."""
        found = [
            s
            for s in self.all()
            if s.attributes.get("gen_ai.operation.name") in ("chat", "text_completion", "generate_content")
        ]
        if model is not None:
            found = [s for s in found if s.attributes.get("gen_ai.request.model") == model]
        return found

    def runs(self):
        """Agent-run spans (``invoke_agent``)."""
        return [s for s in self.all() if s.attributes.get("gen_ai.operation.name") == "invoke_agent"]

    def clear(self) -> None:
        self._exporter.clear()


@pytest.fixture
def spans():
    _EXPORTER.clear()
    yield Spans(_EXPORTER)
    _EXPORTER.clear()


@pytest.fixture
def agent(spans):
    """agent_otel instrumented for one test, exporting only to ``spans``."""
    handle = agent_otel.instrument(service_name="test-agent", traces_exporters="none", gpu="off", frameworks=())
    yield handle
    agent_otel.uninstrument()


@pytest.fixture
def metric(agent):
    """``metric(name, labels)``: one sample's current value in the agent's registry."""

    def value(name: str, labels: dict | None = None) -> float:
        agent.pipeline.drain()
        found = agent.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found

    return value


@pytest.fixture
def wall_clock_on_the_timeline(monkeypatch):
    """For one test, the wall clock (``time.time_ns``) is read from the
    process's timeline (``agent_otel.support.clock``), moved onto the wall clock now.

    agent_otel's timeline follows the wall clock to within a millisecond, a few
    times a second (``clock.follow_wall_clock``, the pipeline thread), and the
    GPU samples stamped with the wall clock, as NVML's are, are mapped onto it
    at each poll. Tests that stamp a stand-in driver's samples with the wall
    clock and compare the results with the timeline to the millisecond need
    the two to agree exactly. On this virtual machine they do not: its wall
    clock has been seen running 0.5 % fast against the monotonic clock for
    minutes, and jumping 3.5 s while a worker ran (which failed 21 such tests
    at once, before the timeline followed the wall clock)."""
    from agent_otel.support import clock

    offset = time.time_ns() - clock.perf_counter_ns()
    monkeypatch.setattr(clock, "OFFSET_NS", offset)
    perf_counter_ns = clock.perf_counter_ns
    monkeypatch.setattr(time, "time_ns", lambda: perf_counter_ns() + offset)


@pytest.fixture
def fresh_pools():
    """Tool pools declared by one test are gone after it."""
    yield
    agent_otel.pools.shutdown(wait=False)


# Under `pytest -n N --dist loadscope` (pyproject.toml), each test module runs
# on one worker. The modules that import the agent frameworks in this process
# run on one worker together, which imports each framework once: a framework
# takes a second or more of CPU to import, and on a 2-core machine the
# workers share the CPU.
FRAMEWORK_MODULES = ("tests/frameworks/", "tests/test_redaction.py")
# The framework tests that import the frameworks only in the processes they
# start: units of their own, so that they run beside that worker, not after it
# (together the unit held about 18 of the suite's 85-90 CPU-s, on one worker).
FRAMEWORKS_IN_SUBPROCESSES = (
    "tests/frameworks/test_lazy_hooks.py",
    "tests/frameworks/test_opentelemetry_instrument.py",
)


# The work units that take longest (seconds of set-up, subprocesses, real
# waits), longest first, as measured with `pytest -n 6 --durations=0`. They
# are handed out before the rest, so that no worker starts one of them last
# while the others have run dry (pytest-xdist otherwise orders the units by
# their number of tests). A unit not named here keeps its place,
# after these (pytest-xdist's order: most tests first); the list only orders,
# it selects nothing.
LONGEST_FIRST = (
    "frameworks",
    "tests/frameworks/test_opentelemetry_instrument.py",
    "tests/frameworks/test_lazy_hooks.py",
    "tests/test_live_vs_report.py",
    "tests/test_demo.py",
    "tests/test_instrument.py",
    "tests/test_prometheus_e2e.py",
    "tests/test_gpu_exporter.py",
    "tests/test_loop_monitor.py",
    "tests/test_demo_serve.py",
    "tests/test_export.py",
    "tests/test_deferred_export.py",
    "tests/test_html_report.py",
    "tests/test_first_run.py",
    "tests/test_otlp_json_encode.py",
    "tests/test_html_legibility.py",
    "tests/test_fork.py",
    "tests/test_report_inputs.py",
)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error where xdist is not installed
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None  # the scheduler the command line asks for
    from xdist.scheduler import LoadScopeScheduling

    class FrameworksTogetherLongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(FRAMEWORK_MODULES) and not nodeid.startswith(FRAMEWORKS_IN_SUBPROCESSES):
                return "frameworks"
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # The first call comes once every unit is queued: order the queue then.
            if not getattr(self, "_longest_first", False):
                self._longest_first = True
                rank = {unit: index for index, unit in enumerate(LONGEST_FIRST)}
                units = sorted(self.workqueue.items(), key=lambda item: rank.get(item[0], len(rank)))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return FrameworksTogetherLongestFirst(config, log)
