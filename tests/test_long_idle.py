"""Idle windows that last hours: the live engine's memory stays bounded by
what attribution needs, and its blame stays the offline rule's.

The engine is driven as the live path drives it (samples every poll, the
calls in flight as the recorder holds them, the finished ones as they
finish) on a compressed clock, and checked, share by share, against
``attribute`` over every call of the run. The slow tests are the soak of
``bench/reliability.py`` (``idle-agent``, ``idle-service``) on a virtual
clock: the real ``LiveTimeline`` and ``PoolTimeline``, minutes of an idle
GPU at hundreds of calls a second, their memory measured with tracemalloc.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import random
import tracemalloc
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from agent_otel.attribution import attribute
from agent_otel.attribution.engine import BlameEngine
from agent_otel.attribution.live import LiveTimeline
from agent_otel.attribution.options import GpuOptions
from agent_otel.attribution.rule import CallShare
from agent_otel.attribution.service import PoolTimeline
from agent_otel.exporters.prometheus import Metrics
from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.wiring.pipeline import Pipeline
from agent_otel.records import NS_PER_S, GpuSample, IdleWindow, LoopBlock, ToolCall
from tests.helpers.nvml_driver import VirtualClock

PERIOD_NS = NS_PER_S // 6
POLL_NS = NS_PER_S // 2
T0 = 1_700_000_000 * NS_PER_S


@dataclass
class Planned:
    """A call as it will happen; ``live`` is the record the hot path keeps (end 0 while in flight)."""

    tool: str
    submit: int
    start: int
    end: int
    live: ToolCall


def plan(rng: random.Random, seconds: float, rate: float) -> list[Planned]:
    """Calls at ``rate`` a second for ``seconds``: short and long, some queued, a few hung for minutes."""
    calls = []
    t = T0
    end_of_run = T0 + round(seconds * NS_PER_S)
    while t < end_of_run - 5 * NS_PER_S:
        t += round(rng.expovariate(rate) * NS_PER_S) + 1
        queued = rng.random() < 0.3
        queue = round(rng.uniform(0.01, 0.5) * NS_PER_S) if queued else 0
        length = round(
            rng.choice([rng.uniform(0.001, 0.04), rng.uniform(0.05, 2.0), rng.uniform(0.05, 2.0)]) * NS_PER_S
        )
        if rng.random() < 0.002:
            length = round(rng.uniform(30, 120) * NS_PER_S)  # a hung tool
        end = min(t + queue + length, end_of_run - NS_PER_S)
        start = min(t + queue, end)
        serial = len(calls) + 1
        tool = rng.choice(["search", "fetch", "sql", "parse"])
        record = ToolCall(tool, "tools" if queued else "direct", t, 0, trace_id=serial, span_id=serial)
        calls.append(Planned(tool, t, start, end, record))
    return calls


class Recorder:
    """The calls as the hot path holds them at each instant: in flight with end 0
    (and start 0 while queued), finished once their end has passed."""

    def __init__(self, planned: list[Planned]):
        self.planned = sorted(planned, key=lambda p: p.submit)
        self.next = 0
        self.inflight: dict[int, Planned] = {}

    def advance(self, now: int) -> list[ToolCall]:
        """Move to ``now``; the calls that finished since."""
        while self.next < len(self.planned) and self.planned[self.next].submit <= now:
            p = self.planned[self.next]
            self.inflight[id(p)] = p
            self.next += 1
        finished = []
        for key, p in list(self.inflight.items()):
            if p.start <= now and not p.live.start_ns:
                p.live.start_ns = p.start
            if p.end <= now:
                p.live.start_ns = p.start
                p.live.end_ns = p.end
                finished.append(p.live)
                del self.inflight[key]
        return finished

    def in_flight(self) -> list[ToolCall]:
        return [p.live for p in self.inflight.values()]


def idle_samples(start: int, end: int, busy: list[tuple[int, int]]) -> list[GpuSample]:
    """Samples every period in [start, end): idle, except within ``busy``."""
    return [GpuSample("0", t, 0.95 if any(a <= t < b for a, b in busy) else 0.0) for t in range(start, end, PERIOD_NS)]


def run_engine(engine: BlameEngine, planned: list[Planned], seconds: float, busy, blocks=()):
    """Poll every 0.5 s as the live timeline does; returns the settled shares,
    the closed windows and the most shares and horizon calls held after any poll."""
    recorder = Recorder(planned)
    settled, closed = [], []
    most_shares = most_horizon = 0
    polled = T0
    end = T0 + round(seconds * NS_PER_S)
    while polled < end:
        now = polled + POLL_NS
        finished = recorder.advance(now)
        running = recorder.in_flight()  # before the finished ones are added, as the live path reads them
        engine.add_finished(finished)
        # the loop monitor's blocks: those begun, open-ended while they last
        known = [b if b.end_ns <= now else dataclasses.replace(b, end_ns=0) for b in blocks if b.start_ns <= now]
        update = engine.feed(idle_samples(polled, now, busy), running, known)
        settled += update.settled
        closed += update.closed
        most_shares = max(most_shares, sum(len(w.shares) for w in engine._open.values()))
        most_horizon = max(most_horizon, len(engine.horizon))
        polled = now
    update = engine.flush(recorder.in_flight())
    return settled + update.settled, closed + update.closed, most_shares, most_horizon


def by_call(shares) -> dict[int, CallShare]:
    return {share.call.span_id: share for share in shares}


def test_a_window_of_many_thousands_of_calls_is_blamed_share_by_share_as_the_offline_rule(monkeypatch):
    rng = random.Random(25)
    seconds = 420.0
    planned = plan(rng, seconds, rate=40.0)
    # Two long windows (0-200 s, 210-420 s) and a short one between busy stretches.
    busy = [(T0 + 200 * NS_PER_S, T0 + 203 * NS_PER_S), (T0 + 205 * NS_PER_S, T0 + 210 * NS_PER_S)]
    engine = BlameEngine(
        dataclasses.replace(GpuOptions.default(), horizon_s=1.0), max_gap_s=None, share_min_s=0.05, max_links=16
    )
    settled, closed, most_shares, most_horizon = run_engine(engine, planned, seconds, busy)

    windows = [c.attribution.window for c in closed]
    assert [(round((w.start_ns - T0) / NS_PER_S), round((w.end_ns - T0) / NS_PER_S)) for w in windows] == [
        (0, 200),
        (203, 205),
        (210, 420),
    ]
    finals = [
        ToolCall(p.tool, "x", p.submit, p.start, p.end, trace_id=p.live.trace_id, span_id=p.live.span_id)
        for p in planned
    ]
    offline = attribute([IdleWindow("0", w.start_ns, w.end_ns, 0.0) for w in windows], finals)
    total_shares = 0
    for window, result, expected in zip(windows, closed, offline):
        got = [s.share for s in settled if s.window_start_ns == window.start_ns]
        # Every call's share once, equal to the rule over the whole window, for
        # the calls long enough to reach share_min (a shorter one has a share
        # only of the stretches it was seen in flight in; all are in the totals).
        mine = by_call(got)
        assert len(got) == len(mine)
        rule = by_call(expected.shares)
        long_enough = [s for s in expected.shares if s.call.end_ns - s.call.submit_ns >= 0.05 * NS_PER_S]
        assert {s.call.span_id for s in long_enough} <= set(mine)
        for span_id, have in mine.items():
            share = rule[span_id]
            if share.call.end_ns - share.call.submit_ns < 0.05 * NS_PER_S:
                assert have.blocked_s <= share.blocked_s + 1e-9
                continue
            assert (have.start_ns, have.end_ns) == (share.start_ns, share.end_ns)
            assert have.queue_s == pytest.approx(share.queue_s, abs=1e-6)
            assert have.exec_s == pytest.approx(share.exec_s, abs=1e-6)
            assert have.phase == share.phase
        total_shares += len(got)
        # The window's totals are every call's; its links the largest shares, as before.
        totals = collections.Counter()
        for share in expected.shares:
            for phase, s in (("queue", share.queue_s), ("exec", share.exec_s)):
                if s > 0:
                    totals[(share.call.tool, phase)] += s
        assert result.blocked == pytest.approx(dict(totals), abs=1e-6)
        assert result.attribution.unattributed_s == pytest.approx(expected.unattributed_s, abs=1e-6)
        linkable = sorted(
            (s for s in got if s.blocked_s >= 0.05),
            key=lambda s: (s.blocked_s, s.call.submit_ns, s.call.start_ns),
        )
        assert result.linkable == len(linkable)
        assert [s.call.span_id for s in result.attribution.shares] == [s.call.span_id for s in linkable[-16:]]
    # Thousands of calls blamed, never more than those in flight and of the last poll held.
    assert total_shares > 5_000
    assert most_shares < 250
    assert most_horizon < 100


def test_with_a_blocked_event_loop_the_shares_handed_out_add_up_to_the_rule_per_call():
    # "lookup" returns at 10.2 s; the loop it blocked runs again at 11.5 s:
    # the rule blames it for the whole block (past its end, a stand-in for
    # it takes the blame, as it always has), and "waiter" for nothing of it.
    lookup = Planned("lookup", T0 + 10 * NS_PER_S, T0 + 10 * NS_PER_S, T0 + 10_200_000_000, None)  # type: ignore[arg-type]
    lookup.live = ToolCall("lookup", "direct", lookup.submit, 0, trace_id=1, span_id=1)
    waiter = Planned("waiter", T0 + 9 * NS_PER_S, T0 + 9 * NS_PER_S, T0 + 12 * NS_PER_S, None)  # type: ignore[arg-type]
    waiter.live = ToolCall("waiter", "direct", waiter.submit, 0, trace_id=2, span_id=2)
    block = LoopBlock("MainThread", T0 + 10 * NS_PER_S, T0 + 11_500_000_000, "lookup", (1, 1), ((2, 2),))
    engine = BlameEngine(max_gap_s=None)
    settled, closed, _, _ = run_engine(engine, [lookup, waiter], 20.0, [], blocks=[block])
    [window] = [c.attribution.window for c in closed]
    finals = [
        ToolCall(p.tool, "direct", p.submit, p.start, p.end, trace_id=i + 1, span_id=i + 1)
        for i, p in enumerate([lookup, waiter])
    ]
    [expected] = attribute([IdleWindow("0", window.start_ns, window.end_ns, 0.0)], finals, [block])
    got: dict[int, float] = collections.Counter()
    for item in settled:
        got[item.share.call.span_id] += item.share.blocked_s
    assert got == pytest.approx({share.call.span_id: share.blocked_s for share in expected.shares}, abs=1e-9)
    assert got[1] == pytest.approx(1.5, abs=1e-9)  # the whole block (10.0-11.5 s), alone


# ---------------------------------------------------------------- the soak, on a virtual clock


class CountingExporter(SpanExporter):
    """Spans counted and let go (an in-memory exporter would be the growth)."""

    def __init__(self) -> None:
        self.names: collections.Counter = collections.Counter()

    def export(self, spans) -> SpanExportResult:
        for span in spans:
            self.names[(span.name, span.parent is None)] += 1
        return SpanExportResult.SUCCESS


class HotPathTables:
    """The recorder's tables the live timeline reads (as tests/test_live_blame.py's FakeRecorder)."""

    def __init__(self) -> None:
        self.inflight: dict[int, ToolCall] = {}
        self.finished: collections.deque = collections.deque()
        self.spans: collections.deque = collections.deque()


def traced_mb() -> float:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / 1e6


SOAK_S = 600  # virtual seconds with the GPU idle throughout
RATE = 200  # calls a second


@pytest.mark.slow
def test_an_agent_on_an_idle_gpu_holds_no_more_memory_after_ten_minutes_than_after_one():
    # The real LiveTimeline, polled every 0.5 s of a virtual clock, as the
    # idle-agent soak of bench/reliability.py runs it in real time: 200 calls
    # a second of 60 ms each (12 in flight), through the recorder's tables and
    # the pipeline, the simulated GPU idle from start to end.
    clock = VirtualClock()
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tables = HotPathTables()
    metrics = Metrics()
    timeline = LiveTimeline(
        SimulatedGpu([], clock=clock),
        # every share a child span: the spans leave as they are made
        dataclasses.replace(GpuOptions.default(), share_min_s=0.001),
        tracer=provider.get_tracer("soak"),
        metrics=metrics,
        recorder=tables,
        pipeline=Pipeline(tables, None, metrics),  # type: ignore[arg-type]  # the tables it reads
    )
    origin = clock()
    running: collections.deque = collections.deque()
    serial = 0
    readings = {}
    tracemalloc.start()
    try:
        for poll in range(1, SOAK_S * 2 + 1):
            now = origin + poll * POLL_NS
            for k in range(RATE // 2):  # the calls submitted in this half second
                serial += 1
                submit = now - POLL_NS + k * POLL_NS // (RATE // 2)
                call = ToolCall("search", "direct", submit, submit, trace_id=serial, span_id=serial)
                tables.inflight[id(call)] = call
                running.append(call)
            while running and running[0].submit_ns + 60_000_000 <= now:
                call = running.popleft()
                call.end_ns = call.submit_ns + 60_000_000
                tables.finished.append(call)
                del tables.inflight[id(call)]
            clock.advance_to(now)
            timeline.on_samples(timeline.source.poll())
            if poll % 120 == 0:  # every minute
                readings[poll // 120] = traced_mb()
    finally:
        tracemalloc.stop()
    print(f"traced MB by minute: {readings}")  # for docs/performance.md (pytest -s)
    growth = max(readings.values()) - readings[1]
    assert growth < 3.0, f"traced MB by minute: {readings}"
    idle_s = metrics.registry.get_sample_value("agent_gpu_idle_seconds_total", {"gpu": "0"})
    assert idle_s == pytest.approx(SOAK_S, abs=1.0)  # one window, open from start to end
    assert exporter.names[("gpu.idle", False)] > 0.9 * serial  # a child span per call, as it settled


@pytest.mark.slow
def test_a_blame_service_on_an_idle_gpu_holds_no_more_memory_after_ten_minutes_than_after_two():
    # The real PoolTimeline (watermark 30 s), polled every 0.5 s of a virtual
    # clock: 200 tool spans a second arriving 1 s after their call ended, as
    # the idle-service soak of bench/reliability.py sends them in real time.
    clock = VirtualClock()
    rng = random.Random(1)
    metrics = Metrics()
    timeline = PoolTimeline(
        SimulatedGpu([], clock=clock),
        pool="vllm-a:8000",
        watermark_s=30.0,
        tracer=TracerProvider().get_tracer("soak"),  # no processor: spans made and let go
        metrics=metrics,
        clock=clock,
    )
    origin = clock()
    serial = 0
    readings = {}
    tracemalloc.start()
    try:
        for poll in range(1, SOAK_S * 2 + 1):
            now = origin + poll * POLL_NS
            calls = []
            for _ in range(RATE // 2):  # ended 1-1.5 s ago, lasted 0.05-1 s
                serial += 1
                end = now - NS_PER_S - rng.randrange(POLL_NS)
                submit = end - rng.randrange(50_000_000, NS_PER_S)
                calls.append(
                    ToolCall(
                        "search", "direct", submit, submit, end, trace_id=serial, span_id=serial, pool="vllm-a:8000"
                    )
                )
            clock.advance_to(now)
            intake = timeline.add_calls(calls)
            assert intake.accepted == len(calls) and not intake.late
            released = timeline.source.poll()
            if released:
                timeline.on_samples(released)
            if poll % 120 == 0:
                readings[poll // 120] = traced_mb()
    finally:
        tracemalloc.stop()
    print(f"traced MB by minute: {readings}")  # for docs/performance.md (pytest -s)
    growth = max(readings.values()) - readings[2]
    assert growth < 3.0, f"traced MB by minute: {readings}"
    assert timeline.engine.horizon.dropped == 0
    assert metrics.registry.get_sample_value("agent_gpu_idle_seconds_total", {"gpu": "0"}) == pytest.approx(
        SOAK_S - 30, abs=1.0
    )  # blamed a watermark behind
