"""The GPU timeline while the agent runs.

GPU samples arrive on the sampler thread and go, with the tool calls in
flight and the finished ones, into a ``BlameEngine``
(``agent_otel.attribution.engine``): the same ``attribute()`` the offline
report uses, applied as the samples come. What it returns leaves here: the
increments go to the GPU counters of the contract at once (so a stall shows
on them while it lasts); each call's share of an idle window leaves as a
child ``gpu.idle`` span under the call's span once it is final (the call
has ended and the blame has passed its end), and each idle window that
closes leaves as a ``gpu.idle`` span carrying the totals the counters
received for it, linked to its largest shares. So nothing here grows with
the calls of a window that lasts hours.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from agent_otel.support import forks
from agent_otel.attribution.engine import (
    DEFAULT_MAX_LINKS,
    MAX_HORIZON_CALLS,
    BlameEngine,
    BlameUpdate,
    ClosedWindow,
    SettledShare,
)
from agent_otel.attribution.options import GpuOptions
from agent_otel.attribution.rule import largest_share
from agent_otel.capture.models import model_calls, peer_model_spans
from agent_otel.gpu.logs import GpuLogWriter
from agent_otel.support.clock import now_ns
from agent_otel.config import check
from agent_otel.gpu.device import GpuSource
from agent_otel.gpu.sampler import GpuSampler
from agent_otel.gpu.timeline import DEFAULT_MAX_GAP_S, is_missing
from agent_otel.records import NS_PER_S, LoopBlock, ModelCall, ServerSample, ToolCall
from agent_otel.semconv import (
    AGENT_GPU_SOURCE,
    AGENT_MODEL_SERVER_KV_CACHE_USAGE,
    AGENT_MODEL_SERVER_RUNNING_MAX,
    AGENT_MODEL_SERVER_WAITING_MAX,
    GPU_IDLE_MODEL_DURATION,
    GPU_IDLE_MODEL_DURATIONS,
    GPU_IDLE_MODEL_PHASES,
    GPU_IDLE_MODELS,
    AGENT_TOOL_PHASE,
    GPU_IDLE_BLOCKED_BY,
    GPU_IDLE_BLOCKED_DURATION,
    GPU_IDLE_BLOCKED_DURATIONS,
    GPU_IDLE_BLOCKED_PHASES,
    GPU_IDLE_BLOCKED_TOOLS,
    GPU_IDLE_DURATION,
    GPU_IDLE_UNATTRIBUTED_DURATION,
    GPU_IDLE_UNLINKED_CALLS,
    GPU_INDEX,
    GPU_SOURCE_SIMULATED,
    GPU_UTILIZATION_AVG,
    GPU_UUID,
    SPAN_GPU_IDLE,
)
from agent_otel.support.problems import Problems
from agent_otel.support.text import NAME_LIMIT, valid_text

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge

    from agent_otel.gpu.server import ServerTimeline

logger = logging.getLogger("agent_otel.gpu")

# The SDK's default link limit per span (OTEL_SPAN_LINK_COUNT_LIMIT).
DEFAULT_LINK_LIMIT = DEFAULT_MAX_LINKS
# Over this share of the time model calls were in flight read idle, the GPU
# data contradicts the model calls (logged once per GPU; the gauge shows it).
MODEL_IDLE_WARN_RATIO = 0.2
# ... once model calls were in flight this long on that GPU (a first call's
# edge, a sample period, is no contradiction).
MODEL_IDLE_WARN_AFTER_S = 2.0

__all__ = [
    "MAX_HORIZON_CALLS",
    "CallsInFlight",
    "FinishedCalls",
    "GpuMetrics",
    "LiveTimeline",
]


class CallsInFlight(Protocol):
    """The tool calls in flight, by id (``agent_otel.capture.recorder.Recorder.inflight``)."""

    @property
    def inflight(self) -> dict[int, ToolCall]: ...


class FinishedCalls(Protocol):
    """Where finished tool calls come from (``agent_otel.wiring.pipeline.Pipeline``): each batch
    is handed to every consumer; ``drain()`` hands over what is pending now."""

    @property
    def consumers(self) -> list[Callable[[list[ToolCall]], None]]: ...

    def drain(self) -> None: ...


class GpuMetrics(Protocol):
    """The GPU metrics of the contract the timeline counts into
    (``agent_otel.exporters.prometheus.Metrics`` has them), and their label caps."""

    @property
    def lock(self) -> ContextManager[Any]: ...  # held while the counters below are updated together
    @property
    def gpu_utilization(self) -> Gauge: ...
    @property
    def gpu_idle(self) -> Counter: ...
    @property
    def gpu_idle_unattributed(self) -> Counter: ...
    @property
    def gpu_idle_blocked(self) -> Counter: ...
    @property
    def gpu_underused(self) -> Counter: ...
    @property
    def gpu_underused_unattributed(self) -> Counter: ...
    @property
    def gpu_underused_blocked(self) -> Counter: ...
    @property
    def gpu_idle_model(self) -> Counter: ...
    @property
    def gpu_underused_model(self) -> Counter: ...
    @property
    def gpu_model_idle_ratio(self) -> Gauge: ...
    @property
    def model_label(self) -> Callable[[str], str]: ...
    @property
    def gpu_missing(self) -> Counter: ...
    @property
    def gpu_errors(self) -> Counter: ...
    @property
    def gpu_hour_price(self) -> Gauge: ...
    @property
    def server_running(self) -> Gauge: ...
    @property
    def server_waiting(self) -> Gauge: ...
    @property
    def server_kv_cache(self) -> Gauge: ...
    @property
    def gpu_idle_kv_cache_held(self) -> Counter: ...
    @property
    def tool_label(self) -> Callable[[str], str]: ...
    @property
    def gpu_label(self) -> Callable[[str], str]: ...
    @property
    def reason_label(self) -> Callable[[str], str]: ...


class LiveTimeline:
    """Samples -> blame -> spans and metrics, in process.

    ``options``: the GPU settings (``GpuOptions``; their defaults without).
    ``attribution.wiring.gpu_timeline`` builds it from the settings.
    """

    part_name = "GPU sampling"

    def __init__(
        self,
        source: GpuSource,
        options: Optional[GpuOptions] = None,
        *,
        tracer: trace_api.Tracer,
        metrics: GpuMetrics,
        recorder: Optional[CallsInFlight] = None,
        pipeline: Optional[FinishedCalls] = None,
        log_path: Optional[str] = None,
        log_max_bytes: Optional[int] = None,
        loop_blocks: Optional[Callable[[int, int], list[LoopBlock]]] = None,
        max_calls: int = MAX_HORIZON_CALLS,
        price_pool: str = "",
    ):
        options = self.options = options if options is not None else GpuOptions.default()
        # First: a log that cannot be written (ConfigError) leaves nothing behind.
        self.log = GpuLogWriter(log_path, source.devices(), log_max_bytes) if log_path else None
        self.source = source
        # A share of a window this long or longer gets a link and (with
        # ``children``) a child span; every share is in the window's totals.
        self.share_min = check("gpu_idle_share_min", options.share_min_s, "share_min_s")
        self.children = options.children
        self.max_links = link_limit()
        # (start_ns, end_ns) -> the event-loop blocks overlapping it (the loop monitor's)
        self.loop_blocks = loop_blocks
        self.horizon_s = options.horizon_s
        self.tracer = tracer
        self.metrics = metrics
        self.recorder = recorder
        self.pipeline = pipeline
        uuids = {device.index: device.uuid for device in source.devices() if device.uuid}
        # A source that vouches for its gaps (NVML: idle where its buffer ran
        # dry, marked where data was lost) needs no gap limit; for the others
        # a poll interval above a second spaces samples out: widen the limit
        # with it, or sparse samples read as missing data.
        max_gap_s = (
            None if getattr(source, "reports_gaps", False) else max(DEFAULT_MAX_GAP_S, 3 * options.poll_interval_s)
        )
        self.engine = BlameEngine(
            options,
            max_gap_s=max_gap_s,
            uuids=uuids,
            max_calls=max_calls,
            share_min_s=self.share_min,
            max_links=self.max_links,
        )
        self._problems = Problems(logger)
        self._reported_errors: dict[str, int] = {}
        self._errors_lock = threading.Lock()  # the sampler's thread, and shutdown's
        # A model server's readings (agent_otel.gpu.server), where the source
        # reads one: its queue and KV cache on the timeline, for the rules
        # and the gpu.idle spans (``server.load(start_ns, end_ns)``).
        self._server_samples: Optional[Callable[[], list[ServerSample]]] = getattr(source, "server_samples", None)
        self.server: Optional[ServerTimeline] = None
        if self._server_samples is not None:
            from agent_otel.gpu.server import ServerTimeline  # here: loaded only where a server is read

            self.server = ServerTimeline()
        if options.prices is not None:  # what an hour of each GPU costs, for the cost panels (docs/report.md)
            for device in source.devices():
                price = options.prices.price(price_pool, device.name)
                if price is not None:
                    metrics.gpu_hour_price.labels(metrics.gpu_label(device.index)).set(price)
        if pipeline is not None:
            pipeline.consumers.append(self.engine.add_finished)
            pipeline.consumers.append(self._check_stuck)  # a stuck sampler is said while it lasts
        # per GPU: seconds model calls were in flight, and of those the GPU read idle
        self._model_in_flight_s: dict[str, float] = {}
        self._model_idle_s: dict[str, float] = {}
        self._warned: set[str] = set()  # GPUs whose contradiction was logged
        # A simulated GPU follows the model calls of the process (docs/gpu.md).
        self._follows = getattr(source, "model_call", None) if source.kind == GPU_SOURCE_SIMULATED else None
        if self._follows is not None:
            model_calls.follow(self._follows)
            peer_model_spans.enabled = True  # where wiring added it (watch_peers): peers' model spans too
        # Before the sampler's own hook: in a child, the log is gone before sampling restarts.
        forks.after_fork_in_child(self.reinit_after_fork)
        # The source's errors are counted after every poll, with samples or
        # without (a lost GPU gives none): they show on /metrics at once.
        self.sampler = GpuSampler(source, options.poll_interval_s, self.on_samples, self._count_source_errors)

    def start(self) -> None:
        self.sampler.start()

    def reinit_after_fork(self) -> None:
        """In a forked child: the parent keeps writing the GPU log (the same samples);
        the child samples and blames its own tool calls (the sampler restarts itself)."""
        log, self.log = self.log, None
        if log is not None:
            log.close()  # the child's copy of the file only
        self._errors_lock = threading.Lock()

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """Stop sampling, close the open windows; True if the sampler stopped within ``timeout_s``."""
        stopped = self.sampler.shutdown(timeout_s)
        if self._follows is not None:
            model_calls.unfollow(self._follows)
            peer_model_spans.enabled = False
        # Close the windows still open: the stall at the end of a run counts too.
        self.apply(self.engine.flush(self._in_flight(), self._blocks(), self._models()))
        self._count_source_errors()
        if self.log is not None:
            self.log.close()
        return stopped

    @property
    def running(self) -> bool:
        return self.sampler.running

    def on_samples(self, samples) -> None:
        self.show_utilization(samples)
        self.take_server_samples()
        if self.log is not None:
            try:
                self.log.write(samples)
            except OSError as exc:
                self._problems.report(
                    ("gpu log", exc.errno),
                    "agent-otel: could not write GPU samples to %s (%s); they are missing from the GPU log",
                    self.log.path,
                    exc.strerror or exc,
                )
        self.apply(self.engine.feed(samples, self._in_flight(), self._blocks(), self._models()))

    def gpu_states(self) -> list[tuple[str, str, str]]:
        """``(gpu, state, reason)`` of each sampled GPU now (``GpuSampler.states``): the
        ``agent_otel_gpu_state`` gauge reads it at each scrape (``exporters.prometheus.LiveReadings``)."""
        self.sampler.check_stuck()
        return [(gpu, state, reason) for gpu, (state, reason) in sorted(self.sampler.states().items())]

    def _check_stuck(self, calls: list[ToolCall]) -> None:
        self.sampler.check_stuck()

    def show_utilization(self, samples) -> None:
        """Set the utilization gauge from the latest sample of each GPU."""
        latest = {}
        for sample in samples:
            if not is_missing(sample.utilization):
                latest[sample.gpu] = sample.utilization
        for gpu, utilization in latest.items():
            self.metrics.gpu_utilization.labels(self.metrics.gpu_label(gpu)).set(utilization)

    def take_server_samples(self) -> None:
        """Move the model server's new readings onto the timeline, and its latest into the gauges."""
        if self._server_samples is None or self.server is None:
            return
        readings = self._server_samples()
        if not readings:
            return
        self.server.add(readings)
        latest = readings[-1]
        server = self.metrics.gpu_label(latest.server)
        self.metrics.server_running.labels(server).set(latest.running)
        self.metrics.server_waiting.labels(server).set(latest.waiting)
        if latest.kv_cache_usage is not None:
            self.metrics.server_kv_cache.labels(server).set(latest.kv_cache_usage)

    def apply(self, update: BlameUpdate) -> None:
        """Counters first, then the child spans of the shares now final, then the spans of the windows that closed."""
        self._count(update)
        if self.children and update.settled:
            self._emit_children(update.settled)
        for closed in update.closed:
            self._emit_window(closed)

    def _blocks(self) -> list[LoopBlock]:
        """The event-loop blocks (the loop monitor's) of the stretch a batch
        of samples can blame: the attribution horizon up to now, and a block
        still going on."""
        if self.loop_blocks is None:
            return []
        now = now_ns()
        return self.loop_blocks(now - round(self.horizon_s * NS_PER_S), now + NS_PER_S)

    def _models(self) -> list[ModelCall]:
        """The model calls of this process that a batch of samples can blame
        (in flight, and finished within the attribution horizon)."""
        if self.recorder is None:
            return []
        return model_calls.overlapping(now_ns() - round(self.horizon_s * NS_PER_S))

    def _in_flight(self) -> list[ToolCall]:
        """The calls in flight, read before the finished ones are drained
        into the engine: a call finishing meanwhile is then in one or both
        (the recorder appends a finished call before it leaves the table)."""
        if self.recorder is None:
            return []
        running = list(self.recorder.inflight.values())
        if self.pipeline is not None:
            self.pipeline.drain()
        return running

    def _count(self, update: BlameUpdate) -> None:
        with self.metrics.lock:  # a scrape sees the update whole (exporters.prometheus._Locked)
            self._count_locked(update)

    def _count_locked(self, update: BlameUpdate) -> None:
        metrics, label, gpu_label = self.metrics, self.metrics.tool_label, self.metrics.gpu_label
        idle, underused = update.idle, update.underused
        for gpu, seconds in idle.idle_s.items():
            metrics.gpu_idle.labels(gpu_label(gpu)).inc(seconds)
        for gpu, seconds in idle.unattributed_s.items():
            metrics.gpu_idle_unattributed.labels(gpu_label(gpu)).inc(seconds)
        for (gpu, tool, phase), seconds in idle.blocked_s.items():
            metrics.gpu_idle_blocked.labels(gpu_label(gpu), label(tool), phase).inc(seconds)
        for gpu, seconds in underused.underused_s.items():
            metrics.gpu_underused.labels(gpu_label(gpu)).inc(seconds)
        for gpu, seconds in underused.unattributed_s.items():
            metrics.gpu_underused_unattributed.labels(gpu_label(gpu)).inc(seconds)
        for (gpu, tool, phase), seconds in underused.blocked_s.items():
            metrics.gpu_underused_blocked.labels(gpu_label(gpu), label(tool), phase).inc(seconds)
        for gpu, seconds in update.missing_s.items():
            metrics.gpu_missing.labels(gpu_label(gpu)).inc(seconds)
        if idle.model_s or underused.model_s or update.model_in_flight_s:
            self._count_models(update)

    def _count_models(self, update: BlameUpdate) -> None:
        """The model server's share, and the share of the model calls' time the GPU read idle."""
        metrics, label, gpu_label = self.metrics, self.metrics.model_label, self.metrics.gpu_label
        for (gpu, model, phase), seconds in update.idle.model_s.items():
            metrics.gpu_idle_model.labels(gpu_label(gpu), label(model), phase).inc(seconds)
        for (gpu, model, phase), seconds in update.underused.model_s.items():
            metrics.gpu_underused_model.labels(gpu_label(gpu), label(model), phase).inc(seconds)
        for gpu, seconds in update.model_in_flight_s.items():
            in_flight = self._model_in_flight_s[gpu] = self._model_in_flight_s.get(gpu, 0.0) + seconds
            idle = self._model_idle_s[gpu] = self._model_idle_s.get(gpu, 0.0) + update.model_idle_s.get(gpu, 0.0)
            ratio = idle / in_flight if in_flight > 0 else 0.0
            metrics.gpu_model_idle_ratio.labels(gpu_label(gpu)).set(ratio)
            if ratio > MODEL_IDLE_WARN_RATIO and in_flight >= MODEL_IDLE_WARN_AFTER_S and gpu not in self._warned:
                self._warned.add(gpu)  # once per GPU: the gauge goes on showing it
                logger.warning(
                    "agent-otel: GPU %s read idle for %.0f%% of the %.1f s model calls were in flight: the GPU "
                    "data contradicts the model calls (a simulated GPU nobody drives, another GPU than the one "
                    "serving the model, clocks apart, or a model served elsewhere); that idle time is blamed on "
                    "the model server (docs/gpu.md)",
                    gpu,
                    100 * ratio,
                    in_flight,
                )

    def _emit_window(self, closed: ClosedWindow) -> None:
        """The window's ``gpu.idle`` span, with the per-tool totals of every
        share and links to the largest shares (docs/telemetry.md, GPU idle spans)."""
        result = closed.attribution
        window = result.window
        gpu = valid_text(window.gpu, NAME_LIMIT)  # from a GPU log, when replayed
        totals = closed.blocked  # (tool, phase) -> seconds, as the counters got them
        # The engine kept the largest shares a link shows, smallest first: a
        # tracer provider whose link limit is lower than the one read at
        # start keeps the last links it is given.
        links = [
            Link(_context_of(share.call), {GPU_IDLE_BLOCKED_DURATION: share.blocked_s, AGENT_TOOL_PHASE: share.phase})
            for share in result.shares
        ]
        attributes: dict[str, AttributeValue] = {
            GPU_INDEX: gpu,
            GPU_IDLE_DURATION: closed.idle_s,  # what agent_gpu_idle_seconds_total received for it
            GPU_UTILIZATION_AVG: window.utilization_avg,
            GPU_IDLE_UNATTRIBUTED_DURATION: result.unattributed_s,
            AGENT_GPU_SOURCE: self.source.kind,  # "simulated" says these are no real GPU's windows
        }
        if window.uuid:
            attributes[GPU_UUID] = valid_text(window.uuid, NAME_LIMIT)
        if closed.linkable > len(links):
            attributes[GPU_IDLE_UNLINKED_CALLS] = closed.linkable - len(links)
        if closed.models:  # the model server's share, as agent_gpu_idle_model_seconds_total got it
            ordered_models = sorted(closed.models.items(), key=_largest_first)
            attributes[GPU_IDLE_MODEL_DURATION] = sum(closed.models.values())
            attributes[GPU_IDLE_MODELS] = [valid_text(model, NAME_LIMIT) for (model, _), _ in ordered_models]
            attributes[GPU_IDLE_MODEL_PHASES] = [phase for (_, phase), _ in ordered_models]
            attributes[GPU_IDLE_MODEL_DURATIONS] = [seconds for _, seconds in ordered_models]
        load = self.server.load(window.start_ns, window.end_ns) if self.server is not None else None
        if load is not None:
            attributes[AGENT_MODEL_SERVER_WAITING_MAX] = load.waiting_max
            attributes[AGENT_MODEL_SERVER_RUNNING_MAX] = load.running_max
            if load.kv_cache_usage is not None:
                attributes[AGENT_MODEL_SERVER_KV_CACHE_USAGE] = load.kv_cache_usage
                self._count_kv_held(gpu, load.kv_cache_usage, totals)
        if totals:
            by_tool: dict[str, float] = {}
            for (tool, _), seconds in totals.items():
                by_tool[tool] = by_tool.get(tool, 0.0) + seconds
            attributes[GPU_IDLE_BLOCKED_BY] = largest_share(by_tool)  # not None: totals has a tool
            ordered = sorted(totals.items(), key=_largest_first)
            attributes[GPU_IDLE_BLOCKED_TOOLS] = [valid_text(tool, NAME_LIMIT) for (tool, _), _ in ordered]
            attributes[GPU_IDLE_BLOCKED_PHASES] = [phase for (_, phase), _ in ordered]
            attributes[GPU_IDLE_BLOCKED_DURATIONS] = [seconds for _, seconds in ordered]
        # Each window is the root of its own trace: the GPU's timeline is not
        # part of any one agent turn, and the links lead to the turns it hit.
        span = self.tracer.start_span(
            SPAN_GPU_IDLE,
            context=trace_api.set_span_in_context(trace_api.INVALID_SPAN),
            attributes=attributes,
            links=links,
            start_time=window.start_ns,
        )
        span.end(end_time=window.end_ns)

    def _emit_children(self, settled: list[SettledShare]) -> None:
        """A child ``gpu.idle`` span under each tool span whose final share of
        a window is large enough (docs/telemetry.md, GPU idle spans)."""
        share_min = self.share_min
        gpus: dict[str, str] = {}
        for gpu, _window_start, share in settled:
            blocked_s = share.queue_s + share.exec_s
            if blocked_s < share_min or blocked_s <= 0.0 or not share.call.trace_id:
                continue
            if gpu not in gpus:
                gpus[gpu] = valid_text(gpu, NAME_LIMIT)  # from a GPU log, when replayed
            child = self.tracer.start_span(
                SPAN_GPU_IDLE,
                context=trace_api.set_span_in_context(NonRecordingSpan(_context_of(share.call))),
                attributes={GPU_INDEX: gpus[gpu], GPU_IDLE_BLOCKED_DURATION: blocked_s, AGENT_TOOL_PHASE: share.phase},
                start_time=share.start_ns,
            )
            child.end(end_time=share.end_ns)

    def _count_kv_held(self, gpu: str, usage: float, blocked: dict[tuple[str, str], float]) -> None:
        """The KV cache in use while the window idled, held by the requests
        waiting on the tools blamed for it: each tool's idle seconds x the
        window's mean usage (docs/model-servers.md)."""
        by_tool: dict[str, float] = {}
        for (tool, _phase), seconds in blocked.items():
            by_tool[tool] = by_tool.get(tool, 0.0) + seconds
        metrics, label = self.metrics, self.metrics.tool_label
        for tool, seconds in by_tool.items():
            if seconds > 0.0 and usage > 0.0:
                metrics.gpu_idle_kv_cache_held.labels(metrics.gpu_label(gpu), label(tool)).inc(seconds * usage)

    def _count_source_errors(self) -> None:
        with self._errors_lock:
            for reason, count in self.sampler.stats()["errors"].items():
                new = count - self._reported_errors.get(reason, 0)
                if new > 0:
                    self.metrics.gpu_errors.labels(self.metrics.reason_label(reason)).inc(new)
                    self._reported_errors[reason] = count


def _context_of(call: ToolCall) -> SpanContext:
    """The span context of a tool call's span."""
    return SpanContext(call.trace_id, call.span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _largest_first(item: tuple[tuple[str, str], float]) -> tuple[float, str, str]:
    (tool, phase), seconds = item
    return (-seconds, tool, phase)


def link_limit() -> int:
    """The links a span keeps at most, as the SDK reads it (``OTEL_SPAN_LINK_COUNT_LIMIT``, 128 by default)."""
    try:
        limit = SpanLimits().max_links
    except ValueError:  # a bad variable: the SDK says so where it makes its tracer provider
        return DEFAULT_LINK_LIMIT
    return DEFAULT_LINK_LIMIT if limit is None else limit
