"""The OTLP exporters are made on the export thread, never on the agent's:
``instrument()`` does not import gRPC (about 58 ms), and a failure to make
the exporter is an export failure (logged once, spans counted), not an
error in the agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from opentelemetry.sdk.trace.export import SpanExportResult

from agent_otel.support import forks
from agent_otel.exporters.deferred import DeferredExporter

SCRIPT = r"""
import json, sys, threading
import agent_otel

importers = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("grpc", "opentelemetry.exporter.otlp")):
            importers.setdefault(name.split(".")[0] if name.startswith("grpc") else "otlp", threading.current_thread().name)
        return None

sys.meta_path.insert(0, Watch())
handle = agent_otel.instrument(service_name="t", traces_exporters="otlp", otlp_endpoint="127.0.0.1:9",
                               gpu="off", frameworks=(), shutdown_timeout=1)
after_instrument = "grpc" in sys.modules

@agent_otel.tool
def search(q):
    return q

search("x")
handle.force_flush(timeout_s=20)
print(json.dumps({"after_instrument": after_instrument, "after_export": "grpc" in sys.modules,
                  "importers": importers}))
"""


def test_instrument_leaves_the_grpc_import_to_the_export_thread():
    # Nothing listens on port 9: the export fails after the exporter's own timeout (10 s by default).
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["after_instrument"] is False
    assert result["after_export"] is True
    assert result["importers"] and set(result["importers"].values()) == {"agent-otel-span-export"}


def test_a_failure_to_make_the_exporter_is_an_export_failure():
    made = []

    def make():
        made.append(1)
        raise ImportError("No module named 'grpc'")

    exporter = DeferredExporter(make)
    try:
        exporter.export([])
    except ImportError:
        pass
    else:  # the batch processor counts the batch lost and logs the error
        raise AssertionError("the error must reach the processor")
    assert exporter.made is None and exporter.force_flush() is True
    exporter.shutdown()  # nothing made, nothing to close


def test_the_exporter_is_made_once_and_used():
    class Null:
        flushed = closed = 0

        def export(self, spans):
            return SpanExportResult.SUCCESS

        def force_flush(self, timeout_millis=30000):
            Null.flushed += 1
            return True

        def shutdown(self):
            Null.closed += 1

    made = []
    exporter = DeferredExporter(lambda: made.append(Null()) or made[-1])
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert len(made) == 1 and exporter.made is made[0]
    assert exporter.force_flush() and Null.flushed == 1
    exporter.shutdown()
    assert Null.closed == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
def test_a_child_forked_while_the_exporter_is_being_made_still_exports(monkeypatch):
    # The fork waits for the exporter's imports to finish, at most FORK_WAIT_S (5 s), then
    # goes ahead: here they never finish, so the wait is cut short to keep the test quick.
    monkeypatch.setattr(forks, "FORK_WAIT_S", 0.2)
    entered, release = threading.Event(), threading.Event()

    class Null:
        def export(self, spans):
            return SpanExportResult.SUCCESS

    def make():
        if os.getpid() == parent:  # the parent's export thread is held inside the lock
            entered.set()
            release.wait(30)
        return Null()

    parent = os.getpid()
    exporter = DeferredExporter(make)
    maker = threading.Thread(target=exporter.export, args=([],))
    maker.start()
    try:
        assert entered.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: its export must not wait on the lock the parent's thread holds
            done = threading.Event()
            threading.Thread(
                target=lambda: exporter.export([]) is SpanExportResult.SUCCESS and done.set(), daemon=True
            ).start()
            os._exit(0 if done.wait(10) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's export waited on a lock held at fork"
    finally:
        release.set()
        maker.join(30)
    assert exporter.made is not None
