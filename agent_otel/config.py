"""Every setting of agent-otel, declared once.

Each field of ``Settings`` carries its type, default and, in its metadata,
a ``Declaration``: environment variables, bounds or choices, and help
text. ``instrument()`` reads keyword arguments first, then the environment
variables, then the defaults; the command lines, the GPU timeline's
defaults and the README's configuration table (``python -m
agent_otel.config --write README.md``) all come from here, so a setting is
written down in one place. Every value is validated with an error naming
the setting (or the variable, or the command-line option) and the value.

The ``OTEL_*`` variables of the OpenTelemetry SDK (endpoint, headers,
timeouts, certificates) are read by the SDK and its exporters themselves;
this module reads only the ones that decide what ``instrument()`` sets up,
and validates them so a typo fails at start-up, not silently.

Importing this module loads nothing else of the toolkit (only
``agent_otel.errors`` and ``agent_otel.support.prices``, which loads only the
errors), so the dashboards and the GPU modules may use it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Union, get_args, get_origin, get_type_hints

from agent_otel.support import prices
from agent_otel.errors import AgentOtelError, ConfigError
from agent_otel.semconv import GPU_SOURCE_REPLAY, GPU_SOURCES

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_KEY = "agent_otel"
_KEEP_DEFAULT = object()  # a list setting given as empty keeps its default


@dataclass(frozen=True)
class Declaration:
    """What the code needs to know about a setting, beside its name, type and default."""

    help: str  # Markdown: the README's "meaning" column; the command lines strip the backticks
    env: tuple[str, ...] = ()  # environment variables, the first one set wins
    low: Optional[float] = None  # bounds of a number, inclusive
    high: Optional[float] = None
    unit: str = ""  # "s" (seconds) or "ratio": how bounds are worded
    env_unit: str = ""  # "ms": the environment variable is in milliseconds, the setting in seconds
    choices: tuple[str, ...] = ()  # the values a text or list setting may take
    if_empty: Any = ()  # the value of a list setting given as an empty list (_KEEP_DEFAULT: its default)
    shown_default: Optional[str] = None  # the README's default, when the value alone does not say it
    # A text setting's own check: what was expected when the text is wrong, else None.
    check: Optional[Callable[[str], Optional[str]]] = None


def setting(default: Any, help: str, **declaration: Any) -> Any:
    """A ``Settings`` field: ``default`` plus its ``Declaration``."""
    return field(default=default, metadata={_KEY: Declaration(help, **declaration)})


# The gpu setting's values: auto, each GPU source of semconv.GPU_SOURCES (a
# replay with its log's path: replay:PATH), off.
GPU_AUTO = "auto"
GPU_OFF = "off"
REPLAY_PREFIX = GPU_SOURCE_REPLAY + ":"
GPU_CHOICES = (
    GPU_AUTO,
    *(REPLAY_PREFIX + "PATH" if kind == GPU_SOURCE_REPLAY else kind for kind in GPU_SOURCES),
    GPU_OFF,
)


@dataclass(frozen=True)
class Settings:
    """Everything ``instrument()`` can be told; see the README's configuration table."""

    service_name: Optional[str] = setting(
        None, "the resource's `service.name`", env=("OTEL_SERVICE_NAME",), shown_default="`unknown_service`"
    )
    traces_file: Optional[str] = setting(
        None, "also write spans as OTLP/JSON lines to this file", env=("AGENT_OTEL_TRACES_FILE",)
    )
    traces_exporters: Optional[tuple[str, ...]] = setting(
        None,
        "comma list of `otlp`, `console`, `none`",
        env=("OTEL_TRACES_EXPORTER",),
        choices=("otlp", "console", "none"),
        if_empty=_KEEP_DEFAULT,
        shown_default="`otlp` if an endpoint is set or a Collector answers on localhost, else a local file "
        "([where spans go](docs/telemetry.md#where-spans-go))",
    )
    otlp_endpoint: Optional[str] = setting(
        None,
        "where OTLP sends traces (gRPC: `http://host:4317` for a receiver without TLS, such as the "
        "Collector and blame service as shipped, `https://host:4317` for TLS; a bare `host:4317` means TLS "
        "([endpoints](docs/telemetry.md#otlp-endpoints)); HTTP: the full `.../v1/traces` URL); "
        "`OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL) is read by the exporter as usual",
        env=("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",),
        shown_default="the SDK's (localhost)",
    )
    otlp_protocol: str = setting(
        "grpc",
        "`grpc` or `http/protobuf`",
        env=("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
        choices=("grpc", "http/protobuf"),
    )
    sdk_disabled: bool = setting(False, "no spans at all (metrics still work)", env=("OTEL_SDK_DISABLED",))
    prometheus_port: Optional[int] = setting(
        None,
        "serve `/metrics` on this port (`0`: any free port, see `handle.prometheus_url`)",
        env=("AGENT_OTEL_PROMETHEUS_PORT",),
        low=0,
        high=65535,
    )
    prometheus_address: str = setting(
        "127.0.0.1", "address `/metrics` binds to; `0.0.0.0` to expose it", env=("AGENT_OTEL_PROMETHEUS_ADDRESS",)
    )
    shutdown_timeout: float = setting(
        5.0, "seconds `shutdown()` may take at most", env=("AGENT_OTEL_SHUTDOWN_TIMEOUT",), low=0, high=3600, unit="s"
    )
    max_queue_size: int = setting(
        2048,
        "spans waiting for export at most, per sink; when full, tool spans take the place of derived ones, "
        "and spans no sink could take are counted in `agent_otel_spans_dropped_total{kind}`",
        env=("OTEL_BSP_MAX_QUEUE_SIZE",),
        low=1,
        high=10_000_000,
    )
    export_batch_size: int = setting(
        512, "spans per export at most", env=("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",), low=1, high=10_000_000
    )
    export_interval: float = setting(
        5.0,
        "seconds between span exports (the variable is in milliseconds)",
        env=("OTEL_BSP_SCHEDULE_DELAY",),
        low=0.001,
        high=3600,
        unit="s",
        env_unit="ms",
    )
    tool_name_limit: int = setting(
        200, "distinct `tool` label values before `_other`", env=("AGENT_OTEL_TOOL_NAME_LIMIT",), low=1, high=10_000_000
    )
    executor_name_limit: int = setting(
        50,
        "distinct `executor` label values (pool names) before `_other`",
        env=("AGENT_OTEL_EXECUTOR_NAME_LIMIT",),
        low=1,
        high=10_000_000,
    )
    instrument_executors: bool = setting(True, "hook `ThreadPoolExecutor.submit`", env=("AGENT_OTEL_EXECUTORS",))
    frameworks: Optional[tuple[str, ...]] = setting(
        None,
        'comma list of framework hooks to install (`""`: none)',
        env=("AGENT_OTEL_FRAMEWORKS",),
        shown_default="all importable",
    )
    model_spans: str = setting(
        "auto",
        "the framework hooks' model-call spans: `auto` (unless another GenAI instrumentation is "
        "active), `on`, `off` ([docs/telemetry.md](docs/telemetry.md#model-call-span))",
        env=("AGENT_OTEL_MODEL_SPANS",),
        choices=("auto", "on", "off"),
    )
    record_arguments: bool = setting(
        False, "record tool arguments on spans (opt-in)", env=("AGENT_OTEL_RECORD_ARGUMENTS",)
    )
    record_results: bool = setting(False, "record tool results on spans (opt-in)", env=("AGENT_OTEL_RECORD_RESULTS",))
    record_exception_messages: bool = setting(
        True,
        "record a failed call's exception message (and the message lines of its stack trace); off: its "
        "type and stack frames only ([why on](docs/telemetry.md#what-a-span-says-about-the-data))",
        env=("AGENT_OTEL_RECORD_EXCEPTION_MESSAGES",),
    )
    deferred_spans: bool = setting(
        False,
        "build each tool span on the pipeline thread after the call, not in it (opt-in; span processors "
        "see it up to 0.25 s later; [docs/telemetry.md](docs/telemetry.md#deferred-spans))",
        env=("AGENT_OTEL_DEFERRED_SPANS",),
    )
    max_attribute_length: int = setting(
        1024,
        "truncate recorded arguments, results and exception messages",
        env=("AGENT_OTEL_MAX_ATTRIBUTE_LENGTH",),
        low=1,
        high=10_000_000,
    )
    redact: Optional[Callable[[str, str], str]] = setting(
        None,
        "`redact(attribute, text) -> text`, applied to every text a tool call's spans carry: arguments, "
        "results, exception messages, stack traces, status descriptions",
    )
    gpu: str = setting(
        "auto",
        "`auto` (NVML if a GPU is found, else the model server's metrics if `model_server_metrics` names them, "
        "else off), `nvml`, `simulated`, `replay:PATH`, `model_server` (its metrics alone), `off`",
        env=("AGENT_OTEL_GPU",),
        choices=GPU_CHOICES,
    )
    gpu_devices: Optional[tuple[str, ...]] = setting(
        None, "comma list of GPU indexes or UUIDs", env=("AGENT_OTEL_GPU_DEVICES",), if_empty=None, shown_default="all"
    )
    gpu_poll_interval: float = setting(
        0.5, "seconds between NVML reads", env=("AGENT_OTEL_GPU_POLL_INTERVAL",), low=0.001, high=3600, unit="s"
    )
    gpu_idle_threshold: float = setting(
        0.10,
        "utilization (0..1) at or below which the GPU is idle",
        env=("AGENT_OTEL_GPU_IDLE_THRESHOLD",),
        low=0,
        high=1,
        unit="ratio",
    )
    gpu_min_idle: float = setting(
        0.5,
        "seconds an idle stretch must last to become a window",
        env=("AGENT_OTEL_GPU_MIN_IDLE",),
        low=0.001,
        high=3600,
        unit="s",
    )
    gpu_idle_share_min: float = setting(
        0.05,
        "seconds a tool call's share of a GPU idle window must reach for a link from the window's `gpu.idle` "
        "span and a child `gpu.idle` span under the tool's span; smaller shares are in the window's per-tool "
        "totals only (`0`: every share) ([telemetry.md](docs/telemetry.md#gpu-idle-spans))",
        env=("AGENT_OTEL_GPU_IDLE_SHARE_MIN",),
        low=0,
        high=3600,
        unit="s",
    )
    gpu_idle_children: bool = setting(
        True,
        "a child `gpu.idle` span under each tool span whose share of an idle window reaches "
        "`gpu_idle_share_min` (in Jaeger the stall shows under the tool); off: the window's span only",
        env=("AGENT_OTEL_GPU_IDLE_CHILDREN",),
    )
    gpu_log_file: Optional[str] = setting(
        None,
        "also write the GPU samples as `nvidia-smi` CSV, for `agent-otel report --gpu-log` (the utilization "
        "curve, dips that are not idle included); when none is named and the spans go to the file agent-otel "
        "chose, beside it (`<that file>-gpu.csv`, up to 100 MB)",
        env=("AGENT_OTEL_GPU_LOG",),
    )
    model_server_metrics: Optional[str] = setting(
        None,
        "a serving engine's Prometheus endpoint (vLLM, SGLang, TGI), e.g. `http://vllm-a.internal:8000/metrics`: "
        "read every `gpu_poll_interval` beside the GPU source (its queue and KV cache on the timeline), or "
        "alone as the GPU signal when `gpu` is `auto` and finds no GPU "
        "([docs/model-servers.md](docs/model-servers.md))",
        env=("AGENT_OTEL_MODEL_SERVER_METRICS",),
    )
    gpu_hour_price: Optional[str] = setting(
        None,
        "what a GPU-hour costs, to show blamed idle time as money: `2.5` (every GPU), `H100=3.1` (by GPU "
        "model), `pool:POOL=2.2` (a GPU pool), `table` (a default table per GPU model, with its source), "
        "comma-separated ([docs/report.md](docs/report.md#what-idle-costs)); none: no money shown",
        env=("AGENT_OTEL_GPU_HOUR_PRICE",),
        check=prices.problem,
    )
    attribution_horizon: float = setting(
        120.0,
        "seconds finished calls are kept for live attribution while GPU samples lag behind (tool calls already blamed go at once)",
        env=("AGENT_OTEL_ATTRIBUTION_HORIZON",),
        low=1,
        high=86400,
        unit="s",
    )
    gpu_pool: Optional[str] = setting(
        None,
        "the GPU pool (model server) this process's tool calls can leave idle, e.g. `vllm-a.internal:8000`: "
        "the resource attribute `agent.gpu.pool`; blame then happens in the pool's blame service, not here "
        "([docs/attribution.md](docs/attribution.md#gpu-pools))",
        env=("AGENT_OTEL_GPU_POOL",),
        shown_default="none: this process's own GPUs",
    )
    blame_memory_limit: int = setting(
        256 * 1024 * 1024,
        "the blame service: bytes it may hold for OTLP requests being received and decoded (both transports); "
        "past it a request is refused with 503 / `UNAVAILABLE` and retried by its sender "
        '(`agent_otel_refused_requests_total{reason="memory"}`; [deploy.md](docs/deploy.md#limits-of-the-blame-service))',
        env=("AGENT_OTEL_BLAME_MEMORY_LIMIT",),
        low=16 * 1024 * 1024,
        high=1 << 40,
        shown_default="`268435456` (256 MiB)",
    )
    blame_request_timeout: float = setting(
        10.0,
        "the blame service: seconds an OTLP request may take to arrive whole, from its first byte (headers and "
        'body); a client that stalls longer is cut off (408 / `DEADLINE_EXCEEDED`, `reason="timeout"`)',
        env=("AGENT_OTEL_BLAME_REQUEST_TIMEOUT",),
        low=0.1,
        high=3600,
        unit="s",
    )
    blame_idle_timeout: float = setting(
        15.0,
        "the blame service: seconds a connection may wait for its next OTLP request before it is closed",
        env=("AGENT_OTEL_BLAME_IDLE_TIMEOUT",),
        low=0.1,
        high=3600,
        unit="s",
    )
    blame_max_connections: int = setting(
        4096,
        "the blame service: open connections per OTLP transport; past it an HTTP connection takes the place "
        "of the one idle longest (none idle: it is closed at once)",
        env=("AGENT_OTEL_BLAME_MAX_CONNECTIONS",),
        low=1,
        high=1_000_000,
    )
    blame_max_rpcs: int = setting(
        64,
        "the blame service: OTLP/gRPC calls in progress at once (`maximum_concurrent_rpcs`); past it a call is "
        'refused with `UNAVAILABLE` (`reason="busy"`) and retried by its sender',
        env=("AGENT_OTEL_BLAME_MAX_RPCS",),
        low=1,
        high=100_000,
    )
    loop_monitor: bool = setting(
        True,
        "watch asyncio event loops for blocking ([telemetry.md](docs/telemetry.md#event-loop-blocking))",
        env=("AGENT_OTEL_LOOP_MONITOR",),
    )
    loop_block_threshold: float = setting(
        0.1,
        "seconds an event loop must be blocked to record an `asyncio.loop.blocked` span",
        env=("AGENT_OTEL_LOOP_BLOCK_THRESHOLD",),
        low=0.01,
        high=60,
        unit="s",
    )


# The defaults, for code that takes a setting as a parameter (the GPU timeline, the report).
DEFAULTS = Settings()


@dataclass(frozen=True)
class SettingInfo:
    """One setting: its name, Python type, default and declaration."""

    name: str
    type: Any
    default: Any
    declaration: Declaration


def _declared() -> dict[str, SettingInfo]:
    hints = get_type_hints(Settings)
    return {
        f.name: SettingInfo(f.name, hints[f.name], f.default, f.metadata[_KEY]) for f in dataclasses.fields(Settings)
    }


SETTINGS: dict[str, SettingInfo] = _declared()


# ---------------------------------------------------------------- parsing and checking


def _base_type(hint: Any) -> Any:
    """``int`` for ``Optional[int]``; the hint itself otherwise."""
    if get_origin(hint) is Union:
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def describe_choices(choices: tuple[str, ...]) -> str:
    """``"a", "b" or "c"``."""
    quoted = [f'"{c}"' for c in choices]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def number_text(number: float) -> str:
    """A bound as a person writes it: 0.001, 1, 3600, 10000000."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _bounds_text(info: SettingInfo, in_env_unit: bool) -> str:
    d = info.declaration
    low, high = d.low or 0.0, d.high or 0.0
    if in_env_unit and d.env_unit == "ms":
        return f"milliseconds from {number_text(low * 1000)} to {number_text(high * 1000)}"
    span = f"from {number_text(low)} to {number_text(high)}"
    if _base_type(info.type) is int:
        return f"a whole number {span}"
    if d.unit == "ratio":
        return f"a ratio {span}"
    if d.unit == "s":
        return f"seconds {span}"
    return f"a number {span}"


def _parse_bool(where: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigError(where, value, "true or false")


def _parse_number(info: SettingInfo, where: str, value: object, in_env_unit: bool) -> float:
    kind = _base_type(info.type)
    expected = _bounds_text(info, in_env_unit)
    if isinstance(value, bool):
        raise ConfigError(where, value, expected)
    try:
        if isinstance(value, str):
            number = float(int(value.strip()) if kind is int else float(value.strip()))
        else:
            number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(where, value, expected) from None
    if kind is int and not number.is_integer():
        raise ConfigError(where, value, expected)
    if in_env_unit and info.declaration.env_unit == "ms":
        number /= 1000.0
    d = info.declaration
    if not (d.low is None or d.low <= number) or not (d.high is None or number <= d.high):
        raise ConfigError(where, value, expected)
    return int(number) if kind is int else number


def _parse_list(info: SettingInfo, where: str, value: object) -> Optional[tuple[str, ...]]:
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]  # type: ignore[attr-defined]
    names = tuple(item.strip() for item in items if item.strip())
    choices = info.declaration.choices
    if choices:
        names = tuple(name.lower() for name in names)
        for name in names:
            if name not in choices:
                raise ConfigError(where, value, "a comma-separated list of " + ", ".join(choices))
    if not names:
        empty = info.declaration.if_empty
        return info.default if empty is _KEEP_DEFAULT else empty
    return names


def _parse_choice(info: SettingInfo, where: str, value: object) -> str:
    choices = info.declaration.choices
    if isinstance(value, bool) and ("off" if value is False else "auto") in choices:
        return "off" if value is False else "auto"  # gpu=False: what the code means
    text = str(value).strip()
    lowered = text.lower()
    for choice in info.declaration.choices:
        if choice.endswith(":PATH"):
            prefix = choice[: -len("PATH")]
            if lowered.startswith(prefix) and len(text) > len(prefix):
                return prefix + text[len(prefix) :]
        elif lowered == choice:
            return choice
    raise ConfigError(where, value, describe_choices(info.declaration.choices))


def parse(name: str, value: object, where: Optional[str] = None, *, from_environment: bool = False) -> Any:
    """Validate ``value`` (text from an environment variable or a command line,
    or a Python value) as setting ``name``; returns it in the setting's type.

    Raises ``ConfigError`` naming ``where`` (the argument, variable or
    option; ``name`` by default) and the value. ``from_environment``: the
    text is in the variable's unit (milliseconds for ``OTEL_BSP_SCHEDULE_DELAY``).
    """
    info = SETTINGS.get(name)
    if info is None:
        raise ConfigError("setting", name, "one of " + ", ".join(SETTINGS))
    where = where or name
    kind = _base_type(info.type)
    if kind is bool:
        return _parse_bool(where, value)
    if kind in (int, float):
        return _parse_number(info, where, value, from_environment)
    if get_origin(kind) is tuple:
        return _parse_list(info, where, value)
    if kind is str:
        if info.declaration.choices:
            return _parse_choice(info, where, value)
        text = str(value).strip()
        if not text:
            raise ConfigError(where, value, "a non-empty string")
        expected = info.declaration.check(text) if info.declaration.check else None
        if expected is not None:
            raise ConfigError(where, value, expected)
        return text
    if value is not None and not callable(value):  # redact: code only
        raise ConfigError(where, value, "a callable (attribute, text) -> text")
    return value


def check(name: str, value: float, where: str) -> float:
    """Raise ``ConfigError`` when a number given to a library class is outside setting ``name``'s bounds."""
    parse(name, value, where)
    return value


def load_settings(
    arguments: Mapping[str, Any],
    environ: Optional[Mapping[str, str]] = None,
    defaults: Optional[Mapping[str, Any]] = None,
    problems: Optional[list[AgentOtelError]] = None,
) -> Settings:
    """Validated settings: ``arguments`` (None: not given) win over the
    environment, which wins over ``defaults`` (a command's own, e.g. the
    GPU exporter's port), which win over the declared defaults.

    An invalid value raises ``ConfigError``; with a ``problems`` list it is
    appended there instead and the setting comes from the next source, as
    if the value had not been given (``instrument()``: a bad setting must
    not stop the agent).
    """
    environ = os.environ if environ is None else environ

    def refuse(error: ConfigError) -> None:
        if problems is None:
            raise error
        problems.append(error)

    for name in sorted(set(arguments) - set(SETTINGS)):
        refuse(ConfigError("instrument()", name, "one of " + ", ".join(SETTINGS)))
    values = {}
    for name, info in SETTINGS.items():
        sources: list[tuple[Any, Optional[str]]] = []  # (value, where), first wins
        if arguments.get(name) is not None:
            sources.append((arguments[name], None))
        for variable in info.declaration.env:
            raw = environ.get(variable)
            if raw is not None and raw.strip() != "":
                sources.append((raw, variable))
                break
        if defaults and defaults.get(name) is not None:
            sources.append((defaults[name], None))
        for value, where in sources:
            try:
                if where is None:
                    values[name] = parse(name, value)
                else:
                    values[name] = parse(name, value, where, from_environment=True)
                break
            except ConfigError as error:
                refuse(error)
    return Settings(**values)


# ---------------------------------------------------------------- for command lines and the README


def plain(markdown: str) -> str:
    """Help text without Markdown's backticks, for a terminal."""
    return markdown.replace("`", "")


def shown_default(info: SettingInfo, in_markdown: bool = True) -> str:
    """The default as the README and ``--help`` show it."""
    d = info.declaration
    if d.shown_default is not None:
        text = d.shown_default
    elif info.default is None:
        text = "none"
    elif isinstance(info.default, bool):
        text = f"`{str(info.default).lower()}`"
    elif isinstance(info.default, tuple):
        text = "`" + ",".join(info.default) + "`"
    elif isinstance(info.default, float):
        text = f"`{info.default:g}`"
    else:
        text = f"`{info.default}`"
    return text if in_markdown else plain(text)


class ArgumentContainer(Protocol):
    """An ``argparse`` parser or argument group."""

    def add_argument(self, *names: str, **options: Any) -> Any: ...


def add_argument(
    parser: ArgumentContainer,
    option: str,
    name: str,
    *,
    default: Any = None,
    metavar: Optional[str] = None,
    environment: bool = True,
) -> None:
    """A command-line option for setting ``name``: help, default and environment variables from its
    declaration. It is stored as ``args.<name>``, a number for a number setting and text otherwise
    (None when not given); ``parse(name, value, option)`` checks it, naming the option in its error."""
    info = SETTINGS[name]
    shown = (
        plain(f"`{default:g}`" if isinstance(default, float) else f"`{default}`")
        if default is not None
        else shown_default(info, in_markdown=False)
    )
    text = f"{plain(info.declaration.help)} (default: {shown})"
    if environment and info.declaration.env:
        text += " [" + ", ".join(info.declaration.env) + "]"
    kind = _base_type(info.type)
    parser.add_argument(
        option, dest=name, default=None, metavar=metavar, help=text, type=kind if kind in (int, float) else str
    )


README_START = "<!-- settings: generated by `python -m agent_otel.config --write README.md`; do not edit -->"
README_END = "<!-- end of settings -->"


def markdown_table() -> str:
    """The README's configuration table."""
    rows = ["| argument | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for info in SETTINGS.values():
        d = info.declaration
        env = ", ".join(f"`{variable}`" for variable in d.env) + (f" ({d.env_unit})" if d.env_unit else "")
        bounds = f" ({number_text(d.low)} to {number_text(d.high)})" if d.low is not None and d.high is not None else ""
        rows.append(f"| `{info.name}` | {env or '(code only)'} | {shown_default(info)} | {d.help}{bounds} |")
    return "\n".join(rows) + "\n"


def readme_with_table(readme: str) -> str:
    """``readme`` with the text between the settings markers replaced by ``markdown_table()``."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise ConfigError("README", "(no settings markers)", f"the lines {README_START!r} and {README_END!r}")
    return readme[: start + len(README_START)] + "\n" + markdown_table() + readme[end:]


def main(argv: Optional[list[str]] = None) -> int:
    import argparse  # here: instrument() imports this module, and needs no command line

    parser = argparse.ArgumentParser(
        prog="python -m agent_otel.config", description="Print the settings table, or put it into a README."
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", metavar="README", help="replace the table between the settings markers")
    action.add_argument("--check", metavar="README", help="exit 1 if the README's table differs from the settings")
    args = parser.parse_args(argv)
    path = args.write or args.check
    if path is None:
        sys.stdout.write(markdown_table())
        return 0
    with open(path, encoding="utf-8") as handle:
        readme = handle.read()
    updated = readme_with_table(readme)
    if args.check:
        if updated != readme:
            print(
                f"{path}: the settings table is stale (run python -m agent_otel.config --write {path})", file=sys.stderr
            )
            return 1
        return 0
    if updated != readme:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
