"""Waiting for something that happens on another thread, without a fixed sleep."""

import time


def eventually(check, timeout_s: float = 5.0) -> bool:
    """True as soon as ``check()`` is; False if it still is not after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False
