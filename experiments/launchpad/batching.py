"""Central inference: the clients' concurrent calls of one server method are served as one
call of a batch. Written as a Launchpad user writes it; only the import names jaxdist.

    python experiments/launchpad/batching.py [--num_clients=3] [--lp_launch_type=local_mp]
"""

import threading

from absl import app
from absl import flags
from absl import logging
import numpy as np

import jaxdist.compat.launchpad as lp

_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 3, "How many clients call the server together.")
_CALLS = 3


class Server:
    """Sums every batch into a running total; stops the program once every client is done."""

    def __init__(self, batch_size: int) -> None:
        self._total = np.zeros(2)
        self._done = 0
        self._lock = threading.Lock()
        self.compute = lp.batched_handler(batch_size=batch_size)(self.compute)

    def compute(self, values):
        logging.info("batch of %d", len(values))
        self._total += np.sum(values, axis=0)
        return np.tile(self._total, (len(values), 1))

    def client_done(self) -> None:
        with self._lock:
            self._done += 1
            if self._done == _NUM_CLIENTS.value:
                lp.stop()


class Client:
    def __init__(self, client_id: int, server) -> None:
        self._id, self._server = client_id, server

    def run(self) -> None:
        for x in range(self._id, self._id + _CALLS):
            self._server.compute([x, x + 1])
        logging.info("client %d done", self._id)
        self._server.client_done()


def make_program() -> lp.Program:
    program = lp.Program("batching")
    batch_size = _NUM_CLIENTS.value
    server = program.add_node(
        lp.CourierNode(Server, batch_size, courier_kwargs={"thread_pool_size": batch_size}), label="server")
    with program.group("clients"):
        for client_id in range(_NUM_CLIENTS.value):
            program.add_node(lp.CourierNode(Client, client_id, server))
    return program


def main(argv):
    if len(argv) > 1:
        raise app.UsageError("Too many command-line arguments.")
    lp.launch(make_program())


if __name__ == "__main__":
    app.run(main)
