"""Drives a node process's worker through bind, construct, run and stop, in this process, with
one fault: closing its clients takes 0.3 s, as under load, so the stop's interrupt (due 0.1 s
after the stop) is sent late. Prints "exit <code> <what close() wrote>"; driven by
test_launchers."""

import pickle
import sys
import threading
import time
from multiprocessing import Pipe

import jaxdist as jd
import launch_nodes as nodes
from jaxdist.launch import worker
from jaxdist.launch.clients import ClientPool
from jaxdist.program import NodeContext


class SlowToClose(ClientPool):
    def close_all(self) -> None:
        time.sleep(0.3)
        super().close_all()


def main(run_dir: str, closed: str) -> None:
    worker.ClientPool = SlowToClose
    program = jd.Program("interrupted")
    node = jd.CourierNode(nodes.RaisesAtStopClosesSlowly, closed, 0.6)
    program.add_node(node)
    parent, child = Pipe()

    def launcher() -> None:
        _, addresses = parent.recv()  # ("bound", addresses)
        parent.send(("construct", addresses))
        parent.recv()  # ("constructed", has_run)
        parent.send(("run",))
        time.sleep(0.3)
        parent.send(("stop",))

    threading.Thread(target=launcher, daemon=True).start()
    code = worker._Worker(child, NodeContext(node.name, run_dir, "token", {}), 0.1).serve(pickle.dumps(node))
    with open(closed) as marker:
        print("exit", code, marker.read(), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
