"""Tool calls + GPU idle windows -> the report (the contract's JSON).

GPU idle windows come from GPU logs when the user gives them (read by
``agent_otel.gpu.logs``, cut into windows by ``agent_otel.gpu.timeline`` with
the report's threshold and minimum idle time), otherwise from the
window-level ``gpu.idle`` spans in the traces. Either way they are clipped
to the traces' time window (idle time before the first span or after the
last cannot be blamed on anything the traces show) and blamed by
``agent_otel.attribution``, the same code the live path runs. Calls and
windows carry the GPU pool of the process that recorded them; a window is
blamed only on the calls of its pool, so the traces of several services
and pools can be merged into one report. GPU logs belong to the pool given
as ``gpu_pool`` ("" by default: the pool of processes that declared none).

Percentiles: see ``stats.percentile``. Seconds in the JSON are rounded to
the microsecond.

From a GPU log the report also knows the GPUs' unused capacity,
``(1 - utilization) x time``, and blames it by the same rule
(``agent_otel.report.underuse``): the ``gpu_underused_*`` keys, ``null``
when GPU idle time comes from ``gpu.idle`` spans alone. Tools are ranked by
it when it is known (a tool that drags the GPU from 95% to 30% ranks above
one that idled it for half a second), else by their blamed idle time.
"""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_left
from itertools import compress
from operator import attrgetter
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from agent_otel.attribution import BlameTotals, WindowAttribution, attribute, gpu_key
from agent_otel.attribution.edges import sharpen
from agent_otel.gpu.logs import GpuLog, GpuSeries, read_gpu_log
from agent_otel.support.prices import GpuPrices
from agent_otel.records import NS_PER_S, AgentRun, IdleWindow, LoopBlock, ModelCall
from agent_otel.spans.calls import CallTable
from agent_otel.report.cost import Costs, price_analysis
from agent_otel.report.kv_cache import KvCacheHeld
from agent_otel.report.parts import report_parts, rfc3339
from agent_otel.report.server_spans import ServerSpans, join_server_requests
from agent_otel.report.columns import CallColumns, Names, seconds_sorted, total
from agent_otel.report.reader import InnerFailures, TraceData, paused_gc, read_traces
from agent_otel.report.recommendations import Recommendation, recommend
from agent_otel.report.slos import SloCompliance, compliance
from agent_otel.report.underuse import Underuse, read_underuse
from agent_otel.report.stats import peak_depth, percentile
from agent_otel.report.turns import ModelStats, Turn, TurnTotals, find_turns, model_stats
from agent_otel.report.waits import (
    CpuStats,
    LoopBlockStats,
    LoopStats,
    cpu_stats,
    loop_block_stats,
)
from agent_otel.slo import Slos
from agent_otel.semconv import (
    AGENT_TOOL_UNFINISHED,
    ERROR_OUTCOMES,
    MODEL_PHASE_DECODE,
    MODEL_PHASE_QUEUED,
    PHASE_EXEC,
    PHASE_QUEUE,
    SIMULATED_GPU_NAME,
    SIMULATED_GPU_UUID_PREFIX,
)

# A call that waited less than this for a worker did not queue: the hand-off
# to an idle worker (a thread woken, on a loaded host some milliseconds).
QUEUED_MIN_S = 0.010
GPU_FROM_LOGS = "gpu-log"
GPU_FROM_TRACES = "traces"
GPU_NONE = "none"

# Where idle windows' edges come from (``analyse(edges=...)``, ``--gpu-edges``):
EDGES_SPANS = "spans"  # moved to the model calls' edges (attribution.edges)
EDGES_SAMPLES = "samples"  # as the GPU's samples have them
EDGES = (EDGES_SPANS, EDGES_SAMPLES)
# Over this share of the time model calls were in flight read idle, the GPU
# data contradicts the model calls: the report warns (docs/report.md).
MODEL_IDLE_WARN_RATIO = 0.2


@dataclass
class ToolStats:
    tool: str
    calls: int
    errors: int
    duration_s: Sequence[float]  # sorted (an array of doubles: 8 bytes a call)
    exec_s: Sequence[float]  # sorted
    queue_s: Sequence[float]  # sorted
    executors: list[str]
    blocked_queue_s: float = 0.0
    blocked_exec_s: float = 0.0
    live_blocked_s: Optional[float] = None
    timeout_s: Optional[float] = None
    cpu: Optional[CpuStats] = None  # the CPU time of its calls that carry one (waits.py)
    loop: Optional[LoopBlockStats] = None  # the event-loop blocks it caused
    loop_idle_blocked_s: float = 0.0  # GPU idle blamed on it while it blocked a loop
    # Unused GPU capacity blamed on the tool (GPU-seconds); None without utilization samples.
    underused_queue_s: Optional[float] = None
    underused_exec_s: Optional[float] = None

    @property
    def blocked_s(self) -> float:
        return self.blocked_queue_s + self.blocked_exec_s

    @property
    def underused_s(self) -> Optional[float]:
        if self.underused_queue_s is None or self.underused_exec_s is None:
            return None
        return self.underused_queue_s + self.underused_exec_s

    @property
    def rank_s(self) -> float:
        """What the tools are ranked by: unused capacity where known, else idle time."""
        underused = self.underused_s
        return self.blocked_s if underused is None else underused


@dataclass
class ModelBlame:
    """The model server's share of one model's GPU time: idle (and unused)
    GPU time while its calls were in flight (docs/attribution.md)."""

    model: str
    idle_queued_s: float = 0.0
    idle_decode_s: float = 0.0
    underused_s: Optional[float] = None  # GPU-seconds; None without utilization samples

    @property
    def idle_s(self) -> float:
        return self.idle_queued_s + self.idle_decode_s


@dataclass
class ExecutorStats:
    executor: str
    submissions: int
    wait_p95_s: float
    max_queue_depth: int  # most calls queued at once, of those that waited QUEUED_MIN_S or more
    queued_calls: int  # calls that waited QUEUED_MIN_S or more
    peak_in_flight: int  # most calls submitted and not finished at once
    max_concurrent_exec: int  # most calls executing at once
    queue_total_s: float
    exec_total_s: float
    tools: list[str]
    max_workers: Optional[int] = None


@dataclass
class GpuStats:
    gpu: str
    observed_s: float
    idle_s: float
    idle_blocked_s: float
    idle_unattributed_s: float
    uuid: Optional[str] = None
    # From utilization samples (a GPU log); None without them.
    underused_s: Optional[float] = None
    underused_blocked_s: Optional[float] = None
    underused_unattributed_s: Optional[float] = None
    missing_s: Optional[float] = None
    utilization_avg: Optional[float] = None
    simulated: bool = False  # a simulated GPU's data (agent.gpu.source, its name or UUID), not a real GPU's
    # the model server's share: idle time while model calls of its pool were in flight
    idle_model_s: float = 0.0
    underused_model_s: Optional[float] = None
    model_in_flight_s: float = 0.0  # time some model call of its pool was in flight, inside the observed time
    idle_samples_s: Optional[float] = None  # idle time with the samples' edges, where edges moved
    edges_moved: int = 0  # window edges moved to a model call's edge

    @property
    def busy_s(self) -> float:
        return max(0.0, self.observed_s - self.idle_s)

    @property
    def model_idle_ratio(self) -> Optional[float]:
        """The share of the time model calls were in flight that the GPU read idle."""
        return self.idle_model_s / self.model_in_flight_s if self.model_in_flight_s > 0 else None


@dataclass
class GpuLogInfo:
    path: str
    samples: int
    start_ns: int
    end_ns: int
    overlaps_traces: bool
    sample_interval_s: float = 0.0  # the median time between a GPU's samples


@dataclass
class Analysis:
    """Everything the renderers need: the records, the blame, the stats."""

    trace_paths: list[str]
    start_ns: int
    end_ns: int
    calls: CallTable  # by (submit, start) time
    windows: list[IdleWindow]
    attributions: list[WindowAttribution]  # empty with analyse(records=False)
    samples: dict[str, GpuSeries]  # gpu -> samples in the window (GpuSample when iterated), by time
    gpu_source: str
    idle_threshold: float
    min_idle_s: float
    edges: str = EDGES_SPANS
    tools: list[ToolStats] = field(default_factory=list)
    model_blame: list[ModelBlame] = field(default_factory=list)  # the model server's share, by model, largest first
    executors: list[ExecutorStats] = field(default_factory=list)
    gpus: list[GpuStats] = field(default_factory=list)
    gpu_logs: list[GpuLogInfo] = field(default_factory=list)
    span_count: int = 0
    duplicate_spans: int = 0  # spans seen again (the same trace and span id), counted once
    skipped_spans: int = 0  # spans left out for a field the report cannot read (one warning per input)
    first_skipped: Optional[tuple[str, int, str]] = None  # the first of them (input, line, why)
    empty_inputs: list[str] = field(default_factory=list)  # trace inputs with nothing in them
    warnings: list[str] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    slos: list[SloCompliance] = field(default_factory=list)  # each tool's latency SLO compliance, breaking first
    loop_blocks: list[LoopBlock] = field(default_factory=list)  # asyncio.loop.blocked spans
    loops: list[LoopStats] = field(default_factory=list)  # per event loop thread, most blocked first
    loop_unknown: Optional[LoopBlockStats] = None  # blocks no tool call held
    underuse: Optional[Underuse] = None  # unused GPU capacity, from a GPU log
    # the model's side of the turn, and the turns (report.turns)
    model_calls: list[ModelCall] = field(default_factory=list)
    agent_runs: list[AgentRun] = field(default_factory=list)
    models: list[ModelStats] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)  # empty with analyse(turns=False)
    turn_totals: TurnTotals = field(default_factory=TurnTotals)
    peer_tool_spans: int = 0
    peer_tool_spans_merged: int = 0
    services: dict[str, int] = field(default_factory=dict)  # service.name -> spans, as read
    cpu_count: Optional[int] = None  # the agent processes' CPUs (agent.process.cpu.count), smallest
    simulated_gpus: set[str] = field(default_factory=set)  # GPUs (gpu_key) a simulated GPU stood for
    inner_failures: dict[int, InnerFailures] = field(default_factory=dict)  # by trace_id << 64 | span_id
    # Where the windows' edges moved to the model calls' (edges "spans"): the
    # idle time per GPU with the samples' own edges, and the edges moved.
    raw_idle_s: Optional[dict[str, float]] = None
    edges_moved: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, tuple[int, int]] = field(default_factory=dict)  # per GPU: the stretch its data covers
    nested_tools: set[str] = field(default_factory=set)  # tools called from inside another tool's call
    blame: Optional[BlameTotals] = None  # the idle time blamed, per (gpu, tool, phase)
    gpu_names: dict[str, str] = field(default_factory=dict)  # gpu_key -> the GPU's name, from a GPU log
    costs: Optional[Costs] = None  # the money of the blame, with gpu_hour_price (report.cost)
    server_spans: Optional[ServerSpans] = None  # the model servers' spans joined to the model calls
    kv_cache: Optional[KvCacheHeld] = None  # the model server's KV cache held per tool (report.kv_cache)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    def blocked_by_call(self) -> dict[int, float]:
        """GPU idle seconds blamed on each call (summed over GPUs), keyed by ``id(call)``."""
        blocked: dict[int, float] = defaultdict(float)
        for attribution in self.attributions:
            for share in attribution.shares:
                blocked[id(share.call)] += share.blocked_s
        return blocked


def analyse(
    trace_paths: Sequence[str],
    gpu_log_paths: Sequence[str] = (),
    *,
    tz: Optional[str] = None,
    idle_threshold: float,
    min_idle_s: float,
    progress: Optional[Callable[[int], None]] = None,
    gpu_pool: str = "",
    slos: Optional[Slos] = None,
    call_ids: bool = True,
    turns: bool = True,
    records: bool = True,
    edges: str = EDGES_SPANS,
    prices: Optional[GpuPrices] = None,
) -> Analysis:
    """Read the inputs, attribute GPU idle time, compute every statistic.

    ``edges``: ``spans`` moves the idle windows' edges read from a GPU log
    to the model calls' edges (``attribution.edges``); ``samples`` keeps the
    samples' own (the GPU busy and idle time as the samples alone say).

    ``call_ids``: keep each call's ``gen_ai.tool.call.id``, which only the
    HTML and Perfetto outputs show (``read_traces``). ``turns``: keep
    every turn in ``turns``, which only they draw (``find_turns``); the
    JSON and the table read the totals. ``records``: keep every call's
    ``ToolCall`` record (``CallTable.keep``) and every window's attribution
    (``attributions``), which only they map onto each other; without it the
    calls stay columns, and the blame only its totals.

    ``slos``: the latency SLO of each tool (``Slos()``, 95% within 0.8 s for
    every tool, the alert rules' default, when None).

    ``prices``: what a GPU-hour costs (``agent_otel.support.prices``): the blamed
    idle time as money (``costs``, and in the recommendations); None: none.

    Python's cyclic garbage collector is paused throughout (``paused_gc``):
    nothing here makes reference cycles, and its rescans of the growing
    heap made the cost per span grow with the input.
    """
    with paused_gc():
        if edges not in EDGES:
            raise ValueError(f"edges must be one of {', '.join(EDGES)}, got {edges!r}")
        analysis = _analyse(
            trace_paths,
            gpu_log_paths,
            tz,
            idle_threshold,
            min_idle_s,
            progress,
            gpu_pool,
            call_ids,
            turns,
            records,
            edges,
        )
        analysis.slos = compliance({tool.tool: tool.duration_s for tool in analysis.tools}, slos or Slos())
        price_analysis(analysis, prices)
        return analysis


def _analyse(
    trace_paths: Sequence[str],
    gpu_log_paths: Sequence[str],
    tz: Optional[str],
    idle_threshold: float,
    min_idle_s: float,
    progress: Optional[Callable[[int], None]],
    gpu_pool: str,
    call_ids: bool,
    turns: bool,
    records: bool,
    edges: str = EDGES_SPANS,
) -> Analysis:
    traces = read_traces(trace_paths, progress, call_ids)
    calls = traces.calls
    _by_submit(calls)
    if records:
        calls.keep()
    analysis = Analysis(
        trace_paths=list(trace_paths),
        start_ns=traces.start_ns,
        end_ns=traces.end_ns,
        calls=calls,
        windows=[],
        attributions=[],
        samples={},
        gpu_source=GPU_NONE,
        idle_threshold=idle_threshold,
        min_idle_s=min_idle_s,
        edges=edges,
        span_count=traces.span_count,
        duplicate_spans=traces.duplicate_count,
        skipped_spans=traces.skipped_spans,
        first_skipped=traces.first_skipped,
        empty_inputs=traces.empty_inputs,
        warnings=list(traces.warnings),
        services=traces.services,
        cpu_count=traces.cpu_count,
        simulated_gpus=set(traces.simulated_gpus),
        inner_failures=traces.inner_failures,
        nested_tools=traces.nested_tools,
    )
    if traces.span_count and not calls:
        analysis.warnings.append("no tool spans (gen_ai.operation.name = execute_tool) in the traces")
    analysis.loop_blocks = traces.loop_blocks
    observed = _gpu_inputs(analysis, traces, gpu_log_paths, tz, gpu_pool)
    analysis.warnings.extend(_pool_warnings(analysis.calls, analysis.windows))
    for tool, count in sorted(traces.unfinished.items()):
        analysis.warnings.append(
            f"{tool}: 1 call was still running when its agent shut down ({AGENT_TOOL_UNFINISHED}): its span, "
            "its duration and the GPU idle time blamed on it end there"
            if count == 1
            else f"{tool}: {count} calls were still running when their agent shut down ({AGENT_TOOL_UNFINISHED}): "
            "their spans, durations and the GPU idle time blamed on them end there"
        )
    columns = CallColumns(analysis.calls)
    in_windows = _in_windows(columns, analysis.windows)
    totals = BlameTotals()
    kv_cache = KvCacheHeld(traces.kv_windows) if traces.kv_windows else None
    models = traces.model_calls
    meeting = _models_in_windows(models, analysis.windows)
    for window_attribution in _attribute(analysis.windows, calls, in_windows, analysis.loop_blocks, meeting):
        totals.add(window_attribution)
        if kv_cache is not None:
            kv_cache.add(window_attribution)
        if records:
            analysis.attributions.append(window_attribution)
    analysis.tools = _tool_stats(columns, totals, traces, analysis.underuse)
    analysis.model_blame = _model_blame(totals, analysis.underuse)
    analysis.executors = _executor_stats(columns)
    names = {"tool": columns.tool, "executor": columns.executor, "outcome": columns.outcome}  # a byte a call each
    del columns  # before the turns, where the memory peaks
    _add_waits(analysis, in_windows)
    _turn_inputs(analysis, traces, turns)
    analysis.gpus = _gpu_stats(analysis, totals, observed)
    analysis.blame = totals
    analysis.kv_cache = kv_cache if kv_cache is not None and kv_cache.matched else None
    _model_contradictions(analysis, models)
    analysis.recommendations = recommend(analysis, names)
    return analysis


def _by_submit(calls: CallTable) -> None:
    """Order the calls by (submit, start) time, ties in the order read (a stable sort)."""
    order = np.lexsort((np.frombuffer(calls.start_ns, np.uint64), np.frombuffer(calls.submit_ns, np.uint64)))
    if np.any(order != np.arange(len(order))):  # (in order already: nothing to move)
        calls.select(order.tolist())


def _turn_inputs(analysis: Analysis, traces: TraceData, keep: bool) -> None:
    """The model calls, the agent runs and the turns they make (report.turns)."""
    analysis.model_calls = sorted(traces.model_calls, key=_START)
    analysis.agent_runs = sorted(traces.agent_runs, key=_START)
    analysis.models = model_stats(analysis.model_calls)
    analysis.turns, analysis.turn_totals = find_turns(
        analysis.calls, analysis.model_calls, analysis.agent_runs, traces.roots, keep, traces.loop_blocks
    )
    if traces.server_requests:
        analysis.server_spans = join_server_requests(analysis.model_calls, traces.server_requests)
    analysis.peer_tool_spans = traces.peer_tool_spans
    analysis.peer_tool_spans_merged = traces.peer_tool_spans_merged


def _gpu_inputs(
    analysis: Analysis, traces: TraceData, gpu_log_paths: Sequence[str], tz: Optional[str], gpu_pool: str
) -> dict[str, float]:
    """Fill the analysis's windows and samples; return seconds observed per GPU (by ``gpu_key``)."""
    start, end = analysis.start_ns, analysis.end_ns
    if gpu_log_paths:
        analysis.gpu_source = GPU_FROM_LOGS
        logs = []
        for path in gpu_log_paths:
            log = read_gpu_log(path, tz)
            info = GpuLogInfo(
                path=str(path),
                samples=len(log),
                start_ns=log.start_ns,
                end_ns=log.end_ns,
                overlaps_traces=any(series.overlaps(start, end) for series in log.series.values()),
            )
            info.sample_interval_s = log.median_spacing_s()
            analysis.gpu_logs.append(info)
            if not info.overlaps_traces:
                analysis.warnings.append(_no_overlap_message(info, start, end))
            elif info.sample_interval_s > analysis.min_idle_s:
                analysis.warnings.append(_coarse_log_message(info, analysis.min_idle_s))
            logs.append(log)
        combined = GpuLog.merge(logs)
        del logs
        for gpu in combined.series:
            if combined.names.get(gpu):
                analysis.gpu_names[f"{gpu_pool}/{gpu}" if gpu_pool else gpu] = combined.names[gpu]
            if combined.names.get(gpu) == SIMULATED_GPU_NAME or combined.uuids.get(gpu, "").startswith(
                SIMULATED_GPU_UUID_PREFIX
            ):
                analysis.simulated_gpus.add(f"{gpu_pool}/{gpu}" if gpu_pool else gpu)
        steps = combined.steps(analysis.idle_threshold, analysis.min_idle_s, pool=gpu_pool)
        models = traces.model_calls
        windows, analysis.underuse = read_underuse(steps, analysis.calls, start, end, analysis.loop_blocks, models)
        windows.sort(key=_START_GPU)
        periods = {(gpu_pool, gpu): _period_ns(series.times) for gpu, series in combined.series.items()}
        if models and analysis.edges == EDGES_SPANS:
            raw = windows
            windows, moved = sharpen(windows, models, periods)
            if moved:
                analysis.raw_idle_s = _idle_by_gpu(_clip(raw, start, end))
                analysis.edges_moved = _moved_by_gpu(raw, windows)
        for gpu, seconds in sorted(analysis.underuse.missing_s.items()):
            analysis.warnings.append(
                f"GPU {gpu}: {seconds:.3g} s of its utilization samples are missing (gaps in the GPU log): "
                "that time is neither idle nor busy, and nothing is blamed for it"
            )
        observed: dict[str, float] = {}
        for gpu, series in combined.series.items():
            key = f"{gpu_pool}/{gpu}" if gpu_pool else gpu
            first, last = series.times[0], series.times[-1]
            observed[key] = max(0, min(last, end) - max(first, start)) / NS_PER_S
            analysis.coverage[key] = (max(first, start), min(last, end))
            around = series.around(start, end)
            if len(around):
                analysis.samples[key] = around
    else:
        windows = union_per_gpu(traces.idle_windows)
        if windows:
            analysis.gpu_source = GPU_FROM_TRACES
        observed = {gpu_key(window): analysis.seconds for window in windows}
        analysis.coverage = {gpu: (start, end) for gpu in observed}
    analysis.windows = _clip(windows, start, end)
    return observed


# Calls per attribute() call: its working memory (a few hundred bytes a
# call) stays bounded however many calls the traces hold.
ATTRIBUTION_GROUP = 20_000


def _attribute(
    windows: Sequence[IdleWindow],
    calls: CallTable,
    rows: np.ndarray,
    blocks: Sequence[LoopBlock] = (),
    models: Sequence[ModelCall] = (),
) -> Iterator[WindowAttribution]:
    """``attribute`` over the calls of these rows, in groups of windows and
    calls that do not meet in time, one group at a time: the same blame (a
    window's depends only on the calls in flight during it), with bounded
    working memory; each group's records are made for it alone. With
    event-loop blocks (which tie calls together) it runs once over all.
    Yields each window's attribution, in the windows' order (by start).

    The groups: the windows (by start) and the calls (by submit) merged
    in time order, a window first at a tie; a group closes before an
    event that starts at or after the latest end so far, once it holds
    ``ATTRIBUTION_GROUP`` calls. Found in numpy, over the times alone."""
    if blocks or len(rows) <= ATTRIBUTION_GROUP:
        yield from attribute(windows, calls.records(rows.tolist()), blocks, models=models)
        return
    models = sorted(models, key=_START)
    model_starts = [model.start_ns for model in models]
    longest = max((model.end_ns - model.start_ns for model in models), default=0)  # bounds the search back
    window_starts = np.fromiter(map(_START, windows), np.uint64, len(windows))
    submits = np.frombuffer(calls.submit_ns, np.uint64)[rows]
    window_order, call_order = np.argsort(window_starts, kind="stable"), np.argsort(submits, kind="stable")
    # every event: (its start, window 0 / call 1, its index), in time order
    starts = np.concatenate((window_starts[window_order], submits[call_order]))
    is_call = np.concatenate((np.zeros(len(windows), np.int8), np.ones(len(rows), np.int8)))
    index = np.concatenate((window_order, call_order))
    call_ends = np.frombuffer(calls.end_ns, np.uint64)[rows]
    ends = np.concatenate(
        (
            np.fromiter(map(_END, windows), np.uint64, len(windows))[window_order],
            np.where(call_ends == 0, np.uint64(_NEVER), call_ends)[call_order],
        )
    )
    merged = np.lexsort((np.arange(len(starts)), is_call, starts))
    starts, is_call, index, ends = starts[merged], is_call[merged], index[merged], ends[merged]
    # the latest end before each event, and the calls before it
    reach = np.concatenate((np.zeros(1, np.uint64), np.maximum.accumulate(ends)[:-1]))
    calls_before = np.concatenate((np.zeros(1, np.int64), np.cumsum(is_call, dtype=np.int64)[:-1]))
    open_at = np.flatnonzero(starts >= reach)  # where a group may close
    cuts = [0]
    while True:
        found = np.searchsorted(calls_before[open_at], calls_before[cuts[-1]] + ATTRIBUTION_GROUP)
        if found == len(open_at):
            break
        cuts.append(int(open_at[found]))
    cuts.append(len(starts))
    # (the windows come in their own order: by start, ties in order, in
    # the groups one after another)
    for low, high in zip(cuts, cuts[1:]):
        kinds, members = is_call[low:high], index[low:high]
        group_calls = calls.records(rows[members[kinds == 1]].tolist())
        group_windows = [windows[i] for i in members[kinds == 0].tolist()]
        group_models: list[ModelCall] = []
        if models and group_windows:  # the model calls that meet the group's windows
            first = min(map(_START, group_windows))
            last = max(map(_END, group_windows))
            near = models[bisect_left(model_starts, first - longest) : bisect_left(model_starts, last)]
            group_models = [m for m in near if m.end_ns > first]
        yield from attribute(group_windows, group_calls, models=group_models)


_NEVER = 1 << 63  # the end of a call still in flight


def _in_windows(columns: CallColumns, windows: Sequence[IdleWindow]) -> np.ndarray:
    """The rows of the calls in flight during some idle window: the only
    ones the blame depends on (a call outside every window changes no share)."""
    bounds = _union_bounds(windows)
    if not len(bounds) or not len(columns.submit):
        return np.zeros(0, np.int64)
    return np.flatnonzero(_meets(bounds, columns.submit, columns.end))


def _union_bounds(windows: Sequence[IdleWindow]) -> np.ndarray:
    """The windows' union, as sorted [start, end) pairs, flat (``uint64``)."""
    edges: list[int] = []
    for window in sorted(windows, key=_START):
        if edges and window.start_ns <= edges[-1]:
            edges[-1] = max(edges[-1], window.end_ns)
        else:
            edges += (window.start_ns, window.end_ns)
    return np.array(edges, dtype=np.uint64)


def _meets(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each life [start, end) meets the union ``bounds`` (``_union_bounds``,
    not empty): it began inside one of its intervals, or before one that
    starts before it ends (an end of 0: still in flight)."""
    i = np.searchsorted(bounds, starts, side="right")
    next_start = bounds[np.minimum(i, len(bounds) - 1)]
    return (i % 2 == 1) | ((i < len(bounds)) & ((ends == 0) | (ends > next_start)))


def _models_in_windows(models: Sequence[ModelCall], windows: Sequence[IdleWindow]) -> list[ModelCall]:
    """The model calls in flight during some idle window, in their order: as
    for the tool calls (``_in_windows``), the only ones the blame depends on
    (one outside every window takes no share, and the tool calls it cuts
    are cut outside every window)."""
    bounds = _union_bounds(windows)
    if not len(bounds) or not models:
        return []
    starts = np.fromiter(map(_START, models), np.uint64, len(models))
    ends = np.fromiter(map(_END, models), np.uint64, len(models))
    return list(compress(models, _meets(bounds, starts, ends).tolist()))


def _period_ns(times: Sequence[int]) -> int:
    """A GPU's sample period: the median time between its samples (0 for fewer than two)."""
    if len(times) < 2:
        return 0
    gaps = np.diff(np.frombuffer(times, np.int64) if isinstance(times, array) else np.asarray(times, np.int64))
    gaps = gaps[gaps > 0]
    return int(np.median(gaps)) if len(gaps) else 0


def _idle_by_gpu(windows: Sequence[IdleWindow]) -> dict[str, float]:
    idle: dict[str, float] = defaultdict(float)
    for window in windows:
        idle[gpu_key(window)] += window.seconds
    return idle


def _moved_by_gpu(raw: Sequence[IdleWindow], sharpened: Sequence[IdleWindow]) -> dict[str, int]:
    moved: dict[str, int] = defaultdict(int)
    for before, after in zip(raw, sharpened):
        moved[gpu_key(before)] += (before.start_ns != after.start_ns) + (before.end_ns != after.end_ns)
    return moved


def _model_blame(totals: BlameTotals, underuse: Optional[Underuse]) -> list[ModelBlame]:
    """The model server's share by model: idle time in both phases, unused capacity."""
    blame: dict[str, ModelBlame] = {}
    for (_gpu, model, phase), seconds in totals.model_s.items():
        entry = blame.setdefault(model, ModelBlame(model))
        if phase == MODEL_PHASE_QUEUED:
            entry.idle_queued_s += seconds
        elif phase == MODEL_PHASE_DECODE:
            entry.idle_decode_s += seconds
    if underuse is not None:
        for (_gpu, model, _phase), seconds in underuse.totals.model_s.items():
            entry = blame.setdefault(model, ModelBlame(model))
            entry.underused_s = (entry.underused_s or 0.0) + seconds
        for entry in blame.values():
            if entry.underused_s is None:
                entry.underused_s = 0.0
    return sorted(blame.values(), key=lambda b: (-round(b.idle_s, 6), b.model))


def _union_within(starts: np.ndarray, ends: np.ndarray, start: int, end: int) -> int:
    """Nanoseconds of ``[start, end)`` covered by some span ``[starts[i], ends[i])``
    (``uint64``): a sweep in numpy, by start, each span counted past the
    latest end before it."""
    a, b = np.maximum(starts, np.uint64(start)), np.minimum(ends, np.uint64(end))
    inside = b > a
    a, b = a[inside], b[inside]
    if not len(a):
        return 0
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    reach = np.maximum.accumulate(np.concatenate((np.array([start], np.uint64), b[:-1])))
    first = np.maximum(a, reach)
    return int(np.where(b > first, b - first, np.uint64(0)).sum(dtype=np.uint64))


def _model_contradictions(analysis: Analysis, models: Sequence[ModelCall]) -> None:
    """Each GPU's time with a model call of its pool in flight, and a warning
    per GPU that read idle for over ``MODEL_IDLE_WARN_RATIO`` of it."""
    if not models:
        return
    starts = np.fromiter(map(_START, models), np.uint64, len(models))
    ends = np.fromiter(map(_END, models), np.uint64, len(models))
    spans = {  # each pool's model calls of some length
        pool: rows[ends[rows] > starts[rows]] for pool, rows in Names(map(_POOL, models), len(models)).groups()
    }
    pool_of = {gpu_key(window): window.pool for window in analysis.windows}
    for stats in analysis.gpus:
        pool = pool_of.get(stats.gpu, stats.gpu.rsplit("/", 1)[0] if "/" in stats.gpu else "")
        coverage = analysis.coverage.get(stats.gpu)
        rows = spans.get(pool)
        if coverage is None or rows is None or not len(rows):
            continue
        stats.model_in_flight_s = _union_within(starts[rows], ends[rows], *coverage) / NS_PER_S
        ratio = stats.model_idle_ratio
        if ratio is not None and ratio > MODEL_IDLE_WARN_RATIO:
            analysis.warnings.append(_contradiction_message(analysis, stats, ratio))


def _contradiction_message(analysis: Analysis, stats: GpuStats, ratio: float) -> str:
    causes = []
    if stats.simulated:
        causes.append(
            "a simulated GPU nobody drives (model calls drive it only in the process that samples it; "
            "see docs/gpu.md, the simulated GPU)"
        )
    causes += [
        "a GPU log of another GPU or host than the one serving the model",
        "clocks apart (the GPU log's host and the agents'; --tz for a log in local time)",
    ]
    coarse = [log for log in analysis.gpu_logs if log.sample_interval_s > analysis.min_idle_s]
    if coarse:
        causes.append(f"a coarse GPU log (one sample every {coarse[0].sample_interval_s:.3g} s, as `dmon -d 2` writes)")
    causes.append("a model served elsewhere than the GPU pool says (agent.gpu.pool)")
    return (
        f"GPU {stats.gpu} read idle for {stats.idle_model_s:.3g} s of the {stats.model_in_flight_s:.3g} s "
        f"model calls were in flight ({ratio:.0%}): the GPU data contradicts the model calls "
        f"(blamed on the model server as it stands). Likely causes: {'; '.join(causes)}"
    )


def _coarse_log_message(info: GpuLogInfo, min_idle_s: float) -> str:
    interval = info.sample_interval_s
    return (
        f"GPU log {info.path} has one sample every {interval:.3g} s, coarser than the minimum idle time "
        f"({min_idle_s:g} s): it can show the average utilization and idle stretches of {interval:.3g} s and "
        f"more; it cannot show idle stretches shorter than {interval:.3g} s (a tool call of a second leaves no "
        f"trace in it), and its windows' edges are known to {interval:.3g} s only "
        "(nvidia-smi dmon -d 1, or agent-otel's own sampling at 1/6 s, sees more)"
    )


def _pool_warnings(calls: CallTable, windows: Sequence[IdleWindow]) -> list[str]:
    """One line per GPU pool whose idle time no tool call can be blamed for."""
    if not calls:
        return []
    call_pools = set(calls.column("pool"))
    warnings = []
    for pool in sorted({window.pool for window in windows} - call_pools):
        name = f"GPU pool {pool!r}" if pool else "the GPUs of processes that declared no GPU pool"
        warnings.append(
            f"no tool call can block {name}: no tool span comes from a process that declared "
            + (f"agent.gpu.pool={pool}" if pool else "no agent.gpu.pool")
            + f" (the tool spans declare {', '.join(repr(p) if p else 'none' for p in sorted(call_pools))}); "
            "see docs/attribution.md, GPU pools"
        )
    return warnings


def _no_overlap_message(info: GpuLogInfo, start: int, end: int) -> str:
    if not info.samples:
        return f"GPU log {info.path} has no utilization samples"
    return (
        f"GPU log {info.path} ({rfc3339(info.start_ns)} to {rfc3339(info.end_ns)}) does not overlap "
        f"the traces ({rfc3339(start)} to {rfc3339(end)}): no GPU idle time can be blamed on tools; "
        "if the log was written in another time zone, pass --tz"
    )


_GPU = attrgetter("pool", "gpu", "uuid")  # one GPU, whichever process saw it


def union_per_gpu(windows: list[IdleWindow]) -> list[IdleWindow]:
    """Each GPU's idle time once, where several processes recorded it.

    One process's windows of a GPU never overlap. Processes that share a GPU
    without declaring a pool (prefork workers, ``multiprocessing`` children:
    each samples the GPU and writes its own ``gpu.idle`` spans) each record
    the same idle seconds; summed, N processes would make one idle second N,
    and each would have been blamed on one process's calls only. Windows of
    one GPU (pool, index and UUID) that overlap become their union, its
    utilization their average weighted by duration, and the report blames
    it on the calls of every process, as it does any window. The windows
    come back as they are (the same list) when none overlap.
    """
    count = len(windows)
    if count < 2:
        return windows
    keys = list(map(_GPU, windows))
    gpus = {key: code for code, key in enumerate(dict.fromkeys(keys))}
    codes = np.fromiter(map(gpus.__getitem__, keys), np.int64, count)
    starts = np.fromiter(map(_START, windows), np.int64, count)
    ends = np.fromiter(map(_END, windows), np.int64, count)
    # One time axis with each GPU's windows on a stretch of their own, so
    # that one running maximum of the ends serves every GPU at once.
    origin = int(starts.min())
    stretch = int(ends.max()) - origin + 1
    if stretch * len(gpus) >= 1 << 62:  # not on one int64 axis (traces over years): one GPU at a time
        return [w for key in gpus for w in union_per_gpu([w for w, k in zip(windows, keys) if k == key])]
    offset = codes * stretch - origin
    order = np.lexsort((starts, codes))
    starts, ends = starts[order] + offset[order], ends[order] + offset[order]
    reach = np.maximum.accumulate(ends)
    joins = starts[1:] < reach[:-1]  # a window that begins before the ones before it ended
    if not joins.any():
        return windows
    firsts = np.flatnonzero(np.concatenate(([True], ~joins)))
    union_ends = np.maximum.reduceat(ends, firsts) - offset[order][firsts]
    durations = (ends - starts).astype(np.float64)
    utilization = np.fromiter((windows[i].utilization_avg for i in order.tolist()), np.float64, count)
    weighted = np.add.reduceat(durations * utilization, firsts) / np.maximum(np.add.reduceat(durations, firsts), 1)
    sizes = np.diff(np.append(firsts, count))
    merged = []
    for first, size, end_ns, average in zip(firsts.tolist(), sizes.tolist(), union_ends.tolist(), weighted.tolist()):
        window = windows[int(order[first])]
        if size > 1:
            window = dataclasses.replace(window, end_ns=end_ns, utilization_avg=average)
        merged.append(window)
    merged.sort(key=_START_GPU)
    return merged


def _clip(windows: Sequence[IdleWindow], start: int, end: int) -> list[IdleWindow]:
    clipped = []
    for window in windows:
        a, b = max(window.start_ns, start), min(window.end_ns, end)
        if a < b:
            if (a, b) != (window.start_ns, window.end_ns):
                window = dataclasses.replace(window, start_ns=a, end_ns=b)
            clipped.append(window)
    clipped.sort(key=_START_GPU)
    return clipped


def _tool_stats(
    columns: CallColumns, totals: BlameTotals, traces: TraceData, underuse: Optional[Underuse] = None
) -> list[ToolStats]:
    live = traces.live_blocked_s
    blocked: dict[tuple[str, str], float] = defaultdict(float)
    for (_gpu, tool, phase), seconds in totals.blocked_s.items():
        blocked[(tool, phase)] += seconds
    underused: dict[tuple[str, str], float] = defaultdict(float)
    if underuse is not None:
        for (_gpu, tool, phase), seconds in underuse.totals.blocked_s.items():
            underused[(tool, phase)] += seconds
    stats = []
    for tool, rows in columns.tool.groups():
        submits, starts, ends = columns.submit[rows], columns.start[rows], columns.end[rows]
        stats.append(
            ToolStats(
                tool=tool,
                calls=len(rows),
                errors=columns.count_of(columns.outcome, ERROR_OUTCOMES, rows),
                duration_s=seconds_sorted(ends - submits),
                exec_s=seconds_sorted(ends - starts),
                queue_s=seconds_sorted(starts - submits),
                executors=columns.executor.names(rows),
                blocked_queue_s=blocked[(tool, PHASE_QUEUE)],
                blocked_exec_s=blocked[(tool, PHASE_EXEC)],
                live_blocked_s=None if live is None else live.get(tool, 0.0),
                timeout_s=traces.timeouts.get(tool),
                underused_queue_s=None if underuse is None else underused[(tool, PHASE_QUEUE)],
                underused_exec_s=None if underuse is None else underused[(tool, PHASE_EXEC)],
            )
        )
    stats.sort(key=lambda s: (-round(s.rank_s, 6), -round(s.blocked_s, 6), -s.calls, s.tool))
    return stats


_SUBMIT, _START, _END, _POOL = attrgetter("submit_ns"), attrgetter("start_ns"), attrgetter("end_ns"), attrgetter("pool")
# sort keys: attrgetter, not a lambda (the 250k runs and 125k windows of a million spans)
_START_GPU = attrgetter("start_ns", "gpu")


def _add_waits(analysis: Analysis, in_windows: np.ndarray) -> None:
    """Each tool's CPU share and event-loop blocks (``waits.py``), and the
    GPU idle time blamed on a tool while it blocked a loop: the blame of the
    idle windows cut to its blocks."""
    cpu = cpu_stats(analysis.calls)
    by_tool, analysis.loops = loop_block_stats(analysis.loop_blocks)
    analysis.loop_unknown = by_tool.get(None)
    pieces: list[IdleWindow] = []
    blockers: list[tuple[int, int]] = []
    for block in analysis.loop_blocks:
        if block.blocker is None or not block.end_ns:
            continue
        for window in analysis.windows:  # few blocks: a plain scan
            a, b = max(window.start_ns, block.start_ns), min(window.end_ns, block.end_ns)
            if a < b and window.pool == block.pool:
                pieces.append(dataclasses.replace(window, start_ns=a, end_ns=b))
                blockers.append(block.blocker)
    during: dict[str, float] = defaultdict(float)
    results = attribute(pieces, analysis.calls.records(in_windows.tolist()), analysis.loop_blocks) if pieces else ()
    for blocker, result in zip(blockers, results):
        for share in result.shares:
            if (share.call.trace_id, share.call.span_id) == blocker:
                during[share.call.tool] += share.blocked_s
    for tool in analysis.tools:
        tool.cpu = cpu.get(tool.tool)
        tool.loop = by_tool.get(tool.tool)
        tool.loop_idle_blocked_s = during.get(tool.tool, 0.0)


def _executor_stats(columns: CallColumns) -> list[ExecutorStats]:
    stats = []
    for executor, rows in columns.executor.groups():
        submits, starts, ends = columns.submit[rows], columns.start[rows], columns.end[rows]
        waits = seconds_sorted(starts - submits)
        queued = starts - submits >= round(QUEUED_MIN_S * NS_PER_S)
        stats.append(
            ExecutorStats(
                executor=executor,
                submissions=len(rows),
                wait_p95_s=percentile(waits, 95),
                max_queue_depth=peak_depth(submits[queued], starts[queued]),
                queued_calls=int(queued.sum()),
                peak_in_flight=peak_depth(submits, ends),
                max_concurrent_exec=peak_depth(starts, ends),
                queue_total_s=sum(waits),
                exec_total_s=total(ends - starts) / NS_PER_S,
                tools=columns.tool.names(rows),
                max_workers=max(filter(None, columns.workers[rows]), default=None),
            )
        )
    stats.sort(key=lambda s: (-s.submissions, s.executor))
    return stats


def _gpu_stats(analysis: Analysis, totals: BlameTotals, observed: dict[str, float]) -> list[GpuStats]:
    blocked: dict[str, float] = defaultdict(float)
    for (gpu, _tool, _phase), seconds in totals.blocked_s.items():
        blocked[gpu] += seconds
    model: dict[str, float] = defaultdict(float)
    for (gpu, _model, _phase), seconds in totals.model_s.items():
        model[gpu] += seconds
    uuids = {gpu_key(window): window.uuid for window in analysis.windows if window.uuid}
    gpus = [
        GpuStats(
            gpu=gpu,
            observed_s=observed.get(gpu, 0.0),
            idle_s=totals.idle_s.get(gpu, 0.0),
            idle_blocked_s=blocked[gpu],
            idle_unattributed_s=totals.unattributed_s.get(gpu, 0.0),
            uuid=uuids.get(gpu),
            simulated=gpu in analysis.simulated_gpus,
            idle_model_s=model[gpu],
            idle_samples_s=None if analysis.raw_idle_s is None else analysis.raw_idle_s.get(gpu, 0.0),
            edges_moved=analysis.edges_moved.get(gpu, 0),
        )
        for gpu in set(observed) | set(totals.idle_s)
    ]
    underuse = analysis.underuse
    if underuse is not None:
        underused_blocked: dict[str, float] = defaultdict(float)
        for (gpu, _tool, _phase), seconds in underuse.totals.blocked_s.items():
            underused_blocked[gpu] += seconds
        for stats in gpus:
            stats.underused_s = underuse.totals.underused_s.get(stats.gpu, 0.0)
            stats.underused_blocked_s = underused_blocked[stats.gpu]
            stats.underused_unattributed_s = underuse.totals.unattributed_s.get(stats.gpu, 0.0)
            stats.underused_model_s = sum(
                (seconds for (gpu, _model, _phase), seconds in underuse.totals.model_s.items() if gpu == stats.gpu),
                0.0,
            )
            stats.missing_s = underuse.missing_s.get(stats.gpu, 0.0)
            observed_share = underuse.observed.get(stats.gpu)
            stats.utilization_avg = observed_share.mean if observed_share and observed_share.ns else None
    gpus.sort(key=lambda g: (not g.gpu.isdecimal(), int(g.gpu) if g.gpu.isdecimal() else 0, g.gpu))
    return gpus


# ---------------------------------------------------------------- JSON


def report_json(analysis: Analysis) -> dict:
    """The contract's report, plus an ``inputs`` section and a few added
    keys (the contract allows additions, never renames): the JSON of the
    report's parts (``report.parts``)."""
    return report_parts(analysis).to_json()
