"""The record types that flow through the pipeline.

Capture produces ``ToolCall`` records, the GPU sources produce ``GpuSample``
records, the timeline turns samples into ``IdleWindow`` records, and
attribution joins windows with calls. The live path and the offline report
build the same records from different inputs and then share every step after
that, so both give the same numbers.

Every timestamp here is wall-clock nanoseconds since the Unix epoch, the
clock OpenTelemetry spans use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from agent_otel.semconv import OUTCOME_OK

NS_PER_S = 1_000_000_000


@dataclass(slots=True)
class ToolCall:
    """One tool call, from the moment it was requested to its result.

    ``submit_ns`` is when the call was requested (submitted to an executor,
    or called directly), ``start_ns`` when execution began and ``end_ns``
    when the result or error was available (0 while the call is in flight).
    For a direct call ``submit_ns == start_ns``.
    """

    tool: str
    executor: str
    submit_ns: int
    start_ns: int
    end_ns: int = 0
    outcome: str = OUTCOME_OK  # one of semconv.OUTCOMES
    call_id: Optional[str] = None
    trace_id: int = 0
    span_id: int = 0
    error_type: Optional[str] = None
    thread: Optional[str] = None
    executor_workers: Optional[int] = None  # the executor's max_workers, when submitted to one
    # The GPU pool the call can block (``agent.gpu.pool`` of the process that
    # made it); "" for a process that declared none. Blame joins a call only
    # with the idle windows of its own pool (docs/attribution.md).
    pool: str = ""
    # CPU time the call's thread spent during exec, where one thread ran all
    # of it (sync tools); None where that cannot be measured (coroutines).
    cpu_ns: Optional[int] = None

    @property
    def queue_seconds(self) -> float:
        return (self.start_ns - self.submit_ns) / NS_PER_S

    @property
    def exec_seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    @property
    def cpu_seconds(self) -> Optional[float]:
        return None if self.cpu_ns is None else self.cpu_ns / NS_PER_S

    @property
    def duration_seconds(self) -> float:
        return (self.end_ns - self.submit_ns) / NS_PER_S

    @property
    def finished(self) -> bool:
        return self.end_ns != 0


@dataclass(slots=True)
class ModelCall:
    """One call of a model (a ``chat`` / ``text_completion`` / ``generate_content``
    span, agent-otel's or another instrumentation's): the GPU's side of a turn.

    ``first_chunk_s`` is the time to the first chunk of a streamed answer;
    token counts and it are None when the span did not report them.
    ``end_ns`` is 0 while the call is in flight (the live path's calls).
    ``pool`` is the GPU pool of the process that made the call, as
    ``ToolCall.pool``: the blame joins a model call with its pool's GPUs.
    """

    model: str
    start_ns: int
    end_ns: int
    trace_id: int = 0
    span_id: int = 0
    operation: str = "chat"
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    first_chunk_s: Optional[float] = None
    failed: bool = False
    pool: str = ""

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    @property
    def first_token_ns(self) -> int:
        """When its first token arrived (the end of its ``queued`` phase); 0
        when not known (an answer not streamed, or none yet): then the call
        is ``queued`` until its end (docs/attribution.md, the model server)."""
        if self.first_chunk_s is None or not self.first_chunk_s >= 0.0:
            return 0
        return self.start_ns + round(self.first_chunk_s * NS_PER_S)


@dataclass(slots=True)
class ServerRequest:
    """A model server's own span of one request (vLLM's ``llm_request``),
    started from the caller's ``traceparent``: its times are the server's.

    ``parent_span_id`` is the span the request came from (the model call's,
    or an HTTP client span under it). The latencies (seconds) are None where
    the span did not report them: ``queue_s`` waiting to be scheduled,
    ``prefill_s`` from scheduled to the first token, ``decode_s`` from the
    first token to the last, ``e2e_s`` the server's whole time.
    """

    model: str
    start_ns: int
    end_ns: int
    trace_id: int = 0
    span_id: int = 0
    parent_span_id: int = 0
    queue_s: Optional[float] = None
    time_to_first_token_s: Optional[float] = None
    prefill_s: Optional[float] = None
    decode_s: Optional[float] = None
    e2e_s: Optional[float] = None

    @property
    def seconds(self) -> float:
        """The server's time: its e2e latency, else the span's duration."""
        return self.e2e_s if self.e2e_s is not None else (self.end_ns - self.start_ns) / NS_PER_S


@dataclass(slots=True)
class AgentRun:
    """One agent run, a turn or a request: an ``invoke_agent`` span (or its
    OpenInference / OpenLLMetry equivalent), or a trace's root span."""

    name: str
    start_ns: int
    end_ns: int
    trace_id: int = 0
    span_id: int = 0

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S


# A GpuSample's utilization when the data for the stretch it covers was
# lost (e.g. the driver's sample buffer overflowed): missing, never idle
# and never busy. Test with ``utilization != utilization`` or math.isnan.
MISSING = float("nan")


class GpuSample(NamedTuple):
    """One utilization reading of one GPU.

    ``utilization`` is a ratio in 0..1 covering the sample period that ends
    at ``timestamp_ns``, or ``MISSING`` (NaN): the stretch since the
    previous sample of that GPU is missing data. ``gpu`` is the device index
    as a string (the Prometheus label value).
    """

    gpu: str
    timestamp_ns: int
    utilization: float


class ServerSample(NamedTuple):
    """One scrape of a model server's own metrics (``agent_otel.gpu.server``):
    its requests running and queued, and the share of its KV cache in use, at
    ``timestamp_ns``.

    ``server`` is the endpoint's ``host:port`` (the Prometheus label value),
    ``engine`` the serving engine whose metric families were read (``vllm``,
    ``sglang``, ``tgi``). ``kv_cache_usage`` is a ratio in 0..1, None where
    the engine reports none (TGI).
    """

    server: str
    timestamp_ns: int
    running: float
    waiting: float
    kv_cache_usage: Optional[float]
    engine: str


class UtilizationSegment(NamedTuple):
    """One GPU's utilization over ``[start_ns, end_ns)``: the stretch of time
    one sample covers on the timeline (``agent_otel.gpu.timeline``).

    Its unused capacity, ``(1 - utilization) x seconds``, is what the
    under-use attribution blames on the tool calls in flight.
    """

    gpu: str
    start_ns: int
    end_ns: int
    utilization: float
    pool: str = ""  # the GPU pool, as IdleWindow.pool

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    @property
    def unused_s(self) -> float:
        """GPU-seconds of capacity left unused: ``(1 - utilization) x seconds``."""
        return (1.0 - min(max(self.utilization, 0.0), 1.0)) * self.seconds


@dataclass(frozen=True, slots=True)
class IdleWindow:
    """A maximal interval in which one GPU stayed at or below the idle
    threshold for at least the minimum idle time."""

    gpu: str
    start_ns: int
    end_ns: int
    utilization_avg: float
    uuid: Optional[str] = None
    pool: str = ""  # the GPU pool of the process that sampled the GPU; "" for none

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S


@dataclass(frozen=True, slots=True)
class LoopBlock:
    """A stretch in which an asyncio event loop ran nothing else: one piece
    of code held the loop's thread (an ``asyncio.loop.blocked`` span).

    ``blocker`` is the ``(trace_id, span_id)`` of the tool call that was
    running on the loop's thread (the innermost one), and ``tool`` its name;
    both None when no tool call was running there. ``waiting`` holds the
    ``(trace_id, span_id)`` of the tool calls that could not go on until the
    loop was free: coroutines suspended on that loop, and the tool calls on
    the loop thread's stack that called the blocker. ``end_ns`` is 0 while
    the loop is still blocked.
    """

    thread: str
    start_ns: int
    end_ns: int
    tool: Optional[str] = None
    blocker: Optional[tuple[int, int]] = None
    waiting: tuple[tuple[int, int], ...] = ()
    pool: str = ""  # the GPU pool of the process whose loop it was (as ToolCall.pool)
    stack: Optional[str] = None  # the loop thread's top frames, when no tool call held it

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S if self.end_ns else 0.0
