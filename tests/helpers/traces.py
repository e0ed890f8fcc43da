"""Recorded agent runs for the report's tests.

``RecordedRun`` writes tool spans exactly as the toolkit names them
(docs/telemetry.md), at chosen times, through the real SDK and the real
OTLP/JSON file exporter, so a test states a run's timeline in seconds and
the report reads it back from disk. ``write_gpu_csv`` writes the
``nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv``
log a user would record next to it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter

# 2026-03-02T09:00:00Z: every test run starts here.
T0 = datetime(2026, 3, 2, 9, 0, 0, tzinfo=timezone.utc)
T0_NS = int(T0.timestamp()) * 1_000_000_000


def ns(seconds: float) -> int:
    """Seconds after T0 as epoch nanoseconds."""
    return T0_NS + round(seconds * 1e9)


class RecordedRun:
    """``pool``: the GPU pool the recording process declared (``agent.gpu.pool``);
    ``cpus``: its ``agent.process.cpu.count``."""

    def __init__(self, path, *, service: str = "test-agent", pool: str | None = None, cpus: int | None = None):
        self.path = path
        self.exporter = OtlpJsonFileExporter(str(path))
        attributes: dict = {"service.name": service}
        if pool is not None:
            attributes["agent.gpu.pool"] = pool
        if cpus is not None:
            attributes["agent.process.cpu.count"] = cpus
        self.provider = TracerProvider(resource=Resource.create(attributes))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("agent_otel")

    def agent_run(self, start: float, end: float) -> None:
        """The agent's own span around its work (sets the report's window)."""
        span = self.tracer.start_span("invoke_agent research", start_time=ns(start))
        span.end(end_time=ns(end))

    def tool_call(
        self,
        tool: str,
        submit: float,
        start: float,
        end: float,
        *,
        executor: str = "io",
        outcome: str = "ok",
        call_id: str | None = None,
        thread: str | None = None,
        timeout: float | None = None,
        exec_event: bool = True,
        cpu: float | None = None,
        exceptions: tuple[float, ...] = (),
        parent: trace.Span | None = None,
        retries: int | None = None,
        workers: int | None = None,
    ) -> trace.Span:
        """One tool call requested at ``submit``, executing from ``start``
        to ``end`` (seconds after T0); ``exceptions``: times of ``exception``
        events the tool's code recorded on its span; ``parent``: the tool
        call it was made from; ``retries``: the toolkit's own (``agent.tool.retries``);
        ``workers``: its pool's size (``agent.executor.max_workers``)."""
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.type": "function",
            "agent.tool.executor": executor,
            "agent.tool.queue.duration": start - submit,
            "agent.tool.exec.duration": end - start,
            "agent.tool.outcome": outcome,
        }
        if call_id is not None:
            attributes["gen_ai.tool.call.id"] = call_id
        if thread is not None:
            attributes["thread.name"] = thread
        if timeout is not None:
            attributes["agent.tool.timeout"] = timeout
        if cpu is not None:
            attributes["agent.tool.exec.cpu_time"] = cpu
        if retries is not None:
            attributes["agent.tool.retries"] = retries
        if workers is not None:
            attributes["agent.executor.max_workers"] = workers
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            f"execute_tool {tool}", context=context, attributes=attributes, start_time=ns(submit)
        )
        if exec_event:
            span.add_event("exec.start", timestamp=ns(start))
        for at in exceptions:
            span.add_event(
                "exception", {"exception.type": "TimeoutError", "exception.message": "timed out"}, timestamp=ns(at)
            )
        if outcome != "ok":
            span.set_attribute("error.type", "TimeoutError" if outcome == "timeout" else "ValueError")
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=ns(end))
        return span

    def span(
        self,
        name: str,
        start: float,
        end: float,
        attributes: dict | None = None,
        parent: trace.Span | None = None,
        status_error: bool = False,
    ) -> trace.Span:
        """Any span (another instrumentation's, an agent's, a model call's), under ``parent`` if given."""
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(name, context=context, attributes=attributes or {}, start_time=ns(start))
        if status_error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=ns(end))
        return span

    def invoke_agent(self, name: str, start: float, end: float, parent: trace.Span | None = None) -> trace.Span:
        """An agent run as agent_otel.agent_span records it (ended at ``end``: make children first)."""
        return self.span(
            f"invoke_agent {name}",
            start,
            end,
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
            parent,
        )

    def model_call(
        self,
        model: str,
        start: float,
        end: float,
        *,
        parent: trace.Span | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        first_chunk: float | None = None,
        operation: str = "chat",
    ) -> trace.Span:
        """A GenAI model-call span, as agent_otel.model_span records it."""
        attributes: dict = {"gen_ai.operation.name": operation, "gen_ai.request.model": model}
        if input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = input_tokens
        if output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = output_tokens
        if first_chunk is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = first_chunk
        return self.span(f"{operation} {model}", start, end, attributes, parent)

    def child_span(
        self, parent: trace.Span, name: str, start: float, end: float, *, error: bool = False, exception: bool = False
    ) -> trace.Span:
        """A span another instrumentation made under a tool call (an HTTP client's request, say):
        ``error`` sets its status to ERROR, ``exception`` records an ``exception`` event."""
        span = self.tracer.start_span(
            name, context=trace.set_span_in_context(parent), start_time=ns(start), kind=trace.SpanKind.CLIENT
        )
        if exception:
            span.add_event("exception", {"exception.type": "TimeoutError"}, timestamp=ns(end))
        if error:
            span.set_status(Status(StatusCode.ERROR, "timed out"))
        span.end(end_time=ns(end))
        return span

    def idle_window(
        self,
        gpu: int,
        start: float,
        end: float,
        utilization: float = 0.02,
        source: str | None = None,
        blocked: tuple[tuple[str, str, float], ...] = (),
        uuid: str | None = None,
    ) -> None:
        """A window-level gpu.idle span, as the live path exports it (``source``: its agent.gpu.source;
        ``blocked``: its per-tool totals, (tool, phase, seconds) each; ``uuid``: the GPU's, by default
        one per index)."""
        attributes = {
            "gpu.index": gpu,
            "gpu.uuid": uuid or f"GPU-0000000{gpu}",
            "gpu.idle.duration": end - start,
            "gpu.utilization.avg": utilization,
        }
        if source is not None:
            attributes["agent.gpu.source"] = source
        if blocked:
            attributes["gpu.idle.blocked_tools"] = [tool for tool, _, _ in blocked]
            attributes["gpu.idle.blocked_phases"] = [phase for _, phase, _ in blocked]
            attributes["gpu.idle.blocked_durations"] = [seconds for _, _, seconds in blocked]
        span = self.tracer.start_span("gpu.idle", attributes=attributes, start_time=ns(start))
        span.end(end_time=ns(end))

    def blamed_child(self, parent: trace.Span, gpu: int, start: float, end: float, blocked: float, phase: str) -> None:
        """The per-tool gpu.idle child span the live path writes under a tool span."""
        context = trace.set_span_in_context(parent)
        span = self.tracer.start_span(
            "gpu.idle",
            context=context,
            attributes={"gpu.index": gpu, "gpu.idle.blocked_duration": blocked, "agent.tool.phase": phase},
            start_time=ns(start),
        )
        span.end(end_time=ns(end))

    def loop_block(
        self,
        start: float,
        end: float,
        blocker: trace.Span | None = None,
        waiting=(),
        thread: str = "MainThread",
        stack: str | None = None,
    ) -> None:
        """An asyncio.loop.blocked span, as the loop monitor exports it."""
        links = []
        if blocker is not None:
            links.append(trace.Link(blocker.get_span_context(), {"asyncio.loop.role": "blocking"}))
        links += [trace.Link(span.get_span_context(), {"asyncio.loop.role": "waiting"}) for span in waiting]
        attributes = {
            "asyncio.loop.blocked_by": blocker.attributes["gen_ai.tool.name"] if blocker is not None else "unknown",
            "asyncio.loop.blocked.duration": end - start,
            "asyncio.loop.waiting_calls": len(waiting),
            "thread.id": 1,
            "thread.name": thread,
        }
        if stack is not None:
            attributes["code.stacktrace"] = stack
        span = self.tracer.start_span(
            "asyncio.loop.blocked",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            attributes=attributes,
            links=links,
            start_time=ns(start),
        )
        span.end(end_time=ns(end))

    def close(self) -> None:
        self.provider.shutdown()


def write_gpu_csv(path, samples) -> None:
    """``samples``: (seconds after T0, gpu index, utilization percent), times in UTC."""
    lines = ["timestamp, index, utilization.gpu [%]"]
    for seconds, gpu, percent in samples:
        moment = T0 + timedelta(seconds=seconds)
        lines.append(f"{moment:%Y/%m/%d %H:%M:%S.%f}"[:-3] + f", {gpu}, {percent} %")
    path.write_text("\n".join(lines) + "\n")
