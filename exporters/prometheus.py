"""The Prometheus face of the toolkit: the contract's metrics and /metrics.

Tool calls reach these metrics as finished ``ToolCall`` records on the
pipeline thread, never on the caller's thread. Gauges that describe the
present (calls in flight, executor queues) are computed when Prometheus
scrapes, from the live tables, so they cost nothing between scrapes.

``prometheus_client`` (its import is about a quarter of a default
``instrument()``: it loads an HTTP server, TLS, email parsing) is imported
when a metric needs it, not before: the tool-call metrics count into plain
tables on the pipeline thread, and the registry and the client's metrics
are made on first use (``Metrics.registry``, a GPU or loss counter, a
remedy), on the thread that uses them. Serving /metrics uses them at once.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from bisect import bisect_left, bisect_right
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, cast

from agent_otel.support import forks
from agent_otel import semconv
from agent_otel.config import DEFAULTS
from agent_otel.records import LoopBlock, ToolCall
from agent_otel.semconv import (
    BLOCKED_BY_UNKNOWN,
    COUNTER,
    EXEMPLAR_TRACE_ID,
    HISTOGRAM,
    KEPT_CLIENT,
    KEPT_PIPELINE,
    KEPT_TOGETHER,
    OTHER_TOOL,
    PHASE_EXEC,
    PHASE_QUEUE,
    SPAN_KINDS,
    MetricSpec,
)
from agent_otel.support.text import LABEL_VALUE_LIMIT, valid_text

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger("agent_otel")

OTHER = OTHER_TOOL  # the label value of every value past a label's limit
# Distinct values of the labels whose values come from outside, besides
# ``tool`` (tool_name_limit) and ``executor`` (executor_name_limit).
GPU_LABEL_LIMIT = 64
REASON_LABEL_LIMIT = 64
THREAD_LABEL_LIMIT = 64


def _client_metric(spec: MetricSpec, registry: Optional[CollectorRegistry]) -> Any:
    """The prometheus_client metric ``spec`` describes (its kind, name, help, labels, buckets)."""
    from prometheus_client import Counter, Gauge, Histogram

    if spec.kind == HISTOGRAM:
        return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)
    return (Counter if spec.kind == COUNTER else Gauge)(spec.name, spec.help, spec.labels, registry=registry)


def _specs(*, kept: tuple[str, ...], remedy: bool = False, blame_service: bool = False) -> tuple[MetricSpec, ...]:
    """The specs of one owner (``Metrics``, its remedies, the blame service) kept one of these ways, in order."""
    return tuple(
        spec
        for spec in semconv.METRICS.values()
        if spec.kept in kept and spec.remedy == remedy and spec.blame_service == blame_service
    )


def _gauge_family(spec: MetricSpec) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


class LabelValues:
    """Makes a label's values safe and few.

    Each value from outside (a tool name from an MCP server, a pool's
    thread name prefix, a GPU index from a log) is made valid UTF-8 and at
    most ``LABEL_VALUE_LIMIT`` characters, once; past ``limit`` distinct
    values, the rest become ``_other``. A value seen before costs one dict
    lookup.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self._labels: dict[str, str] = {}  # value as given -> label value
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def __call__(self, value: str) -> str:
        label = self._labels.get(value)
        if label is not None:
            return label
        with self._lock:
            label = self._labels.get(value)
            if label is None:
                distinct = len(self._labels)
                label = valid_text(value, LABEL_VALUE_LIMIT) if distinct < self.limit else OTHER
                if distinct < 4 * self.limit:  # remember _other too, but not forever
                    self._labels[value] = label
        return label

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()


class PipelineHistogram:
    """A labelled histogram observed by one writer, the pipeline thread.

    ``prometheus_client.Histogram`` takes a lock per bucket and builds an
    exemplar object on every observation: several microseconds per tool
    call, paid under the GIL while the agent runs. This one keeps plain
    per-bucket counts and the latest exemplar per bucket, behind one lock
    that the writer holds for a whole batch (``Metrics.lock``), and builds
    the exposition only when Prometheus scrapes. Same names, same buckets,
    same exemplars in the OpenMetrics output. The writer updates a child
    in place (``Metrics.observe_calls``); ``observe`` is the plain form.
    """

    def __init__(self, spec: MetricSpec):
        self.name = spec.name
        self.documentation = spec.help
        self.labelnames = spec.labels
        self.bounds = tuple(float(b) for b in spec.buckets)
        # labels -> [per-bucket counts (last one +Inf), sum, per-bucket exemplars]; an
        # exemplar is (trace id, value, epoch ns of the observation)
        self.children: dict[tuple[str, ...], list] = {}

    def child(self, *labels: str) -> list:
        child = self.children.get(labels)
        if child is None:
            child = self.children[labels] = [[0] * (len(self.bounds) + 1), 0.0, [None] * (len(self.bounds) + 1)]
        return child

    def observe(self, child: list, value: float, trace_id: int = 0, at_ns: int = 0) -> None:
        index = bisect_left(self.bounds, value)
        child[0][index] += 1
        child[1] += value
        if trace_id:
            child[2][index] = (trace_id, value, at_ns or time.time_ns())

    def describe(self):
        from prometheus_client.core import HistogramMetricFamily

        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self):
        from prometheus_client.core import Exemplar, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (counts, total, exemplars) in sorted(self.children.items()):
            cumulative, buckets = 0, cast("list[tuple]", [])
            for le, count, exemplar in zip(les, counts, exemplars):
                cumulative += count
                if exemplar is None:
                    buckets.append((le, cumulative))
                else:
                    trace_id, value, at_ns = exemplar
                    buckets.append(
                        (le, cumulative, Exemplar({EXEMPLAR_TRACE_ID: format(trace_id, "032x")}, value, at_ns / 1e9))
                    )
            family.add_metric(list(labels), buckets, total)
        return [family]


class PipelineCounter:
    """A labelled counter counted by the pipeline thread, as ``PipelineHistogram``:
    one ``[value]`` per label set, read when Prometheus scrapes."""

    def __init__(self, spec: MetricSpec):
        self.name = spec.name.removesuffix("_total")  # prometheus_client adds it back
        self.documentation = spec.help
        self.labelnames = spec.labels
        self.children: dict[tuple[str, ...], list] = {}

    def child(self, *labels: str) -> list:
        child = self.children.get(labels)
        if child is None:
            child = self.children[labels] = [0]
        return child

    def describe(self):
        from prometheus_client.core import CounterMetricFamily

        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (value,) in sorted(self.children.items()):
            family.add_metric(list(labels), value)
        return [family]


class _Locked:
    """Collects collectors in one hold of the lock their writer holds while
    it writes them (``Metrics.lock``): a scrape never sees one write half
    done, nor, of metrics updated together, one updated and another not yet
    (the GPU's idle seconds, and their blame on tools and unattributed, add
    up in every scrape)."""

    def __init__(self, collectors: list, metrics: "Metrics"):
        self.collectors = collectors
        self._metrics = metrics

    def describe(self):
        return [family for collector in self.collectors for family in collector.describe()]

    def collect(self):
        with self._metrics.lock:
            return [family for collector in self.collectors for family in collector.collect()]


def _nothing() -> None:
    pass


def _no_rows() -> Iterable:
    return ()


@dataclass(frozen=True)
class LiveReadings:
    """Where the gauges read at scrape time read from, given to ``Metrics`` when it is made:
    ``instrument()`` gives its running parts (``agent_otel.wiring.instrumentation``); each reads nothing by default.

    ``before_collect`` brings the counters up to date before a scrape reads
    them (the pipeline's drain); ``inflight_calls`` the tool calls in
    flight; ``executor_stats`` each pool's ``ExecutorStats``; ``loop_lags``
    ``(thread, seconds)`` of each event loop, ``thread_label`` folding the
    thread's name; ``gpu_states`` ``(gpu, state, reason)`` of each sampled
    GPU (``LiveTimeline.gpu_states``).
    """

    before_collect: Callable[[], None] = _nothing
    inflight_calls: Callable[[], Iterable[ToolCall]] = _no_rows
    executor_stats: Callable[[], Iterable] = _no_rows
    loop_lags: Callable[[], Iterable[tuple[str, float]]] = _no_rows
    thread_label: Callable[[str], str] = str
    gpu_states: Callable[[], Iterable[tuple[str, str, str]]] = _no_rows


class _LiveGauges:
    """Collector for the gauges read at scrape time (``LiveReadings``)."""

    SPECS = tuple(
        semconv.METRICS[name]
        for name in (
            semconv.METRIC_TOOL_INFLIGHT,
            semconv.METRIC_EXECUTOR_QUEUE_DEPTH,
            semconv.METRIC_EXECUTOR_ACTIVE_WORKERS,
            semconv.METRIC_EXECUTOR_MAX_WORKERS,
            semconv.METRIC_LOOP_LAG,
            semconv.METRIC_GPU_STATE,
        )
    )

    def __init__(self, metrics: "Metrics", live: LiveReadings):
        self._metrics = metrics
        self._live = live

    def describe(self):
        from prometheus_client.core import GaugeMetricFamily

        # Names only, so registering does not run collect() before setup ends.
        return [GaugeMetricFamily(spec.name, "") for spec in self.SPECS]

    def collect(self):
        metrics, live = self._metrics, self._live
        live.before_collect()
        inflight_spec, queue_depth_spec, active_spec, max_workers_spec, lag_spec, gpu_state_spec = self.SPECS
        inflight = _gauge_family(inflight_spec)
        counts: dict[tuple[str, str], int] = {}
        for call in live.inflight_calls():
            key = (metrics.tool_label(call.tool), PHASE_QUEUE if call.start_ns == 0 else PHASE_EXEC)
            counts[key] = counts.get(key, 0) + 1
        for (tool, phase), count in sorted(counts.items()):
            inflight.add_metric([tool, phase], count)
        yield inflight

        queue_depth = _gauge_family(queue_depth_spec)
        active = _gauge_family(active_spec)
        max_workers = _gauge_family(max_workers_spec)
        totals: dict[str, list[int]] = {}
        for stats in live.executor_stats():
            row = totals.setdefault(metrics.executor_label(stats.name), [0, 0, 0])
            row[0] += max(stats.queued, 0)
            row[1] += max(stats.active, 0)
            row[2] += stats.max_workers or 0
        for name, (queued, busy, workers) in sorted(totals.items()):
            queue_depth.add_metric([name], queued)
            active.add_metric([name], busy)
            max_workers.add_metric([name], workers)
        yield queue_depth
        yield active
        yield max_workers

        lag = _gauge_family(lag_spec)
        lags: dict[str, float] = {}
        for thread, seconds in live.loop_lags():
            thread = metrics.thread_values(live.thread_label(thread))
            lags[thread] = max(seconds, lags.get(thread, 0.0))
        for thread, seconds in sorted(lags.items()):
            lag.add_metric([thread], seconds)
        yield lag

        gpu_state = _gauge_family(gpu_state_spec)
        for gpu, state, reason in live.gpu_states():
            gpu_state.add_metric([metrics.gpu_label(gpu), state, metrics.reason_label(reason) if reason else ""], 1)
        yield gpu_state


class _NullMetric:
    """Stands for a prometheus_client metric when the client cannot be imported."""

    def labels(self, *labels: str) -> "_NullMetric":
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


_NULL_METRIC: Any = _NullMetric()

# Metrics' own metrics: the plain tables made with it, and those made with
# prometheus_client on first use (Metrics._build), by their attributes.
_PIPELINE_SPECS = _specs(kept=(KEPT_PIPELINE,))
_REGISTERED_SPECS = _specs(kept=(KEPT_PIPELINE, KEPT_TOGETHER, KEPT_CLIENT))  # in registration order
_CLIENT_ATTRIBUTES = frozenset(
    {"registry"} | {spec.attribute for spec in _REGISTERED_SPECS if spec.kept != KEPT_PIPELINE}
)


class Metrics:
    """Every metric of the telemetry contract, in its own registry.

    Each metric is made from its ``semconv.METRICS`` spec, as the attribute
    the spec names (``metrics.gpu_idle``): the tool-call metrics as plain
    tables (``PipelineCounter``, ``PipelineHistogram``); the registry and
    the metrics kept by ``prometheus_client`` objects when first used
    (module docstring), so making a ``Metrics`` imports no
    ``prometheus_client``.
    """

    registry: CollectorRegistry

    def __init__(
        self,
        *,
        tool_name_limit: int = DEFAULTS.tool_name_limit,
        executor_name_limit: int = DEFAULTS.executor_name_limit,
        registry: Optional[CollectorRegistry] = None,
        gpu_pool: str = "",
        live: LiveReadings = LiveReadings(),
    ):
        self._given_registry = registry
        self._live = live
        self._gpu_pool = gpu_pool
        self._build_lock = threading.Lock()
        # Every label whose values come from outside goes through one of these.
        self.tool_label = LabelValues(tool_name_limit)
        self.executor_label = LabelValues(executor_name_limit)
        self.gpu_label = LabelValues(GPU_LABEL_LIMIT)
        self.model_label = LabelValues(tool_name_limit)  # gen_ai.request.model, capped as tool names are
        self.reason_label = LabelValues(REASON_LABEL_LIMIT)
        self.thread_values = LabelValues(THREAD_LABEL_LIMIT)  # after thread_label's folding
        # Held by the pipeline thread while it observes a batch, and by a
        # scrape while it reads the tool metrics: a scrape never sees half a batch.
        self.lock = threading.RLock()
        for spec in _PIPELINE_SPECS:  # calls, duration, queue, exec, executor_wait
            setattr(self, spec.attribute, (PipelineHistogram if spec.kind == HISTOGRAM else PipelineCounter)(spec))
        self._children: dict[tuple, tuple] = {}
        # executor name -> its wait histogram's child (observe_waits)
        self._wait_children: dict[str, list] = {}
        # The wait histogram's bounds in whole nanoseconds: a wait of n ns is at most b seconds when n <= floor(b * 1e9).
        self._wait_bounds_ns = tuple(math.floor(bound * 1e9) for bound in self.executor_wait.bounds)
        self.remedies = RemedyMetrics(lambda: self.registry, self.tool_label, self.executor_label)
        forks.after_fork_in_child(self.reinit_after_fork)

    if TYPE_CHECKING:  # the metrics: the attributes semconv.METRICS names, made from their specs

        def __getattr__(self, name: str) -> Any: ...

    else:

        def __getattr__(self, name: str) -> Any:
            # Only for attributes not set yet: the prometheus_client ones, before _build().
            if name in _CLIENT_ATTRIBUTES:
                try:
                    self._build()
                except ImportError:
                    if name == "registry":
                        raise
                return self.__dict__[name]
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _build(self) -> None:
        """Make the registry and the prometheus_client metrics (once, on the thread that first needs them).

        If prometheus_client cannot be imported (a broken install), the
        metrics count nothing, one line says so, and only asking for the
        registry raises (``ImportError``): the agent goes on.
        """
        with self._build_lock:
            if "registry" in self.__dict__:
                return
            try:
                with forks.background_import():  # on whichever thread first needs it: a fork waits
                    # Every prometheus_client module this file imports later, on any thread
                    # (registering and scraping import .core): all loaded here, while a fork waits.
                    import prometheus_client.core  # noqa: F401
                    from prometheus_client import CollectorRegistry, Info
            except ImportError as exc:
                if "gpu_idle" not in self.__dict__:
                    logger.warning("agent-otel: metrics count nothing: prometheus_client cannot be imported (%s)", exc)
                    self.__dict__.update(dict.fromkeys(_CLIENT_ATTRIBUTES - {"registry"}, _NULL_METRIC))
                    self.remedies.register(None)
                raise

            r = self._given_registry or CollectorRegistry(auto_describe=True)
            # Registered first: its collect() brings the counters up to date
            # (before_collect) before the registry reads the others.
            collectors: list[Any] = [_LiveGauges(self, self._live)]
            # The rest in the order of semconv.METRICS; the metrics kept
            # together (GPU time and its blame, updated together by the live
            # timeline under ``lock``) are collected together, where the first
            # of them is.
            together: list[Any] = []
            made: dict[str, Any] = {}
            for spec in _REGISTERED_SPECS:
                if spec.kept == KEPT_PIPELINE:
                    collectors.append(_Locked([getattr(self, spec.attribute)], self))
                    continue
                metric = made[spec.attribute] = _client_metric(spec, None)
                if spec.kept == KEPT_CLIENT:
                    collectors.append(metric)
                else:
                    if not together:
                        collectors.append(_Locked(together, self))
                    together.append(metric)
            for collector in collectors:
                r.register(collector)
            for kind in SPAN_KINDS:  # every kind shows, at 0, before anything is lost
                made["spans_dropped"].labels(kind)
            self.remedies.register(r)
            if self._gpu_pool:
                # The resource attribute the pool rules join on, the way the
                # OpenTelemetry Prometheus exporters expose resource attributes.
                Info("target", "Resource attributes of this process: its GPU pool (agent.gpu.pool).", registry=r).info(
                    {"agent_gpu_pool": self._gpu_pool}
                )
            self.__dict__.update(made)
            self.registry = r  # last: its presence says the rest is made

    def reinit_after_fork(self) -> None:
        """In a forked child: no lock may stay held by a thread that is gone."""
        self.lock = threading.RLock()
        self._build_lock = threading.Lock()
        registry = self.__dict__.get("registry")
        if registry is None:
            return  # prometheus_client's objects are not made yet
        for collector in list(getattr(registry, "_collector_to_names", {})):
            for each in collector.collectors if isinstance(collector, _Locked) else (collector,):
                _reinit_client_locks(each)
        _reinit_client_locks(registry)

    def dropped(self, kind: str, count: int) -> None:
        """Spans of ``kind`` that no sink could take (``exporters.batch.SpanLosses`` calls it)."""
        self.spans_dropped.labels(kind).inc(count)

    def observe_calls(self, calls: Iterable[ToolCall]) -> None:
        """Count finished tool calls. Runs on the pipeline thread, holding ``lock``.

        One loop with everything in locals: the histograms' bisect and
        exemplar by hand (``PipelineHistogram.observe``), about a microsecond
        per call.
        """
        children = self._children
        bounds = self.duration.bounds
        if not (bounds == self.queue.bounds == self.exec.bounds):
            for call in calls:  # different buckets: the plain way
                self._observe_call(call)
            return
        for call in calls:
            key = (call.tool, call.executor, call.outcome)
            child = children.get(key)
            if child is None:
                child = self._children_of(key)
            count, duration, queue, exec_ = child
            count[0] += 1
            submit, start, end, trace_id = call.submit_ns, call.start_ns, call.end_ns, call.trace_id
            value = (end - submit) / 1e9
            index = bisect_left(bounds, value)
            duration[0][index] += 1
            duration[1] += value
            if start == submit:
                # No wait (a direct call): the queue's first bucket and nothing
                # to add to its sum; exec is the whole duration, same bucket.
                queue[0][0] += 1
                exec_[0][index] += 1
                exec_[1] += value
                if trace_id:
                    duration[2][index] = exec_[2][index] = (trace_id, value, end)
                continue
            if trace_id:
                duration[2][index] = (trace_id, value, end)
            value = (start - submit) / 1e9
            index = bisect_left(bounds, value)
            queue[0][index] += 1
            queue[1] += value
            value = (end - start) / 1e9
            index = bisect_left(bounds, value)
            exec_[0][index] += 1
            exec_[1] += value
            if trace_id:
                exec_[2][index] = (trace_id, value, end)

    def _children_of(self, key: tuple[str, str, str]) -> tuple:
        tool_name, executor_name, outcome = key
        tool, executor = self.tool_label(tool_name), self.executor_label(executor_name)
        children = (
            self.calls.child(tool, outcome),
            self.duration.child(tool),
            self.queue.child(tool, executor),
            self.exec.child(tool),
        )
        if len(self._children) < 100_000:
            self._children[key] = children
        return children

    def _observe_call(self, call: ToolCall) -> None:
        count, duration, queue, exec_ = self._children_of((call.tool, call.executor, call.outcome))
        count[0] += 1
        self.duration.observe(duration, (call.end_ns - call.submit_ns) / 1e9, call.trace_id, call.end_ns)
        self.queue.observe(queue, (call.start_ns - call.submit_ns) / 1e9)
        self.exec.observe(exec_, (call.end_ns - call.start_ns) / 1e9, call.trace_id, call.end_ns)

    def observe_block(self, block: LoopBlock) -> None:
        """One finished stretch of a blocked event loop. Pipeline thread."""
        self.loop_blocked.labels(self.tool_label(block.tool) if block.tool else BLOCKED_BY_UNKNOWN).inc(block.seconds)

    def observe_waits(self, waits: Iterable[tuple[str, deque[int]]]) -> None:
        """Submissions' waits for a worker, per executor name a deque of
        nanoseconds (one per submission; the workers append on the right
        meanwhile and wait for the next drain). Each batch is taken off and
        counted in C: sorted, then each bucket's count is where its bound
        falls in the batch (``bisect``), so the Python loop runs per bucket,
        not per wait. Pipeline thread, holding ``lock``."""
        histogram = self.executor_wait
        bounds_ns = self._wait_bounds_ns
        children = self._wait_children
        for executor, queue in waits:
            taken = list(islice(iter(queue.popleft, None), len(queue)))
            taken.sort()
            child = children.get(executor)
            if child is None:
                child = histogram.child(self.executor_label(executor))
                if len(children) < 10_000:
                    children[executor] = child
            counts = child[0]
            below = 0
            for index, bound_ns in enumerate(bounds_ns):
                upto = bisect_right(taken, bound_ns, below)
                counts[index] += upto - below
                below = upto
            counts[-1] += len(taken) - below
            child[1] += sum(taken) / 1e9


def _reinit_client_locks(obj, depth: int = 0) -> None:
    """Make every lock prometheus_client keeps in ``obj`` (and its children) free again.

    prometheus_client takes a lock per metric, per labelled child and per
    value, and does nothing at fork: a lock another thread held then would
    hang the child's next scrape. The locks are found by type among the
    attributes of prometheus_client's own objects, so the walk follows the
    library's layout without naming it.
    """
    if depth > 4 or not type(obj).__module__.startswith("prometheus_client"):
        return
    for name, value in list(vars(obj).items()) if hasattr(obj, "__dict__") else ():
        if isinstance(value, _LOCK_TYPES):
            reinit = getattr(value, "_at_fork_reinit", None)
            if reinit is not None:
                reinit()
            else:
                setattr(obj, name, type(value)())
        elif isinstance(value, dict):
            for child in list(value.values()):
                _reinit_client_locks(child, depth + 1)
        elif isinstance(value, (list, tuple)):
            for child in value:
                _reinit_client_locks(child, depth + 1)
        else:
            _reinit_client_locks(value, depth + 1)
    for name in getattr(type(obj), "__slots__", ()):
        value = getattr(obj, name, None)
        if isinstance(value, _LOCK_TYPES) and hasattr(value, "_at_fork_reinit"):
            value._at_fork_reinit()


_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


# ---------------------------------------------------------------- remedies
# Metrics of agent_otel.remedies (pools, timeouts, retries, fallbacks, cache,
# batching), beyond the contract's list. The remedies count them on the
# caller's thread, only when a remedy acts, on cached label children.


class RemedyMetrics:
    """The remedies' counters, made in the registry ``registry()`` gives when a remedy
    first counts (``Metrics`` makes its registry then), or by ``register``."""

    SPECS = _specs(kept=(KEPT_CLIENT,), remedy=True)

    def __init__(self, registry: Callable[[], CollectorRegistry], tool_label: LabelValues, executor_label: LabelValues):
        self._registry = registry
        self._tool_label = tool_label
        self._executor_label = executor_label
        self._children: dict[tuple, object] = {}

    def register(self, r: Optional[CollectorRegistry]) -> None:
        """Make the counters in ``r``: once, from ``Metrics._build`` (None: count nothing)."""
        for spec in self.SPECS:
            setattr(self, spec.attribute, _NULL_METRIC if r is None else _client_metric(spec, r))

    if TYPE_CHECKING:  # the metrics: the attributes SPECS name, made by register

        def __getattr__(self, name: str) -> Any: ...

    else:

        def __getattr__(self, name: str) -> Any:
            # A counter before register(): making the registry makes them (Metrics._build).
            if not name.startswith("_"):
                try:
                    self._registry()
                except ImportError:
                    pass  # Metrics._build counted nothing and said why
                if name in self.__dict__:
                    return self.__dict__[name]
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _child(self, metric, *labels):
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def fallback(self, tool: str) -> None:
        self._child(self.fallbacks, self._tool_label(tool)).inc()

    def retry(self, tool: str) -> None:
        self._child(self.retries, self._tool_label(tool)).inc()

    def rejection(self, tool: str, executor: str) -> None:
        self._child(self.rejections, self._tool_label(tool) if tool else "", self._executor_label(executor)).inc()

    def cache_hit(self, tool: str) -> None:
        self._child(self.cache_hits, self._tool_label(tool)).inc()

    def cache_miss(self, tool: str) -> None:
        self._child(self.cache_misses, self._tool_label(tool)).inc()

    def cache_evictions(self, tool: str, count: int) -> None:
        self._child(self.cache_evicted, self._tool_label(tool)).inc(count)

    def batch(self, tool: str, size: int, waits: Iterable[float]) -> None:
        tool = self._tool_label(tool)
        self._child(self.batch_size, tool).observe(size)
        wait = self._child(self.batch_wait, tool)
        for seconds in waits:
            wait.observe(seconds)

    def abandoned(self, executor: str, change: int) -> None:
        self._child(self.abandoned_workers, self._executor_label(executor)).inc(change)


# ---------------------------------------------------------------- blame service
# The blame service of a GPU pool (agent-otel gpu-exporter --pool): what its
# OTLP receiver took, refused and took late, beside the GPU metrics above.


class BlameServiceMetrics:
    """The blame service's own metrics, in the contract's registry.

    ``held_calls``, ``dropped_calls`` and ``lag_s`` are read when Prometheus
    scrapes; the others are made from their specs, as the attributes they name.
    """

    SPECS = _specs(kept=(KEPT_CLIENT,), blame_service=True)

    if TYPE_CHECKING:  # the metrics: the attributes SPECS name

        def __getattr__(self, name: str) -> Any: ...

    def __init__(
        self,
        registry: CollectorRegistry,
        tool_label: LabelValues,
        *,
        held_calls: Callable[[], int],
        dropped_calls: Callable[[], int],
        lag_s: Callable[[], float],
    ):
        self._tool_label = tool_label
        for spec in self.SPECS:  # received, refused_spans, refused_requests, late, delay
            setattr(self, spec.attribute, _client_metric(spec, registry))
        registry.register(_BlameServiceGauges(held_calls, dropped_calls, lag_s))

    def late_spans(self, tool: str, count: int) -> None:
        self.late.labels(self._tool_label(tool)).inc(count)


class _BlameServiceGauges:
    def __init__(self, held_calls: Callable[[], int], dropped_calls: Callable[[], int], lag_s: Callable[[], float]):
        self._held, self._dropped, self._lag = held_calls, dropped_calls, lag_s

    def describe(self):
        return list(self.collect())

    def collect(self):
        spec = semconv.METRICS
        held = _gauge_family(spec[semconv.METRIC_BLAME_CALLS])
        held.add_metric([], self._held())
        yield held
        from prometheus_client.core import CounterMetricFamily

        dropped = spec[semconv.METRIC_BLAME_CALLS_DROPPED]
        family = CounterMetricFamily(dropped.name.removesuffix("_total"), dropped.help)
        family.add_metric([], self._dropped())
        yield family
        lag = _gauge_family(spec[semconv.METRIC_BLAME_LAG])
        lag.add_metric([], self._lag())
        yield lag


class MetricsServer:
    """/metrics over HTTP, in the Prometheus text or OpenMetrics format (by Accept)."""

    def __init__(self, registry: CollectorRegistry, port: int, address: str = "127.0.0.1"):
        from prometheus_client.exposition import start_http_server

        self._httpd, self._thread = start_http_server(port, addr=address, registry=registry)
        self._thread.name = "agent-otel-metrics-server"
        self.address = address
        self.port = self._httpd.server_port
        self.serving = True
        forks.after_fork_in_child(self.reinit_after_fork)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def reinit_after_fork(self) -> None:
        """In a forked child: the port stays the parent's; close the child's copy of its socket.

        (Its serving thread is not in the child; ``shutdown()`` would wait for
        that thread for good.)
        """
        self.serving = False
        try:
            self._httpd.socket.close()
        except OSError:
            pass

    def shutdown(self, timeout_s: float = 1.0) -> bool:
        """Stop serving and free the port; True if the server thread ended within ``timeout_s``
        (it does within 0.5 s)."""
        if not self.serving:
            return True
        self.serving = False
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
