"""Node classes for parameter server and cacher tests; a module so spawned processes import it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jaxdist as jd
from jaxdist.nodes.parameter_server import VariableClient, VersionedParams
from jaxdist.program import AddressTable, Executable, Handle, Node, NodeContext


class CountingTarget:
    """Counts the calls it serves; `value(x)` may take `delay` seconds to answer."""

    def __init__(self, delay: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self.delay = delay

    def value(self, x: Any = None) -> dict:
        with self._lock:
            self._calls += 1
            call = self._calls
        time.sleep(self.delay)
        return {"call": call, "x": x}

    def fail(self, key: str) -> None:
        with self._lock:
            self._calls += 1
        raise KeyError(key)

    def calls(self) -> int:
        with self._lock:
            return self._calls

    def set_delay(self, delay: float) -> None:
        self.delay = delay


class GatedParams(VersionedParams):
    """An owner's parameters served with `push` (as a learner stands in a test), whose `get` calls
    can be held until released (to prove that clients never wait on it), and that counts the `get`
    calls that began."""

    def __init__(self) -> None:
        super().__init__()
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._begun = 0

    def get(self, min_version: int = -1, wait: float = 0.0) -> dict:
        with self._lock:
            self._begun += 1
        self._open.wait()
        return super().get(min_version, wait)

    def gets_begun(self) -> int:
        with self._lock:
            return self._begun

    def hold_gets(self) -> None:
        self._open.clear()

    def release_gets(self) -> None:
        self._open.set()


class ExternalNode(Node):
    """A node served by a courier server outside the program (so a test can stop and restart it)."""

    def __init__(self, address: str) -> None:
        self.address = address

    def default_label(self) -> str:
        return "external"

    def create_handle(self) -> Handle:
        return Handle(self.name)

    def executable(self, context: NodeContext) -> Executable:
        return _ExternalExecutable(self.name, self.address)


class _ExternalExecutable(Executable):
    def __init__(self, name: str, address: str) -> None:
        self._name, self._address = name, address

    def bind(self) -> AddressTable:
        return {self._name: self._address}

    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        pass

    def shutdown(self) -> None:
        pass


def follow_params(source, until_version: int) -> None:
    """An actor's loop: act on `VariableClient` parameters until it holds `until_version`."""
    variables = VariableClient(source, refresh_every_seconds=0.05, first_fetch_timeout=60)
    while variables.version < until_version and not jd.stop_requested():
        variables.update()
        time.sleep(0.01)
    version, params = variables.latest()
    print(f"actor holds version {version} with weights {params['w'].tolist()}", flush=True)
    variables.close()
