"""The GPU timeline while the agent runs.

GPU samples arrive on the sampler thread; the idle detector turns them into
idle windows; each closed window is attributed to the tool calls that were
in flight (finished ones from the bounded horizon, plus those still
running) with the same ``attribute()`` the offline report uses; and the
result leaves as ``gpu.idle`` spans and the GPU metrics of the contract.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from opentelemetry import trace as trace_api
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from agent_otel.attribution import WindowAttribution, attribute
from agent_otel.gpu.logs import GpuLogWriter
from agent_otel.attribution.horizon import CallHorizon
from agent_otel.config import DEFAULTS
from agent_otel.records import IdleWindow, ToolCall
from agent_otel.gpu.sampler import GpuSampler
from agent_otel.gpu.timeline import DEFAULT_MAX_GAP_S, IdleDetector
from agent_otel.semconv import (AGENT_TOOL_PHASE, GPU_IDLE_BLOCKED_BY, GPU_IDLE_BLOCKED_DURATION, GPU_IDLE_DURATION,
                                GPU_IDLE_UNATTRIBUTED_DURATION, GPU_INDEX, GPU_UTILIZATION_AVG, GPU_UUID, PHASE_EXEC,
                                PHASE_QUEUE, SPAN_GPU_IDLE)

logger = logging.getLogger("agent_otel.gpu")

# Finished calls kept for attribution: enough for a long idle window on a
# busy agent, small enough to bound memory (~330 bytes a call: ~17 MB).
MAX_HORIZON_CALLS = 50_000


class LiveTimeline:
    """Samples -> idle windows -> attribution -> spans and metrics, in process."""

    def __init__(self, source, *, tracer: trace_api.Tracer, metrics, recorder=None, pipeline=None,
                 poll_interval_s: float = DEFAULTS.gpu_poll_interval,
                 idle_threshold: float = DEFAULTS.gpu_idle_threshold, min_idle_s: float = DEFAULTS.gpu_min_idle,
                 horizon_s: float = DEFAULTS.attribution_horizon, log_path: Optional[str] = None):
        self.source = source
        self.tracer = tracer
        self.metrics = metrics
        self.recorder = recorder
        self.pipeline = pipeline
        uuids = {device.index: device.uuid for device in source.devices() if device.uuid}
        # A poll interval above a second spaces idle samples out: widen the
        # gap that ends a window with it, or sparse idle reads as no data.
        self.detector = IdleDetector(idle_threshold, min_idle_s, uuids=uuids,
                                     max_gap_s=max(DEFAULT_MAX_GAP_S, 3 * poll_interval_s))
        self.horizon = CallHorizon(horizon_s, MAX_HORIZON_CALLS)
        self.log = GpuLogWriter(log_path) if log_path else None
        self.sampler = GpuSampler(source, poll_interval_s, self.on_samples)
        self._reported_errors: dict[str, int] = {}
        if pipeline is not None:
            pipeline.consumers.append(self.horizon.add_many)

    def start(self) -> None:
        self.sampler.start()

    def shutdown(self, timeout_s: float = 2.0) -> None:
        self.sampler.shutdown(timeout_s)
        # Close the windows still open: the stall at the end of a run counts too.
        for window in self.detector.flush():
            self.on_window(window)
        self._count_source_errors()
        if self.log is not None:
            self.log.close()

    def on_samples(self, samples) -> None:
        latest = {}
        for sample in samples:
            latest[sample.gpu] = sample.utilization
        for gpu, utilization in latest.items():
            self.metrics.gpu_utilization.labels(gpu).set(utilization)
        if self.log is not None:
            self.log.write(samples)
        for window in self.detector.feed(samples):
            self.on_window(window)
        self._count_source_errors()

    def on_window(self, window: IdleWindow) -> WindowAttribution:
        (result,) = attribute([window], self._calls_during(window))
        self._count(result)
        self._emit_spans(result)
        return result

    def _calls_during(self, window: IdleWindow) -> list[ToolCall]:
        if self.recorder is None:
            return []
        if self.pipeline is not None:
            self.pipeline.drain()  # calls that just finished reach the horizon first
        calls = {id(call): call for call in self.horizon.overlapping(window.start_ns, window.end_ns)}
        for call in list(self.recorder.inflight.values()):
            if id(call) in calls or call.submit_ns >= window.end_ns:
                continue
            snapshot = dataclasses.replace(call)  # the hot path may change the original meanwhile
            if snapshot.start_ns == 0:  # still queued now, so queued for the whole window
                snapshot.start_ns = window.end_ns
            calls[id(call)] = snapshot
        return list(calls.values())

    def _count(self, result: WindowAttribution) -> None:
        metrics, gpu = self.metrics, result.window.gpu
        metrics.gpu_idle.labels(gpu).inc(result.window.seconds)
        metrics.gpu_idle_unattributed.labels(gpu).inc(result.unattributed_s)
        for share in result.shares:
            tool = metrics.tool_label(share.call.tool)
            if share.queue_s > 0:
                metrics.gpu_idle_blocked.labels(gpu, tool, PHASE_QUEUE).inc(share.queue_s)
            if share.exec_s > 0:
                metrics.gpu_idle_blocked.labels(gpu, tool, PHASE_EXEC).inc(share.exec_s)

    def _emit_spans(self, result: WindowAttribution) -> None:
        window = result.window
        links = []
        for share in result.shares:
            if share.call.trace_id:
                context = SpanContext(share.call.trace_id, share.call.span_id, is_remote=False,
                                      trace_flags=TraceFlags(TraceFlags.SAMPLED))
                links.append(Link(context, {GPU_IDLE_BLOCKED_DURATION: share.blocked_s,
                                            AGENT_TOOL_PHASE: share.phase}))
        attributes: dict[str, AttributeValue] = {
            GPU_INDEX: window.gpu,
            GPU_IDLE_DURATION: window.seconds,
            GPU_UTILIZATION_AVG: window.utilization_avg,
            GPU_IDLE_UNATTRIBUTED_DURATION: result.unattributed_s,
        }
        if window.uuid:
            attributes[GPU_UUID] = window.uuid
        if result.blocked_by:
            attributes[GPU_IDLE_BLOCKED_BY] = result.blocked_by
        # Each window is the root of its own trace: the GPU's timeline is not
        # part of any one agent turn, and the links lead to the turns it hit.
        span = self.tracer.start_span(SPAN_GPU_IDLE, context=trace_api.set_span_in_context(trace_api.INVALID_SPAN),
                                      attributes=attributes, links=links, start_time=window.start_ns)
        span.end(end_time=window.end_ns)
        for share in result.shares:
            if not share.call.trace_id or share.blocked_s <= 0:
                continue
            parent = NonRecordingSpan(SpanContext(share.call.trace_id, share.call.span_id, is_remote=False,
                                                  trace_flags=TraceFlags(TraceFlags.SAMPLED)))
            child = self.tracer.start_span(
                SPAN_GPU_IDLE, context=trace_api.set_span_in_context(parent),
                attributes={GPU_INDEX: window.gpu, GPU_IDLE_BLOCKED_DURATION: share.blocked_s,
                            AGENT_TOOL_PHASE: share.phase},
                start_time=share.start_ns)
            child.end(end_time=share.end_ns)

    def _count_source_errors(self) -> None:
        for reason, count in self.sampler.stats()["errors"].items():
            new = count - self._reported_errors.get(reason, 0)
            if new > 0:
                self.metrics.gpu_errors.labels(reason).inc(new)
                self._reported_errors[reason] = count


def start_live_timeline(handle) -> Optional[LiveTimeline]:
    """Open the configured GPU source and start the timeline; None without a GPU."""
    from agent_otel.clock import now_ns
    from agent_otel.gpu.sources import open_gpu_source

    settings = handle.settings
    options = {"clock": now_ns} if settings.gpu == "simulated" else {}
    source = open_gpu_source(settings.gpu, list(settings.gpu_devices) if settings.gpu_devices else None,
                             **options)
    if source is None:
        return None
    if not source.devices():
        # Asked for NVML where it does not work: the source logged why;
        # count it, and sample nothing.
        for reason, count in getattr(source, "errors", {}).items():
            handle.metrics.gpu_errors.labels(reason).inc(count)
        source.close()
        return None
    timeline = LiveTimeline(source, tracer=handle.tracer, metrics=handle.metrics, recorder=handle.recorder,
                            pipeline=handle.pipeline, poll_interval_s=settings.gpu_poll_interval,
                            idle_threshold=settings.gpu_idle_threshold, min_idle_s=settings.gpu_min_idle,
                            horizon_s=settings.attribution_horizon, log_path=settings.gpu_log_file)
    timeline.start()
    return timeline
