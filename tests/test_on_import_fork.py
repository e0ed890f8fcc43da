"""A child forked while another thread holds the import hooks' lock does not hang on it."""

import os
import threading
import time

import pytest

from agent_otel.capture import on_import


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_the_import_hooks_lock_is_held_can_still_use_them():
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with on_import._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the holding thread is not here
            try:
                on_import.when_imported("agent_otel_no_such_module", lambda module: None)
                os._exit(0 if on_import.waiting("agent_otel_no_such_module") else 3)
            finally:
                os._exit(4)
        deadline = time.monotonic() + 20
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child waited for good on a lock a thread of its parent held")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        holder.join()
