"""The model server's own spans: vLLM's ``llm_request`` joined to the agent's
model calls by trace context, and each call split into client and network,
server queue, prefill and decode (agent_otel.report.server_spans).

The span shape is vLLM's (vllm/tracing.py, vllm/v1/engine/output_processor.py):
name ``llm_request``, kind SERVER, started from the caller's ``traceparent``,
with ``gen_ai.latency.*`` in seconds.
"""

from __future__ import annotations

import json
import urllib.request


import pytest

import agent_otel
from agent_otel.commands.cli import main
from helpers.model_server import FakeModelServer
from helpers.server_traces import ServerTraces, headers_of
from helpers.traces import RecordedRun, ns


def report(capsys, *paths) -> dict:
    assert main(["report", *map(str, paths), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_recorded_llm_request_span_joins_its_model_call_and_splits_it(tmp_path, capsys):
    run = RecordedRun(tmp_path / "agent.jsonl")
    server = ServerTraces(tmp_path / "vllm.jsonl")
    turn = run.invoke_agent("support", 0.0, 6.0)
    # Call 1: the server's span is a child of the model call itself (model_span's headers).
    first = run.model_call("llama-3-70b", 0.5, 2.5, parent=turn)
    server.request(headers_of(first), ns(0.6), ns(2.3), queue=0.4, ttft=0.7, prefill=0.3, decode=0.9, e2e=1.7)
    # Call 2: an HTTP client instrumentation's span in between: joined by trace and time.
    second = run.model_call("llama-3-70b", 3.0, 4.0, parent=turn)
    http = run.span("POST", 3.01, 3.99, {"http.request.method": "POST"}, parent=second)
    server.request(headers_of(http), ns(3.05), ns(3.95), queue=0.0, ttft=0.2, prefill=0.2, decode=0.6, e2e=0.9)
    run.close()
    found = report(capsys, tmp_path / "agent.jsonl", tmp_path / "vllm.jsonl")

    split = found["model_server"]
    assert (split["requests"], split["joined_by_parent"], split["joined_by_time"], split["unjoined"]) == (2, 1, 1, 0)
    assert split["model_calls"] == 2
    assert split["client_network_s"] == pytest.approx((2.0 - 1.7) + (1.0 - 0.9))
    assert split["server_queue_s"] == pytest.approx(0.4)
    assert split["prefill_s"] == pytest.approx(0.5)
    assert split["decode_s"] == pytest.approx(1.5)
    assert split["server_other_s"] == pytest.approx(1.7 - 0.4 - 0.3 - 0.9 + 0.9 - 0.8)
    parts = sum(split[k] for k in ("client_network_s", "server_queue_s", "prefill_s", "decode_s", "server_other_s"))
    assert parts == pytest.approx(split["seconds"]) == pytest.approx(3.0)
    # The turn breakdown carries the same split, overall and for its turn.
    assert found["turns"]["model_split"]["server_queue_s"] == pytest.approx(0.4)
    [slowest] = found["turns"]["slowest"]
    assert slowest["model_split"]["decode_s"] == pytest.approx(1.5)


def test_the_table_and_the_html_show_the_split(tmp_path, capsys):
    run = RecordedRun(tmp_path / "agent.jsonl")
    server = ServerTraces(tmp_path / "vllm.jsonl")
    call = run.model_call("llama-3-70b", 0.5, 2.5)
    server.request(headers_of(call), ns(0.6), ns(2.3), queue=0.4, ttft=0.7, prefill=0.3, decode=0.9, e2e=1.7)
    run.close()
    html_path = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "agent.jsonl"), str(tmp_path / "vllm.jsonl"), "--html", str(html_path)]) == 0
    out = capsys.readouterr().out
    assert "Model calls, split by the model servers' own spans" in out
    assert "1 model calls joined to 1 server spans (by parent 1" in out
    page = html_path.read_text()
    assert 'id="model-server-table"' in page and "server queue s" in page


def test_without_server_spans_there_is_no_split(tmp_path, capsys):
    run = RecordedRun(tmp_path / "agent.jsonl")
    run.model_call("llama-3-70b", 0.5, 2.5)
    run.close()
    found = report(capsys, tmp_path / "agent.jsonl")
    assert found["model_server"] is None and found["turns"]["model_split"] is None


def test_a_server_span_of_another_trace_or_time_stays_unjoined(tmp_path, capsys):
    run = RecordedRun(tmp_path / "agent.jsonl")
    server = ServerTraces(tmp_path / "vllm.jsonl")
    call = run.model_call("llama-3-70b", 0.5, 2.5)
    other = run.span("POST", 5.0, 6.0)  # another trace, after the call
    server.request(headers_of(other), ns(5.1), ns(5.9), queue=0.1, ttft=0.2, prefill=0.1, decode=0.5, e2e=0.8)
    run.close()
    found = report(capsys, tmp_path / "agent.jsonl", tmp_path / "vllm.jsonl")
    assert found["model_server"]["unjoined"] == 1 and found["model_server"]["model_calls"] == 0
    assert call is not None


def test_model_span_sends_its_traceparent_to_the_model_server_and_the_server_span_joins(tmp_path, capsys):
    fake = FakeModelServer()
    server = ServerTraces(tmp_path / "vllm.jsonl")
    handle = agent_otel.instrument(
        traces_file=str(tmp_path / "agent.jsonl"), traces_exporters=("none",), gpu="off", frameworks=()
    )
    try:
        with agent_otel.model_span("llama-3-70b", provider="vllm") as call:
            request = urllib.request.Request(
                f"http://127.0.0.1:{fake.port}/v1/chat/completions",
                data=b'{"model": "llama-3-70b", "messages": []}',
                headers={"Content-Type": "application/json", **call.headers()},
            )
            urllib.request.urlopen(request, timeout=5).read()
            context = call.span.get_span_context()
    finally:
        assert handle.shutdown(timeout_s=5.0)
        fake.stop()
    [(path, sent)] = fake.requests
    headers = {name.lower(): value for name, value in sent.items()}  # urllib capitalises the names
    assert path == "/v1/chat/completions"
    assert headers["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    # The server starts its span from that header, as vLLM does.
    [model_call] = [
        json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        for line in (tmp_path / "agent.jsonl").read_text().splitlines()
        if line.strip()
    ]
    start, end = int(model_call["startTimeUnixNano"]), int(model_call["endTimeUnixNano"])
    server.request(headers, start, end, queue=0.0, ttft=0.0, prefill=0.0, decode=0.0, e2e=(end - start) / 1e9)
    found = report(capsys, tmp_path / "agent.jsonl", tmp_path / "vllm.jsonl")
    assert found["model_server"]["joined_by_parent"] == 1


def test_headers_outside_instrument_are_empty_and_the_call_goes_on():
    agent_otel.uninstrument()
    with agent_otel.model_span("m") as call:
        assert call.headers() == {}
        assert call.headers({"x": "1"}) == {"x": "1"}
