"""The entry point of a node's process under the processes launcher.

The node arrives pickled over the pipe its parent made for it (never over a socket). The child
then follows the parent's two-phase start: bind and report addresses, construct when given the
address table, run when told. SIGTERM asks the parent to stop the whole program (it stops
nodes in order: learners first). A stop (the parent's message, or the parent's death) sets
the stop event first; if `run()` has not returned `interrupt_after` seconds later, its
calls in flight are cancelled and KeyboardInterrupt is raised in it (unless the node asked
for none: `context.finish_on_stop()`, or is saving a checkpoint: `context.saving_checkpoint()`,
which the parent hears of, to wait for the save past its grace).
"""

from __future__ import annotations

import _thread
import os
import pickle
import signal
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

from jaxdist.launch import context, node_processes
from jaxdist.launch.clients import ClientPool
from jaxdist.launch.output import capture_process_output, finish_process_output
from jaxdist.program import NodeContext

ORPHAN_GRACE = 10.0


def main(payload: bytes, node_context: NodeContext, conn: Connection, echo: bool, interrupt_after: float,
         inheritance: node_processes.Inheritance) -> None:
    inheritance.take()
    os.setpgid(0, 0)  # lead a process group, so the parent can signal our whole tree
    # Started ignoring SIGINT (a Ctrl-C at the terminal while starting is the launcher's); out of
    # the terminal's group now, the stop's own interrupt (interrupt_main) needs the handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    pump = capture_process_output(node_context.node_name, node_context.run_dir, echo)
    worker = _Worker(conn, node_context, interrupt_after)
    try:
        exitcode = worker.serve(payload)
    except KeyboardInterrupt:  # the stop's interrupt landed outside run(), during cleanup
        exitcode = 0 if worker.stopping else 1
    finish_process_output(pump)
    os._exit(exitcode)


class _Worker:
    def __init__(self, conn: Connection, node_context: NodeContext, interrupt_after: float) -> None:
        self._conn = conn
        self._context = node_context
        self._interrupt_after = interrupt_after
        self._send_lock = threading.Lock()
        self._messages: dict[str, Any] = {}
        self._arrived = threading.Condition()
        self._clients: ClientPool | None = None
        self._in_run = False
        self._run_lock = threading.Lock()  # an interrupt is sent only while run() runs
        self._stop_event = context.install(self._ask_program_to_stop,
                                           lambda under_way: self._send("saving", under_way))
        self._stop_once = threading.Lock()
        self._stopping = False

    def serve(self, payload: bytes) -> int:
        # Off the main thread: the handler may have interrupted a send that holds the lock.
        signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(
            target=self._on_sigterm, name="jaxdist-sigterm", daemon=True).start())
        threading.Thread(target=self._listen, name="jaxdist-control", daemon=True).start()
        executable = None
        try:
            node = pickle.loads(payload)
            executable = node.executable(self._context)
            self._send("bound", executable.bind())
            addresses = self._wait_for("construct")
            if addresses is None:
                return 0
            self._clients = ClientPool(addresses, self._context.token)
            executable.construct(addresses, self._clients)
            self._send("constructed", executable.has_run)  # known once built: a factory's product may run
            if self._wait_for("run") is None:
                return 0
            if executable.has_run:
                self._in_run = True
                try:
                    executable.run()
                finally:
                    self._leave_run()
                self._send("finished")
            else:
                self._stop_event.wait()
            return 0
        except KeyboardInterrupt:
            if self._stopping:
                return 0
            self._send("failed", traceback.format_exc())
            return 1
        except BaseException as exc:
            if self._stopping:  # most likely a call cut by the stop: a note, not a failure
                print(f"run() ended by the stop: {type(exc).__name__}: {exc}", flush=True)
                return 0
            details = traceback.format_exc()
            print(details, flush=True)
            self._send("failed", details)
            return 1
        finally:
            if executable is not None:
                executable.shutdown()
            if self._clients is not None:
                self._clients.close_all()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _send(self, *message: Any) -> bool:
        """Whether the message went; when the parent is gone, the listener handles that."""
        with self._send_lock:
            try:
                self._conn.send(message)
                return True
            except (OSError, ValueError):
                return False

    def _wait_for(self, kind: str) -> Any:
        """The payload of the parent's `kind` message, or None when a stop came first (one that
        came after it does not take it back: a node told to run runs, and sees the stop)."""
        with self._arrived:
            self._arrived.wait_for(lambda: kind in self._messages or self._stop_event.is_set())
            return self._messages.get(kind)

    def _listen(self) -> None:
        while True:
            try:
                kind, *body = self._conn.recv()
            except (EOFError, OSError):
                self._begin_stop()  # the launcher died: stop, and never outlive it for long
                threading.Timer(ORPHAN_GRACE, lambda: os.killpg(0, signal.SIGKILL)).start()
                return
            if kind == "stop":
                self._begin_stop()
            else:
                with self._arrived:
                    self._messages[kind] = body[0] if body else True
                    self._arrived.notify_all()

    def _on_sigterm(self) -> None:
        """SIGTERM is a preemption notice (`scancel` and a VM's shutdown signal every process):
        the launcher stops the whole program, in order, and tells this node when; without a
        launcher to ask, the node stops now."""
        if not self._send("stop_program", f"node '{self._context.node_name}' got SIGTERM"):
            self._begin_stop()

    def _ask_program_to_stop(self, reason: str | None) -> None:
        caller = context.current_node() or self._context  # a colocated part names itself
        self._send("stop_program", context.stop_reason(reason, caller.node_name))

    def _begin_stop(self) -> None:
        with self._stop_once:
            if self._stopping:
                return
            self._stopping = True
        with self._arrived:
            self._stop_event.set()
            self._arrived.notify_all()
        threading.Timer(self._interrupt_after, self._interrupt_run).start()

    def _interrupt_run(self) -> None:
        if not self._in_run or context.interrupt_waived():
            return
        if self._clients is not None:
            self._clients.close_all()
        with self._run_lock:
            if self._in_run:
                _thread.interrupt_main()

    def _leave_run(self) -> None:
        """No interrupt is sent after this; one sent just before lands here (or as this is
        called), inside run()'s handling, never in the cleanup that follows: there it escaped
        `main` and the process exited 120 without its final messages."""
        try:
            with self._run_lock:
                self._in_run = False
            _handle_pending_signals()
        except KeyboardInterrupt:
            if not self._stopping:
                raise


def _handle_pending_signals() -> None:
    """Empty: the interpreter runs pending signal handlers on entering a Python function."""
