"""The wrapper ``@tool`` builds when a remedy option is given: pool, timeout,
retries, fallback, cache.

Usage::

    @agent_otel.tool(pool="io", timeout=3.0, retries=1, retry_interval=0.1, fallback=cached_quote)
    def finance_quote(symbol: str) -> float: ...

    finance_quote("NVDA")              # sync code: runs on pool "io", waits
    await finance_quote.aio("NVDA")    # async code: the same, without blocking the loop

One call: look in the cache; otherwise up to ``1 + retries`` attempts, each
bounded by ``timeout`` and ``retry_interval`` apart (fixed: a back-off would
stretch the very stall the GPU is waiting out); after the last failure, the
fallback's answer, or the last error. A sync tool with a timeout runs in a
pool (``"default"`` unless named), so the caller can stop waiting: the
abandoned attempt keeps its worker until it returns, which the pool's
metrics show. A coroutine tool is cancelled at its timeout instead.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from typing import Any, Callable, Mapping, Optional

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from agent_otel.errors import ConfigError
from agent_otel.capture.meta import ToolMeta, is_async_gen, is_coroutine, is_gen
from agent_otel.capture.wrappers import finish_wrapper
from agent_otel.remedies import pools
from agent_otel.remedies.cache import MISS, ResultCache
from agent_otel.remedies.options import OPTIONS, check
from agent_otel.remedies.telemetry import open_call
from agent_otel.semconv import (
    AGENT_EXECUTOR_MAX_WORKERS,
    AGENT_POOL_REJECTION,
    AGENT_TOOL_CACHE_HIT,
    AGENT_TOOL_EXECUTOR,
    AGENT_TOOL_RETRIES,
    AGENT_TOOL_TIMEOUT,
    EVENT_POOL_REJECTED,
    EXECUTOR_DIRECT,
    OUTCOME_FALLBACK,
    POOL_REJECTION_CALLER_RUNS,
)


class Remedies:
    """One tool's remedy options (``agent_otel.remedies.options``), checked
    once when the tool is decorated."""

    __slots__ = ("fn", "meta", "wrapper", *OPTIONS)

    def __init__(self, fn: Callable, meta: ToolMeta, values: Mapping[str, Any]):
        check(values, f"@tool {meta.name!r}")
        cache = values["cache"]
        self.fn = fn
        self.meta = meta
        self.pool: Optional[str] = values["pool"]
        self.timeout = None if values["timeout"] is None else float(values["timeout"])
        self.retries: int = values["retries"]
        self.retry_interval = float(values["retry_interval"])
        self.fallback: Optional[Callable] = values["fallback"]
        self.cache: Optional[ResultCache] = ResultCache() if cache is True else None if cache is False else cache
        self.wrapper: Optional[Callable] = None

    def pool_for_call(self) -> Optional[pools.ToolPool]:
        """Where an attempt runs: its pool; ``"default"`` when it needs a thread
        (a timeout); else None (the caller's thread)."""
        if self.pool is None and self.timeout is None:
            return None
        return self.pool_off_loop()

    def pool_off_loop(self) -> pools.ToolPool:
        """Where an attempt called from the event loop runs: its pool, else ``"default"``."""
        return pools.use(self.pool if self.pool is not None else pools.DEFAULT_POOL)

    def target(self, pool: Optional[pools.ToolPool]) -> Callable:
        """The callable an attempt runs; in a process pool, one that pickles by reference."""
        if pool is None or not pool.processes:
            return self.fn
        if self.wrapper is None:
            raise RuntimeError(f"tool {self.meta.name!r} is not decorated yet")
        return functools.partial(pool.in_process, functools.partial(_call_original, self.wrapper))


def _call_original(wrapper: Callable, *args, **kwargs):
    """In a worker process: the undecorated function behind a module-level tool."""
    return wrapper.__wrapped__(*args, **kwargs)  # type: ignore[attr-defined]  # set by functools.update_wrapper


def wrap(fn: Callable, meta: ToolMeta, values: Mapping[str, Any]) -> Callable:
    """Build the remedy wrapper of ``fn``, with ``fn``'s metadata and the tool
    mark; ``values``: every remedy option's (``options.DEFAULTS`` for those not given)."""
    if is_gen(fn) or is_async_gen(fn):
        raise ConfigError(
            f"@tool {meta.name!r}",
            "a generator function",
            "a function or coroutine function: remedies need one result per call",
        )
    remedies = Remedies(fn, meta, values)
    pool = remedies.pool
    if is_coroutine(fn):
        if pool is not None:
            raise ConfigError(
                f"@tool {meta.name!r} pool",
                pool,
                "None for a coroutine function (it runs on the event loop, not in a pool)",
            )

        async def coroutine_wrapper(*args, **kwargs):
            return await _call_coroutine(remedies, args, kwargs)

        wrapper: Callable = coroutine_wrapper
    else:

        def sync_wrapper(*args, **kwargs):
            return _call_sync(remedies, args, kwargs)

        async def aio(*args, **kwargs):
            """Call from async code: runs on the tool's pool and awaits it without blocking the loop."""
            return await _call_from_loop(remedies, args, kwargs)

        sync_wrapper.aio = aio  # type: ignore[attr-defined]
        wrapper = sync_wrapper
    remedies.wrapper = wrapper
    return finish_wrapper(wrapper, fn, meta)


# ---------------------------------------------------------------- the cache


def _cached(remedies: Remedies, args: tuple, kwargs: dict):
    """(key, value): value is MISS when the call must run; key is None when it cannot be cached."""
    cache = remedies.cache
    if cache is None:
        return None, MISS
    key = cache.key_for(remedies.meta.name, args, kwargs)
    if key is None:
        return None, MISS
    try:
        return key, cache.store.get(key)
    except Exception as exc:  # a failing store is a miss, never a failed call
        cache.store_failed("get", remedies.meta.name, exc)
        return key, MISS


def _answer_from_cache(remedies: Remedies, value, args: tuple, kwargs: dict):
    telemetry = open_call(remedies.meta, EXECUTOR_DIRECT)
    telemetry.arguments(args, kwargs)
    telemetry.result(value)
    telemetry.started()
    telemetry.attributes[AGENT_TOOL_CACHE_HIT] = True
    if telemetry.metrics is not None:
        telemetry.metrics.cache_hit(remedies.meta.name)
    telemetry.finish()
    return value


def _keep(remedies: Remedies, telemetry, key, result) -> None:
    cache = remedies.cache
    if key is None or cache is None:  # a key only comes from a cache
        return
    try:
        evicted = cache.store.put(key, result, cache.ttl)
    except Exception as exc:
        cache.store_failed("put", remedies.meta.name, exc)
        return
    if evicted and telemetry.metrics is not None:
        telemetry.metrics.cache_evictions(remedies.meta.name, evicted)


def _open(remedies: Remedies, pool: Optional[pools.ToolPool], args: tuple, kwargs: dict):
    telemetry = open_call(remedies.meta, pool.name if pool is not None else EXECUTOR_DIRECT)
    telemetry.arguments(args, kwargs)
    attributes = telemetry.attributes
    if pool is not None:
        attributes[AGENT_EXECUTOR_MAX_WORKERS] = pool.workers
    if remedies.timeout is not None:
        attributes[AGENT_TOOL_TIMEOUT] = remedies.timeout
    if remedies.cache is not None:
        attributes[AGENT_TOOL_CACHE_HIT] = False
        if telemetry.metrics is not None:
            telemetry.metrics.cache_miss(remedies.meta.name)
    return telemetry


# ---------------------------------------------------------------- one attempt on a pool


class _Attempt:
    """One submission of a call to a pool, which its caller may stop waiting for."""

    __slots__ = ("telemetry", "pool", "lock", "started", "finished", "abandoned", "counted_in")

    def __init__(self, telemetry, pool: str):
        self.telemetry = telemetry
        self.pool = pool
        self.lock = threading.Lock()
        self.started = self.finished = self.abandoned = False
        self.counted_in = None  # the metrics that count it as an abandoned worker

    def begin(self) -> bool:
        """On the worker: False if the caller already gave up (then it does not run)."""
        with self.lock:
            self.started = not self.abandoned
            return self.started

    def end(self) -> None:
        with self.lock:
            self.finished = True
            if self.counted_in is not None:
                self.counted_in.abandoned(self.pool, -1)

    def abandon(self) -> None:
        """The caller stops waiting; a call already running holds its worker until it returns."""
        with self.lock:
            self.abandoned = True
            metrics = self.telemetry.metrics
            if self.started and not self.finished and metrics is not None:
                self.counted_in = metrics
                metrics.abandoned(self.pool, 1)


def _run_attempt(attempt: _Attempt, fn: Callable, args: tuple, kwargs: dict):
    if not attempt.begin():
        return None
    try:
        return _run(attempt.telemetry, fn, args, kwargs)
    finally:
        attempt.end()


def _run(telemetry, fn: Callable, args: tuple, kwargs: dict):
    """Run ``fn`` with the call's span current, so the spans it makes are its children."""
    token = _make_current(telemetry)
    try:
        return fn(*args, **kwargs)
    finally:
        _restore(token)


def _dispatch(remedies: Remedies, pool: pools.ToolPool, telemetry, args: tuple, kwargs: dict):
    """Submit one attempt to ``pool`` (which may reject it); returns (attempt, future)."""
    attempt = _Attempt(telemetry, pool.name)
    future, ran_here = pool.dispatch(
        remedies.meta.name, _run_attempt, (attempt, remedies.target(pool), args, kwargs), {}
    )
    if ran_here:
        telemetry.event(
            EVENT_POOL_REJECTED, {AGENT_TOOL_EXECUTOR: pool.name, AGENT_POOL_REJECTION: POOL_REJECTION_CALLER_RUNS}
        )
    return attempt, future


def _make_current(telemetry):
    """Make the call's span current in this thread (its attempt or its fallback runs here)."""
    span = telemetry.started()
    return context_api.attach(trace_api.set_span_in_context(span)) if span is not None else None


def _restore(token) -> None:
    if token is not None:
        context_api.detach(token)


def _timed_out(remedies: Remedies) -> TimeoutError:
    return TimeoutError(f"tool {remedies.meta.name!r} did not answer within its timeout of {remedies.timeout:g} s")


def _consume(future) -> None:
    # An abandoned attempt's error has no reader; retrieve it so asyncio does not log it.
    if not future.cancelled():
        future.exception()


# ---------------------------------------------------------------- the three call paths


def _call_sync(remedies: Remedies, args: tuple, kwargs: dict):
    key, value = _cached(remedies, args, kwargs)
    if value is not MISS:
        return _answer_from_cache(remedies, value, args, kwargs)
    pool = remedies.pool_for_call()
    telemetry = _open(remedies, pool, args, kwargs)
    failure: Optional[Exception] = None
    for number in range(1, remedies.retries + 2):
        if number > 1:
            _before_retry(remedies, telemetry)
            time.sleep(remedies.retry_interval)
        try:
            result = _attempt_sync(remedies, pool, telemetry, args, kwargs)
        except Exception as exc:
            _after_attempt(remedies, telemetry, number, exc)
            failure = exc
            continue
        except BaseException as exc:
            telemetry.finish(exc)
            raise
        _after_attempt(remedies, telemetry, number, None)
        _keep(remedies, telemetry, key, result)
        telemetry.result(result)
        telemetry.finish()
        return result
    assert failure is not None  # every attempt failed, and there was one at least (retries >= 0)
    if remedies.fallback is None:
        telemetry.finish(failure)
        raise failure
    token = _make_current(telemetry)
    try:
        result = remedies.fallback(*args, **kwargs)
    except BaseException as exc:
        telemetry.finish(exc)
        raise
    finally:
        _restore(token)
    return _fell_back(remedies, telemetry, result)


def _attempt_sync(remedies: Remedies, pool, telemetry, args: tuple, kwargs: dict):
    if pool is None:
        return _run(telemetry, remedies.fn, args, kwargs)
    attempt, future = _dispatch(remedies, pool, telemetry, args, kwargs)
    try:
        return future.result(remedies.timeout)
    except TimeoutError:
        if future.done():  # the tool's own TimeoutError, or it finished just now
            return future.result()
        attempt.abandon()
        raise _timed_out(remedies) from None
    except BaseException:
        if not future.done():  # interrupted while waiting
            attempt.abandon()
        raise


async def _call_from_loop(remedies: Remedies, args: tuple, kwargs: dict):
    key, value = _cached(remedies, args, kwargs)
    if value is not MISS:
        return _answer_from_cache(remedies, value, args, kwargs)
    pool = remedies.pool_off_loop()
    telemetry = _open(remedies, pool, args, kwargs)

    async def attempt_on_pool():
        attempt, future = _dispatch(remedies, pool, telemetry, args, kwargs)
        waiting = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait((waiting,), timeout=remedies.timeout)
        except BaseException:
            attempt.abandon()
            waiting.add_done_callback(_consume)
            raise
        if not done:
            attempt.abandon()
            waiting.add_done_callback(_consume)
            raise _timed_out(remedies)
        return waiting.result()

    return await _policy_async(remedies, telemetry, key, attempt_on_pool, args, kwargs)


async def _call_coroutine(remedies: Remedies, args: tuple, kwargs: dict):
    key, value = _cached(remedies, args, kwargs)
    if value is not MISS:
        return _answer_from_cache(remedies, value, args, kwargs)
    telemetry = _open(remedies, None, args, kwargs)

    async def attempt_on_loop():
        token = _make_current(telemetry)
        try:
            if remedies.timeout is None:
                return await remedies.fn(*args, **kwargs)
            task = asyncio.ensure_future(remedies.fn(*args, **kwargs))  # copies the context: span current
        finally:
            _restore(token)
        try:
            done, _ = await asyncio.wait((task,), timeout=remedies.timeout)
        except BaseException:
            task.cancel()
            raise
        if not done:
            # Cancelled, not awaited: a tool that ignores cancellation must not hold up its caller.
            task.cancel()
            task.add_done_callback(_consume)
            raise _timed_out(remedies)
        return task.result()

    return await _policy_async(remedies, telemetry, key, attempt_on_loop, args, kwargs)


async def _policy_async(remedies: Remedies, telemetry, key, attempt_once, args: tuple, kwargs: dict):
    """The retry and fallback loop of ``_call_sync``, awaiting instead of blocking."""
    failure: Optional[Exception] = None
    for number in range(1, remedies.retries + 2):
        if number > 1:
            _before_retry(remedies, telemetry)
            await asyncio.sleep(remedies.retry_interval)
        try:
            result = await attempt_once()
        except Exception as exc:
            _after_attempt(remedies, telemetry, number, exc)
            failure = exc
            continue
        except BaseException as exc:
            telemetry.finish(exc)
            raise
        _after_attempt(remedies, telemetry, number, None)
        _keep(remedies, telemetry, key, result)
        telemetry.result(result)
        telemetry.finish()
        return result
    assert failure is not None  # every attempt failed, and there was one at least (retries >= 0)
    if remedies.fallback is None:
        telemetry.finish(failure)
        raise failure
    token = _make_current(telemetry)
    try:
        result = remedies.fallback(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
    except BaseException as exc:
        telemetry.finish(exc)
        raise
    finally:
        _restore(token)
    return _fell_back(remedies, telemetry, result)


# ---------------------------------------------------------------- bookkeeping shared by the paths


def _before_retry(remedies: Remedies, telemetry) -> None:
    if telemetry.metrics is not None:
        telemetry.metrics.retry(remedies.meta.name)


def _after_attempt(remedies: Remedies, telemetry, number: int, exc: Optional[Exception]) -> None:
    if remedies.retries:
        telemetry.attempt(number, exc)
        telemetry.attributes[AGENT_TOOL_RETRIES] = number - 1


def _fell_back(remedies: Remedies, telemetry, result):
    if telemetry.metrics is not None:
        telemetry.metrics.fallback(remedies.meta.name)
    telemetry.result(result)
    telemetry.finish(outcome=OUTCOME_FALLBACK)
    return result
