"""A courier peer in its own process, for the shared-memory crash tests and a client killed mid-call.

`python shm_peer.py server` serves `Store` and prints its address; it runs until killed.
`python shm_peer.py send ADDRESS MB` sends an MB-sized array to `keep`, prints "sent", and waits
to be killed (its request segment stays named after it).
`python shm_peer.py call ADDRESS TOKEN` calls `add(1, 2)` from four threads without end, prints
"calling" after its first answer, and runs until killed.
`python shm_peer.py hold ADDRESS MB` fetches an MB-sized answer through shared memory, holds it,
prints "held", and waits to be killed.
"""

import sys
import threading
import time

import numpy as np

from jaxdist import courier

TOKEN = "shm-peer-token"


class Store:
    def keep(self, value):
        self.kept = value
        return float(value[-1])

    def big(self, megabytes):
        return np.full(megabytes << 18, 7.0, np.float32)


def fetch_through_shared_memory(client: courier.Client, megabytes: int) -> np.ndarray:
    """The first large answer comes by the socket and has the client probe; later ones do not."""
    client.big(megabytes)
    deadline = time.monotonic() + 30
    while not client.shares_memory:
        if time.monotonic() > deadline:
            raise SystemExit("the client never linked shared memory")
        time.sleep(0.01)
    return client.big(megabytes)


def call_until_killed(client: courier.Client) -> None:
    def call() -> None:
        while True:
            client.add(1, 2)

    for _ in range(4):
        threading.Thread(target=call, daemon=True).start()
    client.add(1, 2)
    print("calling", flush=True)
    while True:
        time.sleep(60)


def main() -> None:
    if sys.argv[1] == "server":
        server = courier.Server(Store(), token=TOKEN).start()
        print(server.address, flush=True)
        while True:
            time.sleep(60)
    if sys.argv[1] == "call":
        call_until_killed(courier.Client(sys.argv[2], token=sys.argv[3], timeout=60))
    address, megabytes = sys.argv[2], int(sys.argv[3])
    client = courier.Client(address, token=TOKEN, timeout=60)
    if sys.argv[1] == "send":
        client.keep(np.ones(megabytes << 18, np.float32))
        print("sent", flush=True)
    else:
        held = fetch_through_shared_memory(client, megabytes)
        print("held", float(held[0]), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
