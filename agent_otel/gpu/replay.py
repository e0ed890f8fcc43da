"""A recorded GPU log played back as a live source.

Usage::

    from agent_otel.gpu.replay import ReplaySource
    source = ReplaySource("gpu.log")                    # as wall time passes, from now
    source = ReplaySource("gpu.log", realtime=False)    # everything on the first poll

The log is any format ``agent_otel.gpu.logs.read_gpu_log`` reads
(``nvidia-smi dmon -o DT`` or ``--query-gpu`` csv). In real time the log is
shifted so its first sample lands at the moment the source opens, and each
poll returns the samples whose (shifted) time has come; with
``realtime=False`` the first poll returns the whole log at its recorded
times, which is what tests want. ``shift_to_now`` overrides either default.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Callable, Optional

from agent_otel.gpu.logs import read_gpu_log
from agent_otel.records import GpuSample
from agent_otel.semconv import GPU_SOURCE_REPLAY

from agent_otel.gpu.device import GpuDevice


class ReplaySource:
    """Plays back a GPU log; see the module docstring.

    ``devices`` selects GPUs by index or by the UUID the log records.
    Reading the log happens here, so a missing or malformed file raises
    ``InputError`` when the source is opened, never during polling.
    """

    kind = GPU_SOURCE_REPLAY

    def __init__(
        self,
        path: str,
        *,
        devices: Optional[list[str]] = None,
        realtime: bool = True,
        shift_to_now: Optional[bool] = None,
        tz: Optional[str] = None,
        clock: Callable[[], int] = time.time_ns,
    ):
        self.errors: collections.Counter = collections.Counter()  # never counts: the log was read up front
        self._clock = clock
        self._realtime = realtime
        recorded = read_gpu_log(path, tz=tz)
        wanted = None if devices is None else {str(d).strip() for d in devices}
        indexes = sorted({s.gpu for s in recorded}, key=lambda gpu: (len(gpu), gpu))
        name = f"replay of {os.path.basename(path)}"
        self._devices = [
            GpuDevice(index=gpu, uuid=recorded.uuids.get(gpu), name=name)
            for gpu in indexes
            if wanted is None or gpu in wanted or recorded.uuids.get(gpu) in wanted
        ]
        selected = {device.index for device in self._devices}
        if shift_to_now is None:
            shift_to_now = realtime
        offset = clock() - recorded[0].timestamp_ns if shift_to_now and recorded else 0
        self._samples = [
            GpuSample(s.gpu, s.timestamp_ns + offset, s.utilization) for s in recorded if s.gpu in selected
        ]
        self._cursor = 0

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def poll(self) -> list[GpuSample]:
        start = self._cursor
        if self._realtime:
            now = self._clock()
            end = start
            while end < len(self._samples) and self._samples[end].timestamp_ns <= now:
                end += 1
        else:
            end = len(self._samples)
        self._cursor = end
        return self._samples[start:end]

    @property
    def finished(self) -> bool:
        """True once every sample of the log has been returned."""
        return self._cursor >= len(self._samples)

    def close(self) -> None:
        """Nothing to release; present for the GpuSource shape."""
