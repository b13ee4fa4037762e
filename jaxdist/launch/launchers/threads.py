"""The threads launcher: every node a thread of this process (debugging, tests). SIGTERM to the
process is the ordered stop, as under `processes` (`jaxdist.launch.sigterm`).

Python threads cannot be killed: stopping sets the stop event, then after `interrupt_after`
seconds cancels the nodes' calls in flight and raises KeyboardInterrupt in threads still in
`run()`; a thread stuck in C code past the grace period is left behind (a daemon) and named.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

from jaxdist.launch import context, preflight, sigterm
from jaxdist.launch.clients import ClientPool
from jaxdist.launch.interrupt import raise_in_thread
from jaxdist.launch.output import ThreadOutput
from jaxdist.launch.run_lock import RunLock
from jaxdist.launch.running import Running
from jaxdist.program import Executable, NodeContext, Program

log = logging.getLogger(__name__)


def launch(
    program: Program,
    *,
    run_dir: str | None = None,
    resources: dict[str, dict[str, Any]] | None = None,
    token: str | None = None,
    grace: float = 10.0,
    save_grace: float = 300.0,
    interrupt_after: float = 2.0,
    echo: bool = True,
) -> Running:
    """Start `program` as threads; returns once every node is built and running (or one failed)."""
    preflight.check_program(program)
    preflight.check_resources(program, resources, supported={})
    run_dir = preflight.prepare_run_dir(program, run_dir)
    running = _ThreadsRunning(program, run_dir, token or preflight.new_token(), (grace, save_grace),
                              interrupt_after, echo)
    run_lock = RunLock(run_dir)
    running.hold_until_over(run_lock)
    try:
        running.start()
    except BaseException:
        run_lock.release()
        raise
    return running


class _ThreadsRunning(Running):
    def __init__(
        self, program: Program, run_dir: str, token: str, graces: tuple[float, float], interrupt_after: float,
        echo: bool,
    ) -> None:
        nodes = [unit for _, unit in program.units()]
        super().__init__(program.name, [node.name for node in nodes], run_dir)
        self.token = token
        (self._grace, self._save_grace), self._interrupt_after = graces, interrupt_after
        self._executables: dict[str, Executable] = {
            node.name: node.executable(NodeContext(node.name, run_dir, token)) for node in nodes
        }
        self._threads: dict[str, threading.Thread] = {}
        # Held while start() starts the threads: a node that fails at once stops the program
        # while later threads have yet to start, and a thread not started cannot be joined.
        self._starting = threading.Lock()
        self._output = ThreadOutput(run_dir, echo)
        self._clients: ClientPool | None = None
        self._stop_event: threading.Event | None = None
        # The nodes and `start`. Set as the barrier trips, before anyone leaves it: a stop's abort
        # that lands while the nodes are leaving must not cost them their run().
        self._all_constructed = threading.Event()
        self._constructed = threading.Barrier(len(nodes) + 1, action=self._all_constructed.set)

    def start(self) -> None:
        for name, executable in self._executables.items():
            try:
                self.addresses.update(executable.bind())
            except Exception:
                self._shut_down_executables()
                raise
        self._clients = ClientPool(self.addresses, self.token)
        self._stop_event = context.install(self._stop_from_node)
        self._output.install()
        with self._starting:
            self._threads = {
                name: threading.Thread(target=self._node_main, args=(name, executable), name=name, daemon=True)
                for name, executable in self._executables.items()
            }
            for thread in self._threads.values():
                thread.start()
        sigterm.watch(self)
        try:
            self._constructed.wait()
        except threading.BrokenBarrierError:
            pass  # a node failed to construct: wait() reports it

    def _stop_from_node(self, reason: str | None) -> None:
        node = context.current_node()  # a colocated part runs in a helper thread of its unit's
        self.request_stop(context.stop_reason(reason, node.node_name if node else threading.current_thread().name))

    def _node_main(self, name: str, executable: Executable) -> None:
        try:
            self._output.route_current_thread(name)
            executable.construct(self.addresses, self._clients)
            self.node_started(name, executable.has_run)
            self._constructed.wait()
        except threading.BrokenBarrierError:
            if not self._all_constructed.is_set():
                return  # another node failed to construct (it reports), or the launch was stopped
        except BaseException:
            if self._stop_event.is_set():  # cut short by the stop (its interrupt, a peer gone): stopped
                self.node_finished(name)
                return
            self.node_failed(name, traceback.format_exc())
            self._constructed.abort()
            return
        if not executable.has_run:
            return
        try:
            executable.run()
        except KeyboardInterrupt:
            if not self._stop_event.is_set():
                self.node_failed(name, traceback.format_exc())
                return
        except BaseException:
            self.node_failed(name, traceback.format_exc())
            return
        self.node_finished(name)

    def _shut_down(self) -> None:
        self._stop_event.set()
        self._constructed.abort()
        deadline = time.monotonic() + self._grace
        busy = self._wait_threads(min(deadline, time.monotonic() + self._interrupt_after))
        if busy and not context.saves_under_way():  # a save under way is let commit
            self._clients.close_all()
            for thread in busy:
                raise_in_thread(thread, KeyboardInterrupt)
        busy = self._wait_threads_or_save(deadline)
        self._shut_down_executables()
        self._clients.close_all()
        self._output.uninstall()
        context.uninstall()
        if busy:
            names = ", ".join(thread.name for thread in busy)
            log.warning("threads of nodes %s did not stop within %.0f s and were left running", names, self._grace)

    def _wait_threads_or_save(self, deadline: float) -> list[threading.Thread]:
        """The threads still running at `deadline`, or, while a checkpoint save runs in this
        process, when it ends (up to `save_grace` past `deadline`)."""
        save_deadline = deadline + self._save_grace
        busy = self._wait_threads(deadline)
        while busy and context.saves_under_way() and time.monotonic() < save_deadline:
            busy = self._wait_threads(min(save_deadline, time.monotonic() + 0.2))
        return busy

    def _wait_threads(self, deadline: float) -> list[threading.Thread]:
        with self._starting:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread for thread in threads if thread.is_alive()]

    def _shut_down_executables(self) -> None:
        for name, executable in self._executables.items():
            try:
                executable.shutdown()
            except Exception:
                log.exception("shutting down node %s failed", name)
