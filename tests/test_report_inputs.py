"""``agent-otel report`` on real files: compressed, piped, cut off, pretty-printed,
empty, mixed up, and hostile. Every one gives a report or one line with exit 2."""

from __future__ import annotations

import gzip
import json
import resource
import struct
import subprocess
import sys
import zlib

import msgspec
import pytest

from agent_otel.spans.otlp_json import JsonSpan, decode_traces
from agent_otel.version import __version__
from agent_otel.commands.cli import main
from agent_otel.support.inputs import _zstd
from helpers.traces import RecordedRun, write_gpu_csv

zstd = _zstd()


def report_of(capsys, *argv) -> dict:
    assert main(["report", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def error_of(capsys, *argv) -> str:
    """The one line a failed report prints, after checking it failed with 2."""
    assert main(["report", *map(str, argv)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agent-otel report: error: "), captured.err
    return lines[0]


def run_cli(*argv, stdin=None, memory_limit=None, timeout=60) -> subprocess.CompletedProcess:
    """The real command in a process of its own, optionally with its address space capped."""

    def limit():
        if memory_limit:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(
        [sys.executable, "-m", "agent_otel.commands.cli", *map(str, argv)],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        preexec_fn=limit,
    )


@pytest.fixture
def traces(tmp_path):
    """Three tool calls and an idle window, as agent-otel writes them (one line per span)."""
    run = RecordedRun(tmp_path / "traces.jsonl")
    run.agent_run(0.0, 6.0)
    run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct")
    run.tool_call("search", 2.0, 2.5, 3.0)
    run.tool_call("search", 4.0, 4.0, 5.0)
    run.idle_window(0, 2.0, 4.5)
    run.close()
    return tmp_path / "traces.jsonl"


def calls_by_tool(report: dict) -> dict[str, int]:
    return {tool["tool"]: tool["calls"] for tool in report["tools"]}


EXPECTED_CALLS = {"embed": 1, "search": 2}


# ---------------------------------------------------------------- formats


def test_gzip_and_zstd_files_read_like_the_plain_one(traces, capsys):
    data = traces.read_bytes()
    plain = report_of(capsys, traces)
    (traces.parent / "t.jsonl.gz").write_bytes(gzip.compress(data))
    (traces.parent / "t.jsonl.zst").write_bytes(zstd.compress(data))
    for name in ("t.jsonl.gz", "t.jsonl.zst"):
        report = report_of(capsys, traces.parent / name)
        assert report["tools"] == plain["tools"], name
        assert report["gpus"] == plain["gpus"], name


def test_the_collector_file_exporters_zstd_framing(traces, capsys):
    # format: json + compression: zstd (without the native-compression
    # feature gate): each message is its own zstd frame after a 4-byte
    # big-endian length.
    framed = b"".join(
        struct.pack(">I", len(frame)) + frame
        for frame in (zstd.compress(line) for line in traces.read_bytes().splitlines())
    )
    (traces.parent / "collector.json").write_bytes(framed)
    # and with native compression: one zstd stream of JSON lines, in several frames
    lines = traces.read_bytes().splitlines(keepends=True)
    native = zstd.compress(b"".join(lines[:2])) + zstd.compress(b"".join(lines[2:]))
    (traces.parent / "native.json.zst").write_bytes(native)
    for name in ("collector.json", "native.json.zst"):
        assert calls_by_tool(report_of(capsys, traces.parent / name)) == EXPECTED_CALLS, name


def test_standard_input(traces):
    result = run_cli("report", "-", "--format", "json", stdin=gzip.compress(traces.read_bytes()))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert calls_by_tool(report) == EXPECTED_CALLS
    assert report["inputs"]["traces"] == ["-"]


def test_a_pretty_printed_document(traces, capsys):
    documents = [json.loads(line) for line in traces.read_text().splitlines()]
    merged = {"resourceSpans": [rs for document in documents for rs in document["resourceSpans"]]}
    (traces.parent / "pretty.json").write_text(json.dumps(merged, indent=2) + "\n")
    assert calls_by_tool(report_of(capsys, traces.parent / "pretty.json")) == EXPECTED_CALLS
    # several pretty-printed documents one after the other (jq . traces.jsonl)
    (traces.parent / "jq.json").write_text("".join(json.dumps(d, indent=2) + "\n" for d in documents))
    assert calls_by_tool(report_of(capsys, traces.parent / "jq.json")) == EXPECTED_CALLS


@pytest.mark.parametrize("odd_line", [False, True], ids=["odd span", "odd line"])
def test_what_the_typed_decoder_refuses_reads_the_same_through_json(traces, capsys, odd_line):
    """Each line goes to msgspec's typed decoder first, down to its spans'
    JSON text, and each span to it as it is read; a span it refuses (here an
    attribute the report does not read, with a value of another shape) is
    parsed as JSON and read the same way, and so is a line it refuses (here
    with a NaN, which is not JSON: the standard library reads it)."""
    expected = report_of(capsys, traces)
    odd = [{"key": "user.note", "value": "a bare string, not an AnyValue"}]
    if odd_line:
        odd.append({"key": "user.ratio", "value": {"doubleValue": float("nan")}})
    lines = []
    for line in traces.read_text().splitlines():
        document = json.loads(line)
        for resource_spans in document["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    span["attributes"] = [*span.get("attributes", []), *odd]
        lines.append(json.dumps(document) + "\n")
    (traces.parent / "odd.jsonl").write_text("".join(lines))
    for line in lines:
        if odd_line:
            with pytest.raises(msgspec.DecodeError):
                decode_traces(line.encode())
            continue
        assert decode_traces(line.encode()) is not None
        for resource_spans in json.loads(line)["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    with pytest.raises(msgspec.ValidationError):
                        msgspec.json.decode(json.dumps(span), type=JsonSpan)
    got = report_of(capsys, traces.parent / "odd.jsonl")
    assert got["inputs"]["traces"] != expected["inputs"]["traces"]
    got["inputs"]["traces"] = expected["inputs"]["traces"]
    assert got == expected


def test_a_cut_off_last_line_is_a_warning_and_the_rest_is_reported(traces, capsys):
    lines = traces.read_text().splitlines()
    search_last = next(i for i, line in enumerate(lines) if '"search"' in line and "4000000000" not in line)
    cut = "\n".join(lines) + "\n" + lines[search_last][: len(lines[search_last]) // 2]
    (traces.parent / "live.jsonl").write_text(cut)

    report = report_of(capsys, traces.parent / "live.jsonl")
    assert calls_by_tool(report) == EXPECTED_CALLS
    (warning,) = report["inputs"]["warnings"]
    assert warning.startswith(f"{traces.parent / 'live.jsonl'}:{len(lines) + 1}: the last line is cut off")

    assert main(["report", str(traces.parent / "live.jsonl")]) == 0
    assert (
        f"warning: {traces.parent / 'live.jsonl'}:{len(lines) + 1}: the last line is cut off" in capsys.readouterr().out
    )


def test_compressed_data_that_stops_mid_stream_is_a_warning(traces, capsys):
    data = gzip.compress(traces.read_bytes())
    cut = data[:-40]  # the end marker and the last bytes of the last line are missing
    whole_lines = zlib.decompressobj(31).decompress(cut).count(b"\n")
    assert 0 < whole_lines < 7
    (traces.parent / "live.jsonl.gz").write_bytes(cut)
    report = report_of(capsys, traces.parent / "live.jsonl.gz")
    assert report["inputs"]["spans"] == whole_lines  # one span per line
    assert report["inputs"]["warnings"] == [
        f"{traces.parent / 'live.jsonl.gz'}: the gzip data stops inside line {whole_lines + 1} "
        "(a writer still running, or killed): read the lines before it"
    ]


def test_a_broken_line_in_the_middle_is_still_an_error(traces, capsys):
    lines = traces.read_text().splitlines()
    lines[2] = lines[2][:40]
    (traces.parent / "broken.jsonl").write_text("\n".join(lines) + "\n")
    assert error_of(capsys, traces.parent / "broken.jsonl").startswith(
        f"agent-otel report: error: {traces.parent / 'broken.jsonl'}:3: not JSON"
    )


# ---------------------------------------------------------------- mistakes


def test_empty_input_is_an_error(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    assert error_of(capsys, tmp_path / "empty.jsonl", tmp_path / "blank.jsonl") == (
        f"agent-otel report: error: {tmp_path / 'empty.jsonl'}, {tmp_path / 'blank.jsonl'}: empty input: no spans to report"
    )
    result = run_cli("report", "-", stdin=b"")
    assert result.returncode == 2
    assert result.stderr.decode() == "agent-otel report: error: <stdin>: empty input: no spans to report\n"


def test_only_other_signals_is_an_error(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"resourceMetrics": []}\n')
    assert "no trace spans in the input" in error_of(capsys, tmp_path / "metrics.jsonl")


def test_an_empty_file_next_to_real_traces_is_a_warning(traces, capsys):
    (traces.parent / "empty.jsonl").write_text("")
    report = report_of(capsys, traces, traces.parent / "empty.jsonl")
    assert calls_by_tool(report) == EXPECTED_CALLS
    assert report["inputs"]["warnings"] == [f"{traces.parent / 'empty.jsonl'} is empty"]


def test_with_format_json_the_warnings_go_to_stderr_too(traces, capsys):
    (traces.parent / "empty.jsonl").write_text("")
    assert main(["report", str(traces), str(traces.parent / "empty.jsonl"), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["inputs"]["warnings"] == [f"{traces.parent / 'empty.jsonl'} is empty"]
    assert captured.err.splitlines() == [f"agent-otel report: warning: {traces.parent / 'empty.jsonl'} is empty"]


@pytest.mark.parametrize(
    "log",
    [
        "#Date       Time        gpu    sm\n#YYYYMMDD   HH:MM:SS    Idx     %\n 20240102   19:12:31      0    97\n",
        "timestamp, index, utilization.gpu [%]\n2024/01/02 19:12:31.123, 0, 37 %\n",
    ],
)
def test_a_gpu_log_given_as_traces_gets_a_hint(tmp_path, capsys, log):
    (tmp_path / "gpu.log").write_text(log)
    assert error_of(capsys, tmp_path / "gpu.log") == (
        f"agent-otel report: error: {tmp_path / 'gpu.log'}:1: this looks like an nvidia-smi GPU log, "
        "not traces: pass it to agent-otel report with --gpu-log"
    )


def test_traces_given_as_a_gpu_log_get_a_hint(traces, capsys):
    line = error_of(capsys, traces, "--gpu-log", traces)
    assert "this looks like OTLP/JSON traces: pass them to agent-otel report as TRACES, not --gpu-log" in line


def test_tz_without_a_gpu_log_is_refused(traces, capsys):
    line = error_of(capsys, traces, "--tz", "UTC")
    assert line.startswith("agent-otel report: error: invalid value 'UTC' for --tz: expected --gpu-log as well")


def test_standard_input_only_once(traces, capsys):
    assert "standard input (-) given once" in error_of(capsys, "-", "--gpu-log", "-")


def test_version(capsys):
    with pytest.raises(SystemExit) as leaving:
        main(["--version"])
    assert leaving.value.code == 0
    assert capsys.readouterr().out == f"agent-otel {__version__}\n"


def test_html_and_perfetto_say_where_they_wrote(traces, capsys):
    html_path, perfetto_path = traces.parent / "r.html", traces.parent / "t.json"
    assert main(["report", str(traces), "--html", str(html_path), "--perfetto", str(perfetto_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"agent-otel report: wrote the HTML timeline to {html_path} ({html_path.stat().st_size / 1e6:.1f} MB)",
        f"agent-otel report: wrote the Perfetto trace to {perfetto_path} ({perfetto_path.stat().st_size / 1e6:.1f} MB)",
    ]


# ---------------------------------------------------------------- hostile input


def span_line(name="x", tool=None, start='"1700000000000000000"', end='"1700000001000000000"', extra="") -> str:
    attributes = ""
    if tool is not None:
        attributes = (
            ',"attributes":[{"key":"gen_ai.operation.name","value":{"stringValue":"execute_tool"}},'
            f'{{"key":"gen_ai.tool.name","value":{{"stringValue":{tool}}}}}]'
        )
    span = (
        f'{{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"{name}",'
        f'"startTimeUnixNano":{start},"endTimeUnixNano":{end}{attributes}{extra}}}'
    )
    return '{"resourceSpans":[{"scopeSpans":[{"spans":[' + span + "]}]}]}\n"


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("[" * 100_000 + "]" * 100_000 + "\n", ":1: not JSON (nested too deep)"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000 + "\n", ":1: not JSON (nested too deep)"),
        (span_line(start='"' + "9" * 5000 + '"'), ":1: startTimeUnixNano is not an unsigned 64-bit integer: '99999"),
        (span_line(start="9" * 5000), ":1: not JSON (Exceeds the limit (4300 digits) for integer string conversion"),
        (span_line(start="1e400"), ":1: startTimeUnixNano is not an unsigned 64-bit integer: inf"),
        (span_line(start='"18446744073709551616"'), ":1: startTimeUnixNano is not an unsigned 64-bit integer"),
        (span_line(start='"-5"'), ":1: startTimeUnixNano is not an unsigned 64-bit integer: '-5'"),
        ('{"resourceSpans":[{"scopeSpans":[{"spans":[5]}]}]}\n', ":1: spans[] is not a JSON object"),
        (
            span_line(
                name="gpu.idle",
                extra=',"attributes":[{"key":"gpu.index","value":{"intValue":"0"}},'
                '{"key":"gpu.idle.blocked_tools","value":{"arrayValue":{"values":[{"stringValue":"a"}]}}},'
                '{"key":"gpu.idle.blocked_durations","value":{"arrayValue":{"values":[]}}}]',
            ),
            ":1: span 'gpu.idle': gpu.idle.blocked_tools and gpu.idle.blocked_durations are not arrays of tool "
            "names and of seconds of one length (got ['a'] and [])",
        ),
        ("\x00" * 10, ": binary data, not OTLP/JSON lines"),
    ],
)
def test_hostile_traces_are_one_line_errors(tmp_path, capsys, content, complaint):
    (tmp_path / "bad.jsonl").write_text(content)
    line = error_of(capsys, tmp_path / "bad.jsonl")
    assert line.startswith(f"agent-otel report: error: {tmp_path / 'bad.jsonl'}{complaint}")


def test_a_span_out_of_range_is_left_out_alone_with_one_warning_and_exit_0(traces):
    """A queue duration or CPU time of 1e300 s (OverflowError before: a traceback, exit 1)."""
    with open(traces, "a") as handle:
        for number, key in enumerate(["agent.tool.queue.duration", "agent.tool.exec.cpu_time"]):
            span = json.loads(span_line(tool='"search"'))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
            span["spanId"] = f"{number + 1:016x}"
            span["attributes"].append({"key": key, "value": {"doubleValue": 1e300}})
            handle.write(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) + "\n")
    result = run_cli("report", traces, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert calls_by_tool(report) == EXPECTED_CALLS  # the good spans, all of them
    (warning,) = [w for w in report["inputs"]["warnings"] if "left out" in w]
    assert warning.startswith(f"{traces}: 2 span(s) left out") and "agent.tool.queue.duration" in warning
    assert b"Traceback" not in result.stderr


def test_a_lone_surrogate_in_a_name_reaches_table_html_and_perfetto_as_u_fffd(tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text(span_line(tool='"bad\\udcffname"'))
    html_path, perfetto_path = tmp_path / "r.html", tmp_path / "t.json"
    assert main(["report", str(tmp_path / "t.jsonl"), "--html", str(html_path), "--perfetto", str(perfetto_path)]) == 0
    assert "bad\ufffdname" in capsys.readouterr().out
    assert "bad\ufffdname" in html_path.read_text(encoding="utf-8")
    events = json.loads(perfetto_path.read_text(encoding="utf-8"))["traceEvents"]
    assert {event["args"]["tool"] for event in events if event.get("cat") == "exec"} == {"bad\ufffdname"}
    assert calls_by_tool(report_of(capsys, tmp_path / "t.jsonl")) == {"bad\ufffdname": 1}


def test_terminal_escapes_in_names_are_shown_not_sent(tmp_path, capsys):
    title_and_clear = json.dumps("evil\x1b]0;pwned\x07\x1b[2J\x1b[Hname\n")
    (tmp_path / "t.jsonl").write_text(span_line(tool=title_and_clear))
    assert main(["report", str(tmp_path / "t.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\x1b[Hname\\x0a" in out


def test_dev_zero_as_traces_stops_at_once_in_bounded_memory():
    result = run_cli("report", "/dev/zero", memory_limit=1 << 30, timeout=30)
    assert result.returncode == 2
    assert result.stderr.decode() == "agent-otel report: error: /dev/zero: binary data, not OTLP/JSON lines\n"


def test_dev_urandom_as_a_gpu_log_stops_at_once_in_bounded_memory(traces):
    result = run_cli("report", traces, "--gpu-log", "/dev/urandom", memory_limit=1 << 30, timeout=30)
    assert result.returncode == 2
    assert result.stderr.decode() == (
        "agent-otel report: error: /dev/urandom: binary data, not an nvidia-smi GPU log (dmon -o DT, or --query-gpu csv)\n"
    )


def test_an_endless_line_stops_at_the_line_limit_in_bounded_memory(tmp_path):
    # text without a newline, such as `yes | tr -d '\n'`: stopped at the
    # line limit, far below 1 GB of memory
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('y' * 65536)"], stdout=subprocess.PIPE
    )
    try:
        result = subprocess.run(
            [sys.executable, "-m", "agent_otel.commands.cli", "report", "-"],
            stdin=process.stdout,
            capture_output=True,
            timeout=120,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)),
        )
    finally:
        process.kill()
        process.wait()
    assert result.returncode == 2
    assert (
        result.stderr.decode() == "agent-otel report: error: <stdin>:1: line longer than 128 MiB: not OTLP/JSON lines\n"
    )


@pytest.mark.parametrize(
    "line, complaint",
    [
        (
            "0001/01/01 00:00:00.000, 0, 37 %",
            ":2: date/time '0001/01/01 00:00:00.000' is out of range (years 1970 to 2261)",
        ),
        ("9999/12/31 23:59:59.999, 0, 37 %", ":2: date/time '9999/12/31 23:59:59.999' is out of range"),
        (
            "2024/13/01 00:00:00.000, 0, 37 %",
            ":2: date/time '2024/13/01 00:00:00.000' is not like 2024/01/02 19:12:31.123",
        ),
        ("2024/01/02 19:12:31.123, 99999999999999999999, 37 %", ":2: GPU index '99999999999999999999' is not a number"),
        ("2024/01/02 19:12:31.123, 0, nan %", ":2: utilization.gpu value 'nan %' is outside 0..100"),
    ],
)
def test_hostile_gpu_logs_are_one_line_errors(traces, capsys, line, complaint):
    log = traces.parent / "gpu.csv"
    log.write_text("timestamp, index, utilization.gpu [%]\n" + line + "\n")
    assert error_of(capsys, traces, "--gpu-log", log, "--tz", "UTC").startswith(
        f"agent-otel report: error: {log}{complaint}"
    )


def test_a_dmon_log_dated_year_0001(traces, capsys):
    log = traces.parent / "dmon.log"
    log.write_text(
        "#Date       Time        gpu    sm\n#YYYYMMDD   HH:MM:SS    Idx     %\n 00010101   00:00:00      0    97\n"
    )
    assert error_of(capsys, traces, "--gpu-log", log).startswith(
        f"agent-otel report: error: {log}:3: date/time '00010101 00:00:00' is out of range"
    )


def test_utilization_written_as_a_ratio_is_named(traces, capsys):
    log = traces.parent / "ratio.csv"
    write_gpu_csv(log, [(k / 10, 0, 0.9 if k < 20 else 0.05) for k in range(60)])
    line = error_of(capsys, traces, "--gpu-log", log, "--tz", "UTC")
    assert line.startswith(f"agent-otel report: error: {log}:2: utilization '0.9 %' looks like a ratio")
    assert "multiply the values by 100" in line
    # whole percentages that happen to be small are not ratios
    write_gpu_csv(log, [(k / 10, 0, 1 if k < 20 else 0) for k in range(60)])
    assert report_of(capsys, traces, "--gpu-log", log, "--tz", "UTC")["inputs"]["gpu_logs"][0]["samples"] == 60
