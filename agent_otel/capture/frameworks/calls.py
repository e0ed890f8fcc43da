"""One tool call of a framework as one span, with real queue time.

Three shapes cover every hook:

- ``sync_call`` / ``async_call``: the framework runs the tool right here;
  the span is the call (queue time 0, or the queue time the executor hook
  measured when this runs inside a marked submission).
- ``async_call(..., thread_owner=...)``: the framework is about to hand a
  sync tool to a thread pool from async code (``run_in_executor``,
  ``asyncio.to_thread``) inside a closure of its own that the executor hook
  cannot recognize. The span starts now and is current before the framework
  copies the context for the worker; the event-loop hook below notices the
  submission that runs the tool and marks exec start when a worker picks it
  up, so queue time = worker start - submission; the worker's CPU time
  running it is the call's ``agent.tool.exec.cpu_time``.
- ``MarkedWork``: a framework submits tool calls to a thread pool from sync
  code and lets us choose the submitted callable; marking it lets the
  executor hook queue the call, and the first tool span begun in the worker
  claims it.
- ``CarriedWork``: work marked so at one pool submits the same tool call to
  another pool (LangGraph's runner, then the ``ToolNode`` in its task): the
  call queued at the first submission goes on to the second worker, and the
  tool span begun there claims it.

A hook's own failure (a missing attribute in an unknown version) never
reaches the agent: the framework's original code runs untraced, and the
failure is logged once.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from time import thread_time_ns
from typing import Any, Callable, Optional


from agent_otel.support.text import NAME_LIMIT, valid_text
from agent_otel.capture.current import current_recorder
from agent_otel.capture import stacks
from agent_otel.capture.executors import executor_name
from agent_otel.capture.patching import SharedPatch, warn_once
from agent_otel.capture.meta import TOOL_MARK, meta_for
from agent_otel.capture.current import worker_local
from agent_otel.capture.recorder import ActiveCall, LiveCall, Recorder
from agent_otel.capture.payloads import UNREPRESENTABLE
from agent_otel.semconv import (
    ERROR_TYPE,
    ERROR_TYPE_TOOL_ERROR,
    EXECUTOR_ANYIO,
    EXECUTOR_ASYNCIO_DEFAULT,
    EXECUTOR_DIRECT,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_RESULT,
    OUTCOME_ERROR,
)


# The cached span metadata of a framework tool: meta(name, description=None,
# tool_type=TOOL_TYPE_FUNCTION) (a name that is not a str is made one by ToolMeta).
meta = meta_for


def end_with_error_result(rec: Recorder, active: ActiveCall, message: str, cpu_ns: Optional[int] = None) -> None:
    """End a call whose result says it failed, though nothing was raised.

    The framework's error text is the call's error message: recorded as the
    status description through ``redact``, and only with
    ``record_exception_messages`` (else the description is ``tool_error``).
    """
    call = active.call
    if call is not None:
        call.outcome = OUTCOME_ERROR
        call.error_type = ERROR_TYPE_TOOL_ERROR
        active.span.set_attribute(ERROR_TYPE, ERROR_TYPE_TOOL_ERROR)
        rec.set_error_status(active.span, message if rec.record_exception_messages else ERROR_TYPE_TOOL_ERROR)
    rec.end(active, None, cpu_ns)


def _record_arguments(rec: Recorder, active: ActiveCall, arguments: Optional[Callable[[], Any]]) -> None:
    """The tool's input as the framework gave it, when the user opted in (and this hook owns the span)."""
    if not rec.record_arguments or active.call is None or arguments is None:
        return
    try:
        value = arguments()
    except Exception:  # a framework object we cannot read: say so, never fail the tool
        value = UNREPRESENTABLE
    rec.record_payload(active.span, GEN_AI_TOOL_CALL_ARGUMENTS, value)


def _record_result(rec: Recorder, active: ActiveCall, result: Any, result_of: Optional[Callable[[Any], Any]]) -> None:
    if not rec.record_results or active.call is None:
        return
    try:
        value = result_of(result) if result_of is not None else result
    except Exception:
        value = UNREPRESENTABLE
    rec.record_payload(active.span, GEN_AI_TOOL_CALL_RESULT, value)


def positional(args: tuple, kwargs: dict) -> Callable[[], dict]:
    """``arguments`` for a hooked method called as the tool itself: its arguments after ``self``."""
    return lambda: {"args": args[1:], "kwargs": kwargs}


def _begin(
    rec: Recorder, framework: str, describe: Callable[[], tuple], handed_off: bool = False
) -> Optional[ActiveCall]:
    """Begin the call's span (``request`` it when it will be handed to a thread); None if the hook fails."""
    try:
        tool_meta, call_id = describe()
        return rec.request(tool_meta, call_id) if handed_off else rec.begin(tool_meta, call_id)
    except Exception as exc:  # the hook's own failure: run the tool untraced
        _cannot_trace(framework, exc)
        return None


def _cannot_trace(framework: str, exc: Exception) -> None:
    warn_once(
        f"{framework}:describe",
        "agent-otel: cannot trace a %s tool call (%s: %s); running it untraced",
        framework,
        type(exc).__name__,
        exc,
    )


def _finish(
    rec: Recorder,
    active: ActiveCall,
    result: Any,
    failed: Optional[Callable[[Any], Any]],
    cpu_ns: Optional[int] = None,
    result_of: Optional[Callable[[Any], Any]] = None,
) -> None:
    """End a call that returned: as an error when ``failed(result)`` says so."""
    if rec.record_results:
        _record_result(rec, active, result, result_of)
    error = None
    if failed is not None:
        try:
            error = failed(result)
        except Exception:
            error = None
    if error is None:
        rec.end(active, None, cpu_ns)
    else:
        _end_failed(rec, active, error, cpu_ns)


def _end_failed(rec: Recorder, active: ActiveCall, error: Any, cpu_ns: Optional[int]) -> None:
    """End a call that ``failed(result)`` says failed: with the exception it caught, or its error text."""
    if isinstance(error, BaseException):
        rec.end(active, error, cpu_ns)
    else:
        end_with_error_result(rec, active, str(error), cpu_ns)


def sync_call(
    framework: str,
    original: Callable,
    args: tuple,
    kwargs: dict,
    describe: Callable[[], tuple],
    failed: Optional[Callable[[Any], Any]] = None,
    arguments: Optional[Callable[[], Any]] = None,
    result_of: Optional[Callable[[Any], Any]] = None,
) -> Any:
    """Run ``original(*args, **kwargs)`` as one tool span.

    ``describe()`` returns ``(ToolMeta, call_id)``. ``failed(result)`` tells
    a failure the framework turned into a result: the exception it caught, or
    an error message (``error.type`` ``tool_error``), or None for success.
    ``arguments()`` gives the tool's input and ``result_of(result)`` its
    output, recorded with ``record_arguments`` / ``record_results`` (the
    return value itself when ``result_of`` is None).
    """
    rec = current_recorder()
    if rec is None:
        return original(*args, **kwargs)
    if args and current_handoff() is not None and handed_off_here(args[0]):
        # The framework's sync entry point, reached again on the worker that
        # runs the call async_call handed off: that call's span is the one.
        return original(*args, **kwargs)
    try:  # _begin, inlined (the hot path)
        tool_meta, call_id = describe()
        active = rec.begin(tool_meta, call_id)
    except Exception as exc:  # the hook's own failure: run the tool untraced
        _cannot_trace(framework, exc)
        return original(*args, **kwargs)
    if rec.record_arguments:
        _record_arguments(rec, active, arguments)
    # One thread runs the whole call: its CPU time is the call's, read on the
    # calls cpu_clock picks (inlined, as in the @tool wrapper: the hot path).
    skip = tool_meta.cpu_skip
    if skip:
        tool_meta.cpu_skip = skip - 1
        cpu = None
    else:
        cpu = thread_time_ns()
    try:
        result = original(*args, **kwargs)
    except BaseException as exc:
        rec.end(active, exc, None if cpu is None else thread_time_ns() - cpu)
        raise
    if cpu is not None:
        cpu = thread_time_ns() - cpu
    if rec.record_results:
        _record_result(rec, active, result, result_of)
    # _finish, inlined (the hot path)
    if failed is not None:
        try:
            error = failed(result)
        except Exception:
            error = None
        if error is not None:
            _end_failed(rec, active, error, cpu)
            return result
    rec.end(active, None, cpu)
    return result


def handed_off_here(owner: Any) -> bool:
    """Whether this is the worker running the call of ``owner`` that ``async_call``
    handed off (its span is that call's): a hook may run the original straight away."""
    handoff = _handoff.get()
    return handoff is not None and handoff.submitted and handoff.owner is not None and owner is handoff.owner


class _Handoff:
    """A requested call waiting for the framework to submit it to a thread."""

    __slots__ = ("rec", "active", "owner", "optional", "executor", "pool_size", "submitted", "cpu_ns")

    def __init__(self, rec: Recorder, active: ActiveCall, owner: Any, optional: bool = False):
        self.rec = rec
        self.active = active
        self.owner = owner
        self.optional = optional
        self.executor = EXECUTOR_DIRECT
        # The pool's max_workers, read when a worker starts the call: asyncio
        # creates its default pool inside the very run_in_executor call.
        self.pool_size: Callable[[], Optional[int]] = _no_pool_size
        self.submitted = False
        self.cpu_ns: Optional[int] = None  # the worker's CPU time running the call, once it returned

    def started(self) -> None:
        """The call's exec phase begins now, on a worker of ``executor``."""
        try:
            size = self.pool_size()
        except Exception:
            size = None
        self.rec.started(self.active, self.executor, max_workers=size if isinstance(size, int) else None)


def _no_pool_size() -> Optional[int]:
    return None


_handoff: contextvars.ContextVar[Optional[_Handoff]] = contextvars.ContextVar("agent_otel_handoff", default=None)
# The call async_call is handing to a thread in this context, or None: a hook
# tests this (a C call) before it calls handed_off_here.
current_handoff = _handoff.get
_NOT_IN_THREAD = object()


async def async_call(
    framework: str,
    original: Callable,
    args: tuple,
    kwargs: dict,
    describe: Callable[[], tuple],
    failed: Optional[Callable[[Any], Any]] = None,
    thread_owner: Any = _NOT_IN_THREAD,
    thread_optional: bool = False,
    arguments: Optional[Callable[[], Any]] = None,
    result_of: Optional[Callable[[Any], Any]] = None,
) -> Any:
    """Await ``original(*args, **kwargs)`` as one tool span.

    With ``thread_owner``, the framework will run the tool on a thread pool:
    the submission whose callable refers to ``thread_owner`` (the tool
    object, or its function) ends the queue phase when a worker starts it.
    ``thread_owner=None`` takes the first submission made in this call.
    ``thread_optional``: the framework may as well run the tool on the loop
    (a server running sync tools on a thread, async ones in place); a call
    never handed off is then a direct call, with no warning. ``arguments``
    and ``result_of`` as in ``sync_call``.
    """
    rec = current_recorder()
    if rec is None:
        return await original(*args, **kwargs)
    if thread_owner is _NOT_IN_THREAD:
        handed_off = False
        try:  # _begin, inlined (the hot path)
            tool_meta, call_id = describe()
            active = rec.begin(tool_meta, call_id)
        except Exception as exc:  # the hook's own failure: run the tool untraced
            _cannot_trace(framework, exc)
            return await original(*args, **kwargs)
    else:
        handed_off = thread_optional or _loop_hooked()
        begun = _begin(rec, framework, describe, handed_off)
        if begun is None:
            return await original(*args, **kwargs)
        active = begun
    handoff = _Handoff(rec, active, thread_owner, thread_optional) if handed_off and active.call is not None else None
    if rec.record_arguments:
        _record_arguments(rec, active, arguments)
    token = _handoff.set(handoff)
    try:
        result = await original(*args, **kwargs)
    except BaseException as exc:
        _handoff.reset(token)
        if handoff is not None:
            _settle(handoff, framework, raised=True)
        rec.end(active, exc, handoff.cpu_ns if handoff is not None else None)
        raise
    _handoff.reset(token)
    if handoff is not None:
        _settle(handoff, framework, raised=False)
    _finish(rec, active, result, failed, handoff.cpu_ns if handoff is not None else None, result_of)
    return result


# The loop monitor finds the calls these run in their ``active`` local.
stacks.register(sync_call.__code__, sync=True)
stacks.register(async_call.__code__)


def _settle(handoff: _Handoff, framework: str, raised: bool) -> None:
    """Give a requested call that never reached a worker its exec start."""
    call = handoff.active.call
    if call is None or call.start_ns:  # None: a nested begin, recorded by the outer one
        return
    if handoff.submitted:
        # Submitted, never started (cancelled while queued): all queue.
        handoff.started()
        return
    # Never seen going to a thread: an event loop we do not hook (uvloop), a
    # framework version that runs it otherwise, or a failure before the
    # hand-off. Count it as a direct call, as a plain span would.
    handoff.rec.started(handoff.active, EXECUTOR_DIRECT, at_ns=call.submit_ns)
    if not raised and not handoff.optional:
        warn_once(
            f"{framework}:handoff",
            "agent-otel: %s did not hand tool %r to a thread pool where "
            "expected (event loop %s); its queue time is counted as exec time",
            framework,
            call.tool,
            type(_running_loop()).__name__,
        )


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _refers_to(fn: Any, owner: Any, depth: int = 4) -> bool:
    """Whether the submitted callable ``fn`` runs ``owner`` (or a method of it).

    Looks through partials, bound methods and closure cells, the wrappers
    frameworks put around a tool before submitting it.
    """
    if fn is owner:
        return True
    if depth == 0:
        return False
    if isinstance(fn, functools.partial):
        return _refers_to(fn.func, owner, depth - 1) or any(_refers_to(a, owner, depth - 1) for a in fn.args)
    if getattr(fn, "__self__", None) is owner:
        return True
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _refers_to(contents, owner, depth - 1):
            return True
    return False


class _Started:
    """The submitted callable of a requested call: exec starts when a worker runs it."""

    __slots__ = ("fn", "handoff")

    def __init__(self, fn: Callable, handoff: _Handoff):
        self.fn = fn
        self.handoff = handoff

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handoff = self.handoff
        try:
            handoff.started()
        except Exception:
            pass  # timing only; the tool itself must run
        # The worker runs the whole sync call: its CPU time is the call's,
        # read on the calls cpu_clock picks (one in CPU_SAMPLE of a short
        # tool's); Recorder.end counts the ones it skips.
        tool_meta = handoff.active.meta
        skip = tool_meta.cpu_skip
        if skip:
            tool_meta.cpu_skip = skip - 1
            return self.fn(*args, **kwargs)
        cpu = thread_time_ns()
        try:
            return self.fn(*args, **kwargs)
        finally:
            handoff.cpu_ns = thread_time_ns() - cpu


def pending_handoff(fn: Callable) -> Optional[_Handoff]:
    """The call ``async_call`` is about to hand to a thread, when submitting ``fn`` does that."""
    handoff = _handoff.get()
    if handoff is None or handoff.submitted:
        return None
    try:
        if handoff.owner is None or _refers_to(fn, handoff.owner):
            return handoff
    except Exception:
        pass
    return None


def hand_off(handoff: _Handoff, fn: Callable, executor: str, pool_size: Callable[[], Optional[int]]) -> Callable:
    """What to submit instead of ``fn``: the call's exec starts when a worker of ``executor`` runs it.

    Hooks of a thread hand-off point call this with the ``pending_handoff``;
    ``pool_size()`` gives the pool's max_workers once a worker started.
    """
    handoff.submitted = True
    handoff.executor = executor
    handoff.pool_size = pool_size
    return _Started(fn, handoff)


def _run_in_executor_hook(original: Callable) -> Callable:
    """``BaseEventLoop.run_in_executor`` that lets ``async_call`` see its hand-offs, around
    ``original`` (the method as it was when the hook was installed)."""

    @functools.wraps(original)
    def run_in_executor(self, executor, func, *args):
        handoff = pending_handoff(func) if _handoff.get() is not None else None
        if handoff is not None:
            try:
                pool = executor if executor is not None else getattr(self, "_default_executor", None)
                if pool is not None:
                    func = hand_off(handoff, func, executor_name(pool), lambda: getattr(pool, "_max_workers", None))
                else:  # the loop creates its default pool in this call
                    loop = self
                    func = hand_off(
                        handoff,
                        func,
                        EXECUTOR_ASYNCIO_DEFAULT,
                        lambda: getattr(getattr(loop, "_default_executor", None), "_max_workers", None),
                    )
            except Exception:
                pass  # never let timing stop the submission
        return original(self, executor, func, *args)

    return run_in_executor


# One event-loop hook, shared by every framework hook that needs it.
_event_loop = SharedPatch(asyncio.BaseEventLoop, "run_in_executor", _run_in_executor_hook)


def _loop_hooked() -> bool:
    return _event_loop.active and isinstance(_running_loop(), asyncio.BaseEventLoop)


def hook_event_loop() -> None:
    """Let ``async_call`` see hand-offs; counted, one per framework hook."""
    _event_loop.acquire()


def unhook_event_loop() -> None:
    _event_loop.release()


def anyio_run_sync_hook(original: Callable) -> Callable:
    """``anyio.to_thread.run_sync`` (or a framework's own import of it) that lets
    ``async_call`` see its hand-offs to anyio's worker threads (executor
    ``anyio``, ``max_workers`` the capacity limiter's tokens)."""

    @functools.wraps(original)
    async def run_sync(func, *args, limiter=None, **kwargs):
        handoff = pending_handoff(func)
        if handoff is not None:
            try:
                if limiter is None:
                    import anyio.to_thread

                    limiter = anyio.to_thread.current_default_thread_limiter()
                tokens = limiter.total_tokens
                func = hand_off(handoff, func, EXECUTOR_ANYIO, lambda: tokens)
            except Exception:
                pass  # timing only: the tool must run
        return await original(func, *args, limiter=limiter, **kwargs)

    return run_sync


class MarkedWork:
    """A tool call submitted to a thread pool, recognizable by the executor hook.

    The executor hook queues a call named ``tool`` at submission; the first
    tool span of that name begun while this runs claims it, so its span
    starts at submission.
    """

    __slots__ = ("fn", "tool")

    def __init__(self, fn: Callable, tool: str):
        self.fn = fn
        self.tool = valid_text(tool, NAME_LIMIT)  # as ToolMeta makes the name the span claims it by

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


setattr(MarkedWork, TOOL_MARK, staticmethod(lambda work: work.tool))


class CarriedWork:
    """A queued tool call's work going on in another thread.

    ``take(tool)`` on a worker that runs a submission marked as a call of
    ``tool`` (``MarkedWork``) and not yet claimed takes that call; the
    ``CarriedWork`` made with it lets the first tool span of that name begun
    while it runs claim it, so the call's queue time runs from the first
    submission to the start of the tool, through both pools.
    """

    __slots__ = ("fn", "call")

    def __init__(self, fn: Callable, call: LiveCall):
        self.fn = fn
        self.call = call

    @staticmethod
    def take(tool: str) -> Optional[LiveCall]:
        """This worker's queued call of ``tool`` not yet claimed, now taken from it; else None."""
        call = worker_local.pending
        if call is None or call.tool != valid_text(tool, NAME_LIMIT):
            return None
        worker_local.pending = None
        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        previous = worker_local.pending
        worker_local.pending = self.call
        try:
            return self.fn(*args, **kwargs)
        finally:
            if worker_local.pending is self.call:  # never claimed: forget it, as the executor hook does
                rec = current_recorder()
                if rec is not None:
                    rec.inflight.pop(id(self.call), None)
            worker_local.pending = previous
