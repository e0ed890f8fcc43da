"""What is current: the running instrumentation, found in one place, and
the tool call an executor worker is about to run.

``instrument()`` installs its ``Recorder`` here and ``shutdown()`` removes
it; every other module (the tool wrappers, ``tool_span``, the model and
agent spans, the executor hook, the framework hooks, the remedies) asks
``current_recorder()`` at the moment it needs it, and calls straight
through when the answer is None. So ``@agent_otel.tool`` can decorate a
library's functions at import time, before the application calls
``instrument()`` (or without it ever doing so), and those calls are
recorded from the moment it does.

Light (``threading`` only; the ``Recorder`` for the type checker): the
decorator and the span helpers load it without OpenTelemetry's SDK.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from agent_otel.capture.recorder import LiveCall, Recorder

__all__ = ["current_recorder", "set_recorder", "worker_local"]

_recorder: Optional[Recorder] = None


def current_recorder() -> Optional[Recorder]:
    """The running instrumentation's ``Recorder``; None when ``instrument()``
    has not been called, or its handle was shut down since."""
    return _recorder


def set_recorder(recorder: Optional[Recorder]) -> Optional[Recorder]:
    """Install ``recorder`` as the running one (None: no instrumentation);
    the one it replaces. Called by ``instrument()`` and ``shutdown()``."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


class _WorkerLocal(threading.local):
    # The submission an executor worker is about to run, when the submitted
    # callable is a tool: the first tool call in that work item claims it
    # (``Recorder.begin``).
    pending: Optional[LiveCall] = None


worker_local = _WorkerLocal()
