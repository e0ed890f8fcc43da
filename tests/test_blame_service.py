"""The blame service's engine: tool calls from many processes, a GPU sampled
here, joined behind a watermark (agent_otel.attribution.service).

A scripted simulated GPU and scripted agents on a virtual clock, so the
ground truth is the offline rule (``find_idle_windows`` + ``attribute``)
over the same samples and calls, to the nanosecond.
"""

from __future__ import annotations

import random

import pytest
from opentelemetry import trace

from agent_otel.attribution import BlameTotals, attribute
from agent_otel.attribution.service import CLOCK_AHEAD, MAX_HELD_SAMPLES, OTHER_POOL, PoolTimeline, WatermarkSource
from agent_otel.exporters.prometheus import Metrics
from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.gpu.timeline import find_idle_windows
from agent_otel.records import NS_PER_S, GpuSample, ToolCall
from tests.helpers.nvml_driver import VirtualClock

POOL = "vllm-a:8000"
PERIOD_S = 1 / 6
# The GPU: busy 1 s, idle 4 s, busy 1 s, idle 3 s, busy 1 s, idle 5 s, busy 1 s, then idle.
PHASES = [(1.0, 0.95), (4.0, 0.0), (1.0, 0.9), (3.0, 0.02), (1.0, 0.97), (5.0, 0.0), (1.0, 0.9)]
RUN_S = 20.0


class Service:
    """A PoolTimeline polled every 0.5 s of virtual time, as its sampler would."""

    def __init__(self, *, watermark_s: float = 2.0, max_calls: int = 200_000):
        self.clock = VirtualClock()
        self.origin = self.clock()
        self.metrics = Metrics()
        gpu = SimulatedGpu(PHASES, sample_period_s=PERIOD_S, clock=self.clock)
        self.timeline = PoolTimeline(
            gpu,
            pool=POOL,
            watermark_s=watermark_s,
            max_calls=max_calls,
            tracer=trace.get_tracer("test"),
            metrics=self.metrics,
            clock=self.clock,
        )
        self.samples: list[GpuSample] = []
        source: WatermarkSource = self.timeline.source
        shown = source.on_fresh
        source.on_fresh = lambda fresh: (self.samples.extend(fresh), shown(fresh))
        self.polled_to = self.origin

    def at(self, seconds: float) -> int:
        return self.origin + round(seconds * NS_PER_S)

    def run_to(self, seconds: float) -> None:
        """Move the clock, polling every 0.5 s on the way."""
        target = self.at(seconds)
        while self.polled_to + NS_PER_S // 2 <= target:
            self.polled_to += NS_PER_S // 2
            self.clock.advance_to(self.polled_to)
            released = self.timeline.source.poll()
            if released:
                self.timeline.on_samples(released)
        self.clock.advance_to(max(self.clock(), target))

    def blocked(self) -> dict[tuple[str, str], float]:
        found = {}
        for metric in self.metrics.registry.collect():
            if metric.name == "agent_gpu_idle_blocked_seconds":
                for sample in metric.samples:
                    if sample.name.endswith("_total"):
                        found[(sample.labels["tool"], sample.labels["phase"])] = sample.value
        return found

    def counter(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name, {"gpu": "0"}) or 0.0


def call(
    service: Service, tool: str, submit: float, start: float, end: float, *, span_id: int, pool: str = POOL
) -> ToolCall:
    return ToolCall(
        tool, "tools", service.at(submit), service.at(start), service.at(end), trace_id=7, span_id=span_id, pool=pool
    )


def agents(service: Service, rng: random.Random) -> list[ToolCall]:
    """Three agents' calls over the run: some queued, some overlapping, all under 1.5 s."""
    calls = []
    for _agent in range(3):
        t = rng.uniform(0.0, 0.5)
        while t < RUN_S - 2:
            queued = rng.choice([0.0, 0.0, rng.uniform(0.05, 0.4)])
            length = rng.uniform(0.2, 1.5)
            tool = rng.choice(["search", "fetch_page", "sql"])
            calls.append(call(service, tool, t, t + queued, t + queued + length, span_id=len(calls) + 1))
            t += queued + length + rng.uniform(0.05, 1.0)
    return calls


def offline(service: Service, calls: list[ToolCall]) -> dict[tuple[str, str], float]:
    """The rule over the same samples and calls, after the fact."""
    windows = find_idle_windows(service.samples, max_gap_s=3.0)
    totals = BlameTotals()
    for result in attribute(windows, [dataclass_copy(c) for c in calls]):
        totals.add(result)
    return {(tool, phase): s for (_gpu, tool, phase), s in totals.blocked_s.items()}


def dataclass_copy(c: ToolCall) -> ToolCall:
    return ToolCall(c.tool, c.executor, c.submit_ns, c.start_ns, c.end_ns, trace_id=c.trace_id, span_id=c.span_id)


def deliver(service: Service, calls: list[ToolCall], delays: list[float]) -> list:
    """Each call reaches the service ``delay`` seconds after it ended; returns the intakes."""
    arrivals = sorted(zip((c.end_ns + round(d * NS_PER_S) for c, d in zip(calls, delays)), range(len(calls))))
    intakes = []
    for arrival, index in arrivals:
        service.run_to((arrival - service.origin) / NS_PER_S)
        intakes.append(service.timeline.add_calls([calls[index]]))
    service.run_to(RUN_S)
    service.timeline.shutdown()
    return intakes


def test_calls_arriving_within_the_watermark_are_blamed_exactly_as_offline_in_any_order():
    rng = random.Random(11)
    for delays_from in ("in order", "shuffled"):
        service = Service(watermark_s=3.5)
        calls = agents(service, rng)
        # Calls last at most 1.9 s and their spans arrive within 1.5 s of
        # their end: inside the watermark, from each call's submit.
        delays = [0.3] * len(calls) if delays_from == "in order" else [rng.uniform(0.0, 1.5) for _ in calls]
        intakes = deliver(service, calls, delays)
        assert sum(i.accepted for i in intakes) == len(calls)
        assert not any(i.late for i in intakes) and not any(i.refused for i in intakes)
        live, exact = service.blocked(), offline(service, calls)
        assert exact and set(live) == set(exact)
        for key, seconds in exact.items():
            assert live[key] == pytest.approx(seconds, abs=1e-6), (delays_from, key)
        # Every idle second is blamed or unattributed, once.
        idle = service.counter("agent_gpu_idle_seconds_total")
        assert sum(live.values()) + service.counter("agent_gpu_idle_unattributed_seconds_total") == pytest.approx(
            idle, abs=1e-6
        )


def test_the_engine_sees_gpu_time_only_a_watermark_late_and_the_gauge_at_once():
    service = Service(watermark_s=2.0)
    service.run_to(3.0)  # idle since 1 s, per the script
    assert service.metrics.registry.get_sample_value("agent_gpu_utilization_ratio", {"gpu": "0"}) == 0.0
    # Blamed up to 3 s - 2 s at most: the idle window is open since 1 s, so nothing yet.
    assert service.counter("agent_gpu_idle_seconds_total") == 0.0
    assert service.timeline.frontier_ns <= service.at(1.0)
    assert service.timeline.lag_s() >= 2.0
    service.run_to(4.5)
    assert 0.5 < service.counter("agent_gpu_idle_seconds_total") <= 1.5 + 1e-9


def test_a_late_span_is_counted_late_and_its_part_before_the_watermark_is_never_blamed():
    service = Service(watermark_s=2.0)
    hung = call(service, "hung_tool", 1.5, 1.5, 4.5, span_id=1)  # 3 s: longer than the watermark
    quick = call(service, "search", 2.0, 2.0, 2.5, span_id=2)
    service.run_to(3.0)
    assert service.timeline.add_calls([quick]).late == {}
    service.run_to(5.0)  # the hung call's span arrives 0.5 s after it ended: the frontier is near 3 s
    frontier = service.timeline.frontier_ns
    assert service.at(2.5) <= frontier < service.at(3.5)
    intake = service.timeline.add_calls([hung])
    assert intake.accepted == 1 and intake.late == {"hung_tool": 1}
    service.run_to(RUN_S)
    service.timeline.shutdown()
    blocked = service.blocked()
    # The hung call was blamed only from the frontier to its end; search in full.
    assert blocked[("hung_tool", "exec")] == pytest.approx((service.at(4.5) - frontier) / NS_PER_S, abs=1e-6)
    assert blocked[("search", "exec")] == pytest.approx(0.5, abs=1e-6)
    idle = service.counter("agent_gpu_idle_seconds_total")
    assert sum(blocked.values()) + service.counter("agent_gpu_idle_unattributed_seconds_total") == pytest.approx(
        idle, abs=1e-6
    )


def test_a_span_sent_twice_counts_once_and_a_call_wholly_past_the_frontier_is_only_late():
    service = Service(watermark_s=2.0)
    first = call(service, "search", 1.5, 1.5, 2.5, span_id=1)
    service.run_to(3.0)
    assert service.timeline.add_calls([first]).accepted == 1
    retry = service.timeline.add_calls([call(service, "search", 1.5, 1.5, 2.5, span_id=1)])
    assert retry.duplicates == 1 and retry.accepted == 0
    service.run_to(9.0)
    old = service.timeline.add_calls([call(service, "search", 2.0, 2.0, 3.0, span_id=3)])
    assert old.late == {"search": 1}
    service.run_to(RUN_S)
    service.timeline.shutdown()
    assert service.blocked()[("search", "exec")] == pytest.approx(1.0, abs=1e-6)


def test_calls_of_another_pool_or_from_a_clock_far_ahead_are_refused():
    service = Service(watermark_s=2.0)
    service.run_to(3.0)
    intake = service.timeline.add_calls(
        [
            call(service, "search", 1.5, 1.5, 2.5, span_id=1, pool="vllm-b:8000"),
            call(service, "search", 1.5, 1.5, 2.5, span_id=2, pool=""),
            call(service, "search", 3.0, 3.0, 5.5, span_id=3),  # ends 2.5 s ahead of this host: over the watermark
            call(service, "search", 2.0, 2.0, 4.5, span_id=4),  # 1.5 s ahead: within it, taken
        ]
    )
    assert intake.refused == {OTHER_POOL: 2, CLOCK_AHEAD: 1}
    assert intake.accepted == 1
    assert "'vllm-b:8000'" in intake.examples[OTHER_POOL] and "NTP" in intake.examples[CLOCK_AHEAD]


def test_memory_stays_bounded_whatever_order_spans_arrive_in():
    rng = random.Random(5)
    service = Service(watermark_s=2.0, max_calls=100)
    calls = []
    for index in range(5000):  # bursts far in the past, near now and ahead, in any order
        submit = rng.uniform(-30.0, 22.0)
        calls.append(call(service, "t", submit, submit, submit + rng.uniform(0.01, 3.0), span_id=index + 1))
    service.run_to(10.0)
    rng.shuffle(calls)
    for start in range(0, len(calls), 100):
        service.timeline.add_calls(calls[start : start + 100])
        assert service.timeline.held_calls() <= 100
    assert service.timeline.engine.horizon.dropped > 0
    assert len(service.timeline._seen) <= 2 * 100 + 1024 + 100
    # Held samples: a watermark's worth.
    assert len(service.timeline.source._held) <= round(2.0 / PERIOD_S) + 2 < MAX_HELD_SAMPLES
    service.run_to(RUN_S)
    service.timeline.shutdown()
    idle = service.counter("agent_gpu_idle_seconds_total")
    blocked = sum(service.blocked().values())
    assert blocked + service.counter("agent_gpu_idle_unattributed_seconds_total") == pytest.approx(idle, abs=1e-6)


def test_the_dropped_calls_are_only_those_never_blamed_in_full():
    # 100 calls a second for 40 s, each arriving 0.5 s after it ends, into a
    # store of 600: what can still be blamed (ending after the frontier, a
    # watermark of 2 s ago) is ~250 calls at any time, so none is lost; the
    # calls already blamed leave the store without counting as dropped.
    service = Service(watermark_s=2.0, max_calls=600)
    serial = 0
    for tick in range(1, 81):
        now = tick * 0.5
        batch = []
        for k in range(50):  # ended 0.5-1.0 s ago, lasted 0.2 s
            serial += 1
            end = now - 0.5 - k / 100
            batch.append(call(service, "search", end - 0.2, end - 0.2, end, span_id=serial))
        service.run_to(now)
        assert service.timeline.add_calls(batch).accepted == 50
        assert service.timeline.held_calls() <= 400
    assert service.timeline.engine.horizon.dropped == 0
    # A burst of 1,000 calls not yet blamed (ending after the frontier) past
    # the store's 600: those that ended first are lost, and counted.
    held = service.timeline.held_calls()
    burst = [call(service, "search", 39.5, 39.5, 39.6 + k / 10_000, span_id=serial + 1 + k) for k in range(1000)]
    service.timeline.add_calls(burst)
    assert service.timeline.held_calls() == 600
    assert service.timeline.engine.horizon.dropped == held + 1000 - 600
