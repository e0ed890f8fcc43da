"""``instrument()``: wire capture to outputs in one call, and undo it.

What it sets up, in order: settings (arguments, then environment), the
tracer provider and its span exporters, the Prometheus metrics and their
/metrics server, the recorder the tool wrappers use, the executor hook, the
pipeline thread, the framework hooks and the GPU timeline. Each part that
fails for a reason outside the user's control (a port in use, no GPU, a
framework version it does not know) is logged and skipped; invalid settings
raise ``ConfigError`` before anything is changed.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from agent_otel.support import clock, forks, host
from agent_otel.wiring import sinks
from agent_otel.support.background import Background
from agent_otel.capture import executors, frameworks, models
from agent_otel.capture.current import set_recorder
from agent_otel.capture.loop_monitor import LoopMonitor, thread_label
from agent_otel.config import GPU_AUTO, GPU_OFF, Settings, load_settings
from agent_otel.errors import AgentOtelError, ConfigError
from agent_otel.wiring.pipeline import Pipeline
from agent_otel.records import ToolCall
from agent_otel.capture.recorder import Recorder
from agent_otel.exporters.batch import BatchSpanProcessor, SpanLosses
from agent_otel.exporters.deferred import DeferredExporter
from agent_otel.exporters.prometheus import LiveReadings, Metrics, MetricsServer
from agent_otel.semconv import (
    AGENT_GPU_POOL,
    AGENT_PROCESS_CPU_COUNT,
    GPU_SOURCE_NVML,
    GPU_SOURCE_SIMULATED,
    SCOPE_NAME,
    SERVICE_NAME,
    SPAN_KIND_TOOL,
)
from agent_otel.version import __version__

if TYPE_CHECKING:
    from agent_otel.attribution.live import LiveTimeline

logger = logging.getLogger("agent_otel")

_lock = threading.RLock()
_handle: Optional["Instrumentation"] = None


def _reinit_after_fork() -> None:
    global _lock
    _lock = threading.RLock()
    # Where the traces file agent-otel chose is, the parent says at its exit;
    # its children append to the same file and do not say it again each.
    _chosen_files.clear()


forks.after_fork_in_child(_reinit_after_fork)


class Instrumentation:
    """What ``instrument()`` set up; ``shutdown()`` flushes and undoes it.

    Making it makes its parts, each once, in the order below, each given
    the parts it needs; a part not made (turned off, or a start that failed
    before it) stays None. After ``instrument()`` returns, only these
    change: ``gpu_timeline`` and ``background`` when the GPU search finds a
    GPU (``settings`` without a GPU log that cannot be written), and
    whether it is shut down (``metrics_server`` is None in a forked child).
    """

    # The parts, made once by _make_parts in this order.
    tracer_provider: Optional[TracerProvider] = None  # with span_processors, sinks, owns_provider: _setup_tracing's
    owns_provider = False
    tracer: Optional[trace_api.Tracer] = None
    recorder: Optional[Recorder] = None
    monitor: Optional[executors.ExecutorMonitor] = None
    loop_monitor: Optional[LoopMonitor] = None
    pipeline: Optional[Pipeline] = None
    metrics_server: Optional[MetricsServer] = None  # None in a forked child too: /metrics stays the parent's

    def __init__(
        self,
        settings: Settings,
        gpu_pool: str = "",
        refused: Optional[_Refused] = None,
        detected: Optional[Resource] = None,
    ):
        """``detected``: the resource OpenTelemetry's detectors made (``start()``), for a new tracer provider."""
        self.settings = settings
        # The GPU pool this process's tool calls can block ("" for none: its
        # own GPUs); from gpu_pool, or else the resource's agent.gpu.pool.
        self.gpu_pool = gpu_pool
        self.refused = refused if refused is not None else _Refused(None)  # start()'s: settings it could not use
        self.span_processors: list[BatchSpanProcessor] = []
        self.sinks = sinks.Plan(())  # where spans go (agent_otel.wiring.sinks), when agent-otel set up the exporters
        # The pipeline counts into the metrics, and a scrape drains the
        # pipeline: the metrics, made first, read the parts through the handle.
        self.metrics = Metrics(
            tool_name_limit=settings.tool_name_limit,
            executor_name_limit=settings.executor_name_limit,
            gpu_pool=gpu_pool,
            live=LiveReadings(
                before_collect=self._drain,
                inflight_calls=self._inflight_calls,
                executor_stats=self._executor_stats,
                loop_lags=self._loop_lags,
                thread_label=thread_label,
                gpu_states=self._gpu_states,
            ),
        )
        self.background: list[Background] = []  # other parts: GPU timeline, loop monitor, frameworks
        self.gpu_timeline: Optional[LiveTimeline] = None  # when a GPU is sampled (found later with gpu="auto")
        self._closed = False
        # Why instrument() could not set up (logged with its traceback), where
        # it then left the agent uninstrumented; None when it set up.
        self.failure: Optional[Exception] = None
        try:
            self._make_parts(detected)
        except Exception as exc:
            self.shutdown(timeout_s=1.0)
            if self.refused.problems is None:  # the commands: a failure to start is theirs to report
                raise
            # instrument(): a failure of agent-otel's own (a bug, a library
            # it cannot work with) leaves the agent running uninstrumented.
            logger.error(
                "agent-otel: instrument() failed (%s: %s); nothing is instrumented, the agent runs as without it",
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            self.failure = exc
        except BaseException:
            self.shutdown(timeout_s=1.0)
            raise

    def _make_parts(self, detected: Optional[Resource]) -> None:
        """Make the parts, each once, each with the parts it needs (``__init__`` only)."""
        settings = self.settings
        clock.follow_wall_clock()  # imported long before, maybe; the pipeline thread keeps it up (clock.py)
        tracer = self.tracer = _setup_tracing(self, detected)
        recorder = self.recorder = Recorder(
            tracer,
            record_arguments=settings.record_arguments,
            record_results=settings.record_results,
            max_attribute_length=settings.max_attribute_length,
            redact=settings.redact,
            record_exception_messages=settings.record_exception_messages,
            deferred_spans=settings.deferred_spans,
            remedy_metrics=self.metrics.remedies,
        )
        self.monitor = executors.ExecutorMonitor() if settings.instrument_executors else None
        if settings.loop_monitor:
            self.loop_monitor = LoopMonitor(
                tracer, threshold_s=settings.loop_block_threshold, max_stack_chars=settings.max_attribute_length
            )
        self.pipeline = Pipeline(recorder, self.monitor, self.metrics, loop_monitor=self.loop_monitor)
        if settings.prometheus_port is not None:
            try:
                self.metrics_server = MetricsServer(
                    self.metrics.registry, settings.prometheus_port, settings.prometheus_address
                )
            except (OSError, ImportError) as exc:  # a port in use; a broken prometheus_client
                logger.warning(
                    "agent-otel: cannot serve /metrics on %s:%s (%s); metrics are not exposed",
                    settings.prometheus_address,
                    settings.prometheus_port,
                    exc,
                )
        models.configure(settings.model_spans)
        set_recorder(self.recorder)
        if self.monitor is not None:
            executors.install(self.monitor)
        frameworks.instrument_frameworks(settings.frameworks)
        self.background.append(frameworks.FrameworkHooks())
        self.pipeline.start()
        if self.loop_monitor is not None:
            self.background.append(self.loop_monitor)
            self.loop_monitor.install()  # hooks asyncio now, or when the application imports it
        if settings.gpu in (GPU_AUTO, GPU_SOURCE_NVML) and not self.gpu_pool:
            # Whether there is a GPU is NVML's answer: loading NVML takes tens of
            # milliseconds, and a wedged driver never answers. Asked on a thread
            # of its own: instrument() returns first, and never waits for it.
            starter = GpuStart(self)
            self.background.append(starter)
            starter.start()
        elif settings.gpu != GPU_OFF and not self.gpu_pool:
            _start_named_gpu(self)  # a simulated GPU, a replayed log: opened now, its errors said here
        # Last, so that in a forked child it runs after every part above put itself right.
        forks.after_fork_in_child(self.reinit_after_fork)

    # -- what the gauges read at each scrape (exporters.prometheus.LiveReadings)

    def _drain(self) -> None:
        if self.pipeline is not None:
            self.pipeline.drain()

    def _inflight_calls(self) -> list[ToolCall]:
        return list(self.recorder.inflight.values()) if self.recorder is not None else []

    def _executor_stats(self) -> Iterable[executors.ExecutorStats]:
        return self.monitor.snapshot() if self.monitor is not None else ()

    def _loop_lags(self) -> Iterable[tuple[str, float]]:
        return self.loop_monitor.lags() if self.loop_monitor is not None else ()

    def _gpu_states(self) -> Iterable[tuple[str, str, str]]:
        timeline = self.gpu_timeline
        return timeline.gpu_states() if timeline is not None else ()

    @property
    def config_errors(self) -> tuple[AgentOtelError, ...]:
        """The settings ``instrument()`` could not use (each logged once), in the order found."""
        return tuple(self.refused.problems or ())

    def wait_for_gpu(self, timeout_s: Optional[float] = None) -> Optional[LiveTimeline]:
        """``gpu_timeline`` once the GPU is found: with ``gpu="auto"`` or ``"nvml"`` it is
        looked for on a thread of its own after ``instrument()`` returns (``GpuStart``);
        this waits for that search (at most ``timeout_s``). None without a GPU."""
        for part in list(self.background):
            if isinstance(part, GpuStart):
                part.join(timeout_s)
        return self.gpu_timeline

    @property
    def prometheus_url(self) -> Optional[str]:
        return self.metrics_server.url if self.metrics_server else None

    def force_flush(self, timeout_s: Optional[float] = None) -> bool:
        """Bring metrics up to date and export every finished span now."""
        timeout_s = self.settings.shutdown_timeout if timeout_s is None else timeout_s
        if self.pipeline is not None:
            self.pipeline.drain(spans=True)
        deadline = time.monotonic() + timeout_s
        return not _finish([(processor.sink, _flush_within(processor)) for processor in self.span_processors], deadline)

    def shutdown(self, timeout_s: Optional[float] = None) -> bool:
        """Undo ``instrument()``; export what is pending.

        Returns within ``timeout_s`` (``shutdown_timeout``, 5 s by default)
        even if an exporter never answers, plus up to 0.5 s to close
        /metrics (so its port is free on return). Returns True only when
        every background part (GPU sampling, the pipeline, each span
        export) finished and flushed in that time; otherwise False, after
        one log line naming the parts still running.
        """
        global _handle
        with _lock:
            if self._closed:
                return True
            self._closed = True
            if _handle is self:
                _handle = None
        timeout_s = self.settings.shutdown_timeout if timeout_s is None else timeout_s
        start = time.monotonic()
        deadline = start + timeout_s
        executors.uninstall()
        unfinished: list[str] = []
        # The GPU timeline first (it closes the open windows into spans), with
        # at most half the time, so a GPU driver that hangs leaves the export
        # the other half; then the pipeline; then every exporter at once.
        background_deadline = start + timeout_s / 2
        unfinished += _finish(
            [(_part_name(part), part.shutdown) for part in reversed(self.background)], background_deadline
        )
        if self.pipeline is not None:
            unfinished += _finish([("the metrics pipeline", self.pipeline.shutdown)], deadline)
        set_recorder(None)
        if self.pipeline is not None and self.recorder is not None and self.recorder.spans:
            if "the metrics pipeline" not in unfinished:
                # Deferred spans of calls that ended during the pipeline's last
                # drain: built now, before the span processors stop.
                self.pipeline.drain(spans=True)
            else:
                # The pipeline is stuck: the calls it has not built never
                # reach an exporter. Counted as lost tool spans, as the
                # warning below says.
                self.metrics.dropped(SPAN_KIND_TOOL, len(self.recorder.spans))
        if self.recorder is not None:
            # Calls still running (a stall going on as the agent stops): their
            # spans as they stand, so the traces hold what held the GPU idle.
            self.recorder.close()
        unfinished += _finish(
            [(f"span export to {processor.sink}", processor.shutdown) for processor in self.span_processors], deadline
        )
        if self.metrics_server is not None:
            unfinished += _finish(
                [("the /metrics server", self.metrics_server.shutdown)], max(deadline, time.monotonic() + 0.5)
            )
        if unfinished:
            # The time it really took: the GPU timeline and the other background
            # parts are given up on at half of shutdown_timeout.
            logger.warning(
                "agent-otel: shutdown gave up after %.1f s (shutdown_timeout %.1f s): %s still running; spans "
                "not exported by then are counted in agent_otel_spans_dropped_total",
                time.monotonic() - start,
                timeout_s,
                ", ".join(unfinished),
            )
            return False
        return True

    def reinit_after_fork(self) -> None:
        """In a forked child (after every part put itself right): /metrics stays the
        parent's; a ``multiprocessing`` child flushes its spans when it exits."""
        self.metrics_server = None
        if not self._closed:
            self.flush_at_worker_exit()

    def flush_at_worker_exit(self) -> None:
        """A ``multiprocessing`` worker ends with ``os._exit`` (fork, forkserver),
        which runs no ``atexit`` hook, or by its pool's SIGTERM: shut down
        (flush) at either (``forks.at_worker_exit``)."""
        forks.at_worker_exit(self, self.shutdown, self.settings.shutdown_timeout + 0.5)


def _flush_within(processor: BatchSpanProcessor) -> Callable[[float], bool]:
    """``processor.force_flush`` in seconds (the SDK's signature is in milliseconds)."""
    return lambda timeout_s: processor.force_flush(int(timeout_s * 1000))


def _part_name(part: object) -> str:
    return getattr(part, "part_name", None) or type(part).__name__


def _finish(parts: list[tuple[str, Callable[[float], object]]], deadline: float) -> list[str]:
    """Run each ``shutdown(timeout_s)`` at once, each on a daemon thread, until ``deadline``;
    the names of those that did not return True by then.

    A part can block on a peer that never answers (an OTLP endpoint, a GPU
    driver); the agent's shutdown must not wait for it.
    """
    outcomes: dict[str, bool] = {}
    threads = []
    # Each part gets a little less than the time left, to say how it ended
    # (count the spans it could not export) before the caller stops waiting.
    own_deadline = deadline - min(0.05, max(deadline - time.monotonic(), 0.0) / 10)
    for name, shutdown in parts:

        def run(name=name, shutdown=shutdown):
            try:
                outcomes[name] = shutdown(max(0.0, own_deadline - time.monotonic())) is not False
            except Exception as exc:
                logger.warning("agent-otel: shutting down %s failed (%s: %s)", name, type(exc).__name__, exc)
                outcomes[name] = False

        thread = threading.Thread(target=run, name="agent-otel-shutdown", daemon=True)
        thread.start()
        threads.append((name, thread))
    unfinished = []
    for name, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() or not outcomes.get(name, False):
            unfinished.append(name)
    return unfinished


def _sink_name(exporter, settings: Settings) -> str:
    """How the log lines name where spans go: "OTLP/gRPC localhost:4317", "traces file t.jsonl"."""
    path = getattr(exporter, "path", None)
    if path is not None:
        return f"traces file {path}"
    if isinstance(exporter, DeferredExporter):  # an OTLP exporter, made on the export thread
        grpc = settings.otlp_protocol == "grpc"
        # Where the SDK's exporter will send them, as it resolves it.
        endpoint = settings.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        endpoint = endpoint or ("http://localhost:4317" if grpc else "http://localhost:4318/v1/traces")
        return f"OTLP/{'gRPC' if grpc else 'HTTP'} {endpoint}"
    return type(exporter).__name__


def _grpc_exporter(endpoint: Optional[str]) -> Callable[[], SpanExporter]:
    def make() -> SpanExporter:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)

    return make


def _http_exporter(endpoint: Optional[str]) -> Callable[[], SpanExporter]:
    def make() -> SpanExporter:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)

    return make


def _span_exporters(settings: Settings, names: tuple[str, ...]) -> list[SpanExporter]:
    """The exporters ``names`` ask for. The OTLP ones are made on the export
    thread (``DeferredExporter``): their imports (gRPC's is about 58 ms) never
    hold up ``instrument()``."""
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp" and settings.otlp_protocol == "grpc":
            exporters.append(DeferredExporter(_grpc_exporter(settings.otlp_endpoint or None)))
        elif name == "otlp":
            exporters.append(DeferredExporter(_http_exporter(settings.otlp_endpoint or None)))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
    return exporters


def _setup_tracing(handle: Instrumentation, detected: Optional[Resource]) -> trace_api.Tracer:
    """The tracer provider (the application's, an earlier one of agent-otel's, or a new one with
    ``detected``, the resource start() made) and its span processors."""
    global _global_provider
    settings = handle.settings
    if settings.sdk_disabled:
        return trace_api.NoOpTracer()
    from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

    existing = trace_api.get_tracer_provider()
    if isinstance(existing, TracerProvider) and pool_of(existing.resource.attributes) != handle.gpu_pool:
        logger.warning(
            "agent-otel: gpu_pool is %r but the tracer provider's resource, set up earlier, says "
            "agent.gpu.pool=%r; spans keep the resource's (set it before the first instrument(), "
            "or with OTEL_RESOURCE_ATTRIBUTES)",
            handle.gpu_pool,
            pool_of(existing.resource.attributes),
        )
    if existing is _global_provider:
        # An earlier instrument() in this process set it (OpenTelemetry
        # allows that once); its processors were shut down, so add ours again.
        handle.sinks = sinks.plan(settings)
        provider, exporters = existing, _span_exporters(settings, handle.sinks.exporters)
        handle.owns_provider = True
    elif isinstance(existing, TracerProvider):
        # The application configured OpenTelemetry itself: keep its provider
        # and exporters, and add only what agent-otel was asked for.
        provider, exporters = existing, []
    else:
        attributes: dict[str, str | int] = {SERVICE_NAME: settings.service_name} if settings.service_name else {}
        if handle.gpu_pool:
            attributes[AGENT_GPU_POOL] = handle.gpu_pool
        attributes[AGENT_PROCESS_CPU_COUNT] = host.cores()  # what the report sizes its worker advice by
        # Resource.create(attributes), with the detectors' resource made in start() when there is one.
        resource = detected.merge(Resource(attributes)) if detected is not None else Resource.create(attributes)
        provider = TracerProvider(resource=resource)
        handle.owns_provider = True
        handle.sinks = sinks.plan(settings)
        exporters = _span_exporters(settings, handle.sinks.exporters)
    if settings.traces_file:
        try:
            exporters.append(OtlpJsonFileExporter(settings.traces_file))
        except ConfigError as error:  # cannot be opened: the other exporters still run
            handle.refused(error)
    elif handle.sinks.default_file is not None:
        exporters.append(OtlpJsonFileExporter(handle.sinks.default_file, max_bytes=sinks.DEFAULT_FILE_LIMIT_BYTES))
    # Shared by the span processors: a span is dropped when every one of them lost it.
    losses = SpanLosses(handle.metrics.dropped)
    for exporter in exporters:
        processor = BatchSpanProcessor(
            exporter,
            max_queue_size=settings.max_queue_size,
            batch_size=settings.export_batch_size,
            interval_s=settings.export_interval,
            losses=losses,
            sink=_sink_name(exporter, settings),
            advice=sinks.grpc_tls_advice(settings) if isinstance(exporter, DeferredExporter) else None,
        )
        provider.add_span_processor(processor)
        handle.span_processors.append(processor)
    handle.tracer_provider = provider
    if handle.owns_provider and not isinstance(existing, TracerProvider):
        # Global, so other instrumentations' spans join the same traces.
        _global_provider = provider
        trace_api.set_tracer_provider(provider)
    return provider.get_tracer(SCOPE_NAME, __version__)


# The provider the first instrument() made and set as OpenTelemetry's global
# one. shutdown() stops only its processors, so a later instrument() in the
# same process can add new ones (its resource, e.g. service.name, stays).
_global_provider: Optional[TracerProvider] = None


def instrument(
    service_name: Optional[str] = None,
    *,
    traces_file: Optional[str] = None,
    prometheus_port: Optional[int] = None,
    **options,
) -> Instrumentation:
    """Trace every tool call, time executors, and export spans and metrics.

    Idempotent: a second call returns the same handle. Keyword options are
    the fields of ``agent_otel.config.Settings``; each also has an
    environment variable (see the README's configuration table).

    A bad setting never stops the agent: an invalid value (argument or
    environment variable), an unknown option or framework name, a traces
    file or GPU log that cannot be written, is logged as one error line
    naming the setting and the value, and that setting falls back to the
    next source (the environment, then the default); the handle's
    ``config_errors`` lists what was refused.
    """
    with _lock:
        if _handle is not None:
            if service_name or traces_file or prometheus_port is not None or options:
                logger.warning("agent_otel.instrument() was already called; keeping the first settings")
            return _handle
        problems: list[AgentOtelError] = []
        settings = load_settings(
            {
                "service_name": service_name,
                "traces_file": traces_file,
                "prometheus_port": prometheus_port,
                **options,
            },
            problems=problems,
        )
        return start(settings, problems)


def start(settings: Settings, problems: Optional[list[AgentOtelError]] = None) -> Instrumentation:
    """``instrument()`` with settings already resolved by ``config.load_settings``
    (the commands resolve them with defaults of their own). Idempotent too.

    A setting that cannot be used raises ``ConfigError``; with a ``problems``
    list (``instrument()``'s) it is logged, appended there and left out.
    """
    global _handle
    with _lock:
        if _handle is not None:
            logger.warning("agent_otel.instrument() was already called; keeping the first settings")
            return _handle
        refused = _Refused(problems)
        for error in list(problems or ()):
            refused.say(error)
        if settings.frameworks:
            known = []
            for name in settings.frameworks:
                try:
                    frameworks.check_names((name,))
                    known.append(name)
                except ConfigError as error:
                    refused(error)
            settings = dataclasses.replace(settings, frameworks=tuple(known))
        # The resource OpenTelemetry's detectors make (each run starts threads):
        # made once, read for the GPU pool and given to the tracer provider.
        detected = None
        if not settings.gpu_pool and not isinstance(trace_api.get_tracer_provider(), TracerProvider):
            detected = Resource.create()
        gpu_pool = declared_gpu_pool(settings, detected)
        if gpu_pool and settings.gpu not in (GPU_AUTO, GPU_OFF):
            refused(
                ConfigError(
                    "gpu",
                    settings.gpu,
                    f"auto or off with a GPU pool ({gpu_pool!r}): the pool's GPUs are "
                    "sampled and blamed by its blame service, agent-otel gpu-exporter --pool",
                )
            )
            settings = dataclasses.replace(settings, gpu=GPU_AUTO)
        handle = Instrumentation(settings, gpu_pool, refused, detected)
        if handle.failure is not None:
            return handle  # shut down, uninstrumented
        _handle = handle
        _at_exit_once(handle)
        handle.flush_at_worker_exit()
        return handle


class _Refused:
    """Where ``start()`` puts a setting it cannot use: raised (the commands),
    or logged and kept in a list (``instrument()``: the agent goes on)."""

    def __init__(self, problems: Optional[list[AgentOtelError]]):
        self.problems = problems

    def __call__(self, error: AgentOtelError) -> None:
        if self.problems is None:
            raise error
        self.problems.append(error)
        self.say(error)

    @staticmethod
    def say(error: AgentOtelError) -> None:
        logger.error("agent-otel: %s; ignored, as if not given", error)


_exit_registered = False
_chosen_files: list[sinks.Plan] = []  # plans whose traces file agent-otel chose: said at exit


def _at_exit_once(handle: Instrumentation) -> None:
    global _exit_registered
    if handle.sinks.default_file is not None:
        _chosen_files.append(handle.sinks)
    if not _exit_registered:
        _exit_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    """At interpreter exit: shut down what is still instrumented (within
    ``shutdown_timeout``), then say in one line where the traces are when
    agent-otel chose the file (agent_otel.wiring.sinks)."""
    with _lock:
        handle = _handle
    if handle is not None:
        handle.shutdown()
    for plan in _chosen_files:
        line = sinks.exit_line(plan)
        if line is not None:
            logger.warning("%s", line)


def _start_named_gpu(handle: Instrumentation) -> None:
    """``_start_gpu_timeline``, a setting it cannot use refused (``handle.refused``)."""
    try:
        _start_gpu_timeline(handle)
    except AgentOtelError as error:  # a replay file it cannot read; a GPU log it cannot write
        handle.refused(error)
        if isinstance(error, ConfigError) and error.setting == "gpu_log_file":  # sample without the log
            handle.settings = dataclasses.replace(handle.settings, gpu_log_file=None)
            _start_gpu_timeline(handle)


def _start_gpu_timeline(handle: Instrumentation) -> None:
    """Open the GPU source and start the live timeline (``agent_otel.attribution.live``);
    none without a GPU. A handle shut down meanwhile gets none either.

    Opening NVML may hang (a wedged driver): nothing waits for that, not even
    a fork. Making and starting the timeline from the opened source is short,
    and a fork waits for it (``forks.background_import``), so that a child
    has the parent's timeline (and restarts its sampling) or none, and then
    looks for the GPU itself (``GpuStart``), never both.
    """
    from agent_otel.attribution.wiring import gpu_timeline, open_source

    assert handle.tracer is not None
    tracer = handle.tracer
    source = open_source(handle.settings)
    if source is None:
        return
    with forks.background_import():
        timeline = gpu_timeline(
            handle.settings,
            tracer=tracer,
            metrics=handle.metrics,
            source=source,
            recorder=handle.recorder,
            pipeline=handle.pipeline,
            loop_blocks=handle.loop_monitor.blocks_between if handle.loop_monitor is not None else None,
            default_log=sinks.default_gpu_log(handle.sinks),
        )
        if timeline is None:
            return
        timeline.start()
        if timeline.source.kind == GPU_SOURCE_SIMULATED and handle.tracer_provider is not None:
            # A simulated GPU follows the peers' model spans too (docs/gpu.md).
            models.watch_peers(handle.tracer_provider)
        with _lock:
            closed = handle._closed
            if not closed:
                handle.background.append(timeline)
                handle.gpu_timeline = timeline
    if closed:
        timeline.shutdown(1.0)


def _import_gpu_modules() -> None:
    """What the GPU search imports: the timeline's modules and NVML's bindings."""
    import agent_otel.attribution.wiring  # noqa: F401
    import agent_otel.gpu.nvml  # noqa: F401

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated `pynvml` distribution warns
            import pynvml  # noqa: F401
    except ImportError:
        pass  # NvmlSource says so, in one line


class GpuStart:
    """The ``Instrumentation.background`` part that looks for a GPU with ``gpu="auto"``
    or ``"nvml"`` on its own thread (``agent-otel-gpu-start``) and starts the
    timeline if it finds one.

    A fork waits for the search's imports and for the start of the timeline
    (``forks.background_import``), never for NVML (whose initialisation hangs
    on a wedged driver): a child has the parent's timeline, or, forked before
    the search found it (gunicorn's workers, forked right after the
    application loaded), searches again itself.
    """

    part_name = "the GPU search"
    THREAD_NAME = "agent-otel-gpu-start"
    # A search (NVML's initialisation) still running after this long is stuck:
    # said in one line, and counted (agent_otel_gpu_errors_total{reason}).
    STUCK_S = 5.0
    STUCK_REASON = "nvml_init_stuck"

    def __init__(self, handle: Instrumentation):
        self._handle = handle
        self._started = False
        self._done = False
        self._opening_since: Optional[float] = None  # monotonic, while the source is being opened
        self._said_stuck = False
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        if handle.pipeline is not None:
            handle.pipeline.consumers.append(self._check_stuck)  # every 0.25 s, on the pipeline's thread
        forks.after_fork_in_child(self.reinit_after_fork)

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def _run(self) -> None:
        try:
            with forks.background_import():  # a fork waits until the imports are done
                _import_gpu_modules()
            self._opening_since = time.monotonic()
            _start_named_gpu(self._handle)  # a fork waits for no NVML call (_start_gpu_timeline)
        except Exception as exc:  # never the agent's problem: no GPU sampling, one line
            logger.warning("agent-otel: GPU sampling is off (%s: %s)", type(exc).__name__, exc)
        finally:
            self._opening_since = None
            self._done = True
            if self._said_stuck:
                logger.warning(
                    "agent-otel: the GPU search ended, %s",
                    "GPU sampling is on" if self._handle.gpu_timeline else "no GPU sampled",
                )

    def _check_stuck(self, calls: list) -> None:
        """Say it, once, when opening the GPU source has taken ``STUCK_S``."""
        since = self._opening_since
        if since is None or self._said_stuck or time.monotonic() - since < self.STUCK_S:
            return
        self._said_stuck = True
        metrics = self._handle.metrics
        metrics.gpu_errors.labels(metrics.reason_label(self.STUCK_REASON)).inc()
        logger.warning(
            "agent-otel: NVML has not answered for %.0f s (nvmlInit: a wedged GPU driver?); GPU sampling is "
            "off until it does, and nothing else waits for it (counted as %s)",
            self.STUCK_S,
            self.STUCK_REASON,
        )

    def reinit_after_fork(self) -> None:
        """In a forked child: search again if the parent's search had not found the GPU."""
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self._opening_since = None
        self._said_stuck = False
        handle = self._handle
        if self._started and not self._done and handle.gpu_timeline is None and not handle._closed:
            self._thread.start()

    def join(self, timeout_s: Optional[float] = None) -> bool:
        """Wait until the search ended (True) or ``timeout_s`` passed."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def shutdown(self, timeout_s: float) -> bool:
        return self.join(timeout_s)


def pool_of(resource_attributes) -> str:
    """The GPU pool a resource's attributes declare (``agent.gpu.pool``); "" for none."""
    pool = resource_attributes.get(AGENT_GPU_POOL)
    return pool.strip() if isinstance(pool, str) else ""


def declared_gpu_pool(settings: Settings, detected: Optional[Resource] = None) -> str:
    """The GPU pool this process declares: ``gpu_pool`` (``AGENT_OTEL_GPU_POOL``),
    else the ``agent.gpu.pool`` resource attribute (``OTEL_RESOURCE_ATTRIBUTES``,
    or the application's own tracer provider); "" when none."""
    if settings.gpu_pool:
        return settings.gpu_pool
    existing = trace_api.get_tracer_provider()
    if isinstance(existing, TracerProvider):
        resource = existing.resource
    else:
        resource = detected if detected is not None else Resource.create()
    return pool_of(resource.attributes)


def uninstrument(timeout_s: Optional[float] = None) -> bool:
    """Flush, stop every background thread and restore every patched function."""
    with _lock:
        handle = _handle
    return handle.shutdown(timeout_s) if handle is not None else True


def current() -> Optional[Instrumentation]:
    return _handle
