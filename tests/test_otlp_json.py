"""The OTLP/JSON lines file: what the exporter writes, and what the report reads back."""

from __future__ import annotations

import base64
import gzip
import json
import threading

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from agent_otel.errors import ConfigError, InputError
from agent_otel.spans.otlp_json import iter_spans
from agent_otel.exporters.otlp_json_file import OtlpJsonFileExporter, encode_spans_json


def make_provider(exporter, batch=False):
    provider = TracerProvider(resource=Resource.create({"service.name": "research-agent"}))
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider


def test_spans_round_trip_through_a_batch_processor_into_the_file(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = make_provider(OtlpJsonFileExporter(str(path)), batch=True)
    tracer = provider.get_tracer("agent_otel")
    with tracer.start_as_current_span("invoke_agent research") as root:
        for number in range(3):
            with tracer.start_as_current_span(
                "execute_tool web_search",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "web_search",
                    "gen_ai.tool.call.id": f"call_{number}",
                    "agent.tool.queue.duration": 0.25,
                    "agent.tool.attempt": number,
                    "agent.tool.cached": number == 1,
                    "agent.tool.tags": ["net", "slow"],
                },
            ) as span:
                span.add_event("exec.start", {"worker": "io_0"})
    provider.shutdown()  # flushes the batch and closes the file

    records = list(iter_spans(str(path)))
    assert [r.name for r in records] == ["execute_tool web_search"] * 3 + ["invoke_agent research"]
    root_context = root.get_span_context()
    tools = records[:3]
    for number, record in enumerate(tools):
        assert record.trace_id == root_context.trace_id
        assert record.parent_span_id == root_context.span_id
        assert record.attributes["gen_ai.tool.call.id"] == f"call_{number}"
        assert record.attributes["agent.tool.queue.duration"] == 0.25
        assert record.attributes["agent.tool.attempt"] == number
        assert record.attributes["agent.tool.cached"] is (number == 1)
        assert record.attributes["agent.tool.tags"] == ["net", "slow"]
        assert [(e.name, e.attributes) for e in record.events] == [("exec.start", {"worker": "io_0"})]
        assert record.start_ns <= record.events[0].time_ns <= record.end_ns
    assert records[3].parent_span_id == 0
    assert records[3].start_ns <= tools[0].start_ns and records[3].end_ns >= tools[-1].end_ns


def test_ids_are_hex_and_64_bit_integers_are_strings_as_otlp_json_requires(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = make_provider(OtlpJsonFileExporter(str(path)))
    with provider.get_tracer("t").start_as_current_span("execute_tool lookup", kind=SpanKind.CLIENT) as span:
        span.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    context = span.get_span_context()

    line = json.loads(path.read_text().splitlines()[0])
    written = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert written["traceId"] == f"{context.trace_id:032x}"
    assert written["spanId"] == f"{context.span_id:016x}"
    assert written["kind"] == 3  # SPAN_KIND_CLIENT, an integer
    assert written["status"] == {"code": 2, "message": "boom"}
    assert isinstance(written["startTimeUnixNano"], str) and written["startTimeUnixNano"].isdigit()
    assert int(written["endTimeUnixNano"]) >= int(written["startTimeUnixNano"])
    assert line["resourceSpans"][0]["resource"]["attributes"][0]["key"]  # camelCase all the way down
    assert "resource_spans" not in line and "scope_spans" not in line["resourceSpans"][0]


def test_encoding_equals_the_sdks_protobuf_encoder_with_hex_ids():
    """The exporter builds dicts directly for speed; protobuf's JSON mapping
    of the SDK's own encoder, with hex ids, is the reference it must match."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}, schema_url="https://example.com/1"))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agent_otel", "0.1.0", schema_url="https://example.com/s", attributes={"lib": 1})
    other = provider.get_tracer("other")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    parent_context = trace.set_span_in_context(NonRecordingSpan(remote))
    with tracer.start_as_current_span("root", context=parent_context, links=[Link(remote, {"why": "retry"})]):
        attributes = {
            "s": "",
            "i": 0,
            "neg": -5,
            "f": 0.0,
            "b": False,
            "nan": float("nan"),
            "inf": float("-inf"),
            "ints": [1, 2],
            "strs": ["a"],
            "empty": [],
        }
        with other.start_as_current_span("child", attributes=attributes) as child:
            child.add_event("exec.start", {"q": 1.5})
            child.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("ok", kind=SpanKind.PRODUCER) as ok:
            ok.set_status(Status(StatusCode.OK))
    spans = memory.get_finished_spans()

    reference = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in reference["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        link[key] = base64.b64decode(link[key]).hex()
    assert json.loads(encode_spans_json(spans)) == reference


def test_a_collector_file_exporter_line_is_read(tmp_path):
    # As the Collector's file exporter writes it: several resources and
    # scopes, 64-bit integers as numbers here and strings there, default
    # fields left out, and a metrics line in the same file.
    collector_line = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "a"},
                        "spans": [
                            {
                                "traceId": "5B8EFFF798038103D269B633813FC60C",
                                "spanId": "EEE19B7EC3C1B174",
                                "name": "execute_tool search",
                                "startTimeUnixNano": 1544712660000000000,
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                                    {"key": "agent.tool.exec.duration", "value": {"doubleValue": 1}},
                                    {"key": "retries", "value": {"intValue": 2}},
                                    {
                                        "key": "meta",
                                        "value": {
                                            "kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}
                                        },
                                    },
                                ],
                                "events": [{"timeUnixNano": "1544712660300000000", "name": "exec.start"}],
                                "status": {},
                            }
                        ],
                    },
                    {
                        "scope": {"name": "b"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b173",
                                "parentSpanId": "",
                                "name": "root",
                                "startTimeUnixNano": "1544712659000000000",
                                "endTimeUnixNano": "1544712662000000000",
                            }
                        ],
                    },
                ],
            }
        ]
    }
    path = tmp_path / "collector.json"
    path.write_text(json.dumps(collector_line) + "\n\n" + json.dumps({"resourceMetrics": []}) + "\n")

    first, second = iter_spans(str(path))
    assert first.trace_id == 0x5B8EFFF798038103D269B633813FC60C
    assert first.span_id == 0xEEE19B7EC3C1B174
    assert first.start_ns == 1544712660000000000
    assert first.end_ns == 1544712661000000000
    assert first.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "agent.tool.exec.duration": 1.0,
        "retries": 2,
        "meta": {"k": True},
    }
    assert first.events[0].time_ns == 1544712660300000000
    assert (second.name, second.parent_span_id, second.attributes, second.events) == ("root", 0, {}, [])


GOOD_SPAN = '{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"x","startTimeUnixNano":"10","endTimeUnixNano":"20"}'


def line_with(span: str) -> str:
    return '{"resourceSpans":[{"scopeSpans":[{"spans":[' + span + "]}]}]}"


@pytest.mark.parametrize(
    "bad_line, complaint",
    [
        ('{"resourceSpans": [', "not JSON"),
        ('["resourceSpans"]', "not an OTLP ExportTraceServiceRequest"),
        ('{"spans": []}', "no resourceSpans"),
        (
            line_with(GOOD_SPAN.replace("5b8efff798038103d269b633813fc60c", "W47/95gDgQPSabYzgT/GDA==")),
            "traceId is not 32 hex digits: 'W47/95gDgQPSabYzgT/GDA==' (it looks base64",
        ),
        (line_with(GOOD_SPAN.replace("eee19b7ec3c1b174", "eee19b7ec3c1b17z")), "spanId is not 16 hex digits"),
        (
            line_with(GOOD_SPAN.replace('"10"', '"yesterday"')),
            "startTimeUnixNano is not an unsigned 64-bit integer: 'yesterday'",
        ),
        (
            line_with(GOOD_SPAN.replace('"10"', '"\u00b2"')),
            "startTimeUnixNano is not an unsigned 64-bit integer: '\u00b2'",
        ),
        (
            line_with(
                GOOD_SPAN.replace('"name":"x"', '"attributes":[{"key":"k","value":{"arrayValue":{"values":5}}}]')
            ),
            "values is not a JSON array",
        ),
        (line_with(GOOD_SPAN.replace('"20"', '"5"')), "ends (endTimeUnixNano 5) before it starts (10)"),
        (line_with(GOOD_SPAN.replace('"startTimeUnixNano":"10",', "")), "has no startTimeUnixNano"),
        ('{"resourceSpans":[{"scopeSpans":{"spans":[]}}]}', "scopeSpans is not a JSON array"),
    ],
)
def test_a_malformed_line_names_the_file_and_line(tmp_path, bad_line, complaint):
    path = tmp_path / "traces.jsonl"
    path.write_text(line_with(GOOD_SPAN) + "\n" + line_with(GOOD_SPAN.replace("174", "175")) + "\n" + bad_line + "\n")
    spans = iter_spans(str(path))
    assert next(spans).span_id == 0xEEE19B7EC3C1B174  # the good lines before it are read
    assert next(spans).span_id == 0xEEE19B7EC3C1B175
    with pytest.raises(InputError) as error:
        next(spans)
    assert error.value.path == str(path)
    assert error.value.line == 3
    assert str(error.value).startswith(f"{path}:3: ")
    assert complaint in str(error.value)


def test_a_compressed_file_reads_like_a_plain_one(tmp_path):
    path = tmp_path / "traces.jsonl.gz"
    path.write_bytes(gzip.compress((line_with(GOOD_SPAN) + "\n").encode()))
    (record,) = iter_spans(str(path))
    assert record.span_id == 0xEEE19B7EC3C1B174


def test_protobuf_is_named_as_binary(tmp_path):
    path = tmp_path / "traces.binpb"
    path.write_bytes(b"\x00\x00\x00\x10\x0a\x0e\x0a\x0c" + bytes(range(12)))
    with pytest.raises(InputError, match=r"traces.binpb: binary data, not OTLP/JSON lines"):
        list(iter_spans(str(path)))


def test_a_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        list(iter_spans(str(tmp_path / "nope.jsonl")))


def test_an_unwritable_path_fails_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="traces file"):
        OtlpJsonFileExporter(str(tmp_path / "no-such-dir" / "traces.jsonl"))


def test_any_text_a_tool_returns_is_written(tmp_path):
    path = tmp_path / "traces.jsonl"
    provider = make_provider(OtlpJsonFileExporter(str(path)))
    odd = "naïve 東京 \U0001f600 " + b"\xff".decode("utf-8", "surrogateescape")
    with provider.get_tracer("t").start_as_current_span("execute_tool x", attributes={"gen_ai.tool.call.result": odd}):
        pass
    provider.shutdown()
    (record,) = iter_spans(str(path))
    assert record.attributes["gen_ai.tool.call.result"] == odd


def test_export_after_shutdown_fails_without_raising(tmp_path):
    exporter = OtlpJsonFileExporter(str(tmp_path / "traces.jsonl"))
    memory = InMemorySpanExporter()
    provider = make_provider(memory)
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    assert exporter.force_flush() is True
    assert len((tmp_path / "traces.jsonl").read_text().splitlines()) == 1


def test_concurrent_exports_write_whole_lines(tmp_path):
    path = tmp_path / "traces.jsonl"
    exporter = OtlpJsonFileExporter(str(path))
    memory = InMemorySpanExporter()
    provider = make_provider(memory)
    tracer = provider.get_tracer("t")
    for number in range(50):
        with tracer.start_as_current_span(f"span {number}", attributes={"payload": "x" * 2000}):
            pass
    spans = memory.get_finished_spans()
    threads = [threading.Thread(target=lambda: [exporter.export(spans) for _ in range(10)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    exporter.shutdown()
    assert sum(1 for _ in iter_spans(str(path))) == 4 * 10 * 50


def test_the_documented_import_path_reads_with_the_one_reader(tmp_path):
    """agent_otel.exporters.otlp_json (README, CHANGELOG) is the reader of agent_otel.spans, every public name."""
    import ast
    import inspect

    from agent_otel.exporters import otlp_json as documented
    from agent_otel.spans import otlp_json as reader

    tree = ast.parse(inspect.getsource(reader))
    public = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    public |= {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    public = {name for name in public if not name.startswith("_")}
    assert public and set(documented.__all__) == public
    assert all(getattr(documented, name) is getattr(reader, name) for name in public)
    path = tmp_path / "one.jsonl"
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "x", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) + "\n")
    assert [s.name for s in documented.iter_spans(str(path))] == ["x"]
