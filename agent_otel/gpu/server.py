"""A model server's own metrics as a GPU source: vLLM, SGLang and TGI.

Usage::

    from agent_otel.gpu.server import ModelServerSource, ServerTimeline
    source = ModelServerSource("http://vllm-a.internal:8000/metrics")   # alone: the GPU signal
    samples = source.poll()            # GpuSamples: busy while requests run
    readings = source.server_samples() # ServerSamples: running, waiting, KV cache

Agents rarely own their GPU: they call a serving engine, which publishes
its state on its Prometheus endpoint. Each ``poll`` scrapes it once and
reads the families its engine documents (``ENGINES``; the names are in
``agent_otel.semconv``): requests running, requests queued (waiting to be
scheduled) and, where the engine has one, the share of its KV cache in use.
The engine is recognised by the families it exposes; an endpoint that has
none of them, or lacks one family the source reads, is named once in a log
line (and counted in ``errors``), never guessed.

What a sample means
-------------------
A scrape shows the gauges at one instant. A ``GpuSample`` covers the
period since the previous scrape (as NVML's do), so it says *busy* (1.0)
when requests were running at the scrape, or when the engine's work
counters (tokens processed, forward passes) moved since the previous one:
the engine computed during the period even if nothing runs now. Otherwise
it says idle (0.0). So with scrapes every ``p`` seconds an idle window's
edges are each within ``p`` of the truth, a period that was only partly
busy counts as busy (the error falls on the side of blaming less), and a
stall shorter than ``p`` between two busy periods is not seen.

A server that does not answer (refused, timed out, an HTTP error, a body
that is not the text format) gives no sample, the reason is counted and
logged once, and the first scrape that works again gives a ``MISSING``
marker: the stretch in between is missing data, neither idle nor busy. A
server that restarted (a work counter went down) is counted too; its
counters are read afresh, as Prometheus's ``rate`` reads a reset. Nothing
here raises into the sampler or the agent.

Beside NVML (``WithModelServer``) the GPU's own samples are the signal and
the server adds its readings; alone, the server stands for one GPU named
``server``. The readings are kept on the timeline (``ServerTimeline``,
bounded) for the rules and outputs that ask what the server was doing
during a stretch of time.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable, Iterable, NamedTuple, Optional
from urllib.parse import urlsplit

from agent_otel.support import forks
from agent_otel.support.clock import now_ns
from agent_otel.support.problems import Problems
from agent_otel.records import MISSING, GpuSample, ServerSample
from agent_otel import semconv
from agent_otel.semconv import GPU_SOURCE_SERVER, SERVER_GPU_INDEX

from agent_otel.gpu.device import GpuDevice, GpuSource

log = logging.getLogger("agent_otel.gpu")

# Seconds a scrape may take: the sampler's thread waits this long at most.
DEFAULT_TIMEOUT_S = 1.0
# The largest exposition read (a vLLM endpoint with many models' histograms
# is a few hundred kB).
MAX_BODY_BYTES = 16 << 20
# Readings kept on the timeline: at the default 0.5 s that is 2.8 hours;
# each is one ServerSample (about 200 bytes).
MAX_SERVER_SAMPLES = 20_000


class EngineFamilies(NamedTuple):
    """The metric families one serving engine documents, that the source reads."""

    engine: str
    running: str  # gauge: requests being computed
    waiting: str  # gauge: requests queued, not scheduled yet
    kv_cache: tuple[str, ...]  # gauges, 0..1; the first one present is read
    work: tuple[str, ...]  # counters that move while the engine computes


# In the order they are recognised. vLLM's running and waiting gauges are
# the same before and since its V1 engine; its KV-cache gauge was renamed.
ENGINES: tuple[EngineFamilies, ...] = (
    EngineFamilies(
        "vllm",
        semconv.VLLM_RUNNING,
        semconv.VLLM_WAITING,
        (semconv.VLLM_KV_CACHE_USAGE, semconv.VLLM_KV_CACHE_USAGE_V0),
        (semconv.VLLM_PROMPT_TOKENS, semconv.VLLM_GENERATION_TOKENS),
    ),
    EngineFamilies(
        "sglang",
        semconv.SGLANG_RUNNING,
        semconv.SGLANG_WAITING,
        (semconv.SGLANG_KV_CACHE_USAGE,),
        (semconv.SGLANG_PROMPT_TOKENS, semconv.SGLANG_GENERATION_TOKENS),
    ),
    EngineFamilies("tgi", semconv.TGI_RUNNING, semconv.TGI_WAITING, (), (semconv.TGI_INFERENCE_COUNT,)),
)


class Exposition(NamedTuple):
    """What one scrape said, summed over label sets (engines, models)."""

    engine: EngineFamilies
    running: float
    waiting: float
    kv_cache_usage: Optional[float]
    work: dict[str, float]  # work counter -> value
    missing: tuple[str, ...]  # the families this engine documents that the scrape lacked


class UnknownEngine(ValueError):
    """An exposition with none of the families of ``ENGINES``."""

    def __init__(self, prefixes: list[str]):
        super().__init__(", ".join(prefixes) or "no metrics")
        self.prefixes = prefixes


def read_exposition(text: str) -> Exposition:
    """Read a Prometheus text exposition with ``prometheus_client``'s parser.

    Raises ``UnknownEngine`` when no engine's running or waiting family is
    there, and ``ValueError`` when the text is not the text format.
    """
    with forks.background_import():  # the sampler's thread: a fork waits (agent_otel.support.forks)
        from prometheus_client.parser import text_string_to_metric_families  # here: the GPU modules load without it

    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(float(sample.value))

    def get(name: str) -> Optional[list[float]]:
        # A counter is scraped as NAME_total, or as NAME where the engine's
        # exporter does not add the suffix (the parser then adds it).
        base = name.removesuffix("_total")
        return values.get(name) or values.get(base) or values.get(base + "_total")

    for engine in ENGINES:
        if get(engine.running) is not None or get(engine.waiting) is not None:
            break
    else:
        prefixes = sorted({name.split(":", 1)[0] if ":" in name else name.split("_", 1)[0] for name in values})
        raise UnknownEngine(prefixes[:8])
    kv_name = next((name for name in engine.kv_cache if get(name) is not None), None)
    missing = [name for name in (engine.running, engine.waiting) if get(name) is None]
    if engine.kv_cache and kv_name is None:
        missing.append(" or ".join(engine.kv_cache))
    missing += [name for name in engine.work if get(name) is None]
    kv = (get(kv_name) or []) if kv_name else []
    return Exposition(
        engine,
        running=sum(get(engine.running) or ()),
        waiting=sum(get(engine.waiting) or ()),
        kv_cache_usage=sum(kv) / len(kv) if kv else None,  # the mean over engines (data parallel)
        work={name: sum(found) for name in engine.work if (found := get(name)) is not None},
        missing=tuple(missing),
    )


def server_label(url: str) -> str:
    """``host:port`` of a metrics URL (no credentials, path or query): the ``server`` label."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{host}:{parts.port}" if parts.port else host


class ModelServerSource:
    """Scrapes a serving engine's /metrics on each ``poll``; see the module docstring.

    ``as_gpu``: the busy samples are the GPU signal (a device named
    ``server``); False beside another source, which gives them. Raises
    ``ValueError`` for a URL that is not http(s) (a configuration mistake,
    reported when the source is opened).
    """

    kind = GPU_SOURCE_SERVER

    def __init__(
        self,
        url: str,
        *,
        as_gpu: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], int] = now_ns,
        max_samples: int = MAX_SERVER_SAMPLES,
    ):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a model server's metrics URL is http(s)://host:port/metrics, got {url!r}")
        self.url = url.strip()
        self.server = server_label(self.url)
        self.as_gpu = as_gpu
        self.timeout_s = timeout_s
        self.errors: collections.Counter = collections.Counter()
        self.engine: Optional[str] = None  # the engine recognised at the latest scrape
        self._clock = clock
        self._problems = Problems(log)
        self._named: set[tuple[str, str]] = set()  # (engine, family) named once as missing
        self._work: Optional[dict[str, float]] = None  # the work counters at the previous scrape
        self._last_ns: Optional[int] = None
        self._lost = False  # scrapes failed since the last one that worked
        self._readings: collections.deque[ServerSample] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()

    def devices(self) -> list[GpuDevice]:
        if not self.as_gpu:
            return []
        return [GpuDevice(index=SERVER_GPU_INDEX, uuid=None, name=f"model server at {self.server}")]

    def poll(self) -> list[GpuSample]:
        """Scrape once; the busy sample for the period since the previous scrape (none if it failed)."""
        started = self._clock()
        try:
            text = self._fetch()
            exposition = read_exposition(text)
        except UnknownEngine as exc:
            self._fail(
                "model_server_unknown_metrics",
                "agent-otel: the model server at %s exposes none of the metric families agent-otel reads "
                "(vLLM, SGLang, TGI: docs/model-servers.md); its metrics begin with: %s",
                self.url,
                exc,
            )
            return []
        except Exception as exc:  # refused, timed out, HTTP error, not the text format: never into the sampler
            self._fail(_reason(exc), "agent-otel: could not read the model server's metrics at %s: %s", self.url, exc)
            return []
        t = (started + self._clock()) // 2  # the gauges were read during the request
        if self._last_ns is not None and t <= self._last_ns:
            return []
        self._name_missing(exposition)
        self.engine = exposition.engine.engine
        reading = ServerSample(
            self.server, t, exposition.running, exposition.waiting, exposition.kv_cache_usage, exposition.engine.engine
        )
        with self._lock:
            self._readings.append(reading)
        moved = self._work_moved(exposition.work)
        first, lost = self._last_ns is None, self._lost
        self._last_ns, self._lost = t, False
        if not self.as_gpu:
            return []
        if lost and not first:
            return [GpuSample(SERVER_GPU_INDEX, t, MISSING)]  # what happened while it did not answer is unknown
        return [GpuSample(SERVER_GPU_INDEX, t, 1.0 if exposition.running > 0 or moved else 0.0)]

    def server_samples(self) -> list[ServerSample]:
        """The readings since the previous call (oldest first)."""
        with self._lock:
            readings = list(self._readings)
            self._readings.clear()
        return readings

    def close(self) -> None:
        """Nothing held between scrapes; present for the GpuSource shape."""

    def _fetch(self) -> str:
        with forks.background_import():  # the sampler's thread: a fork waits (agent_otel.support.forks)
            import urllib.request  # here: only a process that reads a model server loads the HTTP client

        request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 (http(s) checked)
            body = response.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            raise ValueError(f"the exposition is over {MAX_BODY_BYTES} bytes")
        return body.decode("utf-8", errors="replace")

    def _work_moved(self, work: dict[str, float]) -> bool:
        """Whether the work counters moved since the previous scrape; a counter
        that went down says the server restarted (counted, read from zero)."""
        previous, self._work = self._work, dict(work)
        if previous is None:
            return False
        moved = False
        restarted = False
        for name, value in work.items():
            before = previous.get(name)
            if before is None:
                continue
            if value < before:
                restarted = True
                moved = moved or value > 0
            elif value > before:
                moved = True
        if restarted:
            self.errors["model_server_restarted"] += 1
            self._problems.report(
                ("restarted", self.url),
                "agent-otel: the model server at %s restarted (its counters went back); reading them afresh",
                self.url,
            )
        return moved

    def _name_missing(self, exposition: Exposition) -> None:
        for family in exposition.missing:
            key = (exposition.engine.engine, family)
            if key not in self._named:
                self._named.add(key)
                log.warning(
                    "agent-otel: the %s server at %s has no %s; %s",
                    exposition.engine.engine,
                    self.url,
                    family,
                    _WITHOUT.get(_role(exposition.engine, family), "it is read as absent"),
                )

    def _fail(self, reason: str, message: str, *args: object) -> None:
        self.errors[reason] += 1
        self._lost = True
        self._problems.report((reason, self.url), message, *args)


_WITHOUT = {
    "running": "busy time comes from its work counters alone",
    "waiting": "its queue length reads 0",
    "kv_cache": "no KV-cache usage is shown",
    "work": "busy time comes from the running requests at each scrape alone",
}


def _role(engine: EngineFamilies, family: str) -> str:
    if family == engine.running:
        return "running"
    if family == engine.waiting:
        return "waiting"
    if family in engine.work:
        return "work"
    return "kv_cache"


def _reason(exc: Exception) -> str:
    """The ``errors`` key of a failed scrape."""
    import http.client
    import socket
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return f"model_server_http_{exc.code}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "model_server_timeout"
    if isinstance(reason, (OSError, http.client.HTTPException)):
        return "model_server_unreachable"
    return "model_server_unreadable"


class WithModelServer:
    """A GPU source with a model server's metrics read beside it: the GPU's
    samples are the signal, the server's readings come with them."""

    def __init__(self, gpu: GpuSource, server: ModelServerSource):
        server.as_gpu = False
        self.gpu = gpu
        self.server = server
        self.kind = gpu.kind

    @property
    def reports_gaps(self) -> bool:
        return bool(getattr(self.gpu, "reports_gaps", False))

    @property
    def errors(self) -> collections.Counter:
        return collections.Counter(dict(self.gpu.errors)) + collections.Counter(dict(self.server.errors))

    def devices(self) -> list[GpuDevice]:
        return self.gpu.devices()

    def poll(self) -> list[GpuSample]:
        samples = self.gpu.poll()
        self.server.poll()
        return samples

    def server_samples(self) -> list[ServerSample]:
        return self.server.server_samples()

    def close(self) -> None:
        self.server.close()
        self.gpu.close()

    def __getattr__(self, name: str):
        # What else callers use of the GPU source (the simulated GPU's busy()).
        gpu = self.__dict__.get("gpu")
        if gpu is None:
            raise AttributeError(name)
        return getattr(gpu, name)


class ServerLoad(NamedTuple):
    """What a model server reported during a stretch of time."""

    samples: int
    waiting_max: float
    running_max: float
    kv_cache_usage: Optional[float]  # the mean of its readings; None where the engine reports none


class ServerTimeline:
    """The model server's readings on the timeline, bounded; thread-safe.

    ``load(start_ns, end_ns)`` says what the server was doing during a
    stretch: the readings of ``(start_ns, end_ns]`` (a reading stands for
    the period ending at it, as a GPU sample does), or, where none fell
    inside, the last one before it (the state held until the next scrape).
    """

    def __init__(self, max_samples: int = MAX_SERVER_SAMPLES):
        self._samples: collections.deque[ServerSample] = collections.deque(maxlen=max_samples)
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()

    def add(self, samples: Iterable[ServerSample]) -> None:
        with self._lock:
            self._samples.extend(samples)

    def __len__(self) -> int:
        return len(self._samples)

    def latest(self) -> Optional[ServerSample]:
        with self._lock:
            return self._samples[-1] if self._samples else None

    def load(self, start_ns: int, end_ns: int) -> Optional[ServerLoad]:
        """The readings of ``(start_ns, end_ns]``; None when nothing is known of it."""
        with self._lock:
            inside = [s for s in self._samples if start_ns < s.timestamp_ns <= end_ns]
            if not inside:
                before = [s for s in self._samples if s.timestamp_ns <= start_ns]
                inside = before[-1:]
        if not inside:
            return None
        kv = [s.kv_cache_usage for s in inside if s.kv_cache_usage is not None]
        return ServerLoad(
            samples=len(inside),
            waiting_max=max(s.waiting for s in inside),
            running_max=max(s.running for s in inside),
            kv_cache_usage=sum(kv) / len(kv) if kv else None,
        )
