"""The telemetry contract as code: every name agent-otel emits.

Span, event, attribute, metric and label names, the label values users
query (outcomes, phases, executors) and the histogram buckets. The code,
the report's reader, the dashboards and the alert rules take their names
from here; docs/telemetry.md is where users read them, and the two change
together (tests/test_semconv.py holds them to each other).

Importing this module is cheap and needs nothing but the standard library:
it loads no OpenTelemetry package, no Prometheus client and nothing else
of the toolkit. So ``dashboards/`` can use it without the runtime, and the
record types and GPU modules that use it still run where OpenTelemetry is
not installed (``bench/gpu_probe.py`` on a bare GPU host).

Where the names come from
-------------------------
The names the OpenTelemetry semantic conventions define (``gen_ai.*``,
``error.type``, ``service.name``, ``thread.name``) are theirs, written out
here rather than imported, for two reasons:

- the installed ``opentelemetry-semantic-conventions`` has the GenAI names
  only in its private ``opentelemetry.semconv._incubating`` package, which
  makes no promise between releases: a GenAI name renamed or dropped there
  (the GenAI conventions are still moving) would silently rename what
  agent-otel emits, and break every dashboard, rule and saved query, on a
  dependency upgrade. Our contract changes only on purpose;
- importing even the stable ``opentelemetry.semconv.attributes`` would tie
  this module, and the GPU modules through ``records``, to OpenTelemetry.

tests/test_semconv.py checks that each of them equals the installed
conventions' value (stable or incubating) wherever those define it, so a
divergence is caught in CI, not by users.
"""

from __future__ import annotations

from typing import Final, NamedTuple

# ---------------------------------------------------------------- instrumentation scope

# The tracer name of every span agent-otel makes: it tells our tool spans
# from another library's span of the same name.
SCOPE_NAME: Final = "agent_otel"

# ---------------------------------------------------------------- GenAI semantic conventions

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_OPERATION_EXECUTE_TOOL: Final = "execute_tool"  # the value of gen_ai.operation.name on a tool span
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
TOOL_TYPE_FUNCTION: Final = "function"  # gen_ai.tool.type unless told otherwise
TOOL_TYPE_EXTENSION: Final = "extension"  # a tool run by an external service (an MCP server)
# The GenAI metric of a tool call's duration; agent_tool_duration_seconds is its Prometheus face.
GEN_AI_EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"

# Model calls and agent runs (agent_otel.model_span, agent_span, the framework
# hooks' model spans; and what the report reads from other instrumentations).
GEN_AI_OPERATION_CHAT: Final = "chat"
GEN_AI_OPERATION_TEXT_COMPLETION: Final = "text_completion"
GEN_AI_OPERATION_GENERATE_CONTENT: Final = "generate_content"
GEN_AI_OPERATION_INVOKE_AGENT: Final = "invoke_agent"
# Values of gen_ai.operation.name that are one call of a model.
MODEL_OPERATIONS: Final = (GEN_AI_OPERATION_CHAT, GEN_AI_OPERATION_TEXT_COMPLETION, GEN_AI_OPERATION_GENERATE_CONTENT)
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"  # s, streaming
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"

# Other instrumentations' span kinds, read by the report (never emitted).
# OpenInference: openinference.span.kind LLM / AGENT / TOOL, with llm.model_name,
# llm.token_count.prompt / .completion and tool.name.
# MCP (the MCP SDK's own spans): a client's request span sits between the
# client's tool span and the server's spans of the same call.
MCP_METHOD_NAME: Final = "mcp.method.name"
MCP_METHOD_TOOLS_CALL: Final = "tools/call"
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_LLM: Final = "LLM"
OPENINFERENCE_AGENT: Final = "AGENT"
OPENINFERENCE_TOOL: Final = "TOOL"
OPENINFERENCE_MODEL_NAME: Final = "llm.model_name"
OPENINFERENCE_PROMPT_TOKENS: Final = "llm.token_count.prompt"
OPENINFERENCE_COMPLETION_TOKENS: Final = "llm.token_count.completion"
OPENINFERENCE_TOOL_NAME: Final = "tool.name"
# OpenLLMetry: traceloop.span.kind llm / agent / tool / workflow, traceloop.entity.name.
TRACELOOP_SPAN_KIND: Final = "traceloop.span.kind"
TRACELOOP_LLM: Final = "llm"
TRACELOOP_AGENT: Final = "agent"
TRACELOOP_TOOL: Final = "tool"
TRACELOOP_WORKFLOW: Final = "workflow"
TRACELOOP_ENTITY_NAME: Final = "traceloop.entity.name"


def model_span_name(operation: str, model: str) -> str:
    """The name of a model call's span: ``{gen_ai.operation.name} {gen_ai.request.model}``."""
    return f"{operation} {model}"


def agent_span_name(agent: str) -> str:
    """The name of an agent run's span: ``invoke_agent {gen_ai.agent.name}``."""
    return f"{GEN_AI_OPERATION_INVOKE_AGENT} {agent}"


# ---------------------------------------------------------------- other OpenTelemetry attributes

ERROR_TYPE: Final = "error.type"  # stable
SERVICE_NAME: Final = "service.name"  # stable (a resource attribute)
# On the exception event of a failed call (stable), every text through redact().
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"  # only with record_exception_messages
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"
EXCEPTION_ESCAPED: Final = "exception.escaped"
# On asyncio.loop.blocked spans (the loop's thread); the report also reads
# thread.name on tool spans when another instrumentation recorded it.
THREAD_NAME: Final = "thread.name"
THREAD_ID: Final = "thread.id"
# The top frames of a blocked loop's thread when no tool call held it.
CODE_STACKTRACE: Final = "code.stacktrace"
# error.type of a call the framework reports as failed without an exception
# (an MCP result with isError, a LangChain ToolMessage with status "error"):
# the OpenTelemetry MCP conventions' value.
ERROR_TYPE_TOOL_ERROR: Final = "tool_error"
# error.type where a failure is known only by its message (the conventions' fallback value).
ERROR_TYPE_OTHER: Final = "_OTHER"

# ---------------------------------------------------------------- spans and events

# A tool call: "execute_tool {gen_ai.tool.name}" (tool_span_name).
SPAN_EXECUTE_TOOL_PREFIX: Final = GEN_AI_OPERATION_EXECUTE_TOOL + " "
# A GPU idle window (root of its own trace), and its share under a tool span.
SPAN_GPU_IDLE: Final = "gpu.idle"
# A stretch in which an asyncio event loop was blocked (root of its own trace).
SPAN_LOOP_BLOCKED: Final = "asyncio.loop.blocked"
# One batch of a batched tool (remedies): "batch {gen_ai.tool.name}".
SPAN_BATCH_PREFIX: Final = "batch "

EVENT_EXEC_START: Final = "exec.start"  # when a submitted call began executing
EVENT_TOOL_ATTEMPT: Final = "tool.attempt"  # remedies: how one attempt ended
EVENT_POOL_REJECTED: Final = "pool.rejected"  # remedies: a full pool refused the call
EVENT_EXCEPTION: Final = "exception"  # the OpenTelemetry SDK's record_exception


def tool_span_name(tool: str) -> str:
    """The name of a tool call's span: ``execute_tool {tool}``."""
    return SPAN_EXECUTE_TOOL_PREFIX + tool


def batch_span_name(tool: str) -> str:
    """The name of one batch's span: ``batch {tool}``."""
    return SPAN_BATCH_PREFIX + tool


# ---------------------------------------------------------------- agent-otel attributes

# On a tool span
AGENT_TOOL_QUEUE_DURATION: Final = "agent.tool.queue.duration"  # s, request to start of execution
AGENT_TOOL_EXEC_DURATION: Final = "agent.tool.exec.duration"  # s, execution
AGENT_TOOL_EXEC_CPU_TIME: Final = "agent.tool.exec.cpu_time"  # s, CPU time of its thread during exec (sync calls)
AGENT_TOOL_EXECUTOR: Final = "agent.tool.executor"  # the executor's name (EXECUTOR_* below)
AGENT_EXECUTOR_MAX_WORKERS: Final = "agent.executor.max_workers"  # the pool's max_workers
AGENT_TOOL_OUTCOME: Final = "agent.tool.outcome"  # one of OUTCOMES
AGENT_TOOL_PHASE: Final = "agent.tool.phase"  # one of SPAN_PHASES, on gpu.idle shares and links
# true on the span of a call still running when agent-otel shut down: it ends there
AGENT_TOOL_UNFINISHED: Final = "agent.tool.unfinished"

# On a tool span, with the remedies (docs/remedies.md)
AGENT_TOOL_TIMEOUT: Final = "agent.tool.timeout"  # s
AGENT_TOOL_RETRIES: Final = "agent.tool.retries"
AGENT_TOOL_CACHE_HIT: Final = "agent.tool.cache.hit"
AGENT_TOOL_BATCH_SIZE: Final = "agent.tool.batch.size"
AGENT_TOOL_ATTEMPT: Final = "agent.tool.attempt"  # on tool.attempt events
AGENT_POOL_REJECTION: Final = "agent.pool.rejection"  # on pool.rejected events: POOL_REJECTION_*

# On gpu.idle spans
GPU_INDEX: Final = "gpu.index"
GPU_UUID: Final = "gpu.uuid"
GPU_IDLE_DURATION: Final = "gpu.idle.duration"  # s, the window
GPU_UTILIZATION_AVG: Final = "gpu.utilization.avg"  # 0..1
GPU_IDLE_BLOCKED_BY: Final = "gpu.idle.blocked_by"  # the tool holding the largest share
GPU_IDLE_UNATTRIBUTED_DURATION: Final = "gpu.idle.unattributed_duration"  # s
GPU_IDLE_BLOCKED_DURATION: Final = "gpu.idle.blocked_duration"  # s, one tool's share (child span, link)
# On window-level gpu.idle spans: the calls whose share reached gpu_idle_share_min
# but got no link, past the link limit (absent when none was left out).
GPU_IDLE_UNLINKED_CALLS: Final = "gpu.idle.unlinked_calls"  # int
# On window-level gpu.idle spans: what agent_gpu_idle_blocked_seconds_total received
# for the window, per tool and phase, as three arrays of the same length (entry
# i: tool i, phase i, seconds i): every call's share, however small, links and
# child spans or not (gpu_idle_share_min, gpu_idle_children).
GPU_IDLE_BLOCKED_TOOLS: Final = "gpu.idle.blocked_tools"  # string[]
GPU_IDLE_BLOCKED_PHASES: Final = "gpu.idle.blocked_phases"  # string[], each one of PHASES
GPU_IDLE_BLOCKED_DURATIONS: Final = "gpu.idle.blocked_durations"  # double[], s
# On window-level gpu.idle spans: the share of the model server, the model
# calls in flight (docs/attribution.md), by model and phase, as
# agent_gpu_idle_model_seconds_total received it; parallel arrays.
GPU_IDLE_MODEL_DURATION: Final = "gpu.idle.model_duration"  # s, the model calls' share in all
GPU_IDLE_MODELS: Final = "gpu.idle.models"  # string[]
GPU_IDLE_MODEL_PHASES: Final = "gpu.idle.model_phases"  # string[], each one of MODEL_PHASES
GPU_IDLE_MODEL_DURATIONS: Final = "gpu.idle.model_durations"  # double[], s
# On window-level gpu.idle spans: where the samples came from (GPU_SOURCE_*), so
# a simulated GPU's windows are never read as a real GPU's.
AGENT_GPU_SOURCE: Final = "agent.gpu.source"
# On window-level gpu.idle spans, where a model server's metrics are read
# (agent_otel.gpu.server): what the serving engine reported during the window.
AGENT_MODEL_SERVER_WAITING_MAX: Final = "agent.model_server.requests.waiting.max"  # requests queued, most seen
AGENT_MODEL_SERVER_RUNNING_MAX: Final = "agent.model_server.requests.running.max"  # requests running, most seen
AGENT_MODEL_SERVER_KV_CACHE_USAGE: Final = "agent.model_server.kv_cache.usage"  # 0..1, mean over the window

# On the resource: the GPU pool a process's tool calls can block (docs/telemetry.md, GPU pools)
AGENT_GPU_POOL: Final = "agent.gpu.pool"
# On the resource: the CPUs the process may run on (its affinity), which the
# report's worker advice is sized by (docs/telemetry.md, Resource)
AGENT_PROCESS_CPU_COUNT: Final = "agent.process.cpu.count"
# On asyncio.loop.blocked spans (and their links)
ASYNCIO_LOOP_BLOCKED_BY: Final = "asyncio.loop.blocked_by"  # the blocking tool, or BLOCKED_BY_UNKNOWN
ASYNCIO_LOOP_BLOCKED_DURATION: Final = "asyncio.loop.blocked.duration"  # s
ASYNCIO_LOOP_WAITING_CALLS: Final = "asyncio.loop.waiting_calls"  # tool and model calls that waited for the loop
ASYNCIO_LOOP_ROLE: Final = "asyncio.loop.role"  # on each link: LOOP_ROLE_BLOCKING or LOOP_ROLE_WAITING

# ---------------------------------------------------------------- values

OUTCOME_OK: Final = "ok"
OUTCOME_ERROR: Final = "error"
OUTCOME_TIMEOUT: Final = "timeout"
OUTCOME_CANCELLED: Final = "cancelled"
OUTCOME_FALLBACK: Final = "fallback"  # remedies only
OUTCOMES: Final = (OUTCOME_OK, OUTCOME_ERROR, OUTCOME_TIMEOUT, OUTCOME_CANCELLED, OUTCOME_FALLBACK)
# Outcomes that count against a tool's error ratio (status ERROR on the span).
ERROR_OUTCOMES: Final = (OUTCOME_ERROR, OUTCOME_TIMEOUT)

PHASE_QUEUE: Final = "queue"  # waiting for an executor's worker
PHASE_EXEC: Final = "exec"  # running
PHASE_MIXED: Final = "mixed"  # a gpu.idle share that covers both (span attribute only)
PHASES: Final = (PHASE_QUEUE, PHASE_EXEC)  # the phase label's values
SPAN_PHASES: Final = (PHASE_QUEUE, PHASE_EXEC, PHASE_MIXED)  # agent.tool.phase's values
# A model call's phases, as the blame sees them (docs/attribution.md, the model server):
MODEL_PHASE_QUEUED: Final = "queued"  # in flight, no first token yet (queued, prefill, network)
MODEL_PHASE_DECODE: Final = "decode"  # streaming its answer
MODEL_PHASES: Final = (MODEL_PHASE_QUEUED, MODEL_PHASE_DECODE)  # the model phase label's values

EXECUTOR_DIRECT: Final = "direct"  # a call not submitted to an executor
EXECUTOR_ASYNCIO_DEFAULT: Final = "asyncio-default"  # asyncio's default pool
EXECUTOR_UNNAMED: Final = "ThreadPoolExecutor"  # every pool created without a thread_name_prefix
EXECUTOR_ANYIO: Final = "anyio"  # anyio's worker threads (anyio.to_thread.run_sync)

POOL_REJECTION_CALLER_RUNS: Final = "caller_runs"

# Every GPU source, by kind: agent.gpu.source's values and, beside auto and
# off, the gpu setting's (config.GPU_CHOICES); agent_otel.gpu.sources opens each.
GPU_SOURCE_NVML: Final = "nvml"
GPU_SOURCE_SIMULATED: Final = "simulated"
GPU_SOURCE_REPLAY: Final = "replay"
GPU_SOURCE_SERVER: Final = "model_server"  # a serving engine's /metrics, alone (agent_otel.gpu.server)
GPU_SOURCES: Final = (GPU_SOURCE_NVML, GPU_SOURCE_SIMULATED, GPU_SOURCE_REPLAY, GPU_SOURCE_SERVER)
# A GPU's sampling state (the state label of agent_otel_gpu_state): sampled;
# failing (each poll raises, or its samples are refused); no longer sampled
# (lost, no permission); or its sampler stuck in a call that does not return.
GPU_STATE_OK: Final = "ok"
GPU_STATE_ERROR: Final = "error"
GPU_STATE_LOST: Final = "lost"
GPU_STATE_STUCK: Final = "stuck"
GPU_STATES: Final = (GPU_STATE_OK, GPU_STATE_ERROR, GPU_STATE_LOST, GPU_STATE_STUCK)
# The GPU label of a model server read alone: the engine sees its GPUs as one.
SERVER_GPU_INDEX: Final = "server"

# ---------------------------------------------------------------- the serving engines' names (read, not ours)

# The metric families each serving engine documents on its /metrics
# (agent_otel.gpu.server reads them; docs/model-servers.md lists where each
# comes from). Counters are named as scraped, with ``_total``.
VLLM_RUNNING: Final = "vllm:num_requests_running"
VLLM_WAITING: Final = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"  # V1 engine, 0..1
VLLM_KV_CACHE_USAGE_V0: Final = "vllm:gpu_cache_usage_perc"  # before V1, 0..1
VLLM_PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
SGLANG_RUNNING: Final = "sglang:num_running_reqs"
SGLANG_WAITING: Final = "sglang:num_queue_reqs"
SGLANG_KV_CACHE_USAGE: Final = "sglang:token_usage"  # 0..1 of the KV pool's tokens
SGLANG_PROMPT_TOKENS: Final = "sglang:prompt_tokens_total"
SGLANG_GENERATION_TOKENS: Final = "sglang:generation_tokens_total"
TGI_RUNNING: Final = "tgi_batch_current_size"
TGI_WAITING: Final = "tgi_queue_size"
TGI_INFERENCE_COUNT: Final = "tgi_batch_inference_count"  # counter, per method (prefill, decode)

# vLLM's span per request (vllm/tracing.py, v1/engine/output_processor.py), a
# SERVER span started from the caller's traceparent, and its latencies (s).
SPAN_VLLM_REQUEST: Final = "llm_request"
VLLM_TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"
VLLM_TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"
VLLM_TIME_IN_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
VLLM_TIME_IN_DECODE: Final = "gen_ai.latency.time_in_model_decode"
VLLM_E2E: Final = "gen_ai.latency.e2e"
# How the simulated GPU names itself (gpu.uuid, and the name and uuid columns
# of the GPU log the live path writes): the report tells it by them too.
SIMULATED_GPU_NAME: Final = "Simulated GPU"
SIMULATED_GPU_UUID_PREFIX: Final = "GPU-simulated-"

# The tool label value of every tool name beyond tool_name_limit (and of every
# executor, GPU and reason label value beyond its own limit).
OTHER_TOOL: Final = "_other"

LOOP_ROLE_BLOCKING: Final = "blocking"  # the link to the tool call that blocked the loop
LOOP_ROLE_WAITING: Final = "waiting"  # a link to a tool call that waited for the loop
# asyncio.loop.blocked_by, and the tool label of its metric, when no tool call held the loop.
BLOCKED_BY_UNKNOWN: Final = "unknown"
# Kinds of span (the kind label of agent_otel_spans_dropped_total). When the
# export queue is full, a derived span is the one dropped.
SPAN_KIND_TOOL: Final = "tool"  # execute_tool spans
SPAN_KIND_DERIVED: Final = "derived"  # made from other spans: the per-call gpu.idle children
SPAN_KIND_OTHER: Final = "other"  # the rest: gpu.idle windows, batch spans, other libraries' spans
SPAN_KINDS: Final = (SPAN_KIND_TOOL, SPAN_KIND_DERIVED, SPAN_KIND_OTHER)

# ---------------------------------------------------------------- Prometheus labels

LABEL_TOOL: Final = "tool"
LABEL_OUTCOME: Final = "outcome"
LABEL_EXECUTOR: Final = "executor"
LABEL_PHASE: Final = "phase"
LABEL_GPU: Final = "gpu"
LABEL_MODEL: Final = "model"  # gen_ai.request.model of a model call
LABEL_REASON: Final = "reason"
LABEL_STATE: Final = "state"  # of agent_otel_gpu_state: one of GPU_STATES
LABEL_THREAD: Final = "thread"
LABEL_KIND: Final = "kind"  # of agent_otel_spans_dropped_total: one of SPAN_KINDS
LABEL_TRANSPORT: Final = "transport"  # the blame service's OTLP receiver: "grpc" or "http"
LABEL_SERVER: Final = "server"  # a model server's /metrics address (host:port), agent_otel.gpu.server
# target_info: the resource attributes of a process, as the OpenTelemetry
# Prometheus exporters expose them (dots become underscores); agent-otel
# puts the GPU pool there, and the pool rules join on it.
TARGET_INFO: Final = "target_info"
LABEL_GPU_POOL: Final = "agent_gpu_pool"  # agent.gpu.pool
# The exemplar label of the duration and exec histograms.
EXEMPLAR_TRACE_ID: Final = "trace_id"

# ---------------------------------------------------------------- Prometheus metrics

# Histogram bounds, seconds. They include the default SLO threshold (0.8 s)
# exactly: an SLO threshold must be one of them (dashboards/slo.py).
DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_SIZE_BUCKETS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
BATCH_WAIT_BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)

COUNTER: Final = "counter"
GAUGE: Final = "gauge"
HISTOGRAM: Final = "histogram"


# How the Prometheus exporter keeps a metric (MetricSpec.kept): a
# prometheus_client metric; one of those kept together, updated together under
# Metrics.lock and collected in one hold of it (the GPU's idle time and its
# blame add up in every scrape); a plain table the pipeline thread counts
# (exporters.prometheus.PipelineCounter, PipelineHistogram); or computed when
# Prometheus scrapes, from live tables.
KEPT_CLIENT: Final = "client"
KEPT_TOGETHER: Final = "together"
KEPT_PIPELINE: Final = "pipeline"
KEPT_SCRAPE: Final = "scrape"
KEPT: Final = (KEPT_CLIENT, KEPT_TOGETHER, KEPT_PIPELINE, KEPT_SCRAPE)


class MetricSpec(NamedTuple):
    """One Prometheus metric: its name as scraped and queried (counters end in
    ``_total``), type, labels, help text and, for a histogram, bucket bounds."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()
    remedy: bool = False  # exported by the remedies of docs/remedies.md, beyond the core contract
    blame_service: bool = False  # exported by the blame service of a GPU pool (agent-otel gpu-exporter --pool) only
    # How agent_otel.exporters.prometheus keeps it (one of KEPT), and the
    # attribute its counting code reaches it by (on Metrics, on
    # Metrics.remedies for a remedy's, on BlameServiceMetrics for the blame
    # service's); none for a metric computed when Prometheus scrapes.
    kept: str = KEPT_CLIENT
    attribute: str = ""

    def series(self) -> tuple[str, ...]:
        """The series names a query may use: a histogram's ``_bucket``, ``_count`` and ``_sum``."""
        if self.kind == HISTOGRAM:
            return tuple(f"{self.name}_{part}" for part in ("bucket", "count", "sum"))
        return (self.name,)


METRIC_TOOL_CALLS: Final = "agent_tool_calls_total"
METRIC_TOOL_DURATION: Final = "agent_tool_duration_seconds"
METRIC_TOOL_QUEUE: Final = "agent_tool_queue_seconds"
METRIC_TOOL_EXEC: Final = "agent_tool_exec_seconds"
METRIC_TOOL_INFLIGHT: Final = "agent_tool_inflight"
METRIC_EXECUTOR_QUEUE_DEPTH: Final = "agent_executor_queue_depth"
METRIC_EXECUTOR_ACTIVE_WORKERS: Final = "agent_executor_active_workers"
METRIC_EXECUTOR_MAX_WORKERS: Final = "agent_executor_max_workers"
METRIC_EXECUTOR_WAIT: Final = "agent_executor_wait_seconds"
METRIC_GPU_UTILIZATION: Final = "agent_gpu_utilization_ratio"
METRIC_GPU_IDLE: Final = "agent_gpu_idle_seconds_total"
METRIC_GPU_IDLE_BLOCKED: Final = "agent_gpu_idle_blocked_seconds_total"
METRIC_GPU_IDLE_UNATTRIBUTED: Final = "agent_gpu_idle_unattributed_seconds_total"
METRIC_GPU_UNDERUSED: Final = "agent_gpu_underused_seconds_total"
METRIC_GPU_UNDERUSED_BLOCKED: Final = "agent_gpu_underused_blocked_seconds_total"
METRIC_GPU_UNDERUSED_UNATTRIBUTED: Final = "agent_gpu_underused_unattributed_seconds_total"
# The model server's share: GPU time idle (or capacity unused) while a model
# call of the pool was in flight, by model and phase (queued, decode).
METRIC_GPU_IDLE_MODEL: Final = "agent_gpu_idle_model_seconds_total"
METRIC_GPU_UNDERUSED_MODEL: Final = "agent_gpu_underused_model_seconds_total"
# The share of the time model calls were in flight that the GPU read idle
# (a contradiction above ~20%: docs/gpu.md).
METRIC_GPU_MODEL_IDLE_RATIO: Final = "agent_gpu_model_idle_ratio"
METRIC_SPANS_DROPPED: Final = "agent_otel_spans_dropped_total"
METRIC_GPU_ERRORS: Final = "agent_otel_gpu_errors_total"
METRIC_GPU_MISSING: Final = "agent_otel_gpu_missing_seconds_total"
METRIC_GPU_STATE: Final = "agent_otel_gpu_state"
METRIC_LOOP_BLOCKED: Final = "agent_asyncio_loop_blocked_seconds_total"
METRIC_LOOP_LAG: Final = "agent_asyncio_loop_lag_seconds"
METRIC_GPU_HOUR_PRICE: Final = "agent_gpu_hour_price"  # the gpu_hour_price setting, per GPU
# a model server's metrics, read (agent_otel.gpu.server)
METRIC_SERVER_RUNNING: Final = "agent_model_server_requests_running"
METRIC_SERVER_WAITING: Final = "agent_model_server_requests_waiting"
METRIC_SERVER_KV_CACHE: Final = "agent_model_server_kv_cache_usage_ratio"
METRIC_GPU_IDLE_KV_CACHE_HELD: Final = "agent_gpu_idle_kv_cache_held_seconds_total"
# remedies
METRIC_TOOL_FALLBACKS: Final = "agent_tool_fallbacks_total"
METRIC_TOOL_RETRIES: Final = "agent_tool_retries_total"
METRIC_TOOL_REJECTIONS: Final = "agent_tool_rejections_total"
METRIC_TOOL_CACHE_HITS: Final = "agent_tool_cache_hits_total"
METRIC_TOOL_CACHE_MISSES: Final = "agent_tool_cache_misses_total"
METRIC_TOOL_CACHE_EVICTIONS: Final = "agent_tool_cache_evictions_total"
METRIC_TOOL_BATCH_SIZE: Final = "agent_tool_batch_size"
METRIC_TOOL_BATCH_WAIT: Final = "agent_tool_batch_wait_seconds"
METRIC_EXECUTOR_ABANDONED_WORKERS: Final = "agent_executor_abandoned_workers"

# the blame service of a GPU pool
METRIC_RECEIVED_SPANS: Final = "agent_otel_received_spans_total"
METRIC_REFUSED_SPANS: Final = "agent_otel_refused_spans_total"
METRIC_REFUSED_REQUESTS: Final = "agent_otel_refused_requests_total"
METRIC_LATE_SPANS: Final = "agent_otel_late_spans_total"
METRIC_BLAME_CALLS: Final = "agent_otel_blame_calls"
METRIC_BLAME_CALLS_DROPPED: Final = "agent_otel_blame_calls_dropped_total"
METRIC_BLAME_LAG: Final = "agent_otel_blame_lag_seconds"
METRIC_SPAN_DELAY: Final = "agent_otel_span_delay_seconds"
# From a tool span's end to its arrival at the blame service: the export
# interval and batching the watermark must cover. A span cannot arrive
# before it ended: one that seems to is counted at 0 (the ``le="0"``
# bucket), and says the sender's clock is ahead of this host's.
SPAN_DELAY_BUCKETS: Final = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)

_TOOL = (LABEL_TOOL,)
_EXECUTOR = (LABEL_EXECUTOR,)
_GPU = (LABEL_GPU,)

# Every metric, by name, in the order /metrics shows them (docs/telemetry.md groups
# them by subject).
METRICS: Final[dict[str, MetricSpec]] = {
    spec.name: spec
    for spec in (
        MetricSpec(
            METRIC_TOOL_CALLS,
            COUNTER,
            (LABEL_TOOL, LABEL_OUTCOME),
            "Tool calls by outcome.",
            kept=KEPT_PIPELINE,
            attribute="calls",
        ),
        MetricSpec(
            METRIC_TOOL_DURATION,
            HISTOGRAM,
            _TOOL,
            f"Tool call duration, request to result ({GEN_AI_EXECUTE_TOOL_DURATION}).",
            DURATION_BUCKETS,
            kept=KEPT_PIPELINE,
            attribute="duration",
        ),
        MetricSpec(
            METRIC_TOOL_QUEUE,
            HISTOGRAM,
            (LABEL_TOOL, LABEL_EXECUTOR),
            "Time a tool call waited for an executor worker.",
            DURATION_BUCKETS,
            kept=KEPT_PIPELINE,
            attribute="queue",
        ),
        MetricSpec(
            METRIC_TOOL_EXEC,
            HISTOGRAM,
            _TOOL,
            "Time a tool call ran.",
            DURATION_BUCKETS,
            kept=KEPT_PIPELINE,
            attribute="exec",
        ),
        MetricSpec(
            METRIC_TOOL_INFLIGHT,
            GAUGE,
            (LABEL_TOOL, LABEL_PHASE),
            "Tool calls requested and not finished, by phase.",
            kept=KEPT_SCRAPE,
        ),
        MetricSpec(
            METRIC_EXECUTOR_QUEUE_DEPTH, GAUGE, _EXECUTOR, "Submissions waiting for a worker.", kept=KEPT_SCRAPE
        ),
        MetricSpec(METRIC_EXECUTOR_ACTIVE_WORKERS, GAUGE, _EXECUTOR, "Workers running a submission.", kept=KEPT_SCRAPE),
        MetricSpec(METRIC_EXECUTOR_MAX_WORKERS, GAUGE, _EXECUTOR, "Workers the executor may start.", kept=KEPT_SCRAPE),
        MetricSpec(
            METRIC_EXECUTOR_WAIT,
            HISTOGRAM,
            _EXECUTOR,
            "Time any submission waited for a worker.",
            DURATION_BUCKETS,
            kept=KEPT_PIPELINE,
            attribute="executor_wait",
        ),
        MetricSpec(
            METRIC_GPU_IDLE, COUNTER, _GPU, "GPU idle time in idle windows.", kept=KEPT_TOGETHER, attribute="gpu_idle"
        ),
        MetricSpec(
            METRIC_GPU_IDLE_BLOCKED,
            COUNTER,
            (LABEL_GPU, LABEL_TOOL, LABEL_PHASE),
            "GPU idle time while tool calls were in flight, by tool and phase.",
            kept=KEPT_TOGETHER,
            attribute="gpu_idle_blocked",
        ),
        MetricSpec(
            METRIC_GPU_IDLE_UNATTRIBUTED,
            COUNTER,
            _GPU,
            "GPU idle time with neither a model call nor a tool call in flight.",
            kept=KEPT_TOGETHER,
            attribute="gpu_idle_unattributed",
        ),
        MetricSpec(
            METRIC_GPU_UNDERUSED,
            COUNTER,
            _GPU,
            "GPU capacity left unused, (1 - utilization) x time, in GPU-seconds (idle windows included).",
            kept=KEPT_TOGETHER,
            attribute="gpu_underused",
        ),
        MetricSpec(
            METRIC_GPU_UNDERUSED_BLOCKED,
            COUNTER,
            (LABEL_GPU, LABEL_TOOL, LABEL_PHASE),
            "Unused GPU capacity while tool calls were in flight, by tool and phase.",
            kept=KEPT_TOGETHER,
            attribute="gpu_underused_blocked",
        ),
        MetricSpec(
            METRIC_GPU_UNDERUSED_UNATTRIBUTED,
            COUNTER,
            _GPU,
            "Unused GPU capacity with neither a model call nor a tool call in flight.",
            kept=KEPT_TOGETHER,
            attribute="gpu_underused_unattributed",
        ),
        MetricSpec(
            METRIC_GPU_IDLE_MODEL,
            COUNTER,
            (LABEL_GPU, LABEL_MODEL, LABEL_PHASE),
            "GPU idle time while model calls of its pool were in flight (the model server's share), by model and phase.",
            kept=KEPT_TOGETHER,
            attribute="gpu_idle_model",
        ),
        MetricSpec(
            METRIC_GPU_UNDERUSED_MODEL,
            COUNTER,
            (LABEL_GPU, LABEL_MODEL, LABEL_PHASE),
            "Unused GPU capacity while model calls of its pool were in flight, by model and phase.",
            kept=KEPT_TOGETHER,
            attribute="gpu_underused_model",
        ),
        MetricSpec(
            METRIC_GPU_MISSING,
            COUNTER,
            _GPU,
            "GPU time whose utilization samples were lost: neither idle nor busy.",
            kept=KEPT_TOGETHER,
            attribute="gpu_missing",
        ),
        MetricSpec(
            METRIC_GPU_UTILIZATION, GAUGE, _GPU, "GPU utilization, last sample (0..1).", attribute="gpu_utilization"
        ),
        MetricSpec(
            METRIC_GPU_MODEL_IDLE_RATIO,
            GAUGE,
            _GPU,
            "Share of the time model calls were in flight that the GPU read idle (over ~0.2: the GPU data contradicts "
            "the model calls).",
            attribute="gpu_model_idle_ratio",
        ),
        MetricSpec(
            METRIC_GPU_ERRORS, COUNTER, (LABEL_REASON,), "GPU sampling problems, by reason.", attribute="gpu_errors"
        ),
        MetricSpec(
            METRIC_GPU_STATE,
            GAUGE,
            (LABEL_GPU, LABEL_STATE, LABEL_REASON),
            "1 for each sampled GPU, in its sampling state now (ok, error, lost, stuck) and why.",
            kept=KEPT_SCRAPE,
        ),
        MetricSpec(
            METRIC_GPU_HOUR_PRICE,
            GAUGE,
            _GPU,
            "What an hour of the GPU costs (the gpu_hour_price setting); absent without a price.",
            attribute="gpu_hour_price",
        ),
        MetricSpec(
            METRIC_SERVER_RUNNING,
            GAUGE,
            (LABEL_SERVER,),
            "Requests the model server is running, at its latest scrape.",
            attribute="server_running",
        ),
        MetricSpec(
            METRIC_SERVER_WAITING,
            GAUGE,
            (LABEL_SERVER,),
            "Requests queued at the model server (waiting to run), at its latest scrape.",
            attribute="server_waiting",
        ),
        MetricSpec(
            METRIC_SERVER_KV_CACHE,
            GAUGE,
            (LABEL_SERVER,),
            "Share of the model server's KV cache in use (0..1), at its latest scrape.",
            attribute="server_kv_cache",
        ),
        MetricSpec(
            METRIC_GPU_IDLE_KV_CACHE_HELD,
            COUNTER,
            (LABEL_GPU, LABEL_TOOL),
            "The model server's KV cache in use while the GPU idled (share, 0..1) times the idle time blamed on "
            "each tool: cache held by requests waiting on that tool, in cache-seconds.",
            attribute="gpu_idle_kv_cache_held",
        ),
        MetricSpec(
            METRIC_SPANS_DROPPED,
            COUNTER,
            (LABEL_KIND,),
            "Spans no sink could take (export queue full, export failed), by kind of span.",
            attribute="spans_dropped",
        ),
        MetricSpec(
            METRIC_LOOP_BLOCKED,
            COUNTER,
            _TOOL,
            "Time an asyncio event loop was blocked, by the tool call that blocked it (unknown: none).",
            attribute="loop_blocked",
        ),
        MetricSpec(
            METRIC_LOOP_LAG,
            GAUGE,
            (LABEL_THREAD,),
            "How late the event loop's latest heartbeat ran; while it is blocked, how long so far.",
            kept=KEPT_SCRAPE,
        ),
        MetricSpec(
            METRIC_TOOL_FALLBACKS,
            COUNTER,
            _TOOL,
            "Tool calls answered by their fallback.",
            remedy=True,
            attribute="fallbacks",
        ),
        MetricSpec(
            METRIC_TOOL_RETRIES,
            COUNTER,
            _TOOL,
            "Tool call attempts retried after a failure or timeout.",
            remedy=True,
            attribute="retries",
        ),
        MetricSpec(
            METRIC_TOOL_REJECTIONS,
            COUNTER,
            (LABEL_TOOL, LABEL_EXECUTOR),
            "Submissions a full tool pool rejected.",
            remedy=True,
            attribute="rejections",
        ),
        MetricSpec(
            METRIC_TOOL_CACHE_HITS,
            COUNTER,
            _TOOL,
            "Tool calls answered from the result cache.",
            remedy=True,
            attribute="cache_hits",
        ),
        MetricSpec(
            METRIC_TOOL_CACHE_MISSES,
            COUNTER,
            _TOOL,
            "Tool calls the result cache could not answer.",
            remedy=True,
            attribute="cache_misses",
        ),
        MetricSpec(
            METRIC_TOOL_CACHE_EVICTIONS,
            COUNTER,
            _TOOL,
            "Cached results dropped to make room.",
            remedy=True,
            attribute="cache_evicted",
        ),
        MetricSpec(
            METRIC_TOOL_BATCH_SIZE,
            HISTOGRAM,
            _TOOL,
            "Calls merged into one batch.",
            BATCH_SIZE_BUCKETS,
            remedy=True,
            attribute="batch_size",
        ),
        MetricSpec(
            METRIC_TOOL_BATCH_WAIT,
            HISTOGRAM,
            _TOOL,
            "Time a call waited for its batch to start.",
            BATCH_WAIT_BUCKETS,
            remedy=True,
            attribute="batch_wait",
        ),
        MetricSpec(
            METRIC_EXECUTOR_ABANDONED_WORKERS,
            GAUGE,
            _EXECUTOR,
            "Workers still running a call whose caller stopped waiting (timed out).",
            remedy=True,
            attribute="abandoned_workers",
        ),
        MetricSpec(
            METRIC_RECEIVED_SPANS,
            COUNTER,
            (LABEL_TRANSPORT,),
            "Spans received over OTLP, by transport.",
            blame_service=True,
            attribute="received",
        ),
        MetricSpec(
            METRIC_REFUSED_SPANS,
            COUNTER,
            (LABEL_REASON,),
            "Received spans refused: not tool spans, malformed, of another GPU pool, or ending too far ahead "
            "of this host's clock.",
            blame_service=True,
            attribute="refused_spans",
        ),
        MetricSpec(
            METRIC_REFUSED_REQUESTS,
            COUNTER,
            (LABEL_TRANSPORT, LABEL_REASON),
            "OTLP requests refused whole: malformed, too large, unsupported, busy or failed.",
            blame_service=True,
            attribute="refused_requests",
        ),
        MetricSpec(
            METRIC_LATE_SPANS,
            COUNTER,
            (LABEL_TOOL,),
            "Tool spans that arrived after the watermark had passed part of their call: that part is not blamed.",
            blame_service=True,
            attribute="late",
        ),
        MetricSpec(
            METRIC_BLAME_CALLS,
            GAUGE,
            (),
            "Finished tool calls held for attribution.",
            blame_service=True,
            kept=KEPT_SCRAPE,
        ),
        MetricSpec(
            METRIC_BLAME_CALLS_DROPPED,
            COUNTER,
            (),
            "Finished tool calls dropped to stay within the memory bound before they were blamed in full.",
            blame_service=True,
            kept=KEPT_SCRAPE,
        ),
        MetricSpec(
            METRIC_SPAN_DELAY,
            HISTOGRAM,
            (),
            "Seconds from a tool span's end (the sender's clock) to its arrival (this host's clock).",
            SPAN_DELAY_BUCKETS,
            blame_service=True,
            attribute="delay",
        ),
        MetricSpec(
            METRIC_BLAME_LAG,
            GAUGE,
            (),
            "Seconds between now and the end of the GPU time blamed so far (the watermark, plus sampling delay).",
            blame_service=True,
            kept=KEPT_SCRAPE,
        ),
    )
}


def series_names() -> set[str]:
    """Every series name a PromQL query may use: counters, gauges, histogram parts."""
    return {series for spec in METRICS.values() for series in spec.series()}
