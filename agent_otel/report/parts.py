"""The report as typed parts: one per section of its JSON (docs/report.md).

Usage::

    from agent_otel.report.parts import report_parts
    report = report_parts(analysis)   # a Report: frozen parts, the JSON's values
    report.tools[0].gpu_idle_blocked_s
    report.to_json()                  # the contract's JSON (analysis.report_json)

``analyse`` leaves an ``Analysis``: the records, the blame and the
statistics, at full precision. ``report_parts`` turns it into what is
shown: a ``Report`` of frozen parts, one per top-level key of the JSON
(``window``, ``tools``, ``slos``, ``models``, ``turns``, ``executors``,
``gpus``, ``event_loops``, ``recommendations``, ``cost``,
``model_server``, ``kv_cache``, ``inputs``), each holding that section's
values as the JSON has them (seconds rounded to the microsecond, shares to
four places) and each with its own ``to_json``. The table, the HTML page
and the Perfetto trace read these parts, so every output shows the JSON's
numbers; only the drawings of every record (the HTML timeline, the
Perfetto slices) read the ``Analysis`` itself.

A field's name is its JSON key; ``Part.to_json`` writes the fields in
their order, parts as objects and tuples as lists. A new section of the
report is one part here (its fields, its ``of`` builder, a field of
``Report``) and the renderers' pieces that draw it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Optional

from agent_otel.spans.otlp_json import input_name
from agent_otel.support.inputs import STDIN
from agent_otel.support.prices import CURRENCY
from agent_otel.remedies.suggest import DOCS
from agent_otel.report.server_spans import SplitTotals
from agent_otel.report.stats import percentile
from agent_otel.semconv import BLOCKED_BY_UNKNOWN

if TYPE_CHECKING:
    from agent_otel.report.analysis import Analysis, ExecutorStats, GpuLogInfo, GpuStats, ModelBlame, ToolStats
    from agent_otel.report.cost import Costs
    from agent_otel.report.kv_cache import KvCacheHeld
    from agent_otel.report.recommendations import Recommendation
    from agent_otel.report.server_spans import ServerSpans
    from agent_otel.report.slos import SloCompliance
    from agent_otel.report.turns import ModelStats, Turn
    from agent_otel.report.waits import CpuStats, LoopBlockStats, LoopStats


def rfc3339(ns: int) -> str:
    """Epoch ns as RFC 3339 UTC, to the microsecond."""
    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ns // 1000)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _s(seconds: float) -> float:
    """Seconds as the JSON has them: to the microsecond."""
    return round(seconds, 6)


def _maybe(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds, 6)


def _ratio(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)


def _money(value: float) -> float:
    return round(value, 4)


def _json(value: Any) -> Any:
    if isinstance(value, Part):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    return value


class Part:
    """A part of the report: a frozen dataclass whose field names are its JSON keys."""

    def to_json(self) -> dict:
        return {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


# ---------------------------------------------------------------- window


@dataclass(frozen=True)
class Window(Part):
    start: Optional[str]  # RFC 3339; None without spans
    end: Optional[str]
    seconds: float

    @classmethod
    def of(cls, analysis: Analysis) -> Window:
        has_spans = analysis.span_count > 0
        return cls(
            start=rfc3339(analysis.start_ns) if has_spans else None,
            end=rfc3339(analysis.end_ns) if has_spans else None,
            seconds=_s(analysis.seconds),
        )


# ---------------------------------------------------------------- SLOs


@dataclass(frozen=True)
class Slo(Part):
    """A tool's compliance with its latency SLO (report.slos)."""

    tool: str
    threshold_s: float
    objective: float
    calls: int
    within: int
    over: int
    compliance: float
    budget_spent: float
    met: bool
    on_bucket_bound: bool

    @classmethod
    def of(cls, result: SloCompliance) -> Slo:
        return cls(
            tool=result.tool,
            threshold_s=result.slo.threshold_s,
            objective=result.slo.objective,
            calls=result.calls,
            within=result.within,
            over=result.calls - result.within,
            compliance=round(result.compliance, 4),
            budget_spent=round(result.budget_spent, 4),
            met=not result.breaks,
            on_bucket_bound=result.slo.on_bucket_bound,
        )


# ---------------------------------------------------------------- tools


@dataclass(frozen=True)
class Tool(Part):
    tool: str
    calls: int
    errors: int
    duration_p50_s: float
    duration_p95_s: float
    duration_p99_s: float
    exec_p50_s: float
    exec_p95_s: float
    exec_p99_s: float
    queue_p50_s: float
    queue_p95_s: float
    queue_p99_s: float
    gpu_idle_blocked_s: float
    gpu_idle_blocked_queue_s: float
    gpu_idle_blocked_exec_s: float
    gpu_idle_blocked_live_s: Optional[float]
    executors: tuple[str, ...]
    timeout_s: Optional[float]
    # CPU time of its calls and the event-loop blocks it caused (report.waits)
    exec_cpu_s: Optional[float]
    exec_cpu_share: Optional[float]
    exec_cpu_share_alone: Optional[float]
    exec_cpu_share_parallel: Optional[float]
    wait_kind: Optional[str]
    loop_blocks: int
    loop_blocked_s: float
    loop_blocked_longest_s: float
    gpu_idle_blocked_loop_s: float
    # unused GPU capacity (GPU-seconds); None without utilization samples
    gpu_underused_blocked_s: Optional[float]
    gpu_underused_blocked_queue_s: Optional[float]
    gpu_underused_blocked_exec_s: Optional[float]
    gpu_idle_blocked_per_call_s: float
    latency_share: Optional[float]
    slo: Optional[Slo]

    @classmethod
    def of(cls, t: ToolStats, latency_share: Optional[float], slo: Optional[Slo]) -> Tool:
        return cls(
            tool=t.tool,
            calls=t.calls,
            errors=t.errors,
            duration_p50_s=_s(percentile(t.duration_s, 50)),
            duration_p95_s=_s(percentile(t.duration_s, 95)),
            duration_p99_s=_s(percentile(t.duration_s, 99)),
            exec_p50_s=_s(percentile(t.exec_s, 50)),
            exec_p95_s=_s(percentile(t.exec_s, 95)),
            exec_p99_s=_s(percentile(t.exec_s, 99)),
            queue_p50_s=_s(percentile(t.queue_s, 50)),
            queue_p95_s=_s(percentile(t.queue_s, 95)),
            queue_p99_s=_s(percentile(t.queue_s, 99)),
            gpu_idle_blocked_s=_s(t.blocked_s),
            gpu_idle_blocked_queue_s=_s(t.blocked_queue_s),
            gpu_idle_blocked_exec_s=_s(t.blocked_exec_s),
            gpu_idle_blocked_live_s=_maybe(t.live_blocked_s),
            executors=tuple(t.executors),
            timeout_s=t.timeout_s,
            **_waits(t.cpu, t.loop, t.loop_idle_blocked_s),
            gpu_underused_blocked_s=_maybe(t.underused_s),
            gpu_underused_blocked_queue_s=_maybe(t.underused_queue_s),
            gpu_underused_blocked_exec_s=_maybe(t.underused_exec_s),
            gpu_idle_blocked_per_call_s=_s(t.blocked_s / t.calls) if t.calls else 0.0,
            latency_share=_ratio(latency_share),
            slo=slo,
        )


def _waits(cpu: Optional[CpuStats], loop: Optional[LoopBlockStats], loop_idle_s: float) -> dict[str, Any]:
    """A tool's fields from its CPU time and event-loop blocks (report.waits)."""
    return {
        "exec_cpu_s": None if cpu is None else _s(cpu.all.cpu_s),
        "exec_cpu_share": None if cpu is None else _ratio(cpu.share),
        "exec_cpu_share_alone": None if cpu is None else _ratio(cpu.alone_share),
        "exec_cpu_share_parallel": None if cpu is None else _ratio(cpu.parallel_share),
        "wait_kind": None if cpu is None else cpu.kind,
        "loop_blocks": 0 if loop is None else loop.blocks,
        "loop_blocked_s": 0.0 if loop is None else _s(loop.blocked_s),
        "loop_blocked_longest_s": 0.0 if loop is None else _s(loop.longest_s),
        "gpu_idle_blocked_loop_s": _s(loop_idle_s),
    }


# ---------------------------------------------------------------- models


@dataclass(frozen=True)
class Model(Part):
    model: str
    calls: int
    errors: int
    seconds: float
    duration_p50_s: float
    duration_p95_s: float
    time_to_first_chunk_p50_s: Optional[float]
    input_tokens: Optional[int]
    output_tokens: Optional[int]
    # the model server's share: GPU idle while its calls were in flight (0 where none was blamed)
    gpu_idle_blocked_s: float
    gpu_idle_blocked_queued_s: float
    gpu_idle_blocked_decode_s: float
    gpu_underused_blocked_s: Optional[float]  # None without utilization samples

    @classmethod
    def of(cls, m: ModelStats, blame: Optional[ModelBlame], underuse_known: bool) -> Model:
        idle_queued_s = idle_decode_s = 0.0
        underused_s: Optional[float] = 0.0 if underuse_known else None
        if blame is not None:
            idle_queued_s, idle_decode_s, underused_s = blame.idle_queued_s, blame.idle_decode_s, blame.underused_s
        return cls(
            model=m.model,
            calls=m.calls,
            errors=m.errors,
            seconds=_s(m.seconds),
            duration_p50_s=_s(percentile(m.duration_s, 50)),
            duration_p95_s=_s(percentile(m.duration_s, 95)),
            time_to_first_chunk_p50_s=_s(percentile(m.first_chunk_s, 50)) if m.first_chunk_s else None,
            input_tokens=m.input_tokens,
            output_tokens=m.output_tokens,
            gpu_idle_blocked_s=_s(idle_queued_s + idle_decode_s),
            gpu_idle_blocked_queued_s=_s(idle_queued_s),
            gpu_idle_blocked_decode_s=_s(idle_decode_s),
            gpu_underused_blocked_s=_maybe(underused_s),
        )


# ---------------------------------------------------------------- turns and the model servers' split


@dataclass(frozen=True)
class Split(Part):
    """Model calls' time split by the model servers' own spans (report.server_spans)."""

    model_calls: int
    seconds: float
    client_network_s: float
    server_queue_s: float
    prefill_s: float
    decode_s: float
    server_other_s: float

    @classmethod
    def of(cls, totals: SplitTotals) -> Split:
        return cls(
            model_calls=totals.calls,
            seconds=_s(totals.seconds),
            client_network_s=_s(totals.client_network_s),
            server_queue_s=_s(totals.server_queue_s),
            prefill_s=_s(totals.prefill_s),
            decode_s=_s(totals.decode_s),
            server_other_s=_s(totals.server_other_s),
        )


@dataclass(frozen=True)
class SlowTurn(Part):
    name: str
    trace_id: str  # 32 hex digits
    start: str
    seconds: float
    client_cpu_s: float
    model_s: float
    tool_queue_s: float
    tool_exec_s: float
    other_s: float
    tool_calls: int
    model_calls: int
    model_split: Optional[Split]

    @classmethod
    def of(cls, turn: Turn, split: Optional[ServerSpans]) -> SlowTurn:
        return cls(
            name=turn.name,
            trace_id=f"{turn.trace_id:032x}",
            start=rfc3339(turn.start_ns),
            seconds=_s(turn.seconds),
            client_cpu_s=_s(turn.client_cpu_s),
            model_s=_s(turn.model_s),
            tool_queue_s=_s(turn.tool_queue_s),
            tool_exec_s=_s(turn.tool_exec_s),
            other_s=_s(turn.other_s),
            tool_calls=turn.tool_calls,
            model_calls=turn.model_calls,
            model_split=None if split is None else Split.of(split.of(turn.trace_id, turn.start_ns, turn.end_ns)),
        )


@dataclass(frozen=True)
class Turns(Part):
    count: int
    from_agent_spans: int
    end_to_end_s: float
    end_to_end_p50_s: float
    end_to_end_p95_s: float
    client_cpu_s: float
    model_s: float
    tool_queue_s: float
    tool_exec_s: float
    other_s: float
    model_split: Optional[Split]  # None without the model servers' spans
    slowest: tuple[SlowTurn, ...]

    @classmethod
    def of(cls, analysis: Analysis) -> Turns:
        totals = analysis.turn_totals
        split = analysis.server_spans
        return cls(
            count=totals.count,
            from_agent_spans=totals.from_agent_spans,
            end_to_end_s=_s(totals.end_to_end_s),
            end_to_end_p50_s=_s(percentile(totals.durations_s, 50)),
            end_to_end_p95_s=_s(percentile(totals.durations_s, 95)),
            client_cpu_s=_s(totals.client_cpu_s),
            model_s=_s(totals.model_s),
            tool_queue_s=_s(totals.tool_queue_s),
            tool_exec_s=_s(totals.tool_exec_s),
            other_s=_s(totals.other_s),
            model_split=None if split is None else Split.of(split.totals),
            slowest=tuple(SlowTurn.of(turn, split) for turn in totals.slowest),
        )


@dataclass(frozen=True)
class ModelSplit(Part):
    model: str
    split: Split

    def to_json(self) -> dict:
        return {"model": self.model, **self.split.to_json()}


@dataclass(frozen=True)
class ModelServer(Part):
    """The model servers' spans joined to the model calls (report.server_spans)."""

    requests: int
    joined_by_parent: int
    joined_by_time: int
    unjoined: int
    totals: Split  # its keys are the section's own
    models: tuple[ModelSplit, ...]  # longest first

    @classmethod
    def of(cls, spans: ServerSpans) -> ModelServer:
        return cls(
            requests=spans.requests,
            joined_by_parent=spans.joined_by_parent,
            joined_by_time=spans.joined_by_time,
            unjoined=spans.unjoined,
            totals=Split.of(spans.totals),
            models=tuple(
                ModelSplit(model, Split.of(totals))
                for model, totals in sorted(spans.models.items(), key=lambda item: (-item[1].seconds, item[0]))
            ),
        )

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "joined_by_parent": self.joined_by_parent,
            "joined_by_time": self.joined_by_time,
            "unjoined": self.unjoined,
            **self.totals.to_json(),
            "models": [model.to_json() for model in self.models],
        }


# ---------------------------------------------------------------- executors, GPUs, event loops


@dataclass(frozen=True)
class Executor(Part):
    executor: str
    submissions: int
    wait_p95_s: float
    max_queue_depth: int
    queued_calls: int
    max_workers: Optional[int]
    max_concurrent_exec: int
    peak_in_flight: int
    tools: tuple[str, ...]

    @classmethod
    def of(cls, e: ExecutorStats) -> Executor:
        return cls(
            executor=e.executor,
            submissions=e.submissions,
            wait_p95_s=_s(e.wait_p95_s),
            max_queue_depth=e.max_queue_depth,
            queued_calls=e.queued_calls,
            max_workers=e.max_workers,
            max_concurrent_exec=e.max_concurrent_exec,
            peak_in_flight=e.peak_in_flight,
            tools=tuple(e.tools),
        )


@dataclass(frozen=True)
class Gpu(Part):
    gpu: str
    busy_s: float
    idle_s: float
    idle_blocked_s: float
    idle_unattributed_s: float
    uuid: Optional[str]
    underused_s: Optional[float]
    underused_blocked_s: Optional[float]
    underused_unattributed_s: Optional[float]
    missing_s: Optional[float]
    utilization_avg: Optional[float]
    simulated: bool
    idle_model_s: float
    underused_model_s: Optional[float]
    model_in_flight_s: float
    model_idle_ratio: Optional[float]
    idle_samples_s: Optional[float]
    busy_samples_s: Optional[float]
    edges_moved: int

    @classmethod
    def of(cls, g: GpuStats) -> Gpu:
        return cls(
            gpu=g.gpu,
            busy_s=_s(g.busy_s),
            idle_s=_s(g.idle_s),
            idle_blocked_s=_s(g.idle_blocked_s),
            idle_unattributed_s=_s(g.idle_unattributed_s),
            uuid=g.uuid,
            underused_s=_maybe(g.underused_s),
            underused_blocked_s=_maybe(g.underused_blocked_s),
            underused_unattributed_s=_maybe(g.underused_unattributed_s),
            missing_s=_maybe(g.missing_s),
            utilization_avg=_ratio(g.utilization_avg),
            simulated=g.simulated,
            idle_model_s=_s(g.idle_model_s),
            underused_model_s=_maybe(g.underused_model_s),
            model_in_flight_s=_s(g.model_in_flight_s),
            model_idle_ratio=_ratio(g.model_idle_ratio),
            idle_samples_s=_maybe(g.idle_samples_s),
            busy_samples_s=None if g.idle_samples_s is None else _s(max(0.0, g.observed_s - g.idle_samples_s)),
            edges_moved=g.edges_moved,
        )


@dataclass(frozen=True)
class LoopBlocker(Part):
    tool: str  # BLOCKED_BY_UNKNOWN where no tool call held the loop
    blocked_s: float


@dataclass(frozen=True)
class EventLoop(Part):
    thread: str
    blocks: int
    blocked_s: float
    longest_s: float
    by_tool: tuple[LoopBlocker, ...]  # most blocked first

    @classmethod
    def of(cls, loop: LoopStats) -> EventLoop:
        return cls(
            thread=loop.thread,
            blocks=loop.blocks,
            blocked_s=_s(loop.blocked_s),
            longest_s=_s(loop.longest_s),
            by_tool=tuple(
                LoopBlocker(BLOCKED_BY_UNKNOWN if tool is None else tool, _s(seconds))
                for tool, seconds in sorted(loop.by_tool.items(), key=lambda item: (-item[1], item[0] or ""))
            ),
        )


# ---------------------------------------------------------------- recommendations, cost, KV cache


@dataclass(frozen=True)
class Advice(Part):
    """A recommendation (report.recommendations)."""

    kind: str
    subject: str
    message: str
    evidence: dict
    remedy: Optional[str]  # the agent-otel code that applies it (docs/remedies.md)
    docs: str

    @classmethod
    def of(cls, r: Recommendation) -> Advice:
        return cls(r.kind, r.subject, r.message, r.evidence, r.remedy, DOCS[r.kind])


@dataclass(frozen=True)
class GpuCost(Part):
    gpu: str
    gpu_hour_price: float
    idle_cost: float
    idle_blocked_cost: float
    idle_unattributed_cost: float
    idle_model_cost: float


@dataclass(frozen=True)
class ToolCost(Part):
    tool: str
    gpu_idle_blocked_gpu_hours: float
    gpu_idle_blocked_cost: float
    gpu_hours_per_day: float
    cost_per_day: float


@dataclass(frozen=True)
class Cost(Part):
    """The money of the blame at ``gpu_hour_price`` (report.cost)."""

    currency: str
    source: str
    idle_cost: float
    idle_blocked_cost: float
    idle_unattributed_cost: float
    idle_model_cost: float
    per_day_scale: float
    gpus: tuple[GpuCost, ...]
    tools: tuple[ToolCost, ...]  # most expensive first
    unpriced_gpus: tuple[str, ...]

    @classmethod
    def of(cls, costs: Costs) -> Cost:
        scale = costs.day_scale
        return cls(
            currency=CURRENCY,
            source=costs.source,
            idle_cost=_money(sum(g.idle_cost for g in costs.gpus)),
            idle_blocked_cost=_money(sum(g.blocked_cost for g in costs.gpus)),
            idle_unattributed_cost=_money(sum(g.unattributed_cost for g in costs.gpus)),
            idle_model_cost=_money(sum(g.model_cost for g in costs.gpus)),
            per_day_scale=round(scale, 6),
            gpus=tuple(
                GpuCost(
                    gpu=g.gpu,
                    gpu_hour_price=g.price,
                    idle_cost=_money(g.idle_cost),
                    idle_blocked_cost=_money(g.blocked_cost),
                    idle_unattributed_cost=_money(g.unattributed_cost),
                    idle_model_cost=_money(g.model_cost),
                )
                for g in costs.gpus
            ),
            tools=tuple(
                ToolCost(
                    tool=t.tool,
                    gpu_idle_blocked_gpu_hours=round(t.gpu_hours, 6),
                    gpu_idle_blocked_cost=_money(t.cost),
                    gpu_hours_per_day=round(t.gpu_hours * scale, 4),
                    cost_per_day=_money(t.cost * scale),
                )
                for t in costs.tools
            ),
            unpriced_gpus=tuple(costs.unpriced_gpus),
        )


@dataclass(frozen=True)
class KvCacheTool(Part):
    tool: str
    gpu_idle_blocked_s: float
    kv_cache_held_s: float
    kv_cache_held_share: Optional[float]


@dataclass(frozen=True)
class KvCache(Part):
    """The model server's KV cache held while tools blocked the idle GPU (report.kv_cache)."""

    windows: int
    idle_s: float
    kv_cache_usage_avg: Optional[float]
    tools: tuple[KvCacheTool, ...]  # most cache-seconds first

    @classmethod
    def of(cls, held: KvCacheHeld) -> KvCache:
        return cls(
            windows=held.matched,
            idle_s=_s(held.idle_s),
            kv_cache_usage_avg=round(held.held_s / held.idle_s, 4) if held.idle_s else None,
            tools=tuple(
                KvCacheTool(
                    tool=tool,
                    gpu_idle_blocked_s=_s(held.blocked_s[tool]),
                    kv_cache_held_s=_s(held.tool_held_s[tool]),
                    kv_cache_held_share=round(held.tool_held_s[tool] / held.blocked_s[tool], 4)
                    if held.blocked_s[tool]
                    else None,
                )
                for tool in sorted(held.tool_held_s, key=lambda tool: (-held.tool_held_s[tool], tool))
            ),
        )


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class GpuLogInput(Part):
    path: str
    samples: int
    start: Optional[str]
    end: Optional[str]
    overlaps_traces: bool
    sample_interval_s: float

    @classmethod
    def of(cls, log: GpuLogInfo) -> GpuLogInput:
        return cls(
            path=log.path,
            samples=log.samples,
            start=rfc3339(log.start_ns) if log.samples else None,
            end=rfc3339(log.end_ns) if log.samples else None,
            overlaps_traces=log.overlaps_traces,
            sample_interval_s=_s(log.sample_interval_s),
        )


@dataclass(frozen=True)
class Inputs(Part):
    traces: tuple[str, ...]
    services: tuple[str, ...]
    cpu_count: Optional[int]
    spans: int
    duplicate_spans: int
    tool_calls: int
    model_calls: int
    agent_runs: int
    peer_tool_spans: int
    peer_tool_spans_merged: int
    gpu_source: str
    gpu_logs: tuple[GpuLogInput, ...]
    gpu_edges: str
    idle_threshold: float
    min_idle_s: float
    warnings: tuple[str, ...]

    @classmethod
    def of(cls, analysis: Analysis) -> Inputs:
        return cls(
            traces=tuple(analysis.trace_paths),
            services=tuple(analysis.services),
            cpu_count=analysis.cpu_count,
            spans=analysis.span_count,
            duplicate_spans=analysis.duplicate_spans,
            tool_calls=len(analysis.calls),
            model_calls=len(analysis.model_calls),
            agent_runs=len(analysis.agent_runs),
            peer_tool_spans=analysis.peer_tool_spans,
            peer_tool_spans_merged=analysis.peer_tool_spans_merged,
            gpu_source=analysis.gpu_source,
            gpu_logs=tuple(GpuLogInput.of(log) for log in analysis.gpu_logs),
            gpu_edges=analysis.edges,
            idle_threshold=analysis.idle_threshold,
            min_idle_s=analysis.min_idle_s,
            warnings=tuple(analysis.warnings),
        )


# ---------------------------------------------------------------- the report


@dataclass(frozen=True)
class Report(Part):
    """The whole report: its parts in the JSON's order."""

    window: Window
    tools: tuple[Tool, ...]  # by the GPU time they blocked (unused capacity where known)
    slos: tuple[Slo, ...]  # breaking first
    models: tuple[Model, ...]
    turns: Turns
    executors: tuple[Executor, ...]
    gpus: tuple[Gpu, ...]
    event_loops: tuple[EventLoop, ...]  # most blocked first
    recommendations: tuple[Advice, ...]
    cost: Optional[Cost]  # None without gpu_hour_price
    model_server: Optional[ModelServer]  # None without the model servers' spans
    kv_cache: Optional[KvCache]  # None without the model server's KV cache usage
    inputs: Inputs

    @property
    def underuse_known(self) -> bool:
        """Whether the GPUs' unused capacity is known (utilization samples from a GPU log)."""
        return any(t.gpu_underused_blocked_s is not None for t in self.tools)

    @property
    def simulated_gpus(self) -> list[str]:
        return [g.gpu for g in self.gpus if g.simulated]

    def run_name(self) -> tuple[str, str]:
        """What the report is of: (the service(s) and the input file(s), the
        time range): ``("agent-otel-demo, baseline.jsonl", "2026-11-30
        13:55:53 to 13:56:05 UTC (11.8 s)")``."""
        inputs, window = self.inputs, self.window
        services = _some(list(inputs.services), "services")
        files = _some(
            [input_name(path) if path == STDIN else os.path.basename(path) or path for path in inputs.traces], "files"
        )
        what = ", ".join(part for part in (services, files) if part)
        start, end = window.start, window.end
        if not start or not end:
            return what, "no spans"
        first, last = start[:19].replace("T", " "), end[:19].replace("T", " ")
        if first[:10] == last[:10]:
            last = last[11:]
        return what, f"{first} to {last} UTC ({window.seconds:.1f} s)"


def _some(names: list[str], plural: str) -> str:
    """``a``, ``a, b``, ``a, b, c``, or ``a, b and 5 more services``."""
    if len(names) <= 3:
        return ", ".join(names)
    return f"{', '.join(names[:2])} and {len(names) - 2} more {plural}"


def report_parts(analysis: Analysis) -> Report:
    """The report's parts, from an analysis (``analyse``)."""
    slos = {result.tool: Slo.of(result) for result in analysis.slos}
    blame_of = {blame.model: blame for blame in analysis.model_blame}
    totals = analysis.turn_totals
    underuse_known = analysis.underuse is not None
    return Report(
        window=Window.of(analysis),
        tools=tuple(Tool.of(t, totals.latency_share(t.tool), slos.get(t.tool)) for t in analysis.tools),
        slos=tuple(slos.values()),
        models=tuple(Model.of(m, blame_of.get(m.model), underuse_known) for m in analysis.models),
        turns=Turns.of(analysis),
        executors=tuple(Executor.of(e) for e in analysis.executors),
        gpus=tuple(Gpu.of(g) for g in analysis.gpus),
        event_loops=tuple(EventLoop.of(loop) for loop in analysis.loops),
        recommendations=tuple(Advice.of(r) for r in analysis.recommendations),
        cost=None if analysis.costs is None else Cost.of(analysis.costs),
        model_server=None if analysis.server_spans is None else ModelServer.of(analysis.server_spans),
        kv_cache=None if analysis.kv_cache is None else KvCache.of(analysis.kv_cache),
        inputs=Inputs.of(analysis),
    )
