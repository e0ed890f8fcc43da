"""A file that whole lines are appended to, one ``write()`` each.

The traces file and the GPU log are written this way, not through Python's
buffered files, for three reasons:

- a forked child shares the file with its parent: with ``O_APPEND`` each
  process's lines land whole at the end, never over each other, and there
  is no user-space buffer that both processes would write out;
- a crash loses at most the line being written;
- a full disk fails one write, which is undone (the file is cut back to
  where it was) so the file never ends with half a line, and the caller
  decides what to say (once, not per line).
"""

from __future__ import annotations

import errno
import os
from typing import Optional


_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


class AppendFile:
    """Appends whole lines to ``path``; ``truncate`` empties it first."""

    def __init__(self, path: str, truncate: bool = False):
        self.path = str(path)
        self._fd = os.open(self.path, _FLAGS | (os.O_TRUNC if truncate else 0), 0o644)

    def reopen(self) -> None:
        """Open the file again (in a forked child): a description of its own, so
        that ``append`` can tell its own last write from the parent's."""
        if self._fd < 0:
            return
        old = self._fd
        try:
            self._fd = os.open(self.path, _FLAGS, 0o644)
        except OSError:
            return  # keep writing through the inherited one
        os.close(old)

    def moved(self) -> Optional[str]:
        """``"deleted"`` or ``"replaced"`` when ``path`` no longer names the file
        being written (removed, or renamed away and another put in its place:
        a log rotation), so that lines written now would be lost to readers of
        ``path``; None while it does (or when that cannot be told)."""
        if self._fd < 0:
            return None
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None
        try:
            own = os.fstat(self._fd)
        except OSError:
            return None
        return None if (named.st_dev, named.st_ino) == (own.st_dev, own.st_ino) else "replaced"

    def open_again(self) -> None:
        """Open ``path`` anew (created if missing) and write there from now on;
        raises ``OSError`` (and keeps the open file) when it cannot be opened."""
        fd = os.open(self.path, _FLAGS, 0o644)
        old, self._fd = self._fd, fd
        if old >= 0:
            os.close(old)

    def fileno(self) -> int:
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def append(self, text: str | bytes) -> None:
        """Write ``text`` (whole lines; bytes as they are) in one system call; raises
        ``OSError`` and leaves nothing of it behind when it cannot all be written."""
        if self._fd < 0:
            raise OSError(errno.EBADF, "the file is closed", self.path)
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
        written = os.write(self._fd, data)  # raises OSError when nothing could be written
        if written == len(data):
            return
        self._undo(written)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    def _undo(self, written: int) -> None:
        """Remove the first ``written`` bytes of a line that did not fit, if nobody wrote after them."""
        if not written:
            return
        try:
            end = os.lseek(self._fd, 0, os.SEEK_CUR)  # with O_APPEND: where our write ended
            size = os.fstat(self._fd).st_size
            if size == end:  # nobody appended after it
                os.ftruncate(self._fd, size - written)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
