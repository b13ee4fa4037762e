"""SIGTERM to a launching script (a preempted VM, `scancel`, `kill`) is the ordered stop of its
programs, under every launcher that runs nodes from this process: each node sees the stop (and
a learner checkpoints), `wait()` returns and the script exits 0. A program is the script's until
the script has seen it end (`wait()` said so, or `stop()` returned), not until its teardown ends:
a handler that runs late (the main thread was in a blocking call) after another host stopped the
program meanwhile, as when every process of a pod gets SIGTERM at once, must not kill the script
on its way to exit 0. A script with no program of its own gets the signal's old behaviour. At
exit, programs still running are stopped, so a script that never called `wait()` or `stop()`
leaves no node behind."""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import Any, Protocol


class Running(Protocol):
    """What this module needs of a launch (``jaxdist.launch.running.Running``, which calls it)."""

    def request_stop(self, reason: str) -> None: ...

    def stop(self) -> None: ...


_live: "weakref.WeakSet[Running]" = weakref.WeakSet()
_previous_handler: Any = None


def watch(running: Running) -> None:
    """Stop `running` in order on SIGTERM and at exit, until `forget(running)` (once the script
    has seen it end). The handler is installed from the main thread only (Python delivers
    signals there)."""
    global _previous_handler
    _live.add(running)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        _previous_handler = signal.signal(signal.SIGTERM, _on_sigterm)


def forget(running: Running) -> None:
    _live.discard(running)


def _on_sigterm(signum: int, frame: Any) -> None:
    running = list(_live)
    for program in running:
        program.request_stop("the launcher got SIGTERM")
    if not running:  # no program to stop gracefully: behave as before we took the signal
        signal.signal(signal.SIGTERM, _previous_handler or signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


@atexit.register
def _stop_all_at_exit() -> None:
    for running in list(_live):
        running.stop()
