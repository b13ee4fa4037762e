"""Clients a node's handles become, kept so that stopping can cancel their calls in flight."""

from __future__ import annotations

import threading
from typing import Any

from jaxdist import courier
from jaxdist.program import AddressTable


class ClientPool:
    """`pool(node_name)` makes a courier client for that node; `close_all()` cancels their calls."""

    def __init__(self, addresses: AddressTable, token: str | None) -> None:
        self._addresses = addresses
        self._token = token
        self._clients: list[courier.Client] = []
        self._lock = threading.Lock()

    def __call__(self, node_name: str, **options: Any) -> courier.Client:
        address = self._addresses.get(node_name)
        if address is None:
            known = ", ".join(sorted(self._addresses)) or "(none)"
            raise KeyError(f"no node '{node_name}' serves in this program; serving nodes: {known}")
        client = courier.Client(address, token=self._token, local=True, **options)  # colocated: no RPC
        with self._lock:
            self._clients.append(client)
        return client

    def close_all(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
