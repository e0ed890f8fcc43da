"""Settings for ``instrument()``: keyword arguments first, then environment
variables, then defaults, each validated with an error naming the setting.

The ``OTEL_*`` variables of the OpenTelemetry SDK (endpoint, headers,
timeouts, service name) are read by the SDK and its exporters themselves;
this module reads only the ones that decide what ``instrument()`` sets up,
and validates them so a typo fails at start-up, not silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Callable, Optional

from agent_otel.errors import ConfigError

TRACES_EXPORTERS = ("otlp", "console", "none")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
GPU_SOURCES = ("auto", "nvml", "simulated", "off")  # or "replay:PATH"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclass
class Settings:
    """Everything ``instrument()`` can be told. Environment variable in brackets."""

    service_name: Optional[str] = None  # [OTEL_SERVICE_NAME]
    traces_file: Optional[str] = None  # [AGENT_OTEL_TRACES_FILE]
    traces_exporters: tuple[str, ...] = ("otlp",)  # [OTEL_TRACES_EXPORTER]
    otlp_protocol: str = "grpc"  # [OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL]
    sdk_disabled: bool = False  # [OTEL_SDK_DISABLED]
    prometheus_port: Optional[int] = None  # [AGENT_OTEL_PROMETHEUS_PORT]
    prometheus_address: str = "127.0.0.1"  # [AGENT_OTEL_PROMETHEUS_ADDRESS]
    shutdown_timeout: float = 5.0  # [AGENT_OTEL_SHUTDOWN_TIMEOUT] seconds
    max_queue_size: int = 2048  # [OTEL_BSP_MAX_QUEUE_SIZE]
    export_batch_size: int = 512  # [OTEL_BSP_MAX_EXPORT_BATCH_SIZE]
    export_interval: float = 5.0  # [OTEL_BSP_SCHEDULE_DELAY] (milliseconds in the variable)
    tool_name_limit: int = 200  # [AGENT_OTEL_TOOL_NAME_LIMIT] distinct tool label values
    instrument_executors: bool = True  # [AGENT_OTEL_EXECUTORS]
    frameworks: Optional[tuple[str, ...]] = None  # [AGENT_OTEL_FRAMEWORKS] None: all importable
    record_arguments: bool = False  # [AGENT_OTEL_RECORD_ARGUMENTS]
    record_results: bool = False  # [AGENT_OTEL_RECORD_RESULTS]
    max_attribute_length: int = 1024  # [AGENT_OTEL_MAX_ATTRIBUTE_LENGTH]
    redact: Optional[Callable[[str, str], str]] = None  # code only: (attribute, text) -> text
    gpu: str = "auto"  # [AGENT_OTEL_GPU] auto | nvml | simulated | replay:PATH | off
    gpu_devices: Optional[tuple[str, ...]] = None  # [AGENT_OTEL_GPU_DEVICES] indexes or UUIDs
    gpu_poll_interval: float = 0.5  # [AGENT_OTEL_GPU_POLL_INTERVAL] seconds
    gpu_idle_threshold: float = 0.10  # [AGENT_OTEL_GPU_IDLE_THRESHOLD] ratio 0..1
    gpu_min_idle: float = 0.5  # [AGENT_OTEL_GPU_MIN_IDLE] seconds
    gpu_log_file: Optional[str] = None  # [AGENT_OTEL_GPU_LOG] write the samples as nvidia-smi csv
    attribution_horizon: float = 120.0  # [AGENT_OTEL_ATTRIBUTION_HORIZON] seconds


# setting name -> environment variables, first set one wins
ENVIRONMENT = {
    "service_name": ("OTEL_SERVICE_NAME",),
    "traces_file": ("AGENT_OTEL_TRACES_FILE",),
    "traces_exporters": ("OTEL_TRACES_EXPORTER",),
    "otlp_protocol": ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
    "sdk_disabled": ("OTEL_SDK_DISABLED",),
    "prometheus_port": ("AGENT_OTEL_PROMETHEUS_PORT",),
    "prometheus_address": ("AGENT_OTEL_PROMETHEUS_ADDRESS",),
    "shutdown_timeout": ("AGENT_OTEL_SHUTDOWN_TIMEOUT",),
    "max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE",),
    "export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",),
    "export_interval": ("OTEL_BSP_SCHEDULE_DELAY",),
    "tool_name_limit": ("AGENT_OTEL_TOOL_NAME_LIMIT",),
    "instrument_executors": ("AGENT_OTEL_EXECUTORS",),
    "frameworks": ("AGENT_OTEL_FRAMEWORKS",),
    "record_arguments": ("AGENT_OTEL_RECORD_ARGUMENTS",),
    "record_results": ("AGENT_OTEL_RECORD_RESULTS",),
    "max_attribute_length": ("AGENT_OTEL_MAX_ATTRIBUTE_LENGTH",),
    "gpu": ("AGENT_OTEL_GPU",),
    "gpu_devices": ("AGENT_OTEL_GPU_DEVICES",),
    "gpu_poll_interval": ("AGENT_OTEL_GPU_POLL_INTERVAL",),
    "gpu_idle_threshold": ("AGENT_OTEL_GPU_IDLE_THRESHOLD",),
    "gpu_min_idle": ("AGENT_OTEL_GPU_MIN_IDLE",),
    "gpu_log_file": ("AGENT_OTEL_GPU_LOG",),
    "attribution_horizon": ("AGENT_OTEL_ATTRIBUTION_HORIZON",),
}


def _parse_bool(setting: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigError(setting, value, "true or false")


def _parse_number(setting: str, value: object, kind: type, low: float, high: float) -> float:
    if isinstance(value, bool):
        raise ConfigError(setting, value, f"a number from {low} to {high}")
    try:
        number = kind(str(value).strip()) if isinstance(value, str) else kind(value)
    except (TypeError, ValueError):
        raise ConfigError(setting, value, f"a number from {low} to {high}") from None
    if isinstance(value, float) and kind is int and not float(value).is_integer():
        raise ConfigError(setting, value, f"a whole number from {low} to {high}")
    if not low <= number <= high:
        raise ConfigError(setting, value, f"a number from {low} to {high}")
    return number


def _parse_list(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        items = value.split(",")
    else:
        items = [str(v) for v in value]  # type: ignore[union-attr]
    return tuple(item.strip() for item in items if item.strip())


def _validate(name: str, value: object, where: str) -> object:
    """Turn a raw value (argument or environment text) into the setting's type."""
    if name in ("service_name", "traces_file", "prometheus_address", "gpu_log_file"):
        text = str(value).strip()
        if not text:
            raise ConfigError(where, value, "a non-empty string")
        return text
    if name == "traces_exporters":
        names = tuple(n.lower() for n in _parse_list(value)) or ("otlp",)
        for exporter in names:
            if exporter not in TRACES_EXPORTERS:
                raise ConfigError(where, value, "a comma-separated list of " + ", ".join(TRACES_EXPORTERS))
        return names
    if name == "otlp_protocol":
        protocol = str(value).strip().lower()
        if protocol not in OTLP_PROTOCOLS:
            raise ConfigError(where, value, " or ".join(OTLP_PROTOCOLS))
        return protocol
    if name in ("sdk_disabled", "instrument_executors", "record_arguments", "record_results"):
        return _parse_bool(where, value)
    if name == "prometheus_port":
        return int(_parse_number(where, value, int, 0, 65535))
    if name in ("max_queue_size", "export_batch_size", "tool_name_limit", "max_attribute_length"):
        return int(_parse_number(where, value, int, 1, 10_000_000))
    if name == "export_interval":
        number = _parse_number(where, value, float, 0.001, 3_600_000)
        # The SDK variable is in milliseconds; the argument is in seconds.
        return number / 1000.0 if where.startswith("OTEL_") else number
    if name == "shutdown_timeout":
        return _parse_number(where, value, float, 0.0, 3600.0)
    if name == "gpu_idle_threshold":
        return _parse_number(where, value, float, 0.0, 1.0)
    if name in ("gpu_poll_interval", "gpu_min_idle"):
        return _parse_number(where, value, float, 0.001, 3600.0)
    if name == "attribution_horizon":
        return _parse_number(where, value, float, 1.0, 86400.0)
    if name == "frameworks":
        return _parse_list(value)
    if name == "gpu_devices":
        return _parse_list(value) or None
    if name == "gpu":
        source = str(value).strip()
        lowered = source.lower()
        if lowered in GPU_SOURCES:
            return lowered
        if lowered.startswith("replay:") and len(source) > len("replay:"):
            return source
        raise ConfigError(where, value, "auto, nvml, simulated, off or replay:PATH")
    if name == "redact":
        if value is not None and not callable(value):
            raise ConfigError(where, value, "a callable (attribute, text) -> text")
        return value
    raise ConfigError(where, value, "a known setting")


def load_settings(arguments: dict, environ: Optional[dict] = None) -> Settings:
    """Build validated settings: arguments win over environment over defaults."""
    environ = os.environ if environ is None else environ
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise ConfigError("instrument()", unknown[0], "one of " + ", ".join(sorted(known)))
    values = {}
    for name in known:
        if arguments.get(name) is not None:
            values[name] = _validate(name, arguments[name], name)
            continue
        for variable in ENVIRONMENT.get(name, ()):
            raw = environ.get(variable)
            if raw is not None and raw.strip() != "":
                values[name] = _validate(name, raw, variable)
                break
    return Settings(**values)
