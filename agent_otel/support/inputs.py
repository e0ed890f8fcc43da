"""Input files as bounded lines: a path or ``-`` (standard input), plain,
gzip- or zstd-compressed.

Usage::

    from agent_otel.support.inputs import open_input

    with open_input("traces.jsonl.zst", expected="OTLP/JSON lines") as source:
        for number, line in source:     # line: bytes, newline kept
            ...

Both readers of the report use it (``exporters.otlp_json`` for traces,
``gpu.logs`` for GPU logs), so both take the same inputs and hold the same
limits:

- ``-`` is standard input (read once, never closed).
- Compression is recognised from the first bytes, not the name: gzip,
  zstd (one stream or many frames, as ``zstd`` and the Collector file
  exporter's native compression write it), and the Collector file
  exporter's older framing, where each message is its own zstd frame
  after a 4-byte big-endian length. Each framed message counts as one
  line.
- Memory stays bounded whatever the input: everything is streamed, a line
  (or framed message) longer than ``max_line`` stops the read with an
  ``InputError``, and binary data (a NUL byte in the first block, such as
  ``/dev/zero``, ``/dev/urandom`` or protobuf) is refused at once.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import sys
import zlib
from typing import Any, BinaryIO, Callable, Iterator, Optional

from agent_otel.errors import InputError

MiB = 1024 * 1024
# One OTLP/JSON line is one export request: 512 spans (about 0.4 MB) from
# agent-otel, up to a batch of 8192 (about 6 MB) from a Collector.
DEFAULT_MAX_LINE = 128 * MiB
STDIN = "-"

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOCK = 1 << 20


class Input:
    """An open input: iterate for ``(line number, bytes)``; ``consumed()``
    is how many bytes of the file itself (compressed or not) were read."""

    def __init__(self, path: str, expected: str, max_line: int = DEFAULT_MAX_LINE):
        self.path = str(path)
        self.expected = expected
        self.max_line = max_line
        self.compression: Optional[str] = None  # "gzip", "zstd", "zstd-framed"
        self._raw: BinaryIO = _open(self.path)
        self._counted = _Counting(self._raw)
        # A BufferedReader, then maybe a GzipFile or ZstdFile over it: each has read() and peek().
        self._stream: Any = io.BufferedReader(self._counted, _BLOCK)
        self._frames: Optional[Iterator[bytes]] = None
        # compressed data that stops mid-stream: the number of the line (or
        # framed message) it stopped in; every line before it was whole
        self.cut_off: Optional[int] = None
        try:
            self._recognise()
        except BaseException:
            self.close()
            raise

    @property
    def name(self) -> str:
        return "<stdin>" if self.path == STDIN else self.path

    def consumed(self) -> int:
        return self._counted.count

    def error(self, line: Optional[int], message: str) -> InputError:
        return InputError(self.name, line, message)

    def _recognise(self) -> None:
        try:
            head = self._safely(self._stream.peek, 8)[:8]
        except _EndsEarly:
            head = b""
        if head.startswith(_GZIP_MAGIC):
            self.compression = "gzip"
            # Read directly, not through another buffer: data decompressed
            # before a cut-off end must reach the lines, not be lost with
            # the read that hit the end.
            self._stream = gzip.GzipFile(fileobj=self._stream, mode="rb")
        elif head.startswith(_ZSTD_MAGIC):
            self.compression = "zstd"
            self._stream = _zstd().ZstdFile(self._stream, "rb")
        elif head[4:8] == _ZSTD_MAGIC:
            self.compression = "zstd-framed"
            self._frames = self._framed_messages()
            return
        try:
            block = self._safely(self._stream.peek, _BLOCK)
        except _EndsEarly:
            block = b""
        if b"\x00" in block[:_BLOCK]:
            raise self.error(None, f"binary data, not {self.expected}")

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        if self._frames is not None:
            yield from enumerate(self._frames, start=1)
            return
        readline, limit = self._stream.readline, self.max_line + 1
        number = 0
        while True:
            try:
                line = self._safely(readline, limit)
            except _EndsEarly:
                self.cut_off = number + 1
                return
            if not line:
                return
            number += 1
            if len(line) > self.max_line:
                raise self.error(number, f"line longer than {self.max_line // MiB} MiB: not {self.expected}")
            yield number, line

    def read_rest(self, limit: int) -> bytes:
        """Everything not read yet, at most ``limit`` bytes (more is an error)."""
        try:
            data = self._safely(self._stream.read, limit + 1)
        except _EndsEarly:
            raise self.error(None, f"{self.compression} data ends early") from None
        if len(data) > limit:
            raise self.error(None, f"a single document longer than {limit // MiB} MiB: write it as {self.expected}")
        return data

    def _framed_messages(self) -> Iterator[bytes]:
        zstd = _zstd()
        number = 0
        while True:
            prefix = self._safely(self._stream.read, 4)
            if not prefix:
                return
            number += 1
            if len(prefix) < 4:
                self.cut_off = number
                return
            (size,) = struct.unpack(">I", prefix)
            if size > self.max_line:
                raise self.error(number, f"message of {size} bytes is longer than {self.max_line // MiB} MiB")
            frame = self._safely(self._stream.read, size)
            if len(frame) < size:
                self.cut_off = number
                return
            decompressor = zstd.ZstdDecompressor()
            try:
                message = decompressor.decompress(frame, max_length=self.max_line + 1)
            except zstd.ZstdError as exc:
                raise self.error(number, f"not a zstd frame ({exc})") from None
            if len(message) > self.max_line:
                raise self.error(number, f"message longer than {self.max_line // MiB} MiB once decompressed")
            yield message

    def _safely(self, read: Callable[[int], bytes], size: int) -> bytes:
        """One read; a damaged input becomes an ``InputError``, compressed
        data that stops mid-stream (a writer still running, or killed)
        raises ``_EndsEarly``."""
        try:
            return read(size)
        except EOFError:
            raise _EndsEarly() from None
        except (OSError, zlib.error) as exc:
            if self.compression is None and isinstance(exc, OSError):
                raise self.error(None, f"cannot read: {exc.strerror or exc}") from None
            raise self.error(None, f"{self.compression} data is damaged ({exc})") from None
        except Exception as exc:
            if type(exc).__name__ == "ZstdError":  # compression.zstd's own error type
                raise self.error(None, f"zstd data is damaged ({exc})") from None
            raise

    def close(self) -> None:
        if self.path != STDIN:
            self._raw.close()

    def __enter__(self) -> "Input":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_input(path: str, expected: str, max_line: int = DEFAULT_MAX_LINE) -> Input:
    """Open ``path`` (``-``: standard input) for reading as bounded lines.
    ``expected`` names the format in error messages ("OTLP/JSON lines")."""
    return Input(path, expected, max_line)


def input_size(path: str) -> int:
    """The file's size in bytes (0 for standard input or when unknown)."""
    if path == STDIN:
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _open(path: str) -> BinaryIO:
    if path == STDIN:
        return sys.stdin.buffer
    try:
        handle = open(path, "rb", buffering=0)
    except OSError as exc:
        raise InputError(path, None, f"cannot read: {exc.strerror or exc}") from None
    if os.path.isdir(path):
        handle.close()
        raise InputError(path, None, "cannot read: is a directory")
    return handle


class _EndsEarly(Exception):
    """Compressed data stops before its end marker."""


class _Counting(io.RawIOBase):
    """A raw stream over another that counts the bytes read through it."""

    def __init__(self, stream: Any):  # a file opened unbuffered, or standard input's buffer
        self._stream = stream
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = self._stream.readinto(buffer) or 0
        self.count += size
        return size


def _zstd():
    """The zstd module: the standard library's (Python 3.14+) or its backport."""
    try:
        from compression import zstd
    except ImportError:
        from backports import zstd
    return zstd
