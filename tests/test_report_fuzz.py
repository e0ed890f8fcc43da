"""Fuzzing the report's inputs: any trace file or GPU log gives a report (in
every output format) or one ``InputError`` naming the file, never another
exception. Inputs are drawn from the OTLP/JSON and GPU-log grammars, with
valid and invalid values in every field, then sometimes cut or corrupted."""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent_otel.errors import InputError
from agent_otel.report import html, perfetto, table
from agent_otel.report.analysis import analyse, report_json

FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

T0 = 1_772_442_000_000_000_000  # 2026-03-02T09:00:00Z

# ---------------------------------------------------------------- OTLP/JSON grammar

odd_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "execute_tool",
            "gpu.idle",
            "exec.start",
            "io",
            "direct",
            "ok",
            "error",
            "timeout",
            "\udcff",
            "\x1b[2J",
            "\u202e",
            "",
            "0",
        ]
    ),
)
number = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 0.5, 1e400, -1]),
)
timestamp = st.one_of(
    st.integers(min_value=0, max_value=10**9).map(lambda offset: str(T0 + offset * 1000)),
    st.integers(min_value=0, max_value=10**9).map(lambda offset: T0 + offset * 1000),
    st.sampled_from(["", "0", "-1", "18446744073709551616", "9" * 30, "1e9", "²", "  12"]),
    number,
    st.none(),
)
hex_id = st.one_of(
    st.integers(min_value=0, max_value=2**128 - 1).map(lambda v: f"{v:032x}"),
    st.integers(min_value=0, max_value=2**64 - 1).map(lambda v: f"{v:016x}"),
    st.sampled_from(["", "zz", "W47/95gDgQPSabYzgT/GDA==", "0" * 32, "0" * 16]),
    st.none(),
    number,
)
scalar_value = st.one_of(
    st.builds(lambda v: {"stringValue": v}, odd_text),
    st.builds(lambda v: {"intValue": v}, st.one_of(number, st.integers().map(str), odd_text)),
    st.builds(lambda v: {"doubleValue": v}, st.one_of(number, st.sampled_from(["NaN", "Infinity", "x"]))),
    st.builds(lambda v: {"boolValue": v}, st.booleans()),
    st.builds(lambda v: {"bytesValue": v}, odd_text),
    st.just({}),
    st.none(),
    odd_text,
    number,
)
any_value = st.recursive(
    scalar_value,
    lambda inner: st.one_of(
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(inner, max_size=3)),
        st.builds(
            lambda vs: {"kvlistValue": {"values": vs}},
            st.lists(st.fixed_dictionaries({"key": odd_text, "value": inner}), max_size=3),
        ),
    ),
    max_leaves=6,
)
wanted_keys = st.sampled_from(
    [
        "gen_ai.operation.name",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "agent.tool.queue.duration",
        "agent.tool.executor",
        "agent.tool.outcome",
        "agent.tool.timeout",
        "agent.executor.max_workers",
        "error.type",
        "thread.name",
        "gpu.index",
        "gpu.uuid",
        "gpu.idle.duration",
        "gpu.idle.blocked_duration",
        "gpu.utilization.avg",
    ]
)
attribute = st.one_of(
    st.fixed_dictionaries({"key": wanted_keys, "value": any_value}),
    st.fixed_dictionaries({"key": st.just("gen_ai.operation.name"), "value": st.just({"stringValue": "execute_tool"})}),
    st.fixed_dictionaries({"key": st.one_of(odd_text, number, st.none()), "value": any_value}),
    odd_text,
)
event = st.one_of(
    st.fixed_dictionaries(
        {"name": st.sampled_from(["exec.start", "exception"]), "timeUnixNano": timestamp},
        optional={"attributes": st.lists(attribute, max_size=2)},
    ),
    number,
)
span = st.one_of(
    st.fixed_dictionaries(
        {"traceId": hex_id, "spanId": hex_id, "startTimeUnixNano": timestamp, "endTimeUnixNano": timestamp},
        optional={
            "name": st.one_of(odd_text, st.sampled_from(["gpu.idle", "execute_tool search"])),
            "parentSpanId": hex_id,
            "attributes": st.one_of(st.lists(attribute, max_size=8), odd_text),
            "events": st.one_of(st.lists(event, max_size=2), number),
            "status": st.one_of(st.fixed_dictionaries({}, optional={"code": st.one_of(number, odd_text)}), number),
            "kind": number,
        },
    ),
    number,
    odd_text,
    st.none(),
)
request = st.one_of(
    st.builds(
        lambda spans, wrap: (
            {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]} if wrap else {"resourceSpans": spans}
        ),
        st.lists(span, max_size=6),
        st.booleans(),
    ),
    st.fixed_dictionaries({"resourceMetrics": st.just([])}),
    st.lists(st.integers(), max_size=2),
    odd_text,
    number,
)


@st.composite
def trace_files(draw) -> bytes:
    lines = [
        json.dumps(item, ensure_ascii=draw(st.booleans())) for item in draw(st.lists(request, min_size=0, max_size=5))
    ]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        data += b"\n"
    damage = draw(st.sampled_from(["none", "none", "cut", "byte", "pretty"]))
    if damage == "cut" and data:
        data = data[: draw(st.integers(min_value=0, max_value=len(data)))]
    elif damage == "byte" and data:
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(min_value=0, max_value=255))]) + data[at + 1 :]
    elif damage == "pretty" and lines:
        data = json.dumps(json.loads(lines[0]), indent=2).encode("utf-8", "surrogatepass")
    return data


def render_everything(analysis) -> None:
    json.dumps(report_json(analysis))
    table.render(analysis).encode("utf-8")
    table.render(analysis, width=60, colour=True).encode("utf-8")
    html.render(analysis).encode("utf-8")
    json.dumps(perfetto.trace_events(analysis)).encode("utf-8")


@FUZZ
@given(trace_files())
def test_any_trace_file_gives_a_report_or_an_input_error(data):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "traces.jsonl")
        with open(path, "wb") as handle:
            handle.write(data)
        try:
            analysis = analyse([path], idle_threshold=0.1, min_idle_s=0.5)
        except InputError as error:
            assert str(error).startswith(path)
            assert "\n" not in str(error)
            return
        render_everything(analysis)


# ---------------------------------------------------------------- GPU-log grammar

csv_time = st.one_of(
    st.builds(
        lambda s, ms: f"2026/03/02 09:{s // 60:02d}:{s % 60:02d}.{ms:03d}",
        st.integers(min_value=0, max_value=3599),
        st.integers(min_value=0, max_value=999),
    ),
    st.sampled_from(
        [
            "0001/01/01 00:00:00.000",
            "9999/12/31 23:59:59.999",
            "2026/02/30 00:00:00",
            "2026/03/02 24:00:00",
            "2026/03/02 09:00:61.5",
            "2026/03/02 09:00:00.1234567",
            "x",
            "",
        ]
    ),
)
percent = st.one_of(
    st.integers(min_value=0, max_value=100).map(lambda p: f"{p} %"),
    st.integers(min_value=0, max_value=100).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: f"{f} %"),
    st.sampled_from(["[N/A]", "-", "0.9", "101 %", "%", "nan"]),
)
gpu_index = st.one_of(st.integers(min_value=0, max_value=8).map(str), st.sampled_from(["", "-1", "x", "9" * 30]))
csv_row = st.builds(lambda t, i, u: f"{t}, {i}, {u}", csv_time, gpu_index, percent)
dmon_row = st.builds(
    lambda d, s, i, u: f" {d}   09:{s // 60:02d}:{s % 60:02d}      {i}    {u}",
    st.sampled_from(["20260302", "00010101", "99991231", "2026030", "x"]),
    st.integers(min_value=0, max_value=3599),
    gpu_index,
    st.one_of(st.integers(min_value=0, max_value=100).map(str), st.sampled_from(["-", "0.5", "x"])),
)


@st.composite
def gpu_logs(draw) -> bytes:
    kind = draw(st.sampled_from(["csv", "noheader", "dmon", "junk"]))
    if kind == "csv":
        lines = ["timestamp, index, utilization.gpu [%]"] + draw(st.lists(csv_row, max_size=12))
    elif kind == "noheader":
        lines = draw(st.lists(csv_row, max_size=12))
    elif kind == "dmon":
        lines = ["#Date       Time        gpu    sm", "#YYYYMMDD   HH:MM:SS    Idx     %"] + draw(
            st.lists(dmon_row, max_size=12)
        )
    else:
        lines = draw(st.lists(st.text(max_size=30), max_size=4))
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()) and data:
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(min_value=0, max_value=255))]) + data[at + 1 :]
    return data


TRACES = (
    '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c",'
    '"spanId":"eee19b7ec3c1b174","name":"execute_tool search","startTimeUnixNano":"1772442000000000000",'
    '"endTimeUnixNano":"1772445600000000000","attributes":[{"key":"gen_ai.operation.name",'
    '"value":{"stringValue":"execute_tool"}}]}]}]}]}\n'
)


@FUZZ
@given(gpu_logs(), st.sampled_from([None, "UTC", "Pacific/Chatham"]))
@example(b'\r"', None)  # csv.Error escaped as a traceback
@example(b'timestamp, index, utilization.gpu [%]\n2026/03/02 09:00:00.000, 0, "9\r0"\n', "UTC")
def test_any_gpu_log_gives_a_report_or_an_input_error(data, tz):
    with tempfile.TemporaryDirectory() as directory:
        traces, log = os.path.join(directory, "traces.jsonl"), os.path.join(directory, "gpu.log")
        with open(traces, "w") as handle:
            handle.write(TRACES)
        with open(log, "wb") as handle:
            handle.write(data)
        try:
            analysis = analyse([traces], [log], tz=tz, idle_threshold=0.1, min_idle_s=0.5)
        except InputError as error:
            assert str(error).startswith(log)
            assert "\n" not in str(error)
            return
        render_everything(analysis)
