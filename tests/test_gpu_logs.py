"""Reading nvidia-smi logs, and playing them back as a GPU source."""

import calendar
from datetime import datetime

import pytest

from agent_otel.errors import ConfigError, InputError
from agent_otel.gpu.sources import open_gpu_source
from agent_otel.gpu.replay import ReplaySource
from agent_otel.gpu.logs import read_gpu_log
from agent_otel.records import NS_PER_S, GpuSample
from agent_otel.gpu.timeline import find_idle_windows

# Verbatim `nvidia-smi dmon -s pucet -o DT` output from a public copy.
DMON_EXAMPLE = """\
#Date       Time        gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk sbecc dbecc   pci rxpci txpci
#YYYYMMDD   HH:MM:SS    Idx     W     C     C     %     %     %     %   MHz   MHz  errs  errs  errs  MB/s  MB/s
 20210102   19:12:31      0    37    19     -     0     0     0     0  4006   582     -     -     0     0     1
"""


def utc_ns(text):
    """'2024-01-02 19:12:31.123' in UTC -> epoch ns."""
    moment = datetime.fromisoformat(text)
    return calendar.timegm(moment.timetuple()) * NS_PER_S + moment.microsecond * 1000


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_verbatim_dmon_example_reads_in_local_time(tmp_path):
    log = read_gpu_log(write(tmp_path, "dmon.log", DMON_EXAMPLE))

    local = datetime(2021, 1, 2, 19, 12, 31).timestamp()  # naive = local time
    assert log == [GpuSample("0", round(local * NS_PER_S), 0.0)]


def test_dmon_with_a_time_zone_several_gpus_repeated_headers_and_missing_values(tmp_path):
    text = """\
#Date       Time        gpu    sm   mem   enc   dec   jpg   ofa
#YYYYMMDD   HH:MM:SS    Idx     %     %     %     %     %     %
 20240102   19:12:31      0    97    40     0     0     0     0
 20240102   19:12:31      1     -     -     0     0     0     0
 20240102   19:12:32      0     3     1     0     0     0     0
 20240102   19:12:32      1    55    20     0     0     0     0
#Date       Time        gpu    sm   mem   enc   dec   jpg   ofa
#YYYYMMDD   HH:MM:SS    Idx     %     %     %     %     %     %
 20240102   19:12:33      0     0     0     0     0     0     0
"""
    log = read_gpu_log(write(tmp_path, "dmon.log", text), tz="UTC")

    assert log == [
        GpuSample("0", utc_ns("2024-01-02 19:12:31"), 0.97),
        GpuSample("0", utc_ns("2024-01-02 19:12:32"), 0.03),
        GpuSample("1", utc_ns("2024-01-02 19:12:32"), 0.55),
        GpuSample("0", utc_ns("2024-01-02 19:12:33"), 0.0),
    ]


def test_dmon_columns_are_found_by_name_not_position(tmp_path):
    text = """\
#Date       Time        gpu   pwr    sm
#YYYYMMDD   HH:MM:SS    Idx     W     %
 20240102   19:12:31      2    80    64
"""
    assert read_gpu_log(write(tmp_path, "dmon.log", text), tz="UTC") == [
        GpuSample("2", utc_ns("2024-01-02 19:12:31"), 0.64)
    ]


def test_the_tz_setting_shifts_every_sample(tmp_path):
    path = write(tmp_path, "dmon.log", DMON_EXAMPLE)

    tokyo = read_gpu_log(path, tz="Asia/Tokyo")[0].timestamp_ns
    utc = read_gpu_log(path, tz="UTC")[0].timestamp_ns

    assert utc - tokyo == 9 * 3600 * NS_PER_S


def test_dmon_without_date_and_time_names_the_missing_option(tmp_path):
    text = "# gpu    sm   mem\n# Idx     %     %\n    0    12     3\n"
    with pytest.raises(InputError, match=r"dmon\.log:1: .*no date, time column: record it with -o DT"):
        read_gpu_log(write(tmp_path, "dmon.log", text))


def test_a_malformed_dmon_line_names_its_line(tmp_path):
    bad = DMON_EXAMPLE + " 20210102   19:12:32      0    37\n"
    with pytest.raises(InputError) as caught:
        read_gpu_log(write(tmp_path, "dmon.log", bad))
    assert caught.value.line == 4
    assert "expected 17 columns" in str(caught.value)

    bad_time = DMON_EXAMPLE.replace("19:12:31", "19:61:31")
    with pytest.raises(InputError, match=r":3: date/time '20210102 19:61:31'"):
        read_gpu_log(write(tmp_path, "dmon2.log", bad_time))


def test_csv_with_header_and_units(tmp_path):
    text = """\
timestamp, index, utilization.gpu [%]
2024/01/02 19:12:31.123, 0, 37 %
2024/01/02 19:12:31.125, 1, 100 %
2024/01/02 19:12:32.123, 0, 0 %
"""
    log = read_gpu_log(write(tmp_path, "gpu.csv", text), tz="UTC")

    assert log == [
        GpuSample("0", utc_ns("2024-01-02 19:12:31.123"), 0.37),
        GpuSample("1", utc_ns("2024-01-02 19:12:31.125"), 1.0),
        GpuSample("0", utc_ns("2024-01-02 19:12:32.123"), 0.0),
    ]
    assert log.uuids == {}


def test_csv_nounits_and_noheader_read_the_same(tmp_path):
    nounits = "timestamp, index, utilization.gpu [%]\n2024/01/02 19:12:31.500, 0, 37\n"
    noheader = "2024/01/02 19:12:31.500, 0, 37 %\n"
    bare = "2024/01/02 19:12:31.500, 0, 37\n"

    expected = [GpuSample("0", utc_ns("2024-01-02 19:12:31.500"), 0.37)]
    for name, text in [("a.csv", nounits), ("b.csv", noheader), ("c.csv", bare)]:
        assert read_gpu_log(write(tmp_path, name, text), tz="UTC") == expected


def test_csv_columns_by_name_with_uuids_and_unavailable_values(tmp_path):
    text = """\
index, uuid, utilization.gpu [%], timestamp
0, GPU-11111111-2222-3333-4444-555555555555, 12 %, 2024/01/02 19:12:31.000
1, GPU-66666666-7777-8888-9999-000000000000, [N/A], 2024/01/02 19:12:31.000
"""
    log = read_gpu_log(write(tmp_path, "gpu.csv", text), tz="UTC")

    assert log == [GpuSample("0", utc_ns("2024-01-02 19:12:31"), 0.12)]
    assert log.uuids == {
        "0": "GPU-11111111-2222-3333-4444-555555555555",
        "1": "GPU-66666666-7777-8888-9999-000000000000",
    }


def test_csv_without_header_in_another_column_order_is_refused(tmp_path):
    text = "0, 2024/01/02 19:12:31.000, 12 %\n"
    with pytest.raises(InputError, match=r"gpu\.csv:1: not a GPU log"):
        read_gpu_log(write(tmp_path, "gpu.csv", text))


def test_a_malformed_csv_line_names_its_line_and_value(tmp_path):
    text = """\
timestamp, index, utilization.gpu [%]
2024/01/02 19:12:31.123, 0, 37 %
2024-01-02T19:12:32, 0, 37 %
"""
    with pytest.raises(InputError) as caught:
        read_gpu_log(write(tmp_path, "gpu.csv", text))
    assert caught.value.line == 3
    assert "timestamp '2024-01-02T19:12:32'" in str(caught.value)

    with pytest.raises(InputError, match=r":2: utilization.gpu value '137 %' is outside 0..100"):
        read_gpu_log(
            write(tmp_path, "pct.csv", "timestamp, index, utilization.gpu [%]\n2024/01/02 19:12:31.1, 0, 137 %\n")
        )


def test_a_missing_file_and_a_bad_zone_are_clear_errors(tmp_path):
    with pytest.raises(InputError, match="nope.log: cannot read: No such file"):
        read_gpu_log(str(tmp_path / "nope.log"))
    with pytest.raises(ConfigError, match="--tz"):
        read_gpu_log(write(tmp_path, "dmon.log", DMON_EXAMPLE), tz="Mars/Olympus_Mons")


def test_idle_windows_from_a_dmon_log(tmp_path):
    # One line per second: busy until :05, idle :06-:09, busy from :10.
    rows = [f" 20240102   19:12:{s:02d}      0    {0 if 6 <= s <= 9 else 90}\n" for s in range(0, 14)]
    text = "#Date       Time        gpu    sm\n#YYYYMMDD   HH:MM:SS    Idx     %\n" + "".join(rows)

    log = read_gpu_log(write(tmp_path, "dmon.log", text), tz="UTC")
    windows = find_idle_windows(log, threshold=0.1, min_idle_s=0.5, uuids=log.uuids)

    assert [(w.start_ns, w.end_ns) for w in windows] == [(utc_ns("2024-01-02 19:12:05"), utc_ns("2024-01-02 19:12:09"))]


CSV_TWO_GPUS = """\
timestamp, index, uuid, utilization.gpu [%]
2024/01/02 19:12:31.000, 0, GPU-aaa, 90 %
2024/01/02 19:12:31.000, 1, GPU-bbb, 0 %
2024/01/02 19:12:31.200, 0, GPU-aaa, 0 %
2024/01/02 19:12:31.200, 1, GPU-bbb, 80 %
"""


def test_replay_all_at_once_keeps_recorded_times_and_selects_devices(tmp_path):
    path = write(tmp_path, "gpu.csv", CSV_TWO_GPUS)

    source = ReplaySource(path, realtime=False, devices=["GPU-bbb"], tz="UTC")

    assert source.kind == "replay"
    assert [(d.index, d.uuid) for d in source.devices()] == [("1", "GPU-bbb")]
    assert source.poll() == [
        GpuSample("1", utc_ns("2024-01-02 19:12:31"), 0.0),
        GpuSample("1", utc_ns("2024-01-02 19:12:31.200"), 0.8),
    ]
    assert source.poll() == []
    assert source.finished


def test_replay_in_real_time_starts_now_and_releases_samples_as_time_passes(tmp_path):
    now = [5_000 * NS_PER_S]
    source = open_gpu_source("replay:" + write(tmp_path, "gpu.csv", CSV_TWO_GPUS), clock=lambda: now[0], tz="UTC")

    first = source.poll()
    assert [(s.gpu, s.timestamp_ns) for s in first] == [("0", now[0]), ("1", now[0])]
    now[0] += 199_000_000
    assert source.poll() == []
    now[0] += 1_000_000
    assert [(s.gpu, s.utilization) for s in source.poll()] == [("0", 0.0), ("1", 0.8)]
    assert source.finished


def test_written_log_reads_back_as_the_same_samples(tmp_path):
    from agent_otel.gpu.logs import GpuLogWriter

    path = tmp_path / "gpu.csv"
    start = 1_795_000_000_123_000_000
    samples = [GpuSample(str(gpu), start + i * 166_000_000, (i % 3) / 2) for i in range(6) for gpu in (0, 1)]
    writer = GpuLogWriter(str(path))
    writer.write(samples)
    writer.close()
    back = read_gpu_log(str(path))
    assert sorted(back, key=lambda s: (s.timestamp_ns, s.gpu)) == sorted(samples, key=lambda s: (s.timestamp_ns, s.gpu))


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_written_log_deleted_or_replaced_is_opened_again_with_its_header(tmp_path, caplog, how):
    # A clean-up deletes the log, or a rotation renames it away and leaves an
    # empty file: later samples go to the path, under a header the reader
    # needs (it finds the columns by name), and one line says so.
    from agent_otel.gpu.logs import GpuLogWriter

    path = tmp_path / "gpu.csv"
    start = 1_795_000_000_123_000_000
    samples = [GpuSample("0", start + i * 166_000_000, (i % 3) / 2) for i in range(8)]
    writer = GpuLogWriter(str(path))
    writer.write(samples[:4])
    if how == "deleted":
        path.unlink()
    else:
        path.rename(tmp_path / "gpu.csv.1")
        path.touch()
    with caplog.at_level("WARNING", logger="agent_otel.gpu.logs"):
        writer.write(samples[4:6])
        writer.write(samples[6:])
    writer.close()
    assert list(read_gpu_log(str(path))) == samples[4:]
    (line,) = [r.getMessage() for r in caplog.records if "opened it again" in r.getMessage()]
    assert f"{path} was {how}" in line
    if how == "replaced":
        assert list(read_gpu_log(str(tmp_path / "gpu.csv.1"))) == samples[:4]
