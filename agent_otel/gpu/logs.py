"""Read GPU utilization logs written by ``nvidia-smi``.

Usage::

    from agent_otel.gpu.logs import read_gpu_log
    samples = read_gpu_log("gpu.log")            # local time
    samples = read_gpu_log("gpu.csv", tz="UTC")  # times recorded in UTC

Two formats are recognised from the file itself:

- ``nvidia-smi dmon -o DT`` (any ``-s`` letters that include ``u``): lines
  starting with ``#`` are headers (names, then units, repeated now and
  then); columns are found by name: ``Date`` (YYYYMMDD), ``Time``
  (HH:MM:SS), ``gpu`` and ``sm`` (percent). ``-`` means not available and
  the sample is skipped.
- ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu[,uuid,...]
  --format=csv`` with or without ``noheader`` and ``nounits``. Columns are
  found by header name; only a file without a header is read in the order
  ``timestamp, index, utilization.gpu``. ``[N/A]``-style values are skipped.

Times carry no zone in either format: they are local time unless ``tz``
names an IANA zone. A malformed line raises ``InputError`` naming the file,
the line and what is wrong; so does a log whose utilization values are all
between 0 and 1 with fractions (ratios, where nvidia-smi writes percentages)
and a date outside the years a 64-bit nanosecond clock holds.

The log is streamed (``agent_otel.support.inputs``: a path or ``-``, plain, gzip or
zstd, lines of at most 1 MiB) into one compact ``GpuSeries`` per GPU.
"""

from __future__ import annotations

import csv
import errno
import heapq
import logging
import os
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone, tzinfo
from typing import Iterator, Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent_otel.support.appending import AppendFile
from agent_otel.errors import ConfigError, InputError
from agent_otel.gpu.timeline import DEFAULT_MAX_GAP_S, GAP_SPACINGS, IdleDetector, TimelineStep
from agent_otel.support.inputs import Input, MiB, open_input
from agent_otel.records import NS_PER_S, GpuSample, IdleWindow

_logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_CSV_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")
_CSV_DEFAULT_COLUMNS = ("timestamp", "index", "utilization.gpu")
_NOT_AVAILABLE = {"-", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}
# Times a 64-bit nanosecond clock can hold (what NVML and OpenTelemetry use).
_FIRST_YEAR, _LAST_YEAR = 1970, 2261
EXPECTED = "an nvidia-smi GPU log (dmon -o DT, or --query-gpu csv)"
MAX_LINE = 1 * MiB
# Samples handed to the idle detector at a time.
_CHUNK = 4096


class GpuSeries:
    """One GPU's samples in time order, stored compactly (16 bytes each)."""

    __slots__ = ("gpu", "times", "values")

    def __init__(self, gpu: str):
        self.gpu = gpu
        self.times = array("q")  # epoch ns
        self.values = array("d")  # utilization ratio 0..1

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[GpuSample]:
        gpu = self.gpu
        return (GpuSample(gpu, t, u) for t, u in zip(self.times, self.values))

    def sort(self) -> None:
        times = self.times
        if all(a <= b for a, b in zip(times, times[1:])):
            return
        order = sorted(range(len(times)), key=times.__getitem__)
        self.times = array("q", (times[i] for i in order))
        self.values = array("d", (self.values[i] for i in order))

    def overlaps(self, start_ns: int, end_ns: int) -> bool:
        """Whether a sample lies in [start, end]."""
        return bisect_left(self.times, start_ns) < bisect_right(self.times, end_ns)

    def around(self, start_ns: int, end_ns: int) -> "GpuSeries":
        """The samples inside [start, end] plus one on each side, so a
        curve drawn from them reaches the edges (none if none is inside)."""
        first, last = bisect_left(self.times, start_ns), bisect_right(self.times, end_ns)
        part = GpuSeries(self.gpu)
        if first < last:
            part.times = self.times[max(0, first - 1) : last + 1]
            part.values = self.values[max(0, first - 1) : last + 1]
        return part


class GpuLog(Sequence):
    """The samples of a log: a ``Sequence[GpuSample]`` in time order
    (by GPU where times are equal), stored as one ``GpuSeries`` per GPU in
    ``series``; ``uuids`` and ``names`` map a GPU index to its UUID and
    device name where the log names them (csv ``uuid`` and ``name``)."""

    def __init__(self, samples=(), uuids: Optional[dict[str, str]] = None, names: Optional[dict[str, str]] = None):
        self.series: dict[str, GpuSeries] = {}
        self.uuids: dict[str, str] = dict(uuids or {})
        self.names: dict[str, str] = dict(names or {})
        for sample in samples:
            self.add(sample.gpu, sample.timestamp_ns, sample.utilization)
        self._sorted()

    def add(self, gpu: str, timestamp_ns: int, utilization: float) -> None:
        series = self.series.get(gpu)
        if series is None:
            series = self.series[gpu] = GpuSeries(gpu)
        series.times.append(timestamp_ns)
        series.values.append(utilization)

    @classmethod
    def merge(cls, logs: "list[GpuLog]") -> "GpuLog":
        """One log holding the samples of several (the first itself when alone)."""
        if len(logs) == 1:
            return logs[0]
        merged = cls()
        for log in logs:
            merged.uuids.update(log.uuids)
            merged.names.update(log.names)
            for gpu, series in log.series.items():
                target = merged.series.get(gpu)
                if target is None:
                    target = merged.series[gpu] = GpuSeries(gpu)
                target.times.extend(series.times)
                target.values.extend(series.values)
        return merged._sorted()

    def _sorted(self) -> "GpuLog":
        for series in self.series.values():
            series.sort()
        return self

    def __len__(self) -> int:
        return sum(len(series) for series in self.series.values())

    def __iter__(self) -> Iterator[GpuSample]:
        ordered = sorted(self.series.values(), key=lambda s: s.gpu)
        return heapq.merge(*ordered, key=lambda sample: sample.timestamp_ns)

    def __getitem__(self, index):
        if index == 0 and self.series:
            return min((next(iter(s)) for s in self.series.values() if len(s)), key=lambda x: (x.timestamp_ns, x.gpu))
        return list(self)[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, GpuLog)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def start_ns(self) -> int:
        return min((s.times[0] for s in self.series.values() if len(s)), default=0)

    @property
    def end_ns(self) -> int:
        return max((s.times[-1] for s in self.series.values() if len(s)), default=0)

    def median_spacing_s(self) -> float:
        """Median time between consecutive samples of the same GPU (0 if
        none), as ``timeline.median_spacing_s`` computes it."""
        counts: Counter = Counter()
        for series in self.series.values():
            times = series.times
            counts.update(b - a for a, b in zip(times, times[1:]) if b > a)
        total = sum(counts.values())
        if not total:
            return 0.0
        ordered = sorted(counts.items())

        def nth(n: int) -> int:
            for value, count in ordered:
                if n < count:
                    return value
                n -= count
            raise IndexError(n)

        middle = total // 2
        median = nth(middle) if total % 2 else (nth(middle - 1) + nth(middle)) / 2
        return median / NS_PER_S

    def steps(self, threshold: float, min_idle_s: float, pool: str = "") -> Iterator[TimelineStep]:
        """Run ``timeline.read_timeline``'s detector (same gap limit) over
        these samples a chunk at a time: each step holds the windows that
        closed in it and the stretches it covered (``MISSING`` where a gap
        left data missing); the last step the windows still open at the end.
        No list of every sample or stretch is ever built."""
        max_gap_s = max(DEFAULT_MAX_GAP_S, GAP_SPACINGS * self.median_spacing_s())
        detector = IdleDetector(threshold, min_idle_s, max_gap_s=max_gap_s, uuids=self.uuids, pool=pool)
        for series in self.series.values():
            gpu, times, values = series.gpu, series.times, series.values
            for first in range(0, len(times), _CHUNK):
                chunk = [
                    GpuSample(gpu, t, u) for t, u in zip(times[first : first + _CHUNK], values[first : first + _CHUNK])
                ]
                yield detector.step(chunk)
        yield TimelineStep(detector.flush(), [])

    def idle_windows(self, threshold: float, min_idle_s: float) -> list[IdleWindow]:
        """The idle windows ``timeline.find_idle_windows`` finds in these
        samples (same detector, same gap limit), without a list of every sample."""
        windows = [window for step in self.steps(threshold, min_idle_s) for window in step.windows]
        windows.sort(key=lambda w: (w.start_ns, w.gpu))
        return windows


def read_gpu_log(path: str, tz: Optional[str] = None) -> GpuLog:
    """Read a dmon or csv log (a path, or ``-`` for standard input; plain,
    gzip or zstd); see the module docstring for the formats. Streamed:
    memory holds 16 bytes per sample, whatever the file's size."""
    zone = _zone(tz)
    with open_input(str(path), EXPECTED, MAX_LINE) as source:
        reader = _LogReader(source, zone)
        reader.read()
    return reader.log._sorted()


def _zone(tz: Optional[str]) -> Optional[tzinfo]:
    if tz is None:
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError("--tz", tz, "an IANA time zone name such as UTC or Europe/Berlin") from None


class _LogReader:
    """One pass over a log's lines; the format is recognised from the first one."""

    def __init__(self, source: Input, zone: Optional[tzinfo]):
        self.source = source
        self.zone = zone
        self.log = GpuLog()
        self.gpus: dict[str, str] = {}
        self.minutes: dict[str, int] = {}  # "YYYY/MM/DD HH:MM" -> epoch ns of that minute
        self.max_utilization = 0.0
        self.fraction_at: Optional[tuple[int, str]] = None  # first value with a fractional part

    def error(self, number: Optional[int], message: str) -> InputError:
        return self.source.error(number, message)

    def read(self) -> None:
        lines = ((number, raw.decode("utf-8", "replace")) for number, raw in self.source)
        for number, line in lines:
            if line.strip():
                if line.lstrip().startswith("#"):
                    self._dmon(number, line, lines)
                else:
                    self._csv(number, line, lines)
                break
        if self.source.cut_off is not None:
            pass  # the lines before it were whole; a log being written is read as far as it goes
        if self.fraction_at is not None and self.max_utilization <= 1.0:
            number, text = self.fraction_at
            raise self.error(
                number,
                f"utilization {text!r} looks like a ratio (every value is between 0 and 1): a GPU log holds "
                "percentages, as nvidia-smi writes them (90 for 90 %); multiply the values by 100",
            )

    # -- dmon ------------------------------------------------------------

    def _dmon(self, first_number: int, first_line: str, lines) -> None:
        columns: Optional[dict[str, int]] = None
        count = 0
        for number, line in _chain(first_number, first_line, lines):
            fields = line.split()
            if not fields:
                continue
            if fields[0].startswith("#"):
                names = [fields[0][1:]] + fields[1:]
                if "gpu" in (name.lower() for name in names):
                    columns = self._dmon_columns(number, names)
                    count = len(names)
                continue  # the units line, or a comment
            if columns is None:
                raise self.error(number, "data before the dmon header line (#Date Time gpu ...)")
            if len(fields) != count:
                raise self.error(number, f"expected {count} columns as in the header, found {len(fields)}")
            sm = fields[columns["sm"]]
            if sm.lower() in _NOT_AVAILABLE:
                continue
            date, time = fields[columns["date"]], fields[columns["time"]]
            self.log.add(
                self._gpu(number, fields[columns["gpu"]]),
                self._dmon_time(number, date, time),
                self._percent(number, sm, "sm"),
            )

    def _dmon_columns(self, number: int, names: list[str]) -> dict[str, int]:
        lowered = [name.lower() for name in names]
        missing = [name for name in ("date", "time", "sm") if name not in lowered]
        if missing:
            hint = "record it with -o DT" if "sm" not in missing else "record it with -s u (or -s pucet)"
            raise self.error(number, f"dmon header has no {', '.join(missing)} column: {hint}")
        return {name: lowered.index(name) for name in ("date", "time", "gpu", "sm")}

    def _dmon_time(self, number: int, date: str, time: str) -> int:
        # YYYYMMDD HH:MM:SS; the minute's start is computed once per minute
        if len(date) == 8 and len(time) == 8 and time[2] == ":" and time[5] == ":" and time[6:].isdigit():
            minute = f"{date[:4]}/{date[4:6]}/{date[6:]} {time[:5]}"
            base = self.minutes.get(minute)
            if base is None:
                base = self._minute(number, minute, f"{date} {time}", "YYYYMMDD HH:MM:SS")
            seconds = int(time[6:])
            if seconds < 60:
                return base + seconds * NS_PER_S
        raise self.error(number, f"date/time {date + ' ' + time!r} is not YYYYMMDD HH:MM:SS")

    # -- csv -------------------------------------------------------------

    def _csv(self, number: int, line: str, lines) -> None:
        first = _csv_fields(line)
        names = [_csv_name(field) for field in first]
        has_header = "timestamp" in names
        rows = _chain(number, line, lines)
        if has_header:
            next(rows)
        elif not (len(first) == len(_CSV_DEFAULT_COLUMNS) and self._looks_like_time(first[0])):
            hint = ""
            if line.lstrip().startswith(("{", "[")):
                hint = "; this looks like OTLP/JSON traces: pass them to agent-otel report as TRACES, not --gpu-log"
            raise self.error(
                number,
                "not a GPU log: expected an nvidia-smi dmon header (#Date Time gpu ... sm ...) or a csv "
                "from --query-gpu=timestamp,index,utilization.gpu (header with those names, "
                "or exactly those three columns without one)" + hint,
            )
        else:
            names = list(_CSV_DEFAULT_COLUMNS)  # noheader: the documented query order
        missing = [name for name in _CSV_DEFAULT_COLUMNS if name not in names]
        if missing:
            raise self.error(number, f"csv header has no {', '.join(missing)} column")
        at_time, at_index, at_value = (names.index(name) for name in _CSV_DEFAULT_COLUMNS)
        at_uuid = names.index("uuid") if "uuid" in names else None
        at_name = names.index("name") if "name" in names else None
        count = len(names)
        uuids, device_names = self.log.uuids, self.log.names
        for number, line in rows:
            if not line.strip():
                continue
            fields = _csv_fields(line)
            if len(fields) != count:
                raise self.error(number, f"expected {count} columns, found {len(fields)}")
            if has_header and fields == first:
                continue  # a header repeated by concatenated runs
            gpu = self._gpu(number, fields[at_index])
            if at_uuid is not None and fields[at_uuid].lower() not in _NOT_AVAILABLE:
                uuids[gpu] = fields[at_uuid]
            if at_name is not None and fields[at_name].lower() not in _NOT_AVAILABLE:
                device_names[gpu] = fields[at_name]
            utilization = fields[at_value]
            if utilization.lower() in _NOT_AVAILABLE:
                continue
            self.log.add(
                gpu, self._csv_time(number, fields[at_time]), self._percent(number, utilization, "utilization.gpu")
            )

    def _csv_time(self, number: int, text: str) -> int:
        # YYYY/MM/DD HH:MM:SS[.fff]; the minute's start is computed once per minute
        if len(text) >= 19 and text[16] == ":" and text[17:19].isdigit() and text[4] == "/":
            base = self.minutes.get(text[:16])
            if base is None:
                base = self._minute(number, text[:16], text, "like 2024/01/02 19:12:31.123")
            seconds = int(text[17:19])
            fraction = text[19:]
            if seconds < 60 and (
                not fraction or (fraction[0] == "." and 1 < len(fraction) <= 7 and fraction[1:].isdigit())
            ):
                micros = int((fraction[1:] + "000000")[:6]) if fraction else 0
                return base + seconds * NS_PER_S + micros * 1000
        raise self.error(number, f"timestamp {text!r} is not like 2024/01/02 19:12:31.123")

    def _looks_like_time(self, text: str) -> bool:
        return any(_parse(text, fmt) is not None for fmt in _CSV_TIME_FORMATS)

    # -- fields ----------------------------------------------------------

    def _minute(self, number: int, minute: str, text: str, form: str) -> int:
        """Epoch ns of the start of a minute ("YYYY/MM/DD HH:MM") in the log's zone."""
        moment = _parse(minute, "%Y/%m/%d %H:%M")
        if moment is None:
            raise self.error(number, f"date/time {text!r} is not {form}")
        if not _FIRST_YEAR <= moment.year <= _LAST_YEAR:
            raise self.error(number, f"date/time {text!r} is out of range (years {_FIRST_YEAR} to {_LAST_YEAR})")
        aware = moment.replace(tzinfo=self.zone) if self.zone is not None else moment.astimezone()
        delta = aware - _EPOCH
        base = (delta.days * 86_400 + delta.seconds) * NS_PER_S + delta.microseconds * 1_000
        if len(self.minutes) > 100_000:
            self.minutes.clear()
        self.minutes[minute] = base
        return base

    def _percent(self, number: int, text: str, column: str) -> float:
        value = text.strip()
        if value.endswith("%"):
            value = value[:-1].strip()
        try:
            percent = float(value)
        except ValueError:
            raise self.error(number, f"{column} value {text.strip()!r} is not a percentage") from None
        if not 0.0 <= percent <= 100.0:
            raise self.error(number, f"{column} value {text.strip()!r} is outside 0..100")
        if percent > self.max_utilization:
            self.max_utilization = percent
        if self.fraction_at is None and not percent.is_integer():
            self.fraction_at = (number, text.strip())
        return percent / 100.0

    def _gpu(self, number: int, text: str) -> str:
        gpu = self.gpus.get(text)
        if gpu is None:
            value = text.strip()
            if not (value.isascii() and value.isdigit() and len(value) <= 6):
                raise self.error(number, f"GPU index {value!r} is not a number")
            gpu = self.gpus[text] = str(int(value))
        return gpu


def _chain(number: int, line: str, lines):
    yield number, line
    yield from lines


def _csv_fields(line: str) -> list[str]:
    if '"' in line:
        try:
            return [field.strip() for field in next(csv.reader([line]))]
        except csv.Error:
            pass  # a carriage return inside the line, say: split as is, the caller names what is wrong
    return [field.strip() for field in line.split(",")]


def _csv_name(header: str) -> str:
    """``utilization.gpu [%]`` -> ``utilization.gpu``."""
    name = header.strip().lower()
    if name.endswith("]") and "[" in name:
        name = name[: name.rindex("[")].strip()
    return name


def _parse(text: str, fmt: str) -> Optional[datetime]:
    try:
        return datetime.strptime(text.strip(), fmt)
    except ValueError:
        return None


class GpuLogWriter:
    """Writes samples as ``nvidia-smi --query-gpu=timestamp,index,utilization.gpu
    --format=csv``, so ``read_gpu_log`` and ``agent-otel report --gpu-log``
    read them back. Times are local, like nvidia-smi's, to the millisecond.

    ``instrument(gpu_log_file=...)`` uses it to keep the samples the live
    timeline saw: the report then draws the utilization curve too. Given
    the source's ``devices``, it writes their ``name`` and ``uuid`` too
    (``--query-gpu=timestamp,index,name,uuid,utilization.gpu``), so the
    report knows each GPU, and a simulated one ("Simulated GPU",
    ``GPU-simulated-0``) is never taken for a real one. A ``MISSING``
    sample (data lost) is written ``[N/A]``, which the reader skips: the
    gap it leaves is missing data there too. A log deleted or replaced
    while it is written (a clean-up, a log rotation) is opened anew at the
    next write, its header first where it is empty, with one log line, as
    the traces file is.
    """

    HEADER = "timestamp, index, utilization.gpu [%]\n"
    HEADER_WITH_DEVICES = "timestamp, index, name, uuid, utilization.gpu [%]\n"

    def __init__(self, path: str, devices: Sequence = (), max_bytes: Optional[int] = None):
        self.path = path
        # Past this size nothing more is written (write raises EFBIG): the log
        # agent-otel chose itself must not fill a disk.
        self.max_bytes = max_bytes
        self._size = 0
        # index -> ", name, uuid" (commas in a name would split its column: none in nvidia-smi's)
        self._device = {
            device.index: f", {(device.name or '[N/A]').replace(',', ' ')}, {device.uuid or '[N/A]'}"
            for device in devices
        }
        try:
            self._file = AppendFile(path, truncate=True)
            self._write_header()
        except OSError as exc:
            raise ConfigError("gpu_log_file", path, f"a writable file ({exc.strerror or exc})") from None

    def write(self, samples) -> None:
        """Append the samples' lines in one write (a full disk raises ``OSError``; nothing is half written)."""
        lines = []
        for sample in samples:
            moment = datetime.fromtimestamp(sample.timestamp_ns / 1e9)
            stamp = moment.strftime("%Y/%m/%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
            value = "[N/A]" if sample.utilization != sample.utilization else f"{round(sample.utilization * 100)} %"
            device = self._device.get(sample.gpu, ", [N/A], [N/A]") if self._device else ""
            lines.append(f"{stamp}, {sample.gpu}{device}, {value}\n")
        if lines:
            text = "".join(lines)
            moved = self._file.moved()
            if moved is not None:
                self._open_again(moved)
            if self.max_bytes is not None and self._size + len(text) > self.max_bytes:
                raise OSError(errno.EFBIG, f"the log reached its {self.max_bytes // 2**20} MiB limit", self.path)
            self._file.append(text)
            self._size += len(text)

    def _write_header(self) -> None:
        header = self.HEADER_WITH_DEVICES if self._device else self.HEADER
        self._file.append(header)
        self._size = len(header)

    def _open_again(self, moved: str) -> None:
        """The log was deleted or replaced: write to ``path`` again (raises
        ``OSError`` when it cannot be opened: the caller reports it)."""
        self._file.open_again()
        self._size = os.fstat(self._file.fileno()).st_size
        if not self._size:  # a reader finds the columns by the header's names
            self._write_header()
        _logger.warning(
            "%s was %s while GPU samples were written to it; opened it again: later samples are in the file at that path",
            self.path,
            moved,
        )

    def close(self) -> None:
        self._file.close()
