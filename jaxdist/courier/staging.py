"""What a server holds between the steps of a large transfer, and the bounds on it.

A request too large to travel inline is uploaded first and claimed by the call that follows; a
large answer is staged until its caller downloads it. The peer decides when, and whether, those
steps come, so each is bounded: the bytes uploads hold (`StagingArea`'s budget), the wait for
each chunk and the time a payload waits to be claimed (`Janitor`, one thread per server instead
of a timer per transfer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import grpc

T = TypeVar("T")
log = logging.getLogger(__name__)


class Busy(Exception):
    """Refused for now, for lack of room; the same request may succeed later."""


@dataclasses.dataclass
class _Entry:
    expires: float
    payload: object
    charged: int  # bytes of the budget it holds: an upload's size; 0 for the server's own answers


class StagingArea:
    """Payloads waiting for their one reader. Uploads count against `max_bytes` from the moment
    they are announced until they are claimed or expire; answers cost nothing new (they are views
    of the result) and only expire."""

    def __init__(self, ttl: float, max_bytes: int) -> None:
        self._ttl, self._max_bytes = ttl, max_bytes
        self._entries: dict[bytes, _Entry] = {}
        self._held = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def reserving(self, size: int) -> Iterator[Callable[[object], bytes]]:
        """Room for an upload of `size` bytes, yielding `stage(payload) -> id`; the room is given
        back on leaving unless the payload was staged. Raises Busy while the room is taken."""
        with self._lock:
            if self._held + size > self._max_bytes:
                raise Busy(f"this server holds {self._held} of its max_staged_bytes={self._max_bytes} "
                           f"in uploads not yet claimed; no room for {size} more")
            self._held += size
        staged = False

        def stage(payload: object) -> bytes:
            nonlocal staged
            staged = True
            return self._add(payload, size)

        try:
            yield stage
        finally:
            if not staged:
                with self._lock:
                    self._held -= size

    def put(self, payload: object) -> bytes:
        """Stage one of the server's own answers."""
        return self._add(payload, 0)

    def take(self, blob_id: bytes) -> object | None:
        with self._lock:
            entry = self._entries.pop(blob_id, None)
            if entry is None:
                return None
            self._held -= entry.charged
        return entry.payload

    def evict_expired(self) -> None:
        now = time.monotonic()
        with self._lock:
            for blob_id in [key for key, entry in self._entries.items() if entry.expires < now]:
                self._held -= self._entries.pop(blob_id).charged

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    def _add(self, payload: object, charged: int) -> bytes:
        blob_id = secrets.token_bytes(16)
        with self._lock:
            self._entries[blob_id] = _Entry(time.monotonic() + self._ttl, payload, charged)
        return blob_id


class Janitor:
    """Cuts off transfers whose peer has sent or read nothing for `chunk_timeout` seconds, and
    drops staged payloads nobody claimed in time: a stalled peer holds a thread for seconds, not
    for ever, and an abandoned payload holds memory no longer than its time to live. `chore`:
    anything else the server tidies on the same beat."""

    def __init__(self, staging: StagingArea, chunk_timeout: float, period: float,
                 chore: Callable[[], None] | None = None) -> None:
        self._staging, self._chunk_timeout, self._period = staging, chunk_timeout, period
        self._chore = chore
        self._active: dict[object, list] = {}  # key -> [context, time of the last chunk]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="courier-janitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def watch(self, context: grpc.ServicerContext, chunks: Iterable[T]) -> Iterator[T]:
        """`chunks` as they come (received, or sent and taken by the peer), each one a sign of life."""
        key, entry = object(), [context, time.monotonic()]
        with self._lock:
            self._active[key] = entry
        try:
            for chunk in chunks:
                entry[1] = time.monotonic()
                yield chunk
        finally:
            with self._lock:
                del self._active[key]

    def _run(self) -> None:
        while not self._stopped.wait(self._period):
            self._staging.evict_expired()
            cutoff = time.monotonic() - self._chunk_timeout
            with self._lock:
                stalled = [context for context, last in self._active.values() if last < cutoff]
            for context in stalled:
                context.cancel()
            if self._chore is not None:
                self._tidy()

    def _tidy(self) -> None:
        """The chore, which must not end the janitor: its cut-offs would stop with it."""
        try:
            self._chore()
        except Exception:  # noqa: BLE001 - logged; the next beat tries again
            log.exception("courier janitor: the periodic chore failed; the janitor goes on")
