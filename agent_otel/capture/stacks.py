"""Which tool calls a thread is running, read from its stack by another thread.

The loop monitor (``loop_monitor.py``) needs, while an event loop is
blocked, the tool call that runs on the loop's thread and the tool calls
whose coroutines wait on that loop. Neither can be known on the hot path
without a cost per call, so it is read from the stacks instead, only when a
block is seen:

- every wrapper that runs a tool call keeps its ``ActiveCall`` in a local
  variable; its code object is registered here (``register``, once, at
  import), so a frame running that code holds a call;
- ``tool_span`` runs the user's code in the user's own frame: it registers
  that frame while the ``with`` block runs (``enter_inline`` /
  ``exit_inline``, the only per-call cost, paid by ``tool_span`` alone).

Reading a frame's locals from another thread is what debuggers and
profilers do; it copies the values, it never changes the frame.
"""

from __future__ import annotations

from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

if TYPE_CHECKING:
    from agent_otel.records import ToolCall

# code object -> (name of its local holding the ActiveCall, whether the call
# runs on this one thread from start to end: a sync call)
_CODES: dict[CodeType, tuple[str, bool]] = {}
# id(frame) -> the ActiveCall of the tool_span whose block that frame runs
_INLINE: dict[int, Any] = {}

MAX_DEPTH = 256  # frames or awaited objects followed from one start


def inner_code(outer: Callable, name: str = "wrapper") -> CodeType:
    """The code object of the function ``name`` defined inside ``outer``."""
    for constant in outer.__code__.co_consts:
        if isinstance(constant, CodeType) and constant.co_name == name:
            return constant
    raise LookupError(f"{outer.__qualname__} defines no function {name!r}")


def register(code: CodeType, local: str = "active", sync: bool = False) -> None:
    """Frames running ``code`` hold the ``ActiveCall`` of a tool call in ``local``."""
    _CODES[code] = (local, sync)


def enter_inline(frame: FrameType, active: Any) -> None:
    _INLINE[id(frame)] = active


def exit_inline(frame_id: int) -> None:
    _INLINE.pop(frame_id, None)


def _call_in(frame: FrameType) -> Optional[tuple[ToolCall, bool]]:
    how = _CODES.get(frame.f_code)
    if how is not None:
        active = frame.f_locals.get(how[0])
        sync = how[1]
    else:
        active = _INLINE.get(id(frame))
        sync = False
    call = getattr(active, "call", None)
    # (imported here, where a block is being read: the wrappers that import
    # this module load with OpenTelemetry's API alone, and no records)
    from agent_otel.records import ToolCall

    return (call, sync) if isinstance(call, ToolCall) else None


def calls_on_stack(frame: Optional[FrameType]) -> list[tuple[ToolCall, bool]]:
    """The tool calls a thread's stack is running, innermost first, each
    with whether it is a sync call (it holds the thread from its start)."""
    found = []
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        call = _call_in(frame)
        if call is not None:
            found.append(call)
        frame = frame.f_back
    return found


def _awaited_frames(awaitable: Any) -> Iterator[FrameType]:
    """The frames of a suspended coroutine and of everything it awaits, outermost first."""
    for _ in range(MAX_DEPTH):
        frame = (
            getattr(awaitable, "cr_frame", None)
            or getattr(awaitable, "gi_frame", None)
            or getattr(awaitable, "ag_frame", None)
        )
        if frame is None:
            return
        yield frame
        awaitable = (
            getattr(awaitable, "cr_await", None)
            or getattr(awaitable, "gi_yieldfrom", None)
            or getattr(awaitable, "ag_await", None)
        )


def calls_awaiting(coroutine: Any) -> list[ToolCall]:
    """The tool calls a suspended coroutine (a task's) is inside of."""
    found = []
    for frame in _awaited_frames(coroutine):
        call = _call_in(frame)
        if call is not None:
            found.append(call[0])
    return found
