"""Live blame that holds while a stall lasts, and however long it lasts.

The real ``LiveTimeline`` (engine, Prometheus counters, ``gpu.idle`` spans)
over the real ``NvmlSource`` and a stand-in driver that runs dry while the
GPU idles, on a clock the test moves (``tests/helpers/nvml_driver.py``):
the ground truth is the script, to the nanosecond.
"""

from __future__ import annotations

import collections
import dataclasses
import sys

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py provides the real NVML error classes")

from opentelemetry import trace  # noqa: E402

from agent_otel.attribution import attribute  # noqa: E402
from agent_otel.attribution.live import LiveTimeline  # noqa: E402
from agent_otel.attribution.options import GpuOptions  # noqa: E402
from agent_otel.exporters.prometheus import Metrics  # noqa: E402
from agent_otel.gpu.nvml import NvmlSource  # noqa: E402
from agent_otel.wiring.pipeline import Pipeline  # noqa: E402
from agent_otel.records import NS_PER_S, IdleWindow, ToolCall  # noqa: E402
from tests.helpers.nvml_driver import DriverGpu, StandInNvml, VirtualClock  # noqa: E402

# The stand-in driver stamps its samples with the wall clock, as NVML does (see the fixture).
pytestmark = pytest.mark.usefixtures("wall_clock_on_the_timeline")

PERIOD_S = 1 / 6
POLL_NS = NS_PER_S // 2  # the default poll interval


class FakeRecorder:
    """The two tables of agent_otel's recorder the live timeline reads (and its deferred spans, none)."""

    def __init__(self):
        self.inflight: dict[int, ToolCall] = {}
        self.finished: collections.deque = collections.deque()
        self.spans: collections.deque = collections.deque()


class Agent:
    """A scripted agent and GPU on a virtual clock, with the live timeline polled every 0.5 s."""

    def __init__(self, monkeypatch, *, horizon_s=120.0, keeps_zeros=False, depth=120, **options):
        self.clock = VirtualClock()
        self.gpu = DriverGpu(self.clock, period_s=PERIOD_S, keeps_zeros=keeps_zeros, depth=depth)
        monkeypatch.setitem(sys.modules, "pynvml", StandInNvml([self.gpu]))
        self.metrics = Metrics()
        self.recorder = FakeRecorder()
        self.pipeline = Pipeline(self.recorder, None, self.metrics)
        self.timeline = LiveTimeline(
            NvmlSource(clock=self.clock),
            dataclasses.replace(GpuOptions.default(), horizon_s=horizon_s, **options),
            tracer=trace.get_tracer("test"),
            metrics=self.metrics,
            recorder=self.recorder,
            pipeline=self.pipeline,
        )
        self.origin = self.clock()
        self.next_poll = self.origin
        self.calls: list[ToolCall] = []
        self.starved = False

    def at(self, seconds: float) -> int:
        return self.origin + round(seconds * NS_PER_S)

    def run_until(self, seconds: float) -> None:
        """Move time on, polling every 0.5 s (unless the sampler is starved)."""
        until = self.at(seconds)
        while self.next_poll <= until:
            self.clock.advance_to(self.next_poll)
            if not self.starved:
                self.timeline.on_samples(self.timeline.source.poll())
            self.next_poll += POLL_NS
        self.clock.advance_to(until)

    def start(self, tool: str) -> ToolCall:
        call = ToolCall(
            tool, "direct", self.clock(), self.clock(), trace_id=len(self.calls) + 1, span_id=len(self.calls) + 1
        )
        self.calls.append(call)
        self.recorder.inflight[id(call)] = call
        return call

    def end(self, call: ToolCall) -> None:
        call.end_ns = self.clock()
        self.recorder.finished.append(call)
        del self.recorder.inflight[id(call)]

    def counter(self, name: str, **labels) -> float:
        return self.metrics.registry.get_sample_value(name, {"gpu": "0", **labels}) or 0.0


def test_a_stall_still_going_on_shows_on_the_counters_split_by_the_tools_in_flight(monkeypatch, spans):
    agent = Agent(monkeypatch)
    agent.run_until(1.0)  # the model generates
    stall = agent.clock()
    agent.gpu.set(0.0)
    hung = agent.start("hung_tool")  # 1 s on; it hangs until 8 s
    readings = []

    def read():
        blamed = agent.counter("agent_gpu_idle_blocked_seconds_total", tool="hung_tool", phase="exec")
        readings.append((agent.clock(), blamed, agent.counter("agent_gpu_idle_seconds_total")))
        # Blamed up to one sample period before now (the latest moment the
        # silence proves idle), from a start within one period of the truth.
        [(start, blamed_to)] = agent.timeline.engine.open_windows().values()
        assert abs(start - stall) <= PERIOD_S * NS_PER_S
        assert agent.clock() - blamed_to == pytest.approx(PERIOD_S * NS_PER_S, abs=2_000)
        assert readings[-1][2] == pytest.approx((blamed_to - start) / NS_PER_S, abs=1e-9)

    agent.run_until(3.0)
    read()
    helper = agent.start("lookup")  # 3 s on, in flight with hung_tool until 8 s
    agent.run_until(6.0)
    read()
    agent.run_until(8.0)
    read()
    assert not [s for s in spans.all() if s.name == "gpu.idle"]  # the window has not closed

    # The counters move while the stall lasts, behind the newest poll by no
    # more than one sample period (the silence proves idle up to then).
    for now, _hung_s, idle_s in readings:
        assert (now - stall) / NS_PER_S - 2 * PERIOD_S <= idle_s <= (now - stall) / NS_PER_S
    assert readings[0][1] < readings[1][1] < readings[2][1]
    # Split by the tools in flight at each instant: hung_tool alone, then
    # with lookup from 3 s on, each at half rate.
    first_now, first_hung, first_idle = readings[0]
    assert first_hung == pytest.approx(first_idle, abs=1e-9)
    lookup = agent.counter("agent_gpu_idle_blocked_seconds_total", tool="lookup", phase="exec")
    _, last_hung, last_idle = readings[2]
    assert lookup + last_hung == pytest.approx(last_idle, abs=1e-9)  # nothing unattributed
    # lookup's half of 3 s to the newest evidence (8 s less one period).
    assert lookup == pytest.approx((8.0 - PERIOD_S - 3.0) / 2, abs=1e-3)

    agent.end(helper)
    agent.end(hung)
    agent.gpu.set(1.0)
    agent.run_until(10.0)
    agent.timeline.shutdown()

    # The window's spans carry exactly what the counters accrued.
    [window] = [s for s in spans.all() if s.name == "gpu.idle" and s.parent is None]
    children = [s for s in spans.all() if s.name == "gpu.idle" and s.parent is not None]
    idle_total = agent.counter("agent_gpu_idle_seconds_total")
    assert window.attributes["gpu.idle.duration"] == pytest.approx(idle_total, abs=1e-9)
    assert window.attributes["gpu.idle.unattributed_duration"] == pytest.approx(
        agent.counter("agent_gpu_idle_unattributed_seconds_total"), abs=1e-9
    )
    by_tool = {}
    for child in children:
        by_tool[agent.calls[child.parent.span_id - 1].tool] = child.attributes["gpu.idle.blocked_duration"]
    assert by_tool == {
        "hung_tool": pytest.approx(
            agent.counter("agent_gpu_idle_blocked_seconds_total", tool="hung_tool", phase="exec"), abs=1e-9
        ),
        "lookup": pytest.approx(
            agent.counter("agent_gpu_idle_blocked_seconds_total", tool="lookup", phase="exec"), abs=1e-9
        ),
    }
    assert window.attributes["gpu.idle.blocked_by"] == "hung_tool"
    # And the whole stall, now that it is over, is within a sample period of the truth (1-8 s).
    assert (window.start_time - stall) / NS_PER_S == pytest.approx(0.0, abs=PERIOD_S)
    assert idle_total == pytest.approx(7.0, abs=PERIOD_S)


def offline(agent: Agent, start_ns: int, end_ns: int) -> dict[str, float]:
    """The same window attributed offline, against every call of the run."""
    [full] = attribute([IdleWindow("0", start_ns, end_ns, 0.0)], agent.calls)
    totals: dict[str, float] = {}
    for share in full.shares:
        totals[share.call.tool] = totals.get(share.call.tool, 0.0) + share.blocked_s
    return totals


@pytest.mark.parametrize("starved", [False, True], ids=["polled", "one-batch"])
def test_a_window_longer_than_the_horizon_is_blamed_like_a_short_one(monkeypatch, spans, starved):
    # Horizon 1 s; the GPU idles 6 s. "crawl" runs the first 2 s of it and
    # ends; "ping" calls finish every 0.4 s, which moves the horizon on;
    # "summarize" runs the last 3 s. With starved=True no sample arrives
    # during the stall: the whole window comes in one batch afterwards.
    agent = Agent(monkeypatch, horizon_s=1.0)
    agent.run_until(1.0)
    agent.gpu.set(0.0)
    agent.starved = starved
    crawl = agent.start("crawl")
    t = 1.0
    summarize = None
    while t < 7.0 - 1e-9:
        ping = agent.start("ping")
        agent.run_until(t + 0.05)
        agent.end(ping)
        if crawl.end_ns == 0 and t >= 3.0 - 1e-9:
            agent.end(crawl)
        if summarize is None and t >= 4.0 - 1e-9:
            summarize = agent.start("summarize")
        t += 0.4
        agent.run_until(t)
    agent.run_until(7.0)
    agent.end(summarize)
    agent.gpu.set(1.0)
    agent.starved = False
    agent.run_until(8.0)
    agent.timeline.pipeline.drain()
    agent.timeline.shutdown()

    assert agent.timeline.engine.horizon.dropped == 0
    [window] = [s for s in spans.all() if s.name == "gpu.idle" and s.parent is None]
    assert window.attributes["gpu.idle.duration"] == pytest.approx(6.0, abs=PERIOD_S)
    live = {
        tool: agent.counter("agent_gpu_idle_blocked_seconds_total", tool=tool, phase="exec")
        for tool in ("crawl", "ping", "summarize")
    }
    expected = offline(agent, window.start_time, window.end_time)
    assert live == {tool: pytest.approx(seconds, abs=1e-6) for tool, seconds in expected.items()}
    assert live["crawl"] > 0.9  # the part the old horizon lost once crawl ended more than 1 s before


def test_the_engine_of_a_gpu_pool_blames_only_that_pools_calls():
    from agent_otel.attribution.engine import BlameEngine
    from agent_otel.records import GpuSample

    t0 = 1_700_000_000 * NS_PER_S
    engine = BlameEngine(max_gap_s=None, pool="vllm-a")
    ours = ToolCall("search", "direct", t0, t0, pool="vllm-a")
    theirs = ToolCall("search_b", "direct", t0, t0, pool="vllm-b")
    samples = [GpuSample("0", t0 + i * NS_PER_S // 10, 0.0 if i else 1.0) for i in range(11)]

    update = engine.feed(samples, [ours, theirs])

    assert update.idle.blocked_s == {("vllm-a/0", "search", "exec"): pytest.approx(1.0)}
    assert update.underused.blocked_s == {("vllm-a/0", "search", "exec"): pytest.approx(1.0)}
    assert engine.open_windows() == {"0": (t0, t0 + NS_PER_S)}


# -- small shares: in the window's totals, not in links or child spans ------


def spray(agent: Agent, calls: int, every_s: float, lasting_s: float) -> None:
    """``calls`` calls of "spray", one every ``every_s``, each ``lasting_s`` long (virtual time)."""
    at = (agent.clock() - agent.origin) / NS_PER_S
    for _ in range(calls):
        call = agent.start("spray")
        agent.run_until(at + lasting_s)
        agent.end(call)
        at += every_s
        agent.run_until(at)


def idle_spans(spans):
    idle = [s for s in spans.all() if s.name == "gpu.idle"]
    [window] = [s for s in idle if s.parent is None]
    return window, [s for s in idle if s.parent is not None]


def window_totals(window) -> dict[tuple[str, str], float]:
    tools = window.attributes["gpu.idle.blocked_tools"]
    phases = window.attributes["gpu.idle.blocked_phases"]
    durations = window.attributes["gpu.idle.blocked_durations"]
    assert len(tools) == len(phases) == len(durations)
    assert list(durations) == sorted(durations, reverse=True)  # largest first
    return {(tool, phase): seconds for tool, phase, seconds in zip(tools, phases, durations)}


def stall_with_a_spray(agent: Agent, calls: int = 400) -> ToolCall:
    """A 3 s stall: "slow" runs 2.2 s of it alone; "spray" makes ``calls``
    calls of 1 ms, one every 2 ms, in the rest. Returns slow's call."""
    agent.run_until(1.0)
    agent.gpu.set(0.0)
    slow = agent.start("slow")
    agent.run_until(3.2)
    agent.end(slow)
    spray(agent, calls, every_s=0.002, lasting_s=0.001)
    agent.run_until(4.0)
    agent.gpu.set(1.0)
    agent.run_until(5.0)
    agent.timeline.shutdown()
    return slow


@pytest.mark.parametrize("children", [True, False], ids=["children", "no-children"])
def test_small_shares_are_in_the_window_totals_and_only_large_ones_get_links_and_children(monkeypatch, spans, children):
    agent = Agent(monkeypatch, children=children)  # gpu_idle_share_min: 0.05 s by default
    slow = stall_with_a_spray(agent)
    window, child_spans = idle_spans(spans)

    # Every share, however small, is in the totals: exactly what the counters got.
    counted = {
        (tool, phase): agent.counter("agent_gpu_idle_blocked_seconds_total", tool=tool, phase=phase)
        for tool in ("slow", "spray")
        for phase in ("queue", "exec")
    }
    counted = {key: seconds for key, seconds in counted.items() if seconds > 0.0}
    assert set(counted) == {("slow", "exec"), ("spray", "exec")}
    assert counted[("spray", "exec")] == pytest.approx(0.4, abs=0.01)  # 400 calls of 1 ms
    assert window_totals(window) == {key: pytest.approx(seconds, abs=1e-9) for key, seconds in counted.items()}
    assert sum(counted.values()) + window.attributes["gpu.idle.unattributed_duration"] == pytest.approx(
        window.attributes["gpu.idle.duration"], abs=1e-9
    )
    # Only slow's share (2.2 s) reaches 0.05 s: one link, and one child if children are on.
    assert [link.context.span_id for link in window.links] == [slow.span_id]
    assert window.links[0].attributes["gpu.idle.blocked_duration"] == pytest.approx(counted[("slow", "exec")], abs=1e-9)
    if children:
        [child] = child_spans
        assert child.parent.span_id == slow.span_id
        assert child.attributes["gpu.idle.blocked_duration"] == pytest.approx(counted[("slow", "exec")], abs=1e-9)
    else:
        assert child_spans == []


def test_every_share_gets_a_child_with_share_min_0_and_the_links_keep_the_largest_within_the_limit(monkeypatch, spans):
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "5")  # read when the timeline starts
    agent = Agent(monkeypatch, share_min_s=0.0)
    slow = stall_with_a_spray(agent, calls=100)
    window, child_spans = idle_spans(spans)

    assert len(child_spans) == 101  # every call: slow and 100 spray calls
    share_of = {child.parent.span_id: child.attributes["gpu.idle.blocked_duration"] for child in child_spans}
    largest = sorted(share_of, key=share_of.get)[-5:]
    assert [link.context.span_id for link in window.links] == largest  # ascending: the largest last
    assert largest[-1] == slow.span_id
    # Links and children are for finding calls; the totals hold every share.
    spray_total = sum(seconds for span_id, seconds in share_of.items() if span_id != slow.span_id)
    assert window_totals(window)[("spray", "exec")] == pytest.approx(spray_total, abs=1e-9)
    assert spray_total == pytest.approx(
        agent.counter("agent_gpu_idle_blocked_seconds_total", tool="spray", phase="exec"), abs=1e-9
    )


def test_an_idle_stretch_is_counted_once_it_lasts_the_minimum_and_each_stretch_is_attributed_once(monkeypatch):
    from agent_otel.attribution import engine as engine_module
    from agent_otel.attribution.engine import BlameEngine
    from agent_otel.records import GpuSample

    seen: list[int] = []  # the calls each attribute() was given, per batch
    original = engine_module.attribute

    def counting(intervals, calls, blocks=(), **options):
        calls = list(calls)
        seen.append(len(calls))
        return original(intervals, calls, blocks, **options)

    monkeypatch.setattr(engine_module, "attribute", counting)
    t0 = 1_700_000_000 * NS_PER_S
    step = NS_PER_S // 10
    engine = BlameEngine(dataclasses.replace(GpuOptions.default(), min_idle_s=0.5), max_gap_s=None)
    # One call per 0.1 s stretch, each within it; the GPU idles 0.1-0.4 s
    # (too short), is busy, then idles 0.5-1.3 s (a window from 1.0 s on).
    calls = [ToolCall("t", "direct", t0 + i * step + 1, t0 + i * step + 1, t0 + i * step + 2) for i in range(16)]
    engine.add_finished(calls)
    busy = {0, 4, 5, 14, 15}
    samples = [GpuSample("0", t0 + i * step, 1.0 if i in busy else 0.0) for i in range(16)]
    blamed, settled = [], []
    for batch in (samples[:8], samples[8:10], samples[10:12], samples[12:]):
        update = engine.feed(batch)
        blamed.append(sum(update.idle.blocked_s.values()))
        settled.append(len(update.settled))
    # The short stretch is never counted; the window is counted once it lasts
    # 0.5 s (what it accrued before at once), then as it comes.
    per_call = 1e-9  # each call in flight 1 ns, alone
    assert blamed[:2] == [0.0, 0.0]  # 0.5-0.7 s, then 0.5-0.9 s: under the minimum
    assert blamed[2] == pytest.approx(6 * per_call)  # 0.5-1.1 s: six stretches, counted now
    assert blamed[3] == pytest.approx(2 * per_call)  # 1.1-1.3 s, and the window closes
    [closed] = update.closed
    assert closed.idle_s == pytest.approx(0.8)
    # Each call's share was handed out once, when final: none of the too-short stretch.
    assert settled == [0, 0, 6, 2]
    assert sum(share.blocked_s for share in closed.attribution.shares) == 0.0  # no call has a span to link
    assert closed.linkable == 0
    # Each batch looked at the calls of its own stretches only (not at the
    # window's earlier ones again, nor at those of a fully used GPU).
    assert seen == [7, 2, 2, 2]


def test_a_scrape_sees_the_gpu_time_counters_of_an_update_all_or_none():
    # The live timeline updates the idle seconds and their blame together,
    # holding Metrics.lock; a scrape collects them in one hold of it. Here a
    # writer holds the lock between the two increments of each update, as
    # long as it likes: a scrape in between must still see them add up.
    import threading
    import time

    from prometheus_client.openmetrics.parser import text_string_to_metric_families
    from prometheus_client.openmetrics.exposition import generate_latest

    metrics = Metrics()
    # Only these counters' collectors (the tool-call metrics' take the lock too, and
    # would make the scrape wait for the writer whatever the GPU counters do).
    registry = metrics.registry.restricted_registry(
        ["agent_gpu_idle_seconds_total", "agent_gpu_idle_blocked_seconds_total"]
    )
    half = threading.Event()  # the writer is between the two increments, holding the lock
    scraped = threading.Event()

    def write():
        for _ in range(20):
            with metrics.lock:
                metrics.gpu_idle.labels("0").inc(1.0)
                half.set()
                time.sleep(0.02)  # a scrape that starts meanwhile must wait for the rest of the update
                metrics.gpu_idle_blocked.labels("0", "search", "exec").inc(1.0)
            assert scraped.wait(10)
            scraped.clear()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    for update in range(20):  # one scrape in the middle of each update
        assert half.wait(10)
        half.clear()
        values = {
            sample.name: sample.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples
            if sample.name in ("agent_gpu_idle_seconds_total", "agent_gpu_idle_blocked_seconds_total")
        }
        assert values["agent_gpu_idle_seconds_total"] == values["agent_gpu_idle_blocked_seconds_total"] == update + 1
        scraped.set()
    writer.join(10)


def test_a_long_window_sends_each_child_span_as_its_call_is_done_and_links_only_the_largest(monkeypatch, spans):
    # The link limit at 3: twelve calls of 0.3-1.4 s, one after another, on a
    # GPU idle throughout. Each call's child span leaves a poll or two after
    # the call ends, while the window is still open; the window span links
    # the three largest and counts the nine it left out.
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "3")
    agent = Agent(monkeypatch)
    agent.run_until(1.0)
    agent.gpu.set(0.0)
    lengths = [0.3 + 0.1 * ((5 * i) % 12) for i in range(12)]
    children_seen = []
    at = 1.0
    for length in lengths:
        call = agent.start("step")
        agent.run_until(at + length)
        agent.end(call)
        at += length
        agent.run_until(at + 0.01)
        children_seen.append(len([s for s in spans.all() if s.name == "gpu.idle" and s.parent is not None]))
    agent.run_until(at + 1.0)
    assert not [s for s in spans.all() if s.name == "gpu.idle" and s.parent is None]  # the window is still open
    # Every call but the last few, whose end the blame has not reached yet, has its child already.
    assert len([s for s in spans.all() if s.name == "gpu.idle" and s.parent is not None]) == 12
    assert children_seen[-1] >= 10 and children_seen == sorted(children_seen)
    agent.gpu.set(1.0)
    agent.run_until(at + 2.0)
    agent.timeline.shutdown()

    window, children = idle_spans(spans)
    assert len(children) == 12  # one each, none again at the close
    by_span = {child.parent.span_id: child.attributes["gpu.idle.blocked_duration"] for child in children}
    largest = sorted(by_span, key=by_span.get)[-3:]
    assert [link.context.span_id for link in window.links] == largest  # smallest of the three first
    assert window.attributes["gpu.idle.unlinked_calls"] == 9
    assert sum(by_span.values()) == pytest.approx(window_totals(window)[("step", "exec")], abs=1e-9)
