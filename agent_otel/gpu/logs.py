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
the line and what is wrong.
"""

from __future__ import annotations

import csv
from datetime import datetime, timezone, tzinfo
from typing import Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent_otel.errors import ConfigError, InputError
from agent_otel.records import GpuSample

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_CSV_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")
_CSV_DEFAULT_COLUMNS = ("timestamp", "index", "utilization.gpu")
_NOT_AVAILABLE = {"-", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


class GpuLog(list):
    """The samples of a log (a ``list[GpuSample]``, sorted by time), plus
    ``uuids``: GPU index -> UUID where the log names them (csv ``uuid``)."""

    def __init__(self, samples=(), uuids: Optional[dict[str, str]] = None):
        super().__init__(samples)
        self.uuids: dict[str, str] = dict(uuids or {})


def read_gpu_log(path: str, tz: Optional[str] = None) -> GpuLog:
    """Read a dmon or csv log; see the module docstring for the formats."""
    zone = _zone(tz)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read GPU log: {exc.strerror or exc}") from None
    first = next((line.strip() for line in lines if line.strip()), "")
    reader = _read_dmon if first.startswith("#") else _read_csv
    log = reader(str(path), lines, zone)
    log.sort(key=lambda s: (s.timestamp_ns, s.gpu))
    return log


def _zone(tz: Optional[str]) -> Optional[tzinfo]:
    if tz is None:
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError("--tz", tz, "an IANA time zone name such as UTC or Europe/Berlin") from None


def _epoch_ns(moment: datetime, zone: Optional[tzinfo]) -> int:
    """Naive ``moment`` in ``zone`` (local time when None) -> epoch ns, exactly."""
    aware = moment.replace(tzinfo=zone) if zone is not None else moment.astimezone()
    delta = aware - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _percent(path: str, number: int, text: str, column: str) -> float:
    value = text.strip()
    if value.endswith("%"):
        value = value[:-1].strip()
    try:
        percent = float(value)
    except ValueError:
        raise InputError(path, number, f"{column} value {text.strip()!r} is not a percentage") from None
    if not 0.0 <= percent <= 100.0:
        raise InputError(path, number, f"{column} value {text.strip()!r} is outside 0..100")
    return percent / 100.0


def _gpu_index(path: str, number: int, text: str) -> str:
    value = text.strip()
    if not value.isdigit():
        raise InputError(path, number, f"GPU index {value!r} is not a number")
    return str(int(value))


def _read_dmon(path: str, lines: list[str], zone: Optional[tzinfo]) -> GpuLog:
    log = GpuLog()
    columns: Optional[dict[str, int]] = None
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        if fields[0].startswith("#"):
            names = [fields[0][1:]] + fields[1:]
            if "gpu" in (name.lower() for name in names):
                columns = _dmon_columns(path, number, names)
            continue  # the units line, or a comment
        if columns is None:
            raise InputError(path, number, "data before the dmon header line (#Date Time gpu ...)")
        if len(fields) != columns["_count"]:
            raise InputError(path, number, f"expected {columns['_count']} columns as in the header, found {len(fields)}")
        sm = fields[columns["sm"]]
        if sm.lower() in _NOT_AVAILABLE:
            continue
        stamp = f"{fields[columns['date']]} {fields[columns['time']]}"
        try:
            moment = datetime.strptime(stamp, "%Y%m%d %H:%M:%S")
        except ValueError:
            raise InputError(path, number, f"date/time {stamp!r} is not YYYYMMDD HH:MM:SS") from None
        log.append(
            GpuSample(
                gpu=_gpu_index(path, number, fields[columns["gpu"]]),
                timestamp_ns=_epoch_ns(moment, zone),
                utilization=_percent(path, number, sm, "sm"),
            )
        )
    return log


def _dmon_columns(path: str, number: int, names: list[str]) -> dict[str, int]:
    lowered = [name.lower() for name in names]
    missing = [name for name in ("date", "time", "sm") if name not in lowered]
    if missing:
        hint = "record it with -o DT" if "sm" not in missing else "record it with -s u (or -s pucet)"
        raise InputError(path, number, f"dmon header has no {', '.join(missing)} column: {hint}")
    columns = {name: lowered.index(name) for name in ("date", "time", "gpu", "sm")}
    columns["_count"] = len(names)
    return columns


def _csv_name(header: str) -> str:
    """``utilization.gpu [%]`` -> ``utilization.gpu``."""
    name = header.strip().lower()
    if name.endswith("]") and "[" in name:
        name = name[: name.rindex("[")].strip()
    return name


def _read_csv(path: str, lines: list[str], zone: Optional[tzinfo]) -> GpuLog:
    log = GpuLog()
    rows = [
        (number, [field.strip() for field in next(csv.reader([line]))])
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not rows:
        return log
    first_number, first = rows[0]
    names = [_csv_name(field) for field in first]
    has_header = "timestamp" in names
    if has_header:
        data = rows[1:]
    elif len(first) == len(_CSV_DEFAULT_COLUMNS) and _looks_like_time(first[0]):
        names = list(_CSV_DEFAULT_COLUMNS)  # noheader: the documented query order
        data = rows
    else:
        raise InputError(
            path,
            first_number,
            "not a GPU log: expected an nvidia-smi dmon header (#Date Time gpu ... sm ...) or a csv "
            "from --query-gpu=timestamp,index,utilization.gpu (header with those names, "
            "or exactly those three columns without one)",
        )
    missing = [name for name in _CSV_DEFAULT_COLUMNS if name not in names]
    if missing:
        raise InputError(path, first_number, f"csv header has no {', '.join(missing)} column")
    at = {name: names.index(name) for name in (*_CSV_DEFAULT_COLUMNS, "uuid") if name in names}
    for number, fields in data:
        if len(fields) != len(names):
            raise InputError(path, number, f"expected {len(names)} columns, found {len(fields)}")
        if has_header and fields == first:
            continue  # a header repeated by concatenated runs
        gpu = _gpu_index(path, number, fields[at["index"]])
        if "uuid" in at and fields[at["uuid"]].lower() not in _NOT_AVAILABLE:
            log.uuids[gpu] = fields[at["uuid"]]
        utilization = fields[at["utilization.gpu"]]
        if utilization.lower() in _NOT_AVAILABLE:
            continue
        log.append(
            GpuSample(
                gpu=gpu,
                timestamp_ns=_epoch_ns(_csv_time(path, number, fields[at["timestamp"]]), zone),
                utilization=_percent(path, number, utilization, "utilization.gpu"),
            )
        )
    return log


def _looks_like_time(text: str) -> bool:
    return any(_parse(text, fmt) is not None for fmt in _CSV_TIME_FORMATS)


def _csv_time(path: str, number: int, text: str) -> datetime:
    for fmt in _CSV_TIME_FORMATS:
        moment = _parse(text, fmt)
        if moment is not None:
            return moment
    raise InputError(path, number, f"timestamp {text!r} is not like 2024/01/02 19:12:31.123")


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
    timeline saw: the report then draws the utilization curve too.
    """

    HEADER = "timestamp, index, utilization.gpu [%]\n"

    def __init__(self, path: str):
        try:
            self._file = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise ConfigError("gpu_log_file", path, f"a writable file ({exc.strerror or exc})") from None
        self._file.write(self.HEADER)

    def write(self, samples) -> None:
        lines = []
        for sample in samples:
            moment = datetime.fromtimestamp(sample.timestamp_ns / 1e9)
            stamp = moment.strftime("%Y/%m/%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
            lines.append(f"{stamp}, {sample.gpu}, {round(sample.utilization * 100)} %\n")
        self._file.writelines(lines)

    def close(self) -> None:
        self._file.close()
