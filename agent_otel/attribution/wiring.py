"""The GPU timeline, built from the settings: one function for the agent and the blame service.

Usage::

    timeline = gpu_timeline(settings, tracer=tracer, metrics=metrics, recorder=recorder, pipeline=pipeline)
    timeline = gpu_timeline(settings, tracer=tracer, metrics=metrics, pool="vllm-a:8000")  # a blame service
    if timeline is not None:
        timeline.start()

It opens the GPU source the settings name (``gpu``, ``gpu_devices``, and
the model server's metrics beside it or alone, ``model_server_metrics``),
reads the rest of the GPU settings once (``GpuOptions.of``) and makes the
agent's ``LiveTimeline`` or, for a GPU pool, the blame service's
``PoolTimeline``. A source without GPUs gives None, its errors counted
(``agent_otel_gpu_errors_total``, through the reason label's cap).

A new GPU source needs nothing here: it is opened by
``agent_otel.gpu.sources.open_gpu_source``, and what it can do (gaps it
vouches for, a model server's readings, following the model calls) the
timeline reads from the source itself.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from opentelemetry import trace as trace_api

from agent_otel.attribution.live import CallsInFlight, FinishedCalls, GpuMetrics, LiveTimeline
from agent_otel.attribution.options import GpuOptions
from agent_otel.support.clock import now_ns
from agent_otel.config import Settings
from agent_otel.errors import ConfigError
from agent_otel.gpu.device import GpuSource
from agent_otel.gpu.sources import open_gpu_source
from agent_otel.records import LoopBlock

logger = logging.getLogger("agent_otel.gpu")

__all__ = ["gpu_timeline", "open_source"]


def open_source(settings: Settings) -> Optional[GpuSource]:
    """The GPU source ``settings`` name (``gpu``, ``gpu_devices``, ``model_server_metrics``); None for none."""
    return open_gpu_source(
        settings.gpu,
        list(settings.gpu_devices) if settings.gpu_devices else None,
        model_server=settings.model_server_metrics,
    )


def gpu_timeline(
    settings: Settings,
    *,
    tracer: trace_api.Tracer,
    metrics: GpuMetrics,
    source: Optional[GpuSource] = None,
    recorder: Optional[CallsInFlight] = None,
    pipeline: Optional[FinishedCalls] = None,
    loop_blocks: Optional[Callable[[int, int], list[LoopBlock]]] = None,
    default_log: Optional[tuple[str, int]] = None,
    pool: str = "",
    watermark_s: Optional[float] = None,
) -> Optional[LiveTimeline]:
    """The GPU timeline ``settings`` describe, not started; None without a GPU.

    ``source``: the source, opened already (``open_source``: NVML's
    initialisation can hang on a wedged driver), else opened here.
    The agent's: ``recorder`` and ``pipeline`` (the tool calls in flight
    and finished), ``loop_blocks(start_ns, end_ns)`` (the event-loop
    monitor's blocks of a stretch) and ``default_log``, the ``(path,
    max_bytes)`` of the GPU log to write when ``gpu_log_file`` names none
    (sampling goes on without it if it cannot be written).
    A blame service's: ``pool``, the GPU pool whose calls it blames, a
    ``watermark_s`` late (``agent_otel.attribution.service``).

    Raises ``ConfigError`` for a GPU log named in the settings that cannot
    be written, or a bad GPU source setting.
    """
    if source is None:
        source = open_source(settings)
    if source is None:
        return None
    if not source.devices():
        # Asked for NVML where it does not work: the source logged why;
        # count it, and sample nothing.
        for reason, count in getattr(source, "errors", {}).items():
            metrics.gpu_errors.labels(metrics.reason_label(reason)).inc(count)
        source.close()
        return None
    options = GpuOptions.of(settings)
    log_path, log_max_bytes = settings.gpu_log_file, None
    if log_path is None and default_log is not None:
        log_path, log_max_bytes = default_log

    def make(log_path: Optional[str]) -> LiveTimeline:
        if pool:
            from agent_otel.attribution.service import DEFAULT_WATERMARK_S, PoolTimeline  # the blame service's

            return PoolTimeline(
                source,
                options,
                pool=pool,
                watermark_s=DEFAULT_WATERMARK_S if watermark_s is None else watermark_s,
                tracer=tracer,
                metrics=metrics,
                log_path=log_path,
                log_max_bytes=log_max_bytes,
                clock=now_ns,
            )
        return LiveTimeline(
            source,
            options,
            tracer=tracer,
            metrics=metrics,
            recorder=recorder,
            pipeline=pipeline,
            log_path=log_path,
            log_max_bytes=log_max_bytes,
            loop_blocks=loop_blocks,
        )

    try:
        try:
            return make(log_path)
        except ConfigError as error:
            if settings.gpu_log_file is not None or error.setting != "gpu_log_file":
                raise  # a log the user named: instrument() says so
            logger.warning("agent-otel: the GPU samples are not logged: %s", error)
            return make(None)
    except BaseException:
        source.close()
        raise
