"""A library decorates its tools with OpenTelemetry's API alone.

OpenTelemetry's rule: libraries depend on the API, the application picks
the SDK. ``@agent_otel.tool`` (with or without remedy options),
``tool_span``, ``model_span`` and ``agent_span`` load and run without the
SDK or the toolkit's SDK side; calls before ``instrument()`` run straight
through, and the same decorated functions are recorded once the
application calls it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# What only instrument() may load: OpenTelemetry's SDK, the Prometheus
# client, and the toolkit's modules that build SDK spans, export or wire.
SDK_SIDE = (
    "opentelemetry.sdk",
    "prometheus_client",
    "agent_otel.capture.recorder",
    "agent_otel.capture.sdk_span",
    "agent_otel.capture.deferred",
    "agent_otel.wiring.instrumentation",
    "agent_otel.wiring.pipeline",
    "agent_otel.exporters",
    "agent_otel.attribution",
    "agent_otel.gpu",
)

LIBRARY = """
import asyncio, json, sys

import agent_otel


@agent_otel.tool
def lookup(key: str) -> str:
    "Look a key up."
    return key.upper()


@agent_otel.tool(timeout=5.0, retries=1, fallback=lambda key: "fallback")
def remote(key: str) -> str:
    return key * 2


@agent_otel.tool
async def fetch(key: str) -> str:
    return key


def use_everything() -> list:
    out = [lookup("a"), remote("b"), asyncio.run(fetch("c"))]
    with agent_otel.agent_span("planner"):
        with agent_otel.model_span("llama-3-8b"):
            with agent_otel.tool_span("inline_search", call_id="call-1"):
                out.append("inline")
    return out


def loaded(prefixes):
    return sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in prefixes))


before = use_everything()
report = {"before": before, "sdk_side": loaded(json.loads(sys.argv[1]))}

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

handle = agent_otel.instrument(service_name="app", traces_exporters="none", gpu="off", frameworks=())
exporter = InMemorySpanExporter()
handle.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
report["after"] = use_everything()
handle.shutdown()
report["spans"] = sorted(span.name for span in exporter.get_finished_spans())
print(json.dumps(report))
"""


def run_library() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LIBRARY), json.dumps(SDK_SIDE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_decorator_and_the_span_helpers_run_without_the_sdk_and_record_after_instrument():
    report = run_library()
    # Before instrument(): the calls run straight through, and nothing of the SDK side is loaded.
    assert report["before"] == ["A", "bb", "c", "inline"]
    assert report["sdk_side"] == []
    # The same functions, decorated before instrument(), are recorded after it.
    assert report["after"] == report["before"]
    assert report["spans"] == [
        "chat llama-3-8b",
        "execute_tool fetch",
        "execute_tool inline_search",
        "execute_tool lookup",
        "execute_tool remote",
        "invoke_agent planner",
    ]
