"""The span processor under pressure: priorities, losses, back-off, one line, full disks, shutdown."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

import agent_otel
from agent_otel.exporters.batch import BatchSpanProcessor, SpanLosses, kind_of
from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter
from helpers.waiting import eventually


class Recording(SpanExporter):
    """Records every batch; ``fail`` makes it refuse them, ``gate`` holds export until set."""

    def __init__(self, fail=False, gate=None, raises=None):
        self.batches = []
        self.attempts = []
        self.sizes = []
        self.fail = fail
        self.gate = gate
        self.raises = raises

    def export(self, spans):
        self.attempts.append(time.monotonic())
        self.sizes.append(len(spans))
        if self.gate is not None:
            self.gate.wait()
        if self.raises is not None:
            raise self.raises
        if self.fail:
            logging.getLogger(__name__).warning(
                "Transient error StatusCode.UNAVAILABLE encountered while exporting traces to localhost:4317, "
                "retrying in %.2fs.",
                1.03,
            )
            return SpanExportResult.FAILURE
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    @property
    def names(self):
        return [span.name for batch in self.batches for span in batch]


def tracer():
    return TracerProvider().get_tracer("agent_otel")


def tool_span(t, name="search"):
    span = t.start_span(
        f"execute_tool {name}", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    )
    span.end()
    return span


def derived_span(t):
    parent = NonRecordingSpan(SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    span = t.start_span("gpu.idle", context=set_span_in_context(parent))
    span.end()
    return span


def counted():
    drops = {}

    def on_drop(kind, count):
        drops[kind] = drops.get(kind, 0) + count

    return drops, SpanLosses(on_drop)


def test_kinds():
    t = tracer()
    window = t.start_span("gpu.idle")
    window.end()
    assert [kind_of(s) for s in (tool_span(t), derived_span(t), window)] == ["tool", "derived", "other"]


def test_a_full_queue_keeps_tool_spans_and_drops_derived_ones():
    gate = threading.Event()
    exporter = Recording(gate=gate)
    drops, losses = counted()
    # Derived spans may fill 6 of the 8 places; nothing leaves the queue
    # while the export thread is held in export().
    processor = BatchSpanProcessor(exporter, max_queue_size=8, batch_size=8, interval_s=60, losses=losses)
    t = tracer()
    window = t.start_span("gpu.idle")
    window.end()
    processor.on_end(window)
    assert processor.force_flush(100) is False  # the export thread took it and is held
    assert processor.pending == 0

    for _ in range(8):
        processor.on_end(derived_span(t))
    assert (processor.pending, drops) == (6, {"derived": 2})
    for _ in range(3):  # two fit; the third takes the place of all six derived spans
        processor.on_end(tool_span(t))
    assert (processor.pending, drops) == (3, {"derived": 8})
    for _ in range(2):
        processor.on_end(tool_span(t))
    processor.on_end(derived_span(t))  # below three quarters again: it may wait
    assert processor.pending == 6
    for _ in range(3):  # two fit; the third takes the derived span's place
        processor.on_end(tool_span(t))
    assert (processor.pending, drops) == (8, {"derived": 9})
    processor.on_end(tool_span(t))  # full of tool spans: this one is lost
    assert drops == {"derived": 9, "tool": 1}

    gate.set()
    assert processor.shutdown(5) is True
    assert exporter.names == ["gpu.idle"] + ["execute_tool search"] * 8


def test_spans_taken_before_another_thread_emptied_the_queue_are_exported():
    # The export thread takes a batch in C; should shutdown's _take_all (or a
    # purge of derived spans) empty the queue meanwhile, what it took is kept.
    class Emptied(deque):
        taken = 0

        def popleft(self):
            if self.taken == 2:
                self.clear()  # the other thread took the rest
                raise IndexError("pop from an empty deque")
            self.taken += 1
            return super().popleft()

    exporter = Recording()
    processor = BatchSpanProcessor(exporter, max_queue_size=100, batch_size=10, interval_s=600)
    t = tracer()
    processor._queue = Emptied(tool_span(t, f"tool {n}") for n in range(5))
    assert processor._export_all(must=True) is True
    assert exporter.names == ["execute_tool tool 0", "execute_tool tool 1"]
    assert processor.shutdown(5) is True


def test_a_span_is_dropped_only_when_every_sink_lost_it():
    drops, losses = counted()
    ok, failing = Recording(), Recording(fail=True)
    processors = [
        BatchSpanProcessor(e, max_queue_size=100, batch_size=5, interval_s=0.01, losses=losses) for e in (ok, failing)
    ]
    provider = TracerProvider()
    for processor in processors:
        provider.add_span_processor(processor)
    t = provider.get_tracer("agent_otel")
    for _ in range(5):
        tool_span(t)
    assert eventually(lambda: len(ok.names) == 5 and failing.attempts)
    assert drops == {}  # the file (say) has them all
    ok.fail = True
    for processor in processors:
        processor.force_flush(1000)
    for _ in range(5):
        tool_span(t)
    for processor in processors:
        processor.force_flush(5000)
    assert drops == {"tool": 5}  # lost by both
    provider.shutdown()


def test_failures_back_off_and_are_said_once(caplog):
    caplog.set_level(logging.WARNING)
    exporter = Recording(fail=True)
    drops, losses = counted()
    processor = BatchSpanProcessor(
        exporter, max_queue_size=10_000, batch_size=5, interval_s=0.01, losses=losses, sink="OTLP/gRPC localhost:4317"
    )
    t = tracer()
    start = time.monotonic()
    while time.monotonic() - start < 2.5:
        processor.on_end(tool_span(t))
        time.sleep(0.001)
    # 1 s, then 2 s: at most three attempts in 2.5 s, not one every few spans.
    assert 1 <= len(exporter.attempts) <= 3
    assert drops.get("tool", 0) == sum(exporter.sizes) > 0
    lines = [r for r in caplog.records if r.name.startswith(("agent_otel", "opentelemetry"))]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert "OTLP/gRPC localhost:4317" in message and "UNAVAILABLE" in message and lines[0].exc_info is None
    # A flush still tries now, back-off or not, and says False.
    assert processor.force_flush(5000) is False
    exporter.fail = False
    assert processor.force_flush(5000) is True
    assert processor.pending == 0
    assert processor.shutdown(5) is True


def test_the_otlp_exporters_own_retry_warnings_fold_into_one_line(caplog):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    caplog.set_level(logging.WARNING)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    drops, losses = counted()
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=2),
        batch_size=5,
        interval_s=0.01,
        losses=losses,
        sink=f"OTLP/gRPC 127.0.0.1:{port}",
    )
    t = tracer()
    start = time.monotonic()
    while time.monotonic() - start < 3.0:
        processor.on_end(tool_span(t))
        time.sleep(0.002)
    processor.shutdown(5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert f"OTLP/gRPC 127.0.0.1:{port}" in lines[0] and "UNAVAILABLE" in lines[0]
    assert drops["tool"] > 0


def test_repeats_are_said_once_a_minute_with_a_count(caplog):
    from agent_otel.support.problems import Problems

    now = [0.0]
    problems = Problems(logging.getLogger("agent_otel.test"), clock=lambda: now[0])
    said = []
    for second in range(0, 181):
        now[0] = float(second)
        if problems.report(("sink", "UNAVAILABLE"), "export to %s failed", "x"):
            said.append(second)
        problems.report(("sink", "other"), "another problem")
    assert said == [0, 60, 120, 180]
    assert "(60 times in the last 60 s)" in caplog.records[2].getMessage()


def test_an_exporter_that_raises_costs_one_line_and_no_traceback(caplog):
    exporter = Recording(raises=ConnectionError("connection refused"))
    drops, losses = counted()
    processor = BatchSpanProcessor(exporter, batch_size=1, interval_s=0.01, losses=losses)
    t = tracer()
    for _ in range(3):
        processor.on_end(tool_span(t))
        processor.force_flush(1000)
    assert drops == {"tool": 3}
    lines = [r for r in caplog.records if r.name.startswith("agent_otel")]
    assert len(lines) == 1 and "ConnectionError: connection refused" in lines[0].getMessage()
    assert lines[0].exc_info is None
    processor.shutdown(1)


def test_a_lone_surrogate_in_another_librarys_span_does_not_lose_the_batch():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    class Protobuf(Recording):
        def export(self, spans):
            encode_spans(spans).SerializeToString()  # as the OTLP exporters do: raises on a surrogate
            return super().export(spans)

    exporter = Protobuf()
    drops, losses = counted()
    processor = BatchSpanProcessor(exporter, batch_size=10, interval_s=60, losses=losses)
    t = tracer()
    bad = t.start_span("lookup \udcff", attributes={"path": "/tmp/\udcfe"})
    bad.end()
    processor.on_end(bad)
    processor.on_end(tool_span(t))
    assert processor.force_flush(5000) is True
    assert drops == {}
    assert exporter.names == ["lookup \ufffd", "execute_tool search"]
    processor.shutdown(1)


def test_shutdown_says_false_and_names_an_exporter_that_blocks(caplog, spans, tmp_path):
    handle = agent_otel.instrument(
        traces_file=str(tmp_path / "t.jsonl"), traces_exporters="none", gpu="off", frameworks=()
    )
    gate, entered = threading.Event(), threading.Event()
    (processor,) = handle.span_processors
    exporter = processor.exporter
    real_export = exporter.export

    def blocked(batch):
        entered.set()
        gate.wait()
        return real_export(batch)

    exporter.export = blocked
    # The processor closes the abandoned exporter on a thread of its own, some time
    # after shutdown() gave up on it: seen here, so the held export resumes after it.
    closed = threading.Event()
    real_shutdown = exporter.shutdown

    def shutdown():
        real_shutdown()
        closed.set()

    exporter.shutdown = shutdown

    @agent_otel.tool
    def search():
        return 1

    try:
        for _ in range(3):
            search()
        handle.force_flush(0.2)  # the export thread takes the three spans...
        assert entered.wait(30)  # ... and is held in export() (0.2 s may not be enough on a busy machine)
        search()
        started = time.monotonic()
        assert handle.shutdown(timeout_s=1.0) is False
        took = time.monotonic() - started
        assert took < 3.0
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("agent_otel")]
        assert len(lines) == 1, lines
        assert "span export to traces file" in lines[0] and "t.jsonl" in lines[0]
        # The call still queued is counted: nothing else will export it.
        assert handle.metrics.registry.get_sample_value("agent_otel_spans_dropped_total", {"kind": "tool"}) == 1
        assert closed.wait(30)
    finally:
        gate.set()
        # The abandoned thread's export now fails (its file is closed) and says so: let it
        # finish here, not in the next test on this worker, which must log no warning.
        deadline = time.monotonic() + 30
        while processor.running and time.monotonic() < deadline:
            time.sleep(0.01)
    # ... and says nothing will try again: shutdown has given up on it.
    late = [r.getMessage() for r in caplog.records if r.name == "agent_otel.export"]
    assert late and all("not trying again" in line and "back-off" not in line for line in late), late


def test_shutdown_says_true_when_everything_flushed(caplog, spans, tmp_path):
    path = tmp_path / "t.jsonl"
    handle = agent_otel.instrument(
        traces_file=str(path), traces_exporters="none", gpu="simulated", gpu_poll_interval=0.05, frameworks=()
    )

    @agent_otel.tool
    def search():
        return 1

    for _ in range(20):
        search()
    assert handle.shutdown(timeout_s=5.0) is True
    assert path.read_text().count("execute_tool search") == 20
    assert not [r for r in caplog.records if r.name.startswith("agent_otel") and r.levelno >= logging.WARNING]


def test_shutdown_names_gpu_sampling_stuck_in_the_driver(caplog, spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="simulated", gpu_poll_interval=0.01, frameworks=())
    source = handle.gpu_timeline.source
    gate, entered = threading.Event(), threading.Event()
    real_poll = source.poll

    def stuck():
        entered.set()
        gate.wait()
        return real_poll()

    source.poll = stuck
    try:
        assert entered.wait(5)
        started = time.monotonic()
        assert handle.shutdown(timeout_s=1.0) is False
        assert time.monotonic() - started < 3.0
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("agent_otel")]
        assert len(lines) == 1 and "GPU sampling" in lines[0], lines
    finally:
        gate.set()


def run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_disk_drops_spans_with_a_count_and_one_line():
    result = run("""
        import json, agent_otel
        handle = agent_otel.instrument(traces_file="/dev/full", traces_exporters="none", gpu="off",
                                       export_batch_size=10, export_interval=0.01)
        @agent_otel.tool
        def search(i):
            return i
        for i in range(1000):
            search(i)
            if i % 100 == 0:
                handle.force_flush(5.0)
        handle.shutdown()  # what a failing sink still holds is lost now, and counted
        dropped = handle.metrics.registry.get_sample_value("agent_otel_spans_dropped_total", {"kind": "tool"})
        print(json.dumps({"dropped": dropped}))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dropped"] == 1000
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "/dev/full" in lines[0] and "No space left on device" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_disk_that_fills_up_leaves_no_half_line(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        exporter = OtlpJsonFileExporter(str(mount / "traces.jsonl"))
        t = tracer()
        results = [exporter.export([tool_span(t, f"tool_{i}") for i in range(3)]) for i in range(200)]
        exporter.shutdown()
        assert SpanExportResult.FAILURE in results  # it did fill up
        text = (mount / "traces.jsonl").read_text()
        assert text.endswith("\n")
        lines = text.splitlines()
        assert all(json.loads(line)["resourceSpans"] for line in lines)
        assert len(lines) == results.index(SpanExportResult.FAILURE)
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def names_in(path) -> list[str]:
    return [
        span["name"]
        for line in path.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


def test_a_deleted_or_replaced_traces_file_is_opened_again_with_one_line(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    path = tmp_path / "traces.jsonl"
    exporter = OtlpJsonFileExporter(str(path))
    t = tracer()
    assert exporter.export([tool_span(t, "first")]) == SpanExportResult.SUCCESS
    path.unlink()  # a clean-up deletes it while the agent runs
    assert exporter.export([tool_span(t, "second")]) == SpanExportResult.SUCCESS
    assert names_in(path) == ["execute_tool second"]
    path.rename(tmp_path / "traces.jsonl.1")  # a log rotation: renamed away, a new file put in its place
    path.write_text("")
    assert exporter.export([tool_span(t, "third")]) == SpanExportResult.SUCCESS
    assert exporter.export([tool_span(t, "fourth")]) == SpanExportResult.SUCCESS
    assert names_in(path) == ["execute_tool third", "execute_tool fourth"]
    assert names_in(tmp_path / "traces.jsonl.1") == ["execute_tool second"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "was deleted" in lines[0] and "was replaced" in lines[1], lines
    exporter.shutdown()


def test_a_traces_file_that_cannot_be_made_again_refuses_its_spans(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    folder = tmp_path / "out"
    folder.mkdir()
    exporter = OtlpJsonFileExporter(str(folder / "traces.jsonl"))
    (folder / "traces.jsonl").unlink()
    folder.rmdir()
    assert exporter.export([tool_span(tracer(), "lost")]) == SpanExportResult.FAILURE  # counted by the processor
    [line] = [r.getMessage() for r in caplog.records]
    assert "was deleted and cannot be created again" in line
    exporter.shutdown()


def test_an_agent_whose_traces_file_is_deleted_keeps_its_spans(tmp_path, caplog, spans):
    path = tmp_path / "traces.jsonl"
    handle = agent_otel.instrument(traces_file=str(path), traces_exporters="none", gpu="off", frameworks=())

    @agent_otel.tool
    def search(i):
        return i

    try:
        for i in range(50):
            search(i)
        assert handle.force_flush(5.0)
        path.unlink()
        with caplog.at_level(logging.WARNING):
            for i in range(70):
                search(i)
            assert handle.force_flush(5.0)
    finally:
        handle.shutdown()
    assert names_in(path).count("execute_tool search") == 70
    assert handle.metrics.registry.get_sample_value("agent_otel_spans_dropped_total", {"kind": "tool"}) == 0
    assert len([r for r in caplog.records if "was deleted" in r.getMessage()]) == 1
