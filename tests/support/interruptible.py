"""Starting a script that a test will stop with Ctrl-C (SIGINT), as a terminal's Ctrl-C finds it."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def popen_interruptible(command: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(command, **kwargs)`` with SIGINT at Python's default in the child.

    A runner started in the background (``nohup make test &``) passes SIGINT on ignored, and an
    ignored signal stays ignored across exec: Python would then never raise it. A handled one
    becomes the default at exec, so the parent handles it for the moment of the spawn. Not with
    ``preexec_fn``: it makes Python fork the worker and run its fork handlers in the child, where
    gRPC's, with the worker's channels live, can write to the script's stderr before it starts."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(command, **kwargs)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)  # None: set outside Python
