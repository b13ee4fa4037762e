"""Interrupting a Python thread from another, for stops that cannot wait on cooperation."""

from __future__ import annotations

import ctypes
import threading


def raise_in_thread(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise `exc_type` in `thread` at its next Python instruction (CPython; not inside C calls)."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
