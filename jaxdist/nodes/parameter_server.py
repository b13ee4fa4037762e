"""Versioned parameters: their owner publishes in its own process, everyone else pulls.

    learner = p.add_node(jd.CourierNode(Learner, ...))       # the owner: serves get()
    server = p.add_node(jd.CourierNode(jd.ParameterServer, source=learner))  # follows it
    actor:   variables = jd.VariableClient(server, refresh_every_seconds=1.0)
             act(variables.params); variables.update()   # once per step; never blocks

A version is the learner's step. `get(min_version)` sends the parameters only when the server
holds a newer version than the caller's, so an up-to-date actor costs the network a few bytes.

Nothing is pushed over the wire. Every node of a program holds the same token, so a served
`push` would let any of them (or anything that took a dead node's port) publish version 2**62
and freeze every actor's parameters. Instead only the process that computes the parameters
writes them (`VersionedParams.push`, in process), and a `ParameterServer` pulls from the one
address it was given, by long polls, so a new version reaches it as soon as it is published.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxdist.launch.restart import Restart

log = logging.getLogger(__name__)

MAX_WAIT = 60.0
"""Longest long-poll `get(..., wait=...)` honoured; each waiting call holds a server thread."""

RETRY_FIRST, RETRY_MAX = 0.05, 1.0
WARN_AFTER = 5.0
"""A `VariableClient`'s source away this long gets a warning; a shorter outage (a restart, or the
ordered stop, where the learner goes before the actors that fetch from it) only counts in `stats`."""
"""A `VariableClient`'s first and longest pause between fetches from a source that is away."""

FOLLOW_WAIT = 10.0
"""Seconds each of a following `ParameterServer`'s long polls may wait on its source."""


class VersionedParams:
    """The newest (version, params) in the owner's process; thread-safe. A learner holds one and
    serves its `get`; a `ParameterServer` holds one for what it follows.

    Versions only move forward under `push`: a version not newer than the held one is ignored
    (it returns False), so a late publish from a lagging thread cannot roll readers back.
    """

    def __init__(self, params: Any = None, version: int = 0, max_waiting: int = 8) -> None:
        """`max_waiting` long polls wait at once (keep it below the server's threads, 16 by
        default, so that other calls always find one); a long poll beyond them answers at once."""
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self._waiting = threading.BoundedSemaphore(max_waiting)
        self._changed = threading.Condition()
        self._params = params
        self._version = _check_version(version) if params is not None else -1
        self._counts = {"pushes": 0, "ignored_pushes": 0, "gets": 0, "transfers": 0}

    def push(self, params: Any, version: int, *, allow_older: bool = False) -> bool:
        """Hold `params` as `version`; False (and nothing changes) when `version` <= the held one,
        unless `allow_older` (a follower whose owner restarted from an older checkpoint)."""
        version = _check_version(version)
        if params is None:
            raise ValueError("push(params=None, ...): None means 'nothing newer' to get(); push real parameters")
        with self._changed:
            if version <= self._version and not (allow_older and version != self._version):
                self._counts["ignored_pushes"] += 1
                return False
            self._params, self._version = params, version
            self._counts["pushes"] += 1
            self._changed.notify_all()
        return True

    def get(self, min_version: int = -1, wait: float = 0.0) -> dict[str, Any]:
        """`{"version": v, "params": p}` when the held v > `min_version`, else params None.

        v is -1 while nothing was pushed. With `wait` > 0 (a long poll, at most `MAX_WAIT` s) the
        call returns as soon as a newer version arrives, or after `wait` seconds with params None;
        when `max_waiting` polls already wait, it answers at once instead (each waiting call
        holds a server thread).
        """
        min_version = _check_version(min_version)
        may_wait = wait > 0 and self._waiting.acquire(blocking=False)  # else: answer now, as wait=0
        try:
            with self._changed:
                if may_wait:
                    self._changed.wait_for(lambda: self._version > min_version, timeout=min(float(wait), MAX_WAIT))
                self._counts["gets"] += 1
                if self._version > min_version:
                    self._counts["transfers"] += 1
                    return {"version": self._version, "params": self._params}
                return {"version": self._version, "params": None}
        finally:
            if may_wait:
                self._waiting.release()

    def version(self) -> int:
        """The version held (-1 before the first push)."""
        with self._changed:
            return self._version

    def stats(self) -> dict[str, int]:
        """Calls so far: pushes, ignored_pushes, gets, transfers (gets that sent params)."""
        with self._changed:
            return dict(self._counts, version=self._version)


class ParameterServer:
    """Serves versioned parameters to many readers: fixed ones (`params`, `version`), or those of
    the `source` it follows (a learner or another parameter server, by handle). Serve it with
    `jd.CourierNode`; put a `CacherNode` in front of it for very many readers.

    Served: `get(min_version, wait)`, `version()`, `stats()`; no `push` (see the module doc).
    While the source is away the server keeps serving the version it holds; when the source
    comes back with an older version (a learner restored from an older checkpoint) the server
    follows it back, as actors do. A restarted server holds nothing until its first answer.
    """

    default_restart = Restart(max_restarts=10, backoff=0.5)  # it follows its source again

    def __init__(self, params: Any = None, version: int = 0, *, source: Any = None,
                 max_waiting: int = 8, follow_wait: float = FOLLOW_WAIT) -> None:
        if source is not None and params is not None:
            raise ValueError("ParameterServer takes fixed params or a source to follow, not both")
        self._held = VersionedParams(params, version, max_waiting)
        self._follower = None if source is None else VariableClient(
            source, long_poll=follow_wait, on_update=self._hold, call_timeout=follow_wait + 10.0)

    def get(self, min_version: int = -1, wait: float = 0.0) -> dict[str, Any]:
        """`{"version": v, "params": p}`: params only when v > `min_version` (the
        `VersionedParams.get` contract: `wait` long-polls, v is -1 while nothing is held)."""
        return self._held.get(min_version, wait)

    def version(self) -> int:
        """The version held (-1 before the first)."""
        return self._held.version()

    def stats(self) -> dict[str, Any]:
        """gets, transfers and the version held; `source`: the follower's fetches and errors."""
        counts = self._held.stats()
        served = {key: counts[key] for key in ("gets", "transfers", "version")}
        return served if self._follower is None else dict(served, source=self._follower.stats)

    def close(self) -> None:
        """Stop following (the node calls it at shutdown)."""
        if self._follower is not None:
            self._follower.close()

    def _hold(self, version: int, params: Any) -> None:
        self._held.push(params, version, allow_older=True)


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"a version is an int (the learner's step), got {type(version).__name__} {version!r}")
    return version


class VariableClient:
    """An actor's view of a `ParameterServer` (or a learner, or a `CacherNode` in front of either).

    `source` is anything with the server's `get(min_version)`: a courier client (a handle inside a
    node) or the server object itself. One background thread fetches: first as soon as the client
    is made, retrying until the server holds a version, then every `refresh_every_seconds`
    (its own clock) and/or on every `refresh_every_calls`-th `update()`; with neither given it
    refreshes every second. With `long_poll` > 0 it fetches back to back instead, each fetch
    waiting up to `long_poll` s on the source for a newer version (how a `ParameterServer`
    follows its owner). Reading `params` blocks only until the first fetch arrives;
    `on_update(version, params)` is called on the fetching thread with each new version.

    While the server is away, fetches fail in the background (counted in `stats`, logged once per
    outage that lasts WARN_AFTER s) and the client keeps its last parameters and version; when the server is back (on the
    same address, e.g. restarted by the launcher) the next refresh picks the new version up. If
    the server reports a version lower than the one held (it restarted from an older checkpoint),
    the client adopts the server's parameters: it follows the learner, not the highest number.
    """

    def __init__(
        self,
        source: Any,
        refresh_every_seconds: float | None = None,
        refresh_every_calls: int | None = None,
        *,
        first_fetch_timeout: float = 60.0,
        call_timeout: float = 10.0,
        long_poll: float = 0.0,
        on_update: Callable[[int, Any], None] | None = None,
    ) -> None:
        if refresh_every_seconds is None and refresh_every_calls is None:
            refresh_every_seconds = 1.0
        if refresh_every_seconds is not None and refresh_every_seconds <= 0:
            raise ValueError(f"refresh_every_seconds must be > 0, got {refresh_every_seconds}")
        if refresh_every_calls is not None and refresh_every_calls < 1:
            raise ValueError(f"refresh_every_calls must be >= 1, got {refresh_every_calls}")
        with_timeout = getattr(source, "with_timeout", None)
        self._source = with_timeout(call_timeout) if callable(with_timeout) else source
        self._every_seconds = refresh_every_seconds
        self._every_calls = refresh_every_calls
        self._long_poll = long_poll
        self._on_update = on_update
        self._first_fetch_timeout = first_fetch_timeout
        self._held: tuple[int, Any] = (-1, None)  # swapped as one tuple: version and params agree
        self._on_device: tuple[int, Any] = (-2, None)
        self._calls = 0
        self._due = threading.Event()
        self._closed = threading.Event()
        self._fetched = threading.Condition()
        self._counts = {"fetches": 0, "transfers": 0, "errors": 0}
        self._last_error: str | None = None
        self._failing = False
        self._failing_since = 0.0
        self._warned = False  # about this outage
        self._in_flight = False
        self._thread = threading.Thread(target=self._loop, name="variable-client", daemon=True)
        self._thread.start()

    @property
    def params(self) -> Any:
        """The newest parameters fetched; blocks (up to `first_fetch_timeout`) only for the first."""
        version, params = self._held
        if version >= 0:
            return params
        return self.latest()[1]

    @property
    def version(self) -> int:
        """The version of `params` (-1 before the first fetch)."""
        return self._held[0]

    def latest_on_device(self) -> tuple[int, Any]:
        """``latest()`` with the params moved to the default device once per version (what a
        jitted policy takes on every step)."""
        version, params = self.latest()
        if version != self._on_device[0]:
            import jax

            self._on_device = (version, jax.device_put(params))
        return self._on_device

    def latest(self) -> tuple[int, Any]:
        """(version, params) read together; blocks like `params` before the first fetch."""
        held = self._held
        if held[0] >= 0:
            return held
        with self._fetched:
            arrived = self._fetched.wait_for(
                lambda: self._held[0] >= 0 or self._closed.is_set(), timeout=self._first_fetch_timeout
            )
        if not arrived or self._held[0] < 0:
            reason = f"last error: {self._last_error}" if self._last_error else "the server holds no version yet"
            raise TimeoutError(
                f"VariableClient got no parameters within {self._first_fetch_timeout} s ({reason}); is the "
                f"learner pushing? raise first_fetch_timeout for slow starts"
            )
        return self._held

    def update(self) -> None:
        """Count one actor step; every `refresh_every_calls`-th call asks for a background refresh.

        Never blocks. Call it from one thread (the acting loop).
        """
        if self._every_calls is not None:
            self._calls += 1
            if self._calls >= self._every_calls:
                self._calls = 0
                self._due.set()

    def refresh(self, timeout: float | None = None) -> bool:
        """Ask for a fetch now and wait for it to finish; True when it completed within `timeout`."""
        with self._fetched:
            done = self._counts["fetches"] + self._counts["errors"]
            target = done + (2 if self._in_flight else 1)  # one in flight may predate this call
            self._due.set()
            return self._fetched.wait_for(
                lambda: self._counts["fetches"] + self._counts["errors"] >= target or self._closed.is_set(),
                timeout=timeout,
            ) and not self._closed.is_set()

    @property
    def stats(self) -> dict[str, Any]:
        """fetches (calls answered), transfers (answers with params), errors, last_error, version."""
        with self._fetched:
            return dict(self._counts, last_error=self._last_error, version=self._held[0])

    def close(self) -> None:
        """Stop refreshing (the source client is the caller's to close). A fetch in flight is not
        waited for: at a stop it hangs on a learner that has gone, for up to ``call_timeout``."""
        self._closed.set()
        self._due.set()
        with self._fetched:
            self._fetched.notify_all()

    def __enter__(self) -> "VariableClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # The background thread ------------------------------------------------------------------

    def _loop(self) -> None:
        retry = RETRY_FIRST
        while not self._closed.is_set():
            if self._held[0] >= 0 and not self._long_poll:  # refresh on the clock, or when asked
                self._due.wait(self._every_seconds)
                self._due.clear()
                if self._closed.is_set():
                    return
            if self._fetch():
                retry = RETRY_FIRST
                if self._long_poll:  # a poll the source answered at once (its waiting cap) cannot spin
                    self._closed.wait(RETRY_FIRST)
            else:  # the source is away or holds nothing yet: keep asking, backing off to 1 s
                self._due.wait(retry)
                self._due.clear()
                retry = min(RETRY_MAX, retry * 2)

    def _fetch(self) -> bool:
        """One refresh; True when the source answered and the client holds a version."""
        held_version = self._held[0]
        with self._fetched:
            self._in_flight = True
        try:
            reply = self._source.get(held_version, self._long_poll) if self._long_poll else self._source.get(held_version)
            if 0 <= reply["version"] < held_version:  # the server went back (an older checkpoint)
                reply = self._source.get(-1)
            version, params = _check_version(reply["version"]), reply["params"]
        except Exception as exc:  # the server is away: keep what we hold
            self._record_error(exc)
            return False
        with self._fetched:
            self._in_flight = False
            self._counts["fetches"] += 1
            if params is not None:
                self._held = (version, params)
                self._counts["transfers"] += 1
            if self._failing and self._warned:
                log.info("parameter server is back; holding version %d", self._held[0])
            self._failing = self._warned = False
            self._fetched.notify_all()
        if params is not None and self._on_update is not None:
            self._on_update(version, params)
        return self._held[0] >= 0

    def _record_error(self, exc: Exception) -> None:
        if self._closed.is_set():  # the source went away with the client: nothing to report
            return
        with self._fetched:
            self._in_flight = False
            self._counts["errors"] += 1
            self._last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if not self._failing:
                self._failing, self._failing_since = True, time.monotonic()
            away = time.monotonic() - self._failing_since
            warn = not self._warned and away >= WARN_AFTER
            self._warned = self._warned or warn
            self._fetched.notify_all()
        if warn:
            log.warning("parameter fetch failing for %.0f s (keeping version %d): %s", away, self._held[0],
                        self._last_error)
