"""Exported spans -> what the report keeps: the records, and what it joins across spans.

One pass over the inputs' span objects (``spans.otlp_json``), with
Python's cyclic garbage collector paused: it would otherwise rescan the
growing heap again and again, which made reading a million spans cost
more per span than reading ten thousand. Each span becomes its record in
``agent_otel.spans`` (``spans.decode.SpanReader``: the one place a span
becomes a record, which the blame service reads received spans with too);
``TraceReader`` adds what the report keeps across spans:

- **what the live path blamed**, summed per tool to compare with the
  report's own attribution: the window spans' per-tool totals
  (``gpu.idle.blocked_tools`` and ``gpu.idle.blocked_durations``, every
  share) where the windows carry them; else, in traces of versions before
  them, the per-tool ``gpu.idle`` child spans (with
  ``gpu.idle.blocked_duration``), which then had one for every share;
- **failures inside a tool call** it went on after (``InnerFailures``):
  ``exception`` events on its span recorded before it ended, and failed
  child spans (status ERROR, or an ``exception`` event) under it, such as
  an HTTP client instrumentation's spans of attempts that timed out. The
  report reads retries hidden inside a tool from them. A call with the
  toolkit's own retries (``agent.tool.retries``) is left out: its policy
  already bounds them;
- the tools called inside another tool's call, each tool's smallest
  ``agent.tool.timeout``, the calls still running at shut-down
  (``agent.tool.unfinished``), the model server's readings on the
  ``gpu.idle`` windows (``report.kv_cache``) and which GPUs were simulated
  (``agent.gpu.source``, or a ``GPU-simulated-`` UUID);
- from the resources, the services (``service.name``) and the smallest
  ``agent.process.cpu.count`` (the CPUs an agent process may use).
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

from agent_otel.attribution import gpu_key
from agent_otel.errors import InputError
from agent_otel.records import NS_PER_S, IdleWindow
from agent_otel.report.kv_cache import KvWindow
from agent_otel.semconv import (
    AGENT_PROCESS_CPU_COUNT,
    AGENT_TOOL_RETRIES,
    GPU_SOURCE_SIMULATED,
    OUTCOME_ERROR,
    OUTCOME_TIMEOUT,
    SERVICE_NAME,
    SIMULATED_GPU_UUID_PREFIX,
)
from agent_otel.spans.decode import SpanData, SpanReader, gpu_pool_of
from agent_otel.spans.ids import rows_among
from agent_otel.spans.otlp_json import (
    JsonKeyValue,
    SpanFormatError,
    decode_traces,
    input_name,
    iter_requests,
    typed_resource_spans,
    value_of,
)

_SPAN_ID_MASK = (1 << 64) - 1


@dataclass
class InnerFailures:
    """Failures inside one tool call that it went on after (see the module docstring)."""

    exceptions: list[int] = field(default_factory=list)  # times (ns) of exception events on its span
    children: list[tuple[str, int, int]] = field(default_factory=list)  # failed child spans: (name, start, end)
    # seconds from each failed nested tool call (an @agent_otel.tool called
    # inside it) to the next call of that tool under it: its retry's wait
    retry_waits: list[float] = field(default_factory=list)


@dataclass
class TraceData(SpanData):
    """Everything the report takes from trace files: the records (``SpanData``), and what it keeps across spans."""

    # tool -> seconds the live path blamed on it (the windows' totals, or
    # the child spans of older traces); None when the traces hold neither
    live_blocked_s: Optional[dict[str, float]] = None
    # tool -> the smallest ``agent.tool.timeout`` (s) its spans carried
    timeouts: dict[str, float] = field(default_factory=dict)
    skipped_spans: int = 0  # spans left out for a field the report cannot read
    first_skipped: Optional[tuple[str, int, str]] = None  # the first of them: input, line, why
    # inputs that held nothing at all (no line that is not blank)
    empty_inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # the model server's readings on the gpu.idle windows (KV cache, queue), for report.kv_cache
    kv_windows: list[KvWindow] = field(default_factory=list)
    # tool -> its calls still running when their process's agent-otel shut down (agent.tool.unfinished)
    unfinished: dict[str, int] = field(default_factory=dict)
    # service.name -> spans its resources held, in order of first appearance
    services: dict[str, int] = field(default_factory=dict)
    # the smallest agent.process.cpu.count of the resources; None when none carries it
    cpu_count: Optional[int] = None
    # the GPUs (by attribution.gpu_key) whose gpu.idle windows a simulated GPU made
    simulated_gpus: set[str] = field(default_factory=set)
    # trace_id << 64 | span_id of a tool call -> the failures inside it that it went on after
    inner_failures: dict[int, InnerFailures] = field(default_factory=dict)
    # tools some of whose calls ran inside a call of another tool (a tool span's child)
    nested_tools: set[str] = field(default_factory=set)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (reference counting still frees
    memory): the report builds millions of objects that live until it
    ends, and each collection would rescan all of them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            # What was made meanwhile is all in the youngest generation: the
            # first collection after the pause would scan all of it. Move it
            # to the oldest instead (freeze, then unfreeze), where it is
            # scanned only by the rare full collections.
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def read_traces(
    paths: Iterable[str], progress: Optional[Callable[[int], None]] = None, call_ids: bool = True
) -> TraceData:
    """Read OTLP/JSON trace inputs (files, or ``-`` for standard input) into records.

    ``call_ids``: keep each call's ``gen_ai.tool.call.id`` (the HTML and
    Perfetto outputs show it; the table and the JSON do not, and at a
    million spans the ids take about 35 MB); without it only a hash of
    each is kept, to tell calls apart.

    A span seen twice (the same trace and span id, e.g. files that overlap)
    counts once, and so does a call seen from two sides: a tool span whose
    parent is a tool span of the same tool (an MCP client's span and the
    server's own span under it) is the same call. A span with a field the
    report needs and cannot read (a number out of range, a value of the
    wrong type, a broken id) is left out alone, with one warning per input
    (how many, and the first); raises ``InputError`` naming the file and
    line for a malformed line or request.
    """
    reader = TraceReader(call_ids)
    data = reader.data
    add = reader.add
    with paused_gc():
        for path in paths:
            name = input_name(path)
            reader.name = name
            documents = spans_before = skipped = 0
            first_skipped: Optional[tuple[str, int, str]] = None
            spans_before = data.span_count + data.duplicate_count
            for number, request in iter_requests(path, progress, data.warnings.append, decode_traces):
                documents += 1
                try:
                    for resource, count, spans in typed_resource_spans(request):
                        pool = reader.resource(resource, count)
                        for span in spans:  # decoded one at a time
                            try:
                                add(span, number, pool)
                            except SpanFormatError as exc:
                                skipped += 1
                                if first_skipped is None:
                                    first_skipped = (name, number, str(exc))
                except SpanFormatError as exc:
                    raise InputError(name, number, str(exc)) from None
            if first_skipped is not None:
                data.skipped_spans += skipped
                data.first_skipped = data.first_skipped or first_skipped
                data.warnings.append(
                    f"{name}: {skipped} span(s) left out: a field the report reads is out of range, "
                    f"of the wrong type or malformed (the first, line {first_skipped[1]}: {first_skipped[2]})"
                )
            if not documents:
                data.empty_inputs.append(name)
                data.warnings.append(f"{name} is empty")
            elif data.span_count + data.duplicate_count + skipped == spans_before:
                data.warnings.append(f"no spans in {name}")
        reader.finish()
    return data


class TraceReader(SpanReader):
    """One read of the report: ``SpanReader``'s records in a ``TraceData``,
    and what the report keeps across spans (the module docstring).

    ``add`` each span object (OTLP/JSON shape) with the GPU pool of its
    resource (``resource``), then ``finish``; the records are in ``data``.
    """

    data: TraceData

    def __init__(self, call_ids: bool = True) -> None:
        super().__init__(call_ids, TraceData())
        self.name = ""
        self._live: dict[int, float] = {}  # trace_id << 64 | parent span id -> seconds blamed by gpu.idle children
        self._window_live: Optional[dict[str, float]] = None  # tool -> seconds, the windows' totals
        # trace_id << 64 | parent span id -> failed child spans (name, start, end)
        self._failed_children: dict[int, list[tuple[str, int, int]]] = {}
        self._policy_tools: set[str] = set()  # tools with the toolkit's own retries (agent.tool.retries)
        self._last_resource: Optional[list] = None  # the resource read last, and what resource() said of it
        self._last_answer: tuple[Optional[str], str] = (None, "")

    def resource(self, resource: list, spans: int) -> str:
        """Note a resource's service and CPU count; return its GPU pool.

        The resource of the line before (a process's next export, one span
        a line as often as 512) is answered from then: its attributes equal
        (msgspec structs compare in C), nothing is read again."""
        data = self.data
        if resource == self._last_resource:
            service_name, pool = self._last_answer
            if service_name is not None:
                data.services[service_name] += spans
            return pool
        answer = self._resource(resource, spans)
        self._last_resource, self._last_answer = resource, answer
        return answer[1]

    def _resource(self, resource: list, spans: int) -> tuple[Optional[str], str]:
        """(its service's name, or None; its GPU pool), the service counted and the CPU count noted."""
        data = self.data
        name = None
        service = cpus = None
        for item in resource:
            if type(item) is JsonKeyValue:
                key = item.key
                if key == SERVICE_NAME:
                    service = value_of(item.value, SERVICE_NAME)
                elif key == AGENT_PROCESS_CPU_COUNT:
                    cpus = value_of(item.value, AGENT_PROCESS_CPU_COUNT)
        if type(service) is str and service.strip():
            name = self._name(service.strip())
            data.services[name] = data.services.get(name, 0) + spans
        if type(cpus) is int and cpus > 0 and (data.cpu_count is None or cpus < data.cpu_count):
            data.cpu_count = cpus
        return name, gpu_pool_of(resource)

    # -- what each span held beyond its record ----------------------------

    def _keep_tool_call(
        self,
        tool: str,
        key: int,
        unfinished: bool,
        timeout: Optional[float],
        exceptions: Optional[list[int]],
        found: dict,
    ) -> None:
        data = self.data
        if unfinished:
            data.unfinished[tool] = data.unfinished.get(tool, 0) + 1
        if timeout is not None and timeout > 0:
            data.timeouts[tool] = min(timeout, data.timeouts.get(tool, math.inf))
        if exceptions:
            data.inner_failures[key] = InnerFailures(exceptions)
        elif AGENT_TOOL_RETRIES in found:
            self._policy_tools.add(tool)

    def _keep_idle_window(
        self,
        window: IdleWindow,
        blame: Optional[list[tuple[str, float]]],
        source: Optional[str],
        kv_usage: Optional[float],
        waiting: Optional[float],
    ) -> None:
        data = self.data
        if kv_usage is not None:
            data.kv_windows.append(KvWindow(gpu_key(window), window.start_ns, window.end_ns, kv_usage, waiting))
        if blame:
            totals = self._window_live
            if totals is None:
                totals = self._window_live = {}
            for tool, seconds in blame:
                totals[tool] = totals.get(tool, 0.0) + seconds
        if source == GPU_SOURCE_SIMULATED or (window.uuid or "").startswith(SIMULATED_GPU_UUID_PREFIX):
            data.simulated_gpus.add(gpu_key(window))

    def _keep_live_share(self, parent: int, seconds: float) -> None:
        if parent:
            self._live[parent] = self._live.get(parent, 0.0) + seconds
        if self.data.live_blocked_s is None:
            self.data.live_blocked_s = {}

    def _keep_failed_child(self, parent: int, name: str, start_ns: int, end_ns: int) -> None:
        self._failed_children.setdefault(parent, []).append((name, start_ns, end_ns))

    def _parents_wanted(self) -> list[int]:
        wanted = list(self._live)
        wanted.extend(super()._parents_wanted())
        wanted.extend(self._failed_children)
        return wanted

    # -- after the last span: join what refers to other spans ----------

    def finish(self) -> dict[int, str]:
        """``SpanReader.finish``, then give the live path's blame to the
        tools: the windows' totals where they carry them, else the child
        spans' by the tool spans they hang under (a window with totals may
        also have children, for its larger shares: counted once, from the
        totals)."""
        data = self.data
        tool_of = super().finish()
        if self._window_live is not None:
            data.live_blocked_s = self._window_live
        elif data.live_blocked_s is not None:
            for parent, seconds in self._live.items():
                tool = tool_of.get(parent)
                if tool is not None:
                    data.live_blocked_s[tool] = data.live_blocked_s.get(tool, 0.0) + seconds
        return tool_of

    def _joined(self, tool_of: dict[int, str]) -> None:
        """Tools called from inside another tool's call, and the failed child
        spans of tool calls (none of a tool with the toolkit's own retries)."""
        data = self.data
        if not tool_of:
            return
        calls, parents = data.calls, self._parents
        highs, lows, tools = calls.trace_id.high, calls.trace_id.low, calls.tool
        outcomes = calls.column("outcome")
        nested: dict[int, list[tuple[str, int, int, bool]]] = {}  # outer call -> its nested calls
        for i in rows_among(parents, [key & _SPAN_ID_MASK for key in tool_of]):  # as in _dedupe_tool_calls
            outer_key = (highs[i] << 64 | lows[i]) << 64 | parents[i]
            outer = tool_of.get(outer_key)
            if outer is not None and outer != tools[i]:
                data.nested_tools.add(tools[i])
                if outer not in self._policy_tools:
                    failed = outcomes[i] in (OUTCOME_ERROR, OUTCOME_TIMEOUT)
                    nested.setdefault(outer_key, []).append((tools[i], calls.submit_ns[i], calls.end_ns[i], failed))
        for outer_key, inner in nested.items():
            self._join_retries(outer_key, inner)
        for parent, children in self._failed_children.items():
            tool = tool_of.get(parent)
            if tool is not None and tool not in self._policy_tools:
                data.inner_failures.setdefault(parent, InnerFailures()).children.extend(children)
        self._failed_children = {}

    def _join_retries(self, outer_key: int, inner: list[tuple[str, int, int, bool]]) -> None:
        """The failed nested tool calls of one call that a call of the same
        tool followed (its retry): failed children of the outer call, with
        the wait before each retry."""
        inner.sort(key=lambda call: call[1])
        for k, (tool, start, end, failed) in enumerate(inner):
            if not failed:
                continue
            retry = next((call for call in inner[k + 1 :] if call[0] == tool and call[1] >= end), None)
            if retry is None:
                continue
            found = self.data.inner_failures.setdefault(outer_key, InnerFailures())
            found.children.append((tool, start, end))
            found.retry_waits.append((retry[1] - end) / NS_PER_S)
