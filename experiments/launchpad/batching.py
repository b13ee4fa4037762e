"""Central inference: clients' calls to one server method are batched into one call.

    python experiments/launchpad/batching.py [local_mt|local_mp]
"""

import sys

import numpy as np

import jaxdist.compat.launchpad as lp

NUM_CLIENTS = 3


class Server:
    def __init__(self, batch_size: int) -> None:
        self.total = np.zeros(2)
        self.compute = lp.batched_handler(batch_size=batch_size)(self.compute)

    def compute(self, values):
        print(f"batch of {len(values)}", flush=True)
        self.total += np.sum(values, axis=0)
        return np.tile(self.total, (len(values), 1))


class Client:
    def __init__(self, client_id: int, server) -> None:
        self._id, self._server = client_id, server

    def run(self) -> None:
        for x in range(self._id, self._id + 3):
            self._server.compute([x, x + 1])
        print(f"client {self._id} done", flush=True)


def make_program() -> lp.Program:
    program = lp.Program("batching")
    server = program.add_node(lp.CourierNode(Server, NUM_CLIENTS), label="server")
    with program.group("clients"):
        for client_id in range(NUM_CLIENTS):
            program.add_node(lp.CourierNode(Client, client_id, server))
    return program


if __name__ == "__main__":
    lp.launch(make_program(), launch_type=sys.argv[1] if len(sys.argv) > 1 else "local_mt")
