"""Per-node log files under `<run_dir>/logs/` and name-prefixed console output."""

from __future__ import annotations

import codecs
import io
import os
import sys
import threading
from typing import IO, TextIO


def log_path(run_dir: str, node_name: str) -> str:
    """Where node ``node_name``'s output is logged in ``run_dir``."""
    return os.path.join(run_dir, "logs", node_name.replace("/", "-") + ".log")


class _Prefixer:
    """Writes text to a console with `[name] ` at the start of each line."""

    def __init__(self, name: str) -> None:
        self._prefix = f"[{name}] "
        self._at_line_start = True

    def format(self, text: str) -> str:
        pieces = []
        for line in text.splitlines(keepends=True):
            if self._at_line_start:
                pieces.append(self._prefix)
            pieces.append(line)
            self._at_line_start = line.endswith("\n")
        return "".join(pieces)


class _Route:
    def __init__(self, name: str, log: TextIO) -> None:
        self.log = log
        self.prefixer = _Prefixer(name)


class _RoutedStream(io.TextIOBase):
    """Stands in for sys.stdout/sys.stderr: a node thread's writes go to its log and, prefixed,
    to the console; other threads write to the console as before."""

    def __init__(self, console: TextIO, routes: threading.local, echo: bool) -> None:
        self._console = console
        self._routes = routes
        self._echo = echo

    def write(self, text: str) -> int:
        route: _Route | None = getattr(self._routes, "route", None)
        if route is None:
            return self._console.write(text)
        route.log.write(text)
        if self._echo:
            self._console.write(route.prefixer.format(text))
        return len(text)

    def flush(self) -> None:
        route = getattr(self._routes, "route", None)
        if route is not None:
            route.log.flush()
        self._console.flush()

    def isatty(self) -> bool:
        return False


class ThreadOutput:
    """Routes each node thread's prints to its own log file (threads launcher)."""

    def __init__(self, run_dir: str, echo: bool = True) -> None:
        self._run_dir = run_dir
        self._routes = threading.local()
        self._echo = echo
        self._saved: tuple[TextIO, TextIO] | None = None
        self._logs: list[TextIO] = []

    def install(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _RoutedStream(sys.stdout, self._routes, self._echo)
        sys.stderr = _RoutedStream(sys.stderr, self._routes, self._echo)

    def route_current_thread(self, node_name: str) -> None:
        path = log_path(self._run_dir, node_name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log = open(path, "a", buffering=1, encoding="utf-8", opener=_log_opener)
        self._logs.append(log)
        self._routes.route = _Route(node_name, log)

    def uninstall(self) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None
        for log in self._logs:
            log.close()


def _log_opener(path: str, flags: int) -> int:
    """Logs are the owner's alone (0o600), and a symlink planted at a log's path is refused
    rather than followed (O_NOFOLLOW)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def capture_process_output(node_name: str, run_dir: str, echo: bool = True) -> threading.Thread:
    """Send this process's fds 1 and 2 -- C libraries' output too -- to its log and the console.

    Returns the pump thread; `finish_process_output` flushes and joins it at exit.
    """
    path = log_path(run_dir, node_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    log = open(path, "ab", buffering=0, opener=_log_opener)
    console = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True, encoding="utf-8")
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True, encoding="utf-8")
    pump = threading.Thread(target=_pump, args=(read_end, log, console, echo, node_name), daemon=True)
    pump.start()
    return pump


def finish_process_output(pump: threading.Thread) -> None:
    """Flush and close fds 1 and 2 so the pump drains the pipe and ends."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.close(1)
    os.close(2)
    pump.join(timeout=5)


def _pump(read_end: int, log: IO[bytes], console: TextIO, echo: bool, node_name: str) -> None:
    prefixer = _Prefixer(node_name)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            log.write(chunk)
            if echo:
                console.write(prefixer.format(decoder.decode(chunk)))
    log.close()
    console.close()
