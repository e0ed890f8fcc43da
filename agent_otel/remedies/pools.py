"""Named tool pools: bounded executors that keep one group of tools from
starving another (bulkheads).

Usage::

    agent_otel.pool("search", workers=8, queue_limit=32)

    @agent_otel.tool(pool="search")
    def web_search(query: str) -> list[str]: ...

Each pool is a ``ThreadPoolExecutor`` whose ``thread_name_prefix`` is the
pool's name, so the executor hook of ``instrument()`` reports it under that
name (``agent_executor_*{executor="search"}``) with nothing else to set up.
In front of it sits a count of outstanding calls (running, queued, and
abandoned by a caller that timed out but still running): when it reaches
``workers + queue_limit`` a new call is rejected, either with
``PoolFullError`` or by running it in the caller's thread. A pool with
``processes=True`` runs its calls in worker processes, one thread of the pool
waiting on each, so the same metrics describe it.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Callable, Optional

from agent_otel.support import forks
from agent_otel.errors import AgentOtelError, ConfigError
from agent_otel.support.host import cores
from agent_otel.capture.executors import submitted_tool
from agent_otel.remedies import telemetry

KINDS = ("io", "cpu")
REJECTIONS = ("raise", "caller_runs")
QUEUE_PER_WORKER = 4
DEFAULT_POOL = "default"  # where a sync tool with a timeout but no pool runs


def default_workers(kind: str) -> int:
    """I/O pools mostly wait, so they get more threads than cores (the
    ``ThreadPoolExecutor`` rule); CPU pools get one worker per core."""
    return min(32, cores() + 4) if kind == "io" else cores()


class PoolFullError(AgentOtelError, RuntimeError):
    """A pool with ``rejection="raise"`` had every worker busy and a full queue."""

    def __init__(self, pool: "ToolPool", tool: str):
        self.pool = pool.name
        self.tool = tool
        what = f"tool {tool!r}" if tool else "a submission"
        super().__init__(
            f"pool {pool.name!r} is full: {what} was rejected with all {pool.workers} workers busy and "
            f"{pool.queue_limit} calls queued (workers={pool.workers}, queue_limit={pool.queue_limit}); "
            f"raise workers or queue_limit, or declare it with rejection='caller_runs'"
        )


class ToolPool(Executor):
    """A bounded executor with a name, a worker count, a queue limit and a rejection policy."""

    def __init__(self, name: str, workers: int, queue_limit: int, kind: str, rejection: str, processes: bool):
        self.name = name
        self.workers = workers
        self.queue_limit = queue_limit
        self.kind = kind
        self.rejection = rejection
        self.processes = processes
        self._start()
        forks.after_fork_in_child(self.reinit_after_fork)

    def _start(self) -> None:
        self._threads = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name)
        self._process_pool = ProcessPoolExecutor(max_workers=self.workers) if self.processes else None
        self._slots = threading.Semaphore(self.workers + self.queue_limit)

    def reinit_after_fork(self) -> None:
        """In a forked child: the parent's workers are not here; a pool that waited
        for them would hang every call. The child gets workers of its own (the
        calls queued at fork are the parent's)."""
        self._start()

    def settings(self) -> dict:
        return {
            "workers": self.workers,
            "queue_limit": self.queue_limit,
            "kind": self.kind,
            "rejection": self.rejection,
            "processes": self.processes,
        }

    def submit(self, fn, /, *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` on the pool, or reject it as configured."""
        target = fn if self._process_pool is None else functools.partial(self.in_process, fn)
        return self.dispatch(submitted_tool(fn) or "", target, args, kwargs)[0]

    def dispatch(self, tool: str, fn: Callable, args: tuple, kwargs: dict) -> tuple[Future, bool]:
        """Run ``fn(*args, **kwargs)`` on a pool thread; also say whether it ran in the caller instead."""
        if not self._slots.acquire(blocking=False):
            telemetry.count_rejection(tool, self.name)
            if self.rejection == "raise":
                raise PoolFullError(self, tool)
            return _ran_here(fn, args, kwargs), True
        try:
            future = self._threads.submit(fn, *args, **kwargs)
        except BaseException:
            self._slots.release()
            raise
        # The slot is free only when the call returns, even if its caller
        # stopped waiting: an abandoned call still holds its worker.
        future.add_done_callback(self._release)
        return future, False

    def in_process(self, fn: Callable, /, *args, **kwargs):
        """On a pool thread of a ``processes=True`` pool: run ``fn`` in a worker process and wait."""
        if self._process_pool is None:
            raise RuntimeError(f"pool {self.name!r} has no worker processes (declared without processes=True)")
        return self._process_pool.submit(fn, *args, **kwargs).result()

    def _release(self, _future: Future) -> None:
        self._slots.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._threads.shutdown(wait=wait, cancel_futures=cancel_futures)
        if self._process_pool is not None:
            self._process_pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.settings().items())
        return f"ToolPool({self.name!r}, {options})"


def _ran_here(fn: Callable, args: tuple, kwargs: dict) -> Future:
    """``caller_runs``: run in this thread and hand back a finished future."""
    future: Future = Future()
    future.set_running_or_notify_cancel()
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:
        future.set_exception(exc)
    return future


_pools: dict[str, ToolPool] = {}
_lock = threading.Lock()


def _reinit_after_fork() -> None:
    global _lock
    _lock = threading.Lock()


forks.after_fork_in_child(_reinit_after_fork)


def _validated(name: object, workers, queue_limit, kind, rejection, processes) -> dict:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("pool name", name, "a non-empty string")
    if kind not in KINDS:
        raise ConfigError(f"pool {name!r} kind", kind, " or ".join(repr(k) for k in KINDS))
    if rejection not in REJECTIONS:
        raise ConfigError(f"pool {name!r} rejection", rejection, " or ".join(repr(r) for r in REJECTIONS))
    if workers is None:
        workers = default_workers(kind)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"pool {name!r} workers", workers, "a whole number >= 1")
    if queue_limit is None:
        queue_limit = QUEUE_PER_WORKER * workers
    if isinstance(queue_limit, bool) or not isinstance(queue_limit, int) or queue_limit < 0:
        raise ConfigError(f"pool {name!r} queue_limit", queue_limit, "a whole number >= 0")
    return {
        "workers": workers,
        "queue_limit": queue_limit,
        "kind": kind,
        "rejection": rejection,
        "processes": bool(processes),
    }


def pool(
    name: str,
    workers: Optional[int] = None,
    queue_limit: Optional[int] = None,
    kind: str = "io",
    rejection: str = "raise",
    processes: bool = False,
) -> ToolPool:
    """Declare the pool ``name`` (or return it if already declared the same way).

    ``workers`` defaults to min(32, cores + 4) for ``kind="io"`` and to the
    number of cores for ``kind="cpu"``; ``queue_limit`` (calls waiting beyond
    the busy workers) to 4 per worker. ``rejection`` is what a call meets
    when the queue is full: ``"raise"`` (``PoolFullError``) or
    ``"caller_runs"`` (it runs in the caller's thread). ``processes=True``
    runs calls in worker processes (CPU-bound pure-Python tools; the tool
    function must be importable at module level). Declaring a name again
    with other settings raises ``ConfigError``.
    """
    settings = _validated(name, workers, queue_limit, kind, rejection, processes)
    with _lock:
        existing = _pools.get(name)
        if existing is not None:
            if existing.settings() != settings:
                raise ConfigError(
                    f"pool {name!r}",
                    settings,
                    f"the settings it already has, {existing.settings()} "
                    "(a pool is declared once, before its first use)",
                )
            return existing
        created = _pools[name] = ToolPool(name, **settings)
    return created


def get(name: str) -> ToolPool:
    """The pool declared (or first used) under ``name``."""
    found = _pools.get(name)
    if found is None:
        raise ConfigError("pool", name, "a declared pool: " + (", ".join(sorted(_pools)) or "none declared yet"))
    return found


def use(name: str) -> ToolPool:
    """The pool ``name``, declared with defaults if nobody declared it: what ``@tool(pool=...)`` calls."""
    return _pools.get(name) or pool(name)


def shutdown(wait: bool = True) -> None:
    """Shut every pool down and forget it (at exit, or between tests)."""
    with _lock:
        closing = list(_pools.values())
        _pools.clear()
    for each in closing:
        each.shutdown(wait=wait)
