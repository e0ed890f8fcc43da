"""The blame service's OTLP receiver: what real OTLP exporters send it, and
what a bad sender gets back (the OTLP error statuses) while it keeps serving."""

from __future__ import annotations

import collections
import gzip
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agent_otel.spans.otlp_json import WRONG_TYPE
from agent_otel.receiver.decode import NOT_A_TOOL_SPAN, tool_calls
from agent_otel.receiver.server import GRPC_SERVICE, HTTP_PATH, OtlpReceiver, Outcome

T0 = 1_767_000_000_000_000_000


class Sink:
    """A consumer that decodes what arrives, as the blame service does."""

    def __init__(self):
        self.decoded = []
        self.refused = []
        self.lock = threading.Lock()
        self.fail = False

    def __call__(self, request, peer, transport):
        if self.fail:
            raise RuntimeError("boom")
        decoded = tool_calls(request)
        with self.lock:
            self.decoded.append(decoded)
        rejected = sum(decoded.refused.values())
        return Outcome(rejected, "; ".join(decoded.examples.values()))

    def calls(self):
        with self.lock:
            return [call for decoded in self.decoded for call in decoded.calls]


@pytest.fixture
def receiver():
    sink = Sink()
    refused = []
    server = OtlpReceiver(
        sink,
        grpc_endpoint="127.0.0.1:0",
        http_endpoint="127.0.0.1:0",
        max_request_bytes=64 * 1024,
        on_refused=lambda transport, reason: refused.append((transport, reason)),
    )
    server.start()
    sink.refused = refused
    yield server, sink
    server.shutdown()


def agent_spans(exporter, pool="vllm-a:8000"):
    """Two tool calls and one agent span through the real SDK and exporter."""
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-1", "agent.gpu.pool": pool}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent_otel")
    with tracer.start_as_current_span("invoke_agent research", start_time=T0):
        span = tracer.start_span(
            "execute_tool search",
            start_time=T0 + 1_000_000_000,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search",
                "agent.tool.executor": "tools",
                "agent.tool.queue.duration": 0.5,
            },
        )
        span.add_event("exec.start", timestamp=T0 + 1_500_000_000)
        span.end(end_time=T0 + 3_000_000_000)
        direct = tracer.start_span(
            "execute_tool sql",
            start_time=T0 + 2_000_000_000,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "sql",
                "agent.tool.executor": "direct",
            },
        )
        direct.end(end_time=T0 + 2_500_000_000)
    provider.shutdown()


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


@pytest.mark.parametrize("transport", ["grpc", "http", "http+gzip"])
def test_tool_spans_from_the_sdk_exporters_become_tool_calls_with_their_pool(receiver, transport):
    server, sink = receiver
    if transport == "grpc":
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True)
    else:
        exporter = HttpExporter(
            endpoint=f"http://127.0.0.1:{server.http_port}{HTTP_PATH}",
            compression=Compression.Gzip if transport.endswith("gzip") else Compression.NoCompression,
        )
    agent_spans(exporter)
    wait_for(lambda: len(sink.decoded) == 3)
    calls = {call.tool: call for call in sink.calls()}
    assert set(calls) == {"search", "sql"}
    search = calls["search"]
    assert (search.submit_ns, search.start_ns, search.end_ns) == (
        T0 + 1_000_000_000,
        T0 + 1_500_000_000,
        T0 + 3_000_000_000,
    )
    assert search.executor == "tools" and search.pool == "vllm-a:8000" and search.trace_id and search.span_id
    assert calls["sql"].start_ns == calls["sql"].submit_ns
    # The agent's own span is not a tool span: refused, one by one.
    refused = sum((d.refused for d in sink.decoded), start=collections.Counter())
    assert refused == {NOT_A_TOOL_SPAN: 1}
    assert not sink.refused


def grpc_export(server, body: bytes):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        export = channel.unary_unary(
            f"/{GRPC_SERVICE}/Export",
            request_serializer=None,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        return export(body, timeout=10)


def http_post(server, body: bytes, headers=None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{HTTP_PATH}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/x-protobuf", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def one_tool_span_request(name="execute_tool search", tool=True, span_id=b"\x01" * 8) -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x02" * 16, span_id, name
    span.start_time_unix_nano, span.end_time_unix_nano = T0, T0 + 10
    if tool:
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = "gen_ai.operation.name", "execute_tool"
    return request.SerializeToString()


def test_malformed_protobuf_is_invalid_argument_and_the_receiver_keeps_serving(receiver):
    server, sink = receiver
    with pytest.raises(grpc.RpcError) as error:
        grpc_export(server, b"\x0a\xff\xff\xff\xff not protobuf")
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an OTLP ExportTraceServiceRequest" in error.value.details()
    status, body = http_post(server, b"\x0a\xff\xff\xff\xff not protobuf")
    assert status == 400
    assert status_pb2.Status.FromString(body).code == code_pb2.INVALID_ARGUMENT
    assert sink.refused == [("grpc", "malformed"), ("http", "malformed")]
    # Both transports still answer a good request.
    assert grpc_export(server, one_tool_span_request()) == ExportTraceServiceResponse()
    assert http_post(server, one_tool_span_request(span_id=b"\x03" * 8))[0] == 200
    assert len(sink.calls()) == 2


def test_a_span_that_is_no_tool_call_is_refused_in_a_partial_success(receiver):
    server, _ = receiver
    response = grpc_export(server, one_tool_span_request(name="chat gpt-4o", tool=False))
    assert response.partial_success.rejected_spans == 1
    assert "has no gen_ai.operation.name=execute_tool" in response.partial_success.error_message
    status, body = http_post(server, one_tool_span_request(span_id=b"\x00" * 3))
    partial = ExportTraceServiceResponse.FromString(body).partial_success
    assert status == 200 and partial.rejected_spans == 1 and "3-byte span_id" in partial.error_message


def test_a_tool_span_with_an_unreadable_attribute_is_refused_alone(receiver):
    request = ExportTraceServiceRequest.FromString(one_tool_span_request())
    spans = request.resource_spans[0].scope_spans[0].spans
    bad = spans.add()
    bad.CopyFrom(spans[0])
    bad.span_id = b"\x09" * 8
    attribute = bad.attributes.add()
    attribute.key, attribute.value.string_value = "agent.tool.queue.duration", "soon"
    decoded = tool_calls(request)
    assert len(decoded.calls) == 1
    assert decoded.refused == {WRONG_TYPE: 1}
    assert "agent.tool.queue.duration is not a non-negative number: 'soon'" in decoded.examples[WRONG_TYPE]


def test_an_oversized_request_is_refused_before_it_is_read(receiver):
    server, sink = receiver
    big = b"\x0a" + b"\x80\x80\x04" + b"\x00" * 65536  # a 64 KiB field: over the 64 KiB limit
    with pytest.raises(grpc.RpcError) as error:
        grpc_export(server, big)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status, body = http_post(server, big)
    assert status == 413 and status_pb2.Status.FromString(body).code == code_pb2.RESOURCE_EXHAUSTED
    # A small gzip body that inflates past the limit is refused the same way.
    status, _ = http_post(server, gzip.compress(b"\x00" * 1_000_000), {"Content-Encoding": "gzip"})
    assert status == 413
    assert ("http", "too_large") in sink.refused and ("grpc", "too_large") in sink.refused
    assert grpc_export(server, one_tool_span_request()) == ExportTraceServiceResponse()


def test_http_refuses_what_is_not_otlp_protobuf(receiver):
    server, _ = receiver
    status, body = http_post(server, b"{}", {"Content-Type": "application/json"})
    assert status == 415 and "OTLP/JSON is not accepted" in status_pb2.Status.FromString(body).message
    status, _ = http_post(server, b"x", {"Content-Encoding": "br"})
    assert status == 415
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/metrics", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    assert error.value.code == 404


def test_a_failing_consumer_is_an_internal_error_not_a_dead_receiver(receiver):
    server, sink = receiver
    sink.fail = True
    with pytest.raises(grpc.RpcError) as error:
        grpc_export(server, one_tool_span_request())
    assert error.value.code() == grpc.StatusCode.INTERNAL
    assert http_post(server, one_tool_span_request())[0] == 500
    sink.fail = False
    assert grpc_export(server, one_tool_span_request()) == ExportTraceServiceResponse()


def test_a_port_in_use_is_an_error_naming_the_endpoint(receiver):
    server, _ = receiver
    other = OtlpReceiver(
        lambda request, peer, transport: Outcome(), grpc_endpoint=None, http_endpoint=f"127.0.0.1:{server.http_port}"
    )
    with pytest.raises(OSError, match=f"OTLP/HTTP on 127.0.0.1:{server.http_port}"):
        other.start()
    other = OtlpReceiver(
        lambda request, peer, transport: Outcome(), grpc_endpoint=f"127.0.0.1:{server.grpc_port}", http_endpoint=None
    )
    with pytest.raises(OSError, match=f"OTLP/gRPC on 127.0.0.1:{server.grpc_port}"):
        other.start()


def test_a_peers_bare_tool_span_is_a_tool_call_not_refused():
    """OpenInference's TOOL span with only its kind and tool name: the reader sets it
    aside until the merge (report.peers.Aside); the service still counts it a tool call."""
    request = ExportTraceServiceRequest.FromString(one_tool_span_request(name="search", tool=False))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    for key, value in (("openinference.span.kind", "TOOL"), ("tool.name", "search")):
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = key, value
    decoded = tool_calls(request)
    assert not decoded.refused
    (call,) = decoded.calls
    assert (call.tool, call.executor, call.submit_ns, call.end_ns) == ("search", "unknown", T0, T0 + 10)
