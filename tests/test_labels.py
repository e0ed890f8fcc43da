"""Hostile names are harmless: valid before prometheus_client or an exporter sees them, and few."""

import urllib.request
from concurrent.futures import ThreadPoolExecutor

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

import agent_otel
from agent_otel.exporters.prometheus import LabelValues
from agent_otel.support.text import valid_text

SURROGATE = "search\udcff"  # text decoded with surrogateescape, or a JSON "\udcff" escape


def scrape(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def test_valid_text():
    assert valid_text("search", 200) == "search"
    assert valid_text(SURROGATE, 200) == "search\ufffd"
    assert valid_text("\ud83d\ude00", 200) == "\U0001f600"  # a pair written as two code points
    assert valid_text("x" * 300, 200) == "x" * 199 + "…"
    assert valid_text(12, 200) == "12"


def test_a_lone_surrogate_tool_name_never_breaks_metrics_nor_spans(spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), prometheus_port=0)
    try:
        with agent_otel.tool_span(SURROGATE):
            pass
        with ThreadPoolExecutor(1, thread_name_prefix="pool\udcfe") as pool:
            pool.submit(agent_otel.tool(lambda: 1, name="fetch")).result()
        for _ in range(3):
            status, text = scrape(handle.prometheus_url)
            assert status == 200
            assert 'agent_tool_calls_total{outcome="ok",tool="search\ufffd"} 1.0' in text
            assert 'executor="pool\ufffd"' in text
        (span, fetch) = spans.tools()
        assert span.name == "execute_tool search\ufffd"
        assert span.attributes["gen_ai.tool.name"] == "search\ufffd"
        assert fetch.attributes["agent.tool.executor"] == "pool\ufffd"
        encode_spans([span, fetch]).SerializeToString()  # what an OTLP exporter does: no error
    finally:
        agent_otel.uninstrument()


def test_a_pool_per_request_makes_at_most_executor_name_limit_label_values(spans):
    handle = agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=(), executor_name_limit=5)
    try:
        work = agent_otel.tool(lambda: 1, name="work")
        for request in range(100):
            with ThreadPoolExecutor(1, thread_name_prefix=f"request-{request}") as pool:
                pool.submit(work).result()
        handle.pipeline.drain()
        executors = {
            sample.labels["executor"]
            for family in handle.metrics.registry.collect()
            for sample in family.samples
            if "executor" in sample.labels
        }
        assert executors == {f"request-{i}" for i in range(5)} | {"_other"}
        assert (
            handle.metrics.registry.get_sample_value(
                "agent_tool_queue_seconds_count", {"tool": "work", "executor": "_other"}
            )
            == 95
        )
    finally:
        agent_otel.uninstrument()


def test_label_values_are_capped_in_length_and_number():
    labels = LabelValues(3)
    assert labels("x" * 1000) == "x" * 199 + "…"
    assert [labels(name) for name in ("a", "b", "c", "a")] == ["a", "b", "_other", "a"]
