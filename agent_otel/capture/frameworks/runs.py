"""One run of a framework's agent as one ``invoke_agent`` span: a turn with no extra code.

The hooks call these where a run of an agent (or a compiled graph) begins
and ends; ``models.FrameworkRun`` decides whether the run is one of its own
(the application's ``agent_span`` wins, a graph's ``invoke`` running its own
``stream`` is one run) and makes the span. The span is current while the
framework's own code runs, so the tool and model calls it makes, and the
tasks and threads it starts meanwhile, are in the run's trace; between the
chunks of a stream the consumer's code runs in its own context. A failure
of the telemetry never stops the run.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterator, Optional

from agent_otel.capture.models import FrameworkRun


def sync_run(name: Callable[[], Any], owner: Any, original: Callable, args: tuple, kwargs: dict) -> Any:
    """``original(*args, **kwargs)`` as one run of ``owner`` (its name: ``name()``)."""
    run = FrameworkRun.start(_name(name), owner)
    if run is None:
        return original(*args, **kwargs)
    tokens = run.enter()
    try:
        result = original(*args, **kwargs)
    except BaseException as exc:
        run.exit(tokens)
        run.end(exc)
        raise
    run.exit(tokens)
    run.end()
    return result


async def async_run(name: Callable[[], Any], owner: Any, original: Callable, args: tuple, kwargs: dict) -> Any:
    """``await original(*args, **kwargs)`` as one run of ``owner``."""
    run = FrameworkRun.start(_name(name), owner)
    if run is None:
        return await original(*args, **kwargs)
    tokens = run.enter()
    try:
        result = await original(*args, **kwargs)
    except BaseException as exc:
        run.exit(tokens)
        run.end(exc)
        raise
    run.exit(tokens)
    run.end()
    return result


def stream_run(name: Callable[[], Any], owner: Any, start: Callable[[], Iterator]) -> Iterator:
    """The chunks of the stream ``start()`` makes, as one run of ``owner``, from its first step to its last."""
    run = FrameworkRun.start(_name(name), owner)
    if run is None:
        return (yield from start())
    tokens = run.enter()
    try:
        chunks = start()
    except BaseException as exc:
        run.exit(tokens)
        run.end(exc)
        raise
    run.exit(tokens)
    error = None
    try:
        while True:
            tokens = run.enter()
            try:
                chunk = next(chunks)
            except StopIteration as stop:
                return stop.value
            finally:
                run.exit(tokens)
            yield chunk
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        finally:
            run.end(error)


async def astream_run(name: Callable[[], Any], owner: Any, start: Callable[[], AsyncIterator]) -> AsyncGenerator:
    """The chunks of the async stream ``start()`` makes, as one run of ``owner``."""
    run = FrameworkRun.start(_name(name), owner)
    if run is None:
        chunks = start()
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
        return
    tokens = run.enter()
    try:
        chunks = start()
    except BaseException as exc:
        run.exit(tokens)
        run.end(exc)
        raise
    run.exit(tokens)
    error = None
    try:
        while True:
            tokens = run.enter()
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            finally:
                run.exit(tokens)
            yield chunk
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
        finally:
            run.end(error)


def started_run(
    name: Callable[[], Any], owner: Any, original: Callable, args: tuple, kwargs: dict, future_of: Callable[[Any], Any]
) -> Any:
    """``original(*args, **kwargs)``, which starts a run in the background and
    returns a handle, as one run of ``owner`` until ``future_of(handle)`` (an
    ``asyncio`` task or future) is done; a handle without one ends the run at once."""
    run = FrameworkRun.start(_name(name), owner)
    if run is None:
        return original(*args, **kwargs)
    tokens = run.enter()
    try:
        handle = original(*args, **kwargs)
    except BaseException as exc:
        run.exit(tokens)
        run.end(exc)
        raise
    run.exit(tokens)
    try:
        future = future_of(handle)
        future.add_done_callback(lambda done: run.end(_failure(done)))
    except Exception:  # a version that keeps no such future: the run's span covers its start only
        run.end()
    return handle


def _failure(future: Any) -> Optional[BaseException]:
    try:
        return None if future.cancelled() else future.exception()
    except BaseException:
        return None


def _name(name: Callable[[], Any]) -> Any:
    try:
        return name()
    except Exception:
        return None
