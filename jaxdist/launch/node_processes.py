"""Node processes forked from a server that has already imported what nodes import.

A spawned Python spends over a second of CPU importing JAX, Flax, Optax, Orbax and gRPC before
its node does anything, and a program starts several processes, more as it restarts and scales.
The launchers instead have multiprocessing's forkserver fork each node process: the forkserver
(one per launching process) imports those modules once, before it runs a thread or starts JAX's
backend, and every fork shares their pages.

A fork inherits the forkserver's environment and standard streams, not the launcher's, so each
child is handed what a spawned one would have inherited (`Inheritance`: the launcher's
environment at that moment with its group's variables, its stdout and stderr) and takes it
before anything reads it. JAX reads its ``JAX_*`` variables at import: the forkserver drops
them first, so that its JAX holds its defaults, and the child applies its own to JAX's config
as a fresh import would have read them (`forkserver_preload` prepares the forkserver: those
variables, and the signals it ignores). ``XLA_FLAGS`` and the accelerators' variables are read
when JAX's backend starts, in the child.

glibc reads ``MALLOC_ARENA_MAX`` once, when a process first allocates: a fork keeps its
forkserver's setting, so each child sets its own limit through ``mallopt`` (`MALLOC_ARENA_MAX`
below is the default).

The forkserver listens on a Unix socket that only this user may open (mode 0600, in a private
directory), as the nodes' own sockets are; what arrives there is a node pickled by its launcher.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from multiprocessing import reduction
from typing import Any

PRELOAD = ["jaxdist.launch.forkserver_preload", "jaxdist.launch.worker", "numpy", "jax", "flax.linen", "optax", "grpc", "msgpack"]
"""What nodes import that leaves no trace a fresh process would not have (Orbax's import adds a
handler to the root logger: a node that never saves would log twice)."""

MALLOC_ARENA_MAX = 2
"""glibc's malloc arenas in a node process, unless its environment says otherwise (0: glibc's
default, eight per core). glibc gives each thread that allocates an arena of its own up to that
limit, and each arena keeps what is freed in it: a learner's server, save and tensorstore threads
spread its allocations over ever more arenas, and its resident memory climbs in steps for minutes.
With two, its memory is flat over a long life (the soak's table in the checkpoints guide), at no
speed cost experiments/benchmarks/malloc_arenas.py can find (the benchmarks page's table)."""

_M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
_TRUE, _FALSE = ("y", "yes", "t", "true", "on", "1"), ("n", "no", "f", "false", "off", "0")
_start_lock = threading.Lock()


def context(start_method: str = "forkserver") -> multiprocessing.context.BaseContext:
    """The context node processes start from: a forkserver's, running with the modules loaded
    (started again, the same, if it died), or `start_method`'s (a spawned child imports them
    itself; `Inheritance` serves both)."""
    if start_method != "forkserver":
        return multiprocessing.get_context(start_method)
    forkserver = multiprocessing.get_context("forkserver")
    with _start_lock:
        forkserver.set_forkserver_preload(PRELOAD)
        multiprocessing.forkserver.ensure_running()
    return forkserver


class Inheritance:
    """What a node process inherits: `environ`, and stdout and stderr (this process's, passed as
    descriptors when it is pickled for the child; `streams` once they arrived there)."""

    def __init__(self, environ: dict[str, str], streams: list[tuple[int, int]] | None = None) -> None:
        self.environ = environ
        self._streams = streams or []  # (1 or 2, the descriptor it arrived as)

    @classmethod
    def now(cls, overrides: dict[str, str]) -> "Inheritance":
        """What a node process started now inherits: this process's environment with `overrides`."""
        return cls({**os.environ, **overrides})

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        streams = [(fd, reduction.DupFd(fd)) for fd in (1, 2) if _is_open(fd)]
        return _received, (self.environ, streams)

    def take(self) -> None:
        """In the child, before anything else: the streams, the environment, JAX's config, and
        numpy's global random generator reseeded, as in a fresh process."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in self._streams:
            if fd != target:  # spawn passes a descriptor under its own number
                os.dup2(fd, target)
                os.close(fd)
        os.environ.clear()
        os.environ.update(self.environ)
        _limit_malloc_arenas(os.environ.setdefault("MALLOC_ARENA_MAX", str(MALLOC_ARENA_MAX)))
        if "numpy.random" in sys.modules:  # its global generator, seeded at import, is every fork's
            sys.modules["numpy.random"].seed()
        if "jax" not in sys.modules:  # not preloaded: it reads the environment when imported
            return
        import jax

        for variable, text in self.environ.items():
            name = variable.lower()
            if variable.startswith("JAX_") and name in jax.config.meta:
                jax.config.update(name, _parsed(variable, text, jax.config.meta[name][0]))


def _limit_malloc_arenas(value: str) -> None:
    """glibc's arena limit for this process from now on; elsewhere (macOS, musl) nothing."""
    try:
        limit = int(value)
    except ValueError:
        raise ValueError(f"MALLOC_ARENA_MAX={value!r}: expected a whole number of arenas "
                         "(0: glibc's default)") from None
    if sys.platform.startswith("linux"):  # the process's own symbols: no library search at every start
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
        if mallopt is not None:
            mallopt(_M_ARENA_MAX, limit)


def _received(environ: dict[str, str], streams: list[tuple[int, Any]]) -> Inheritance:
    return Inheritance(environ, [(target, fd.detach()) for target, fd in streams])


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _parsed(variable: str, text: str, kind: object) -> object:
    if kind is bool:
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError(f"{variable}={text!r}: expected one of {', '.join(_TRUE + _FALSE)}")
        return text.lower() in _TRUE
    if kind in (int, float):
        return kind(text)  # type: ignore[operator]
    return text
