"""What the host gives this process: its CPUs, and how its shell runs our command.

Importing it loads nothing else of the toolkit, so the remedies' pools,
``instrument()`` (the ``agent.process.cpu.count`` resource attribute) and
the report's worker advice share one count, and every line that tells a
user what to run next (the exit line, the demo) spells it one way.
"""

from __future__ import annotations

import os
import sys

COMMAND = "agent-otel"


def cores() -> int:
    """CPUs this process may run on (a container's affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def command() -> str:
    """The ``agent-otel`` command as a shell can run it, as printed: its name
    when the ``PATH`` finds this installation's script (or the name is on
    the ``PATH`` and this interpreter has none beside it: a ``--user`` or
    system install); else the full path of the script beside this
    interpreter (a virtual environment that is not activated); else this
    interpreter with ``-m agent_otel``. (Said once, at exit.)"""
    import shlex

    own = _which(COMMAND, os.path.dirname(sys.executable))
    found = _which(COMMAND, os.environ.get("PATH", os.defpath))
    if own is None:
        return COMMAND if found is not None else f"{shlex.quote(sys.executable)} -m agent_otel"
    if found is not None and os.path.realpath(found) == os.path.realpath(own):
        return COMMAND
    return shlex.quote(own)


def _which(name: str, path: str) -> "str | None":
    """The first executable ``name`` in the directories of ``path``
    (``shutil.which`` on Windows, for its extensions; elsewhere this, not
    the 17 ms of importing ``shutil`` at exit)."""
    if os.name == "nt":
        import shutil

        return shutil.which(name, path=path)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None
