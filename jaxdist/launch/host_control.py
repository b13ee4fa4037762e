"""A stop travels between hosts: each host's launcher serves ``stop`` on its control port, and
when its own program begins to stop (the user, SIGTERM, ``jd.stop()``, a failure) it tells the
other hosts, which stop too (and do not tell anyone again). A host whose own nodes have all
finished their work stops alone (the others may still have work), and says so: the others
then know that its control port going away is not a launcher that died (see
``multihost._check_peers``, which stops a host whose peer stops answering unannounced).

Without this, a host that stops leaves the others running: their learner processes wait in a
collective for peers that are gone, and their actors act for nothing.

The control ports also carry what the plan cannot fix in advance: the nodes that
``running.scale`` starts or removes on a host. Every host knows where the nodes placed at launch
serve (the plan gives every address), but a node added later binds a fresh port of its host;
its host tells the others where (``nodes_changed``), and tells them again when it is removed,
so host 0's monitor counts and polls the actors every host adds, and only while they run.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent import futures

from jaxdist import courier
from jaxdist.launch.running import WORK_DONE, Running
from jaxdist.program import AddressTable

PEER_PREFIX = "host "
TELL_TIMEOUT = 5.0


class _Control:
    """What other hosts may ask of this host's launcher."""

    def __init__(self, running: Running, host_index: int) -> None:
        self._running, self._host_index = running, host_index
        self.finished_hosts: set[int] = set()  # peers that finished their share and said so
        self.seen_hosts: set[int] = set()  # peers that called this host: they were up
        self.announce: Callable[[AddressTable, list[str]], None] = lambda joined, left: None
        """Tells the other hosts which nodes `scale` started here (where they serve) or removed."""

    def stop(self, reason: str, from_host: int) -> int:
        self._running.request_stop(f"{PEER_PREFIX}{from_host} stopped the program: {reason}")
        return self._host_index

    def finished(self, from_host: int) -> int:
        self.finished_hosts.add(int(from_host))
        return self._host_index

    def ping(self, from_host: int | None = None) -> int:
        if from_host is not None:
            self.seen_hosts.add(int(from_host))
        return self._host_index

    def nodes_changed(self, joined: AddressTable, left: list[str], from_host: int) -> int:
        self._running.peer_nodes_changed(dict(joined), list(left))
        return self._host_index


def serve(running: Running, host_index: int, controls: tuple[str, ...], bind_host: str | None,
          token: str | None) -> _Control:
    """Serve this host's control port and tell the other hosts when this host's stop begins
    (or, when its nodes finished their work, that it finished); returns what peers told it."""
    own = controls[host_index]
    port = own.rsplit(":", 1)[1]
    control = _Control(running, host_index)
    server = courier.Server(control, address=f"{bind_host or own.rsplit(':', 1)[0]}:{port}", token=token).start()
    peers = [address for index, address in enumerate(controls) if index != host_index]

    def tell_peers(reason: str) -> None:
        if reason == WORK_DONE:
            _tell(peers, token, lambda client: client.finished(host_index))
        elif not reason.startswith(PEER_PREFIX):  # a peer's stop was told by it
            _tell(peers, token, lambda client: client.stop(reason, host_index))
        threading.Thread(target=server.stop, kwargs={"grace": 1.0}, daemon=True).start()

    running.on_stop(tell_peers)
    control.announce = _Announcer(peers, token, host_index, running).announce
    return control


class _Announcer:
    """Tells each peer, in the order they happened, the nodes `scale` started or removed here:
    one thread per peer, whose client waits for a peer not up yet (it is told once it is), so
    neither `scale` nor the supervisor that reports a node bound ever waits on another host.
    This host's stop ends the telling."""

    def __init__(self, peers: list[str], token: str | None, host_index: int, running: Running) -> None:
        self._host_index = host_index
        self._peers = [(courier.Client(address, token=token, timeout=None), queue.SimpleQueue()) for address in peers]
        for client, pending in self._peers:
            threading.Thread(target=self._tell, args=(client, pending), name="jaxdist-announce", daemon=True).start()
        running.on_stop(self._end)

    def announce(self, joined: AddressTable, left: list[str]) -> None:
        for _, pending in self._peers:
            pending.put((dict(joined), list(left)))

    def _end(self, reason: str) -> None:
        for client, pending in self._peers:
            pending.put(None)
            client.close()

    def _tell(self, client: courier.Client, pending: queue.SimpleQueue) -> None:
        while (message := pending.get()) is not None:
            joined, left = message
            try:
                client.nodes_changed(joined, left, self._host_index)
            except (courier.CourierError, futures.CancelledError, ValueError):
                return  # this host's stop closed the client (ValueError: on a closed channel), or the peer is gone


def _tell(peers: list[str], token: str | None, call: Callable[[courier.Client], object]) -> None:
    """Best effort, all at once, each within TELL_TIMEOUT: a host that is down is already stopped."""
    def one(address: str) -> None:
        with courier.Client(address, token=token, timeout=TELL_TIMEOUT) as client:
            call(client)

    with futures.ThreadPoolExecutor(max(1, len(peers))) as pool:
        for address, outcome in zip(peers, [pool.submit(one, address) for address in peers]):
            try:
                outcome.result()
            except Exception as exc:  # noqa: BLE001 - reported, never raised: the stop goes on
                print(f"[launcher] could not tell the host at {address} to stop: {type(exc).__name__}", flush=True)
