"""The blame engine of a GPU pool's blame service: tool calls from many
processes, GPU samples from this host, joined behind a watermark.

Usage (``agent_otel.commands.blame_service`` wires it to the OTLP receiver)::

    timeline = PoolTimeline(source, options, pool="vllm-a:8000", watermark_s=30.0, tracer=tracer, metrics=metrics)
    timeline.start()
    outcome = timeline.add_calls(calls)      # tool calls received over OTLP, any thread
    ...
    timeline.shutdown()

It is the live path's ``LiveTimeline`` (the same ``BlameEngine``, counters
and ``gpu.idle`` spans) with two differences:

- **Calls come from other processes**, as finished tool spans. Only calls
  of this service's pool are taken (``other_pool`` otherwise); a call seen
  twice (an exporter's retry) counts once; one that ends more than the
  watermark after this host's clock is refused (``clock_ahead``: a clock
  that far off cannot be placed on this GPU's timeline).
- **GPU time is blamed a watermark late.** A span arrives after its call
  has ended, plus the agent's export interval, plus the Collector's
  batching. So the GPU samples are held for ``watermark_s``
  (``WatermarkSource``) before the engine sees them: by then every call
  that was in flight during them, and ended within the watermark, has
  arrived. The utilization gauge still shows each sample as it comes.

A span whose call began before the blame had reached it (its submit is
earlier than the newest sample the engine has seen: the ``frontier``) is
**late**: the engine blames each stretch of GPU time once, with the calls
it knows then, so the part of a late call before the frontier goes
unblamed, and is never counted twice; the rest of it is blamed as usual.
Late spans are counted per tool (``agent_otel_late_spans_total``): a call
that lasts longer than the watermark minus its export delay is always
late. A check of "late" and the blame of a batch of samples never
interleave (one lock), so a call is either blamed in full or counted late.

Model-call spans of the pool (``add_calls(calls, models)``) are held the
same way, at most ``MAX_MODEL_CALLS``: while one is in flight, the GPU's
idle time is the model server's (docs/attribution.md), not the tools'. A
model span arrives once its call has ended, so the watermark must cover the
model calls too.

Memory is bounded whatever the order spans arrive in: held samples by the
watermark (and ``MAX_HELD_SAMPLES``), calls by the engine's horizon
(``max_calls``; more are dropped and counted: calls not yet blamed in
full), and a call is only kept if it ends between the frontier and the
watermark ahead of now, until the frontier passes its end (the engine's
``keep_from``): two watermarks' worth at most while spans arrive in time.
An idle window that lasts hours holds no more (the engine settles each
call's share as the frontier passes its end).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from agent_otel.attribution.live import LiveTimeline
from agent_otel.attribution.options import GpuOptions
from agent_otel.records import NS_PER_S, GpuSample, ModelCall, ToolCall

# Refusal reasons (the ``reason`` label of agent_otel_refused_spans_total).
OTHER_POOL = "other_pool"
CLOCK_AHEAD = "clock_ahead"
# Default watermark: the SDK's export interval (5 s) + the Collector's
# blame pipeline batching (collector/gateway.yaml: 1 s) + tool calls up to
# ~20 s blamed in full + margin for clock skew; docs/attribution.md.
DEFAULT_WATERMARK_S = 30.0
# Samples held at most (a GPU sampled every 1/6 s: 1200 GPU-minutes).
MAX_HELD_SAMPLES = 200_000
# Calls kept for attribution at most (~330 bytes each: ~66 MB).
MAX_CALLS = 200_000
# Model calls kept at most (~250 bytes each).
MAX_MODEL_CALLS = 50_000


class WatermarkSource:
    """A GPU source whose samples come out ``delay_s`` after their time.

    ``poll`` reads the wrapped source, hands the fresh samples to
    ``on_fresh`` (the real-time utilization gauge) and returns the held
    samples whose time is ``delay_s`` old. Otherwise it looks like the
    source it wraps (devices, errors, gaps). Not thread-safe: the sampler
    thread polls it.
    """

    def __init__(
        self,
        source,
        delay_s: float,
        *,
        on_fresh: Callable[[list[GpuSample]], None] = lambda s: None,
        clock: Callable[[], int] = time.time_ns,
    ):
        self.source = source
        self.kind = source.kind
        self.reports_gaps = getattr(source, "reports_gaps", False)
        self.delay_ns = round(delay_s * NS_PER_S)
        self.on_fresh = on_fresh
        self._clock = clock
        self._held: list[GpuSample] = []
        self.overflowed = 0  # samples released early to stay within MAX_HELD_SAMPLES
        server_samples = getattr(source, "server_samples", None)
        if server_samples is not None:  # a model server's readings pass through as they come
            self.server_samples = server_samples

    @property
    def errors(self) -> collections.Counter:
        return self.source.errors

    def states(self) -> dict[str, tuple[str, str]]:
        """The wrapped source's GPU states now (``GpuSampler.states``), not a watermark late."""
        states = getattr(self.source, "states", None)
        return states() if states is not None else {}

    @property
    def calling(self) -> Optional[str]:
        """The NVML call the wrapped source is in, if any (what a stuck poll is stuck in)."""
        return getattr(self.source, "calling", None)

    def devices(self):
        return self.source.devices()

    def poll(self) -> list[GpuSample]:
        fresh = self.source.poll()
        if fresh:
            self.on_fresh(fresh)
            self._held.extend(fresh)
        cutoff = self._clock() - self.delay_ns
        due = [sample for sample in self._held if sample.timestamp_ns <= cutoff]
        if due:
            self._held = [sample for sample in self._held if sample.timestamp_ns > cutoff]
        excess = len(self._held) - MAX_HELD_SAMPLES
        if excess > 0:  # a clock that jumped back: release the oldest rather than grow
            self._held.sort(key=lambda sample: sample.timestamp_ns)
            due += self._held[:excess]
            del self._held[:excess]
            self.overflowed += excess
        return due

    def release_all(self) -> list[GpuSample]:
        """Every sample still held (at shutdown)."""
        held, self._held = self._held, []
        return held

    def close(self) -> None:
        self.source.close()


@dataclass
class Intake:
    """What became of a batch of received calls."""

    accepted: int = 0
    duplicates: int = 0
    refused: collections.Counter = field(default_factory=collections.Counter)
    late: collections.Counter = field(default_factory=collections.Counter)  # tool -> late spans
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one message
    # The latest late call: (tool, seconds it lasted, seconds from its end to its arrival).
    late_example: Optional[tuple[str, float, float]] = None


class PoolTimeline(LiveTimeline):
    """The blame service's timeline; see the module docstring.

    ``metrics`` is the contract's ``exporters.prometheus.Metrics``: the GPU
    counters, gauge and spans are the live path's. What ``add_calls``
    returns (``Intake``) is for the caller to count (``BlameService``).
    """

    def __init__(
        self,
        source,
        options: Optional[GpuOptions] = None,
        *,
        pool: str,
        watermark_s: float = DEFAULT_WATERMARK_S,
        max_calls: int = MAX_CALLS,
        clock: Callable[[], int] = time.time_ns,
        **parts,
    ):
        if not pool:
            raise ValueError("a blame service needs the GPU pool it blames (agent.gpu.pool)")
        if not watermark_s >= 0:
            raise ValueError(f"watermark_s must be >= 0, got {watermark_s!r}")
        self.pool = pool
        self.watermark_ns = round(watermark_s * NS_PER_S)
        self._clock = clock
        self._lock = threading.Lock()
        self.frontier_ns = 0  # the newest sample time the engine has blamed up to
        self._seen: dict[tuple[int, int], int] = {}  # (trace id, span id) -> end, of the calls kept
        self._model_calls: collections.deque[ModelCall] = collections.deque(maxlen=MAX_MODEL_CALLS)
        self._model_seen: set[tuple[int, int]] = set()
        self._started_ns = clock()
        delayed = self.delayed = WatermarkSource(source, watermark_s, on_fresh=self.show_utilization_now, clock=clock)
        # The horizon must reach from the frontier (a watermark behind now)
        # to the newest end it may hold (a watermark ahead). The engine runs
        # the calls as its one unnamed pool: every call it holds is of this
        # service's pool, and so its GPU keys stay plain indexes, as
        # agent_gpu_utilization_ratio's (the pool is on target_info).
        options = options if options is not None else GpuOptions.default()
        horizon_s = max(options.horizon_s, 2 * watermark_s + 60.0)
        super().__init__(
            delayed,
            dataclasses.replace(options, horizon_s=horizon_s),
            max_calls=max_calls,
            price_pool=pool,
            **parts,
        )

    # -- calls, from the receiver's threads ------------------------------

    def add_calls(self, calls: Iterable[ToolCall], models: Iterable[ModelCall] = ()) -> Intake:
        """Take the received tool calls (and model calls) of this pool; see the module docstring."""
        intake = Intake()
        now = self._clock()
        kept: list[ToolCall] = []
        with self._lock:
            frontier = self.frontier_ns
            self._add_models(models, frontier, now)
            for call in calls:
                if call.pool != self.pool:
                    intake.refused[OTHER_POOL] += 1
                    intake.examples.setdefault(
                        OTHER_POOL,
                        f"tool span {call.tool!r} is of GPU pool {call.pool!r} "
                        f"(agent.gpu.pool), not this blame service's {self.pool!r}",
                    )
                    continue
                if call.end_ns > now + self.watermark_ns:
                    intake.refused[CLOCK_AHEAD] += 1
                    intake.examples.setdefault(
                        CLOCK_AHEAD,
                        f"tool span {call.tool!r} ends "
                        f"{(call.end_ns - now) / NS_PER_S:.1f} s after this host's clock: "
                        "check the sender's clock (NTP)",
                    )
                    continue
                key = (call.trace_id, call.span_id)
                if key in self._seen:
                    intake.duplicates += 1
                    continue
                intake.accepted += 1
                if call.submit_ns < frontier:
                    intake.late[call.tool] += 1
                    intake.late_example = (
                        call.tool,
                        (call.end_ns - call.submit_ns) / NS_PER_S,
                        max(0, now - call.end_ns) / NS_PER_S,
                    )
                if call.end_ns <= frontier:
                    continue  # wholly before the frontier: nothing of it can still be blamed
                call.pool = ""  # the engine's pool (see __init__)
                self._seen[key] = call.end_ns
                kept.append(call)
            if kept:
                self.engine.add_finished(kept)
                self._bound_seen()
        return intake

    def _add_models(self, models: Iterable[ModelCall], frontier: int, now: int) -> None:
        """The model calls of this pool that can still be blamed, each once (under the lock)."""
        for model in models:
            key = (model.trace_id, model.span_id)
            if model.pool != self.pool or model.end_ns <= frontier or model.end_ns > now + self.watermark_ns:
                continue
            if key in self._model_seen:
                continue
            if len(self._model_seen) >= 2 * MAX_MODEL_CALLS:
                self._model_seen = {(m.trace_id, m.span_id) for m in self._model_calls}
            self._model_seen.add(key)
            model.pool = ""  # the engine's pool (see __init__)
            self._model_calls.append(model)

    def _models(self) -> list[ModelCall]:
        """The model calls received that may overlap the samples the engine gets now (under the lock)."""
        if not self._model_calls:
            return []
        since = self.frontier_ns - self.engine.horizon.horizon_ns
        return [model for model in self._model_calls if model.end_ns > since]

    def lag_s(self) -> float:
        """Seconds between now and the frontier (since start, before the first blame)."""
        return (self._clock() - (self.frontier_ns or self._started_ns)) / NS_PER_S

    def held_calls(self) -> int:
        return len(self.engine.horizon)

    # -- samples, on the sampler thread ----------------------------------

    def show_utilization_now(self, samples) -> None:
        super().show_utilization(samples)

    def show_utilization(self, samples) -> None:
        """The samples the engine gets are a watermark old: the gauge was set when they came."""

    def on_samples(self, samples) -> None:
        with self._lock:
            super().on_samples(samples)
            newest = max(sample.timestamp_ns for sample in samples)
            if newest > self.frontier_ns:
                self.frontier_ns = newest
                self._forget_before(newest)

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """Stop sampling, blame the samples still held with the calls received
        so far, and close the windows still open; True if the sampler stopped
        within ``timeout_s``."""
        stopped = self.sampler.shutdown(timeout_s)
        held = self.delayed.release_all() if stopped else []
        if held:
            self.on_samples(held)
        with self._lock:
            self.apply(self.engine.flush(models=self._models()))
        self._count_source_errors()
        if self.log is not None:
            self.log.close()
        return stopped

    def _forget_before(self, frontier: int) -> None:
        """Dedup keys are needed only while their call can still be blamed."""
        horizon = frontier - self.engine.horizon.horizon_ns
        while self._model_calls and self._model_calls[0].end_ns <= horizon:
            old = self._model_calls.popleft()
            self._model_seen.discard((old.trace_id, old.span_id))
        if len(self._seen) > 2 * max(1, len(self.engine.horizon)) + 1024:
            self._seen = {key: end for key, end in self._seen.items() if end > frontier}

    def _bound_seen(self) -> None:
        """At most the keys of the calls held (a burst past ``max_calls`` dropped the others)."""
        if len(self._seen) > 2 * self.engine.horizon.max_calls + 1024:
            held = self.engine.horizon.overlapping(0, 1 << 63)
            self._seen = {(call.trace_id, call.span_id): call.end_ns for call in held}
