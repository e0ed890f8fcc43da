"""The blame service of a GPU pool: OTLP tool spans in, the pool's blame out.

``agent-otel gpu-exporter --pool POOL`` runs it on a GPU host: it samples
the host's GPUs, receives the tool spans of every agent of the pool over
OTLP (gRPC and HTTP/protobuf, from the Collector's routing), and blames the
GPUs' idle time on all of those calls together, with the same engine as an
agent's live path (``agent_otel.attribution.service``). Out come the
contract's GPU metrics and ``gpu.idle`` spans (linked to the agents' tool
spans) and its own intake metrics.

Wiring only: ``receiver`` decodes and answers OTLP, ``receiver.decode``
turns spans into calls, ``attribution.service`` blames them.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import time
from typing import Callable, Optional

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agent_otel.attribution.service import DEFAULT_WATERMARK_S, Intake, PoolTimeline
from agent_otel.attribution.wiring import gpu_timeline
from agent_otel.support.clock import now_ns
from agent_otel.config import DEFAULTS, SETTINGS, Settings
from agent_otel.errors import ConfigError
from agent_otel.exporters.prometheus import BlameServiceMetrics
from agent_otel.wiring.instrumentation import Instrumentation, declared_gpu_pool, start
from agent_otel.receiver.decode import tool_calls
from agent_otel.receiver import DEFAULT_GRPC_ENDPOINT, DEFAULT_HTTP_ENDPOINT, DEFAULT_MAX_REQUEST_BYTES
from agent_otel.receiver.server import DEFAULT_LIMITS, Limits, OtlpReceiver, Outcome
from agent_otel.support.problems import Problems
from agent_otel.records import NS_PER_S
from agent_otel.semconv import METRIC_LATE_SPANS

logger = logging.getLogger("agent_otel.commands.blame_service")
EXPORT_INTERVAL_VARIABLE = SETTINGS["export_interval"].declaration.env[0]


class LateSpans:
    """Says that tool spans arrive late: one line naming the likely cause and
    the setting to change, then at most one a minute with how many since."""

    def __init__(self, pool: str, watermark_s: float, clock: Callable[[], float] = time.monotonic):
        self.pool = pool
        self.watermark_s = watermark_s
        self._problems = Problems(logger, clock=clock)

    def report(self, intake: Intake) -> None:
        if intake.late_example is None:
            return
        tool, lasted_s, delay_s = intake.late_example
        # Late: it began more than the watermark before it arrived (lasted + delay).
        exported_late = delay_s >= lasted_s
        if exported_late:
            cause = (
                f"likely cause: the agents' export interval (export_interval, {EXPORT_INTERVAL_VARIABLE}: "
                f"{DEFAULTS.export_interval:g} s by default) plus the Collector's batching is longer than the "
                "watermark: raise --watermark well above it, or make the agents export sooner"
            )
        else:
            cause = (
                "likely cause: tool calls that last longer than the watermark (less their export delay): "
                "raise --watermark to blame calls that long in full"
            )
        self._problems.report(
            ("late", exported_late),
            "agent-otel: tool spans arrive late at the blame service of GPU pool %r (e.g. %r, %.1f s long, "
            "received %.1f s after it ended; watermark %g s): their GPU time before the blame reached them "
            "stays unblamed (counted in %s); %s",
            self.pool,
            tool,
            lasted_s,
            delay_s,
            self.watermark_s,
            METRIC_LATE_SPANS,
            cause,
            count=sum(intake.late.values()),
        )


class BlameService:
    """The receiver and the pool timeline of one GPU pool; ``shutdown`` stops both."""

    def __init__(
        self,
        timeline: PoolTimeline,
        metrics: BlameServiceMetrics,
        *,
        grpc_endpoint: Optional[str],
        http_endpoint: Optional[str],
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.timeline = timeline
        self.metrics = metrics
        self.receiver = OtlpReceiver(
            self.consume,
            grpc_endpoint=grpc_endpoint,
            http_endpoint=http_endpoint,
            max_request_bytes=max_request_bytes,
            limits=limits,
            on_refused=self._refused_request,
        )
        self._late = LateSpans(timeline.pool, timeline.watermark_ns / NS_PER_S)

    def start(self) -> None:
        self.receiver.start()
        self.timeline.start()

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """No more spans; then blame what is held and close the open windows. True if both in time."""
        deadline = time.monotonic() + timeout_s
        received = self.receiver.shutdown(min(1.0, timeout_s))
        return self.timeline.shutdown(max(0.0, deadline - time.monotonic())) and received

    def consume(self, request: ExportTraceServiceRequest, peer: str, transport: str) -> Outcome:
        """One OTLP request's spans (a receiver thread)."""
        arrived = now_ns()
        decoded = tool_calls(request)
        metrics = self.metrics
        metrics.received.labels(transport).inc(
            len(decoded.calls) + len(decoded.models) + decoded.duplicates + sum(decoded.refused.values())
        )
        for call in decoded.calls:
            # Before its end by this host's clock: the sender's clock is ahead (le="0").
            metrics.delay.observe(max(0.0, (arrived - call.end_ns) / NS_PER_S))
        intake = self.timeline.add_calls(decoded.calls, decoded.models)
        refused = decoded.refused + intake.refused
        for reason, count in refused.items():
            metrics.refused_spans.labels(reason).inc(count)
        for tool, count in intake.late.items():
            metrics.late_spans(tool, count)
        self._late.report(intake)
        examples = {**decoded.examples, **intake.examples}
        rejected = sum(refused.values())
        message = (
            ""
            if not rejected
            else (
                f"{rejected} span(s) refused by the blame service of GPU pool {self.timeline.pool!r}: "
                + "; ".join(f"{refused[reason]} {reason} (e.g. {examples[reason]})" for reason in sorted(refused))
            )
        )
        return Outcome(rejected, message)

    def _refused_request(self, transport: str, reason: str) -> None:
        self.metrics.refused_requests.labels(transport, reason).inc()


def start_blame_service(
    settings: Settings,
    *,
    watermark_s: float = DEFAULT_WATERMARK_S,
    grpc_endpoint: Optional[str] = DEFAULT_GRPC_ENDPOINT,
    http_endpoint: Optional[str] = DEFAULT_HTTP_ENDPOINT,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> tuple[Instrumentation, Optional[BlameService]]:
    """Set up the process (tracer, /metrics, its pool on the resource and
    ``target_info``) and, when the GPU source has GPUs, the blame service.

    Returns the handle (``handle.shutdown()`` stops everything) and the
    service, or None without a GPU (the source logged why). Raises
    ``ConfigError`` for a missing pool or a bad watermark, and ``OSError``
    naming the endpoint when an OTLP port cannot be bound.
    """
    pool = declared_gpu_pool(settings)
    if not pool:
        raise ConfigError(
            "--pool",
            None,
            "the GPU pool this service blames (AGENT_OTEL_GPU_POOL), e.g. the model "
            "server's address as its agents call it",
        )
    if not 0 <= watermark_s <= 3600:
        raise ConfigError("--watermark", watermark_s, "seconds from 0 to 3600")
    if not grpc_endpoint and not http_endpoint:
        raise ConfigError("--otlp-grpc, --otlp-http", "off", "at least one OTLP endpoint to receive tool spans on")
    # The process itself samples nothing: the pool timeline does, below.
    handle = start(dataclasses.replace(settings, gpu="off", gpu_pool=pool))
    try:
        service = _pool_service(handle, settings, pool, watermark_s, grpc_endpoint, http_endpoint, max_request_bytes)
    except BaseException:
        handle.shutdown(timeout_s=1.0)
        raise
    return handle, service


def _pool_service(
    handle: Instrumentation,
    settings: Settings,
    pool: str,
    watermark_s: float,
    grpc_endpoint: Optional[str],
    http_endpoint: Optional[str],
    max_request_bytes: int,
) -> Optional[BlameService]:
    assert handle.tracer is not None
    timeline = gpu_timeline(settings, tracer=handle.tracer, metrics=handle.metrics, pool=pool, watermark_s=watermark_s)
    if timeline is None:
        return None
    assert isinstance(timeline, PoolTimeline)
    metrics = BlameServiceMetrics(
        handle.metrics.registry,
        handle.metrics.tool_label,
        held_calls=timeline.held_calls,
        dropped_calls=lambda: timeline.engine.horizon.dropped,
        lag_s=timeline.lag_s,
    )
    limits = limits_of(settings)
    _allow_files(2 * limits.max_connections + 256)
    service = BlameService(
        timeline,
        metrics,
        grpc_endpoint=grpc_endpoint,
        http_endpoint=http_endpoint,
        max_request_bytes=max_request_bytes,
        limits=limits,
    )
    service.start()
    handle.background.append(service)
    handle.gpu_timeline = timeline
    return service


def limits_of(settings: Settings) -> Limits:
    """The receivers' limits, from the settings."""
    return Limits(
        request_timeout_s=settings.blame_request_timeout,
        idle_timeout_s=settings.blame_idle_timeout,
        max_connections=settings.blame_max_connections,
        max_rpcs=settings.blame_max_rpcs,
        memory_bytes=settings.blame_memory_limit,
    )


def _allow_files(wanted: int) -> None:
    """Raise this process's open-file limit towards ``wanted`` (within the hard
    limit): each connection is a file, and past the limit accepting fails."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        logger.info("blame service: could not raise the open-file limit to %d (%s)", wanted, exc)


__all__ = ["BlameService", "LateSpans", "limits_of", "start_blame_service"]
