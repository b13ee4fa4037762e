"""The processes launcher: every node its own process on this machine.

Children are started with multiprocessing's spawn, which hands each its node pickled over an
inherited pipe; the same pipe then carries the two-phase start (bind, construct, run) and stop.
Each child leads a process group, so a stop reaches its whole tree: the stop message and
SIGTERM, a grace period, then SIGKILL of every process below it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import weakref
from typing import Any, Iterator

from jaxdist.launch import preflight, worker
from jaxdist.launch.output import log_path
from jaxdist.launch.process_tree import describe_exit, signal_tree
from jaxdist.launch.running import Running
from jaxdist.program import NodeContext, Program

SUPPORTED_RESOURCES = {"env": "environment variables set in the group's processes before they import anything"}

_live: "weakref.WeakSet[_ProcessesRunning]" = weakref.WeakSet()
_environ_lock = threading.Lock()


def launch(
    program: Program,
    *,
    run_dir: str | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    token: str | None = None,
    grace: float = 10.0,
    interrupt_after: float = 2.0,
    echo: bool = True,
    start_timeout: float = 300.0,
) -> Running:
    """Start `program` as processes; returns once every node runs (or one failed: see `wait`)."""
    preflight.check_program(program)
    resources = preflight.check_resources(program, resources, SUPPORTED_RESOURCES)
    preflight.check_shippable(program)
    run_dir = preflight.prepare_run_dir(program, run_dir)
    running = _ProcessesRunning(program, run_dir, token or preflight.new_token(), resources, grace)
    running.start(echo, interrupt_after, start_timeout)
    return running


class _Child:
    def __init__(self, name: str, process: multiprocessing.Process, conn: multiprocessing.connection.Connection):
        self.name, self.process, self.conn = name, process, conn
        self.stage = "spawned"  # spawned -> bound -> constructed -> running -> exited


class _ProcessesRunning(Running):
    def __init__(
        self, program: Program, run_dir: str, token: str, resources: dict[str, dict[str, Any]], grace: float
    ) -> None:
        super().__init__(program.name, [unit.name for _, unit in program.units()], run_dir)
        self.token = token
        self._program = program
        self._resources = resources
        self._grace = grace
        self._children: dict[str, _Child] = {}
        self._has_run: dict[str, bool] = {}
        self._started = threading.Event()
        self._monitor: threading.Thread | None = None

    def start(self, echo: bool, interrupt_after: float, start_timeout: float) -> None:
        spawn = multiprocessing.get_context("spawn")
        for label, node in self._program.units():
            env = {key: str(value) for key, value in self._resources.get(label, {}).get("env", {}).items()}
            parent_end, child_end = spawn.Pipe()
            node_context = NodeContext(node.name, self.run_dir, self.token)
            process = spawn.Process(
                target=worker.main,
                args=(pickle.dumps(node), node_context, child_end, echo, interrupt_after),
                name=node.name,
            )
            with _environment(env):
                process.start()
            child_end.close()
            self._children[node.name] = _Child(node.name, process, parent_end)
        _live.add(self)
        self._monitor = threading.Thread(target=self._watch, args=(start_timeout,), name="jaxdist-monitor", daemon=True)
        self._monitor.start()
        self._started.wait()

    # The monitor ----------------------------------------------------------------------------

    def _watch(self, start_timeout: float) -> None:
        start_deadline = time.monotonic() + start_timeout
        while any(child.stage != "exited" for child in self._children.values()):
            waitables = {}
            for child in self._children.values():
                if child.stage != "exited":
                    waitables[child.conn] = child
                    waitables[child.process.sentinel] = child
            for ready in multiprocessing.connection.wait(list(waitables), timeout=0.5):
                child = waitables[ready]
                if ready is child.conn:
                    self._receive(child)
                elif child.stage != "exited":
                    self._reap(child)
            self._advance_start(start_deadline)
        self._started.set()

    def _receive(self, child: _Child) -> bool:
        """Handle one message; False when the pipe is closed (its sentinel tells how it ended)."""
        try:
            kind, *body = child.conn.recv()
        except (EOFError, OSError):
            return False
        if kind == "bound":
            addresses, has_run = body
            self.addresses.update(addresses)
            self._has_run[child.name] = has_run
            child.stage = "bound"
        elif kind == "constructed":
            child.stage = "constructed"
        elif kind == "finished":
            self.node_finished(child.name)
        elif kind == "failed":
            self.node_failed(child.name, body[0])
        elif kind == "stop_program":
            self.request_stop(body[0])
        return True

    def _reap(self, child: _Child) -> None:
        while child.conn.poll() and self._receive(child):  # messages sent just before exiting
            pass
        child.process.join()
        exitcode = child.process.exitcode
        child.stage = "exited"
        if exitcode != 0 and self.status()[child.name]["state"] != "failed":
            self.node_failed(child.name, self._death_report(child.name, exitcode), exitcode)
        else:
            self.node_finished(child.name, exitcode)

    def _advance_start(self, deadline: float) -> None:
        """Move all children through bind -> construct -> run together (the two-phase start)."""
        if self._started.is_set():
            return
        stages = {child.stage for child in self._children.values()}
        if stages == {"bound"}:
            self._broadcast("construct", dict(self.addresses))
        elif stages == {"constructed"}:
            for child in self._children.values():
                self.node_started(child.name, self._has_run[child.name], child.process.pid)
                child.stage = "running"
            self._broadcast("run")
            self._started.set()
        elif "exited" in stages or self._stop_requested.is_set():
            self._started.set()
        elif time.monotonic() > deadline:
            slow = sorted(child.name for child in self._children.values() if child.stage == "spawned")
            self.node_failed(slow[0] if slow else "launcher", f"nodes {slow} did not start within the start timeout")
            self._started.set()

    def _broadcast(self, *message: Any) -> None:
        for child in self._children.values():
            if child.stage != "exited":
                with contextlib.suppress(OSError, ValueError):
                    child.conn.send(message)

    def _death_report(self, name: str, exitcode: int | None) -> str:
        lines = _tail(log_path(self.run_dir, name), 20)
        return f"process {describe_exit(exitcode)}; last lines of {log_path(self.run_dir, name)}:\n{lines}"

    # Stopping -------------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """Stop message and SIGTERM, `grace` seconds, then SIGKILL of every tree. Only the
        monitor reaps children (two threads joining one process lose its exit code)."""
        self._broadcast("stop")
        for child in self._children.values():
            if child.process.is_alive():
                signal_tree(child.process.pid, signal.SIGTERM)
        self._wait_for_exits(time.monotonic() + self._grace)
        for child in self._children.values():
            signal_tree(child.process.pid, signal.SIGKILL)  # stragglers and anything left in its group
        self._wait_for_exits(None)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join()
        _live.discard(self)

    def _wait_for_exits(self, deadline: float | None) -> None:
        pending = [child.process.sentinel for child in self._children.values()]
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait(pending, timeout)
            if not ready:
                return
            pending = [sentinel for sentinel in pending if sentinel not in ready]


@contextlib.contextmanager
def _environment(overrides: dict[str, str]) -> Iterator[None]:
    """os.environ with `overrides` while a child is spawned (it copies the environment)."""
    with _environ_lock:
        saved = {key: os.environ.get(key) for key in overrides}
        os.environ.update(overrides)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _tail(path: str, count: int) -> str:
    try:
        with open(path, "rb") as log:
            return b"".join(log.readlines()[-count:]).decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"


@atexit.register
def _stop_all_at_exit() -> None:
    """A script that exits without wait() or stop() must not leave its nodes running."""
    for running in list(_live):
        running.stop()
