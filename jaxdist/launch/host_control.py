"""A stop travels between hosts: each host's launcher serves ``stop`` on its control port, and
when its own program begins to stop (the user, SIGTERM, ``jd.stop()``, a failure) it tells the
other hosts, which stop too (and do not tell anyone again). A host whose own nodes have all
finished their work stops alone: the others may still have work.

Without this, a host that stops leaves the others running: their learner processes wait in a
collective for peers that are gone, and their actors act for nothing.
"""

from __future__ import annotations

import threading
from concurrent import futures

from jaxdist import courier
from jaxdist.launch.running import WORK_DONE, Running

PEER_PREFIX = "host "
TELL_TIMEOUT = 5.0


class _Control:
    """What other hosts may ask of this host's launcher."""

    def __init__(self, running: Running, host_index: int) -> None:
        self._running, self._host_index = running, host_index

    def stop(self, reason: str, from_host: int) -> int:
        self._running.request_stop(f"{PEER_PREFIX}{from_host} stopped the program: {reason}")
        return self._host_index

    def ping(self) -> int:
        return self._host_index


def serve(running: Running, host_index: int, controls: tuple[str, ...], bind_host: str | None,
          token: str | None) -> courier.Server:
    """Serve this host's control port and tell the other hosts when this host's stop begins."""
    own = controls[host_index]
    port = own.rsplit(":", 1)[1]
    server = courier.Server(_Control(running, host_index), address=f"{bind_host or own.rsplit(':', 1)[0]}:{port}",
                            token=token).start()
    peers = [address for index, address in enumerate(controls) if index != host_index]

    def tell_peers(reason: str) -> None:
        if not (reason.startswith(PEER_PREFIX) or reason == WORK_DONE):  # a peer's stop was told by it
            _tell(peers, reason, host_index, token)
        threading.Thread(target=server.stop, kwargs={"grace": 1.0}, daemon=True).start()

    running.on_stop(tell_peers)
    return server


def _tell(peers: list[str], reason: str, host_index: int, token: str | None) -> None:
    """Best effort, all at once, each within TELL_TIMEOUT: a host that is down is already stopped."""
    def one(address: str) -> None:
        with courier.Client(address, token=token, timeout=TELL_TIMEOUT) as client:
            client.stop(reason, host_index)

    with futures.ThreadPoolExecutor(max(1, len(peers))) as pool:
        for address, outcome in zip(peers, [pool.submit(one, address) for address in peers]):
            try:
                outcome.result()
            except Exception as exc:  # noqa: BLE001 - reported, never raised: the stop goes on
                print(f"[launcher] could not tell the host at {address} to stop: {type(exc).__name__}", flush=True)
