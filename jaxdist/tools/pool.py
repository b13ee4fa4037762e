"""A pool of evaluators over courier clients, after Fiber's Pool: ``pool.map(method, tasks)``.

    pool = jd.Pool(evaluators)                       # clients, e.g. handles inside a node
    results = pool.map("evaluate", tasks)            # evaluator.evaluate(task) for each task

Every evaluator runs one task at a time, called with futures so that all of them work at once;
a free evaluator takes the next task. An evaluator whose call fails because it went away
(``UnavailableError``, a missed deadline, a cancelled call) is taken out and its task goes back
to the front of the queue for the others. The pool probes a lost evaluator every
``retry_interval`` seconds (a supervisor may restart it on the same address) and gives it tasks
again once it answers. Only when no evaluator has been reachable for ``unavailable_timeout``
seconds does a map raise :class:`EvaluatorsUnavailableError`. Any other exception of a task
(the remote method raised) is the caller's and is raised as it is.

The pool calls with ``client.failing_fast()``: a call to an evaluator that died between two
tasks fails at once instead of waiting for its restart, so its task goes to another. With
``backup_after`` set, an evaluator left idle at the end of a map runs a copy of a task that has
been running longer than that, and the first copy to finish counts (MapReduce's backup tasks):
a slow or hung evaluator then holds a map up by about ``backup_after``.

Tasks may therefore run more than once, and should be pure functions of their argument.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any

from jaxdist.courier.errors import DeadlineExceededError, UnavailableError

# Courier's own errors for a call that never got its answer; a remote method's exception is
# rebuilt as a builtin (a remote TimeoutError is not a DeadlineExceededError) and is not a loss.
_LOSSES = (UnavailableError, DeadlineExceededError, futures.CancelledError)


class EvaluatorsUnavailableError(UnavailableError):
    """No evaluator of the pool answered for longer than its ``unavailable_timeout``."""


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """Counts since the pool was made: tasks ``completed``; tasks ``requeued`` after their
    evaluator was lost and ``backups`` started for stragglers; evaluators ``lost`` and
    ``rejoined``; and how many are ``live`` now."""

    size: int
    live: int
    completed: int
    requeued: int
    backups: int
    lost: int
    rejoined: int


class _Evaluator:
    def __init__(self, client: Any, task_timeout: float | None, probe_timeout: float) -> None:
        self.name = getattr(client, "address", repr(client))
        self.calls = client.with_timeout(task_timeout).failing_fast()
        self.prober = client.with_timeout(probe_timeout)
        self.live = True
        self.busy = False
        self.next_probe = 0.0
        self.probe: futures.Future | None = None
        self.last_error = ""


@dataclasses.dataclass
class _Call:
    evaluator: _Evaluator
    index: int
    task: Any
    started: float


class Pool:
    """Keeps a group of courier evaluators busy with tasks; see the module docstring.

    ``task_timeout`` is each call's deadline (None: none; then only a connection loss takes an
    evaluator out). ``probe_timeout`` bounds one probe of a lost evaluator (a ``methods()``
    call). One map runs at a time; the pool does not close the clients it was given.
    """

    def __init__(self, clients: Sequence[Any], *, task_timeout: float | None = 60.0,
                 unavailable_timeout: float = 60.0, retry_interval: float = 1.0, probe_timeout: float = 1.0,
                 backup_after: float | None = None) -> None:
        if not clients:
            raise ValueError("a Pool needs at least one evaluator client")
        for client in clients:
            if not (callable(getattr(client, "with_timeout", None)) and callable(getattr(client, "failing_fast", None))):
                raise TypeError(f"Pool takes courier clients (with .futures, .with_timeout and .failing_fast), "
                                f"got {client!r}")
        self._evaluators = [_Evaluator(client, task_timeout, probe_timeout) for client in clients]
        self._unavailable_timeout = unavailable_timeout
        self._retry_interval = retry_interval
        self._backup_after = backup_after
        self._probes = futures.ThreadPoolExecutor(len(clients), thread_name_prefix="pool-probe")
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._running = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        self._gone_since: float | None = None

    def map(self, method: str, tasks: Iterable[Any]) -> list[Any]:
        """``[evaluator.method(task) for task in tasks]``, spread over the evaluators, in order."""
        tasks = list(tasks)
        results: list[Any] = [None] * len(tasks)
        for index, result in self._results(method, tasks):
            results[index] = result
        return results

    def imap_unordered(self, method: str, tasks: Iterable[Any]) -> Iterator[Any]:
        """The results of ``map`` as they arrive; a task that must be told apart carries its key."""
        for _, result in self._results(method, list(tasks)):
            yield result

    def stats(self) -> PoolStats:
        """Counts so far (see ``PoolStats``); safe to call while a map runs."""
        counts = self._counts
        return PoolStats(size=len(self._evaluators), live=sum(ev.live for ev in self._evaluators),
                         completed=counts["completed"], requeued=counts["requeued"], backups=counts["backups"],
                         lost=counts["lost"], rejoined=counts["rejoined"])

    def close(self) -> None:
        """Stop probing; the clients stay open (they belong to the caller)."""
        self._probes.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # The loop -------------------------------------------------------------------------------

    def _results(self, method: str, tasks: list[Any]) -> Iterator[tuple[int, Any]]:
        if not self._running.acquire(blocking=False):
            raise RuntimeError("this Pool is already running a map; run one at a time or make another Pool")
        try:
            yield from self._loop(method, tasks)
        finally:
            self._running.release()

    def _loop(self, method: str, tasks: list[Any]) -> Iterator[tuple[int, Any]]:
        pending = collections.deque(enumerate(tasks))
        in_flight: dict[futures.Future, _Call] = {}
        copies: collections.Counter = collections.Counter()  # calls in flight per task index
        finished: set[int] = set()
        events = self._events = queue.SimpleQueue()
        now = time.monotonic()
        for ev in self._evaluators:
            ev.busy, ev.next_probe = False, now  # a new map probes lost evaluators at once
        if not any(ev.live for ev in self._evaluators):
            self._gone_since = now
        while len(finished) < len(tasks):
            self._finish_probes()
            self._dispatch(method, pending, in_flight, copies, events)
            self._start_probes()
            self._raise_if_gone(len(finished), len(tasks))
            try:
                future = events.get(timeout=self._wait_time(in_flight, copies))
            except queue.Empty:
                continue
            call = in_flight.pop(future, None)
            if call is None:
                continue  # a probe's wake-up
            call.evaluator.busy = False
            copies[call.index] -= 1
            try:
                result = future.result()
            except _LOSSES as exc:
                self._lose(call.evaluator, exc)
                if call.index not in finished and not copies[call.index]:
                    pending.appendleft((call.index, call.task))
                    self._counts["requeued"] += 1
                continue
            except Exception:
                if call.index in finished:
                    continue  # a backup copy's failure, after the other copy's result
                raise
            if call.index not in finished:
                finished.add(call.index)
                self._counts["completed"] += 1
                yield call.index, result

    def _dispatch(self, method: str, pending: collections.deque, in_flight: dict[futures.Future, _Call],
                  copies: collections.Counter, events: queue.SimpleQueue) -> None:
        for ev in self._evaluators:
            if not ev.live or ev.busy:
                continue
            if pending:
                index, task = pending.popleft()
            else:
                straggler = self._straggler(ev, in_flight, copies)
                if straggler is None:
                    continue
                index, task = straggler.index, straggler.task
                self._counts["backups"] += 1
            future = getattr(ev.calls.futures, method)(task)
            ev.busy = True
            copies[index] += 1
            in_flight[future] = _Call(ev, index, task, time.monotonic())
            future.add_done_callback(events.put)

    def _straggler(self, ev: _Evaluator, in_flight: dict[futures.Future, _Call],
                   copies: collections.Counter) -> _Call | None:
        """The longest-running task that has no copy yet and is past ``backup_after``."""
        if self._backup_after is None:
            return None
        due = time.monotonic() - self._backup_after
        candidates = [call for call in in_flight.values()
                      if call.evaluator is not ev and copies[call.index] == 1 and call.started <= due]
        return min(candidates, key=lambda call: call.started, default=None)

    def _lose(self, ev: _Evaluator, exc: BaseException) -> None:
        ev.live, ev.last_error = False, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        ev.next_probe = time.monotonic() + self._retry_interval
        self._counts["lost"] += 1
        if not any(other.live for other in self._evaluators):
            self._gone_since = time.monotonic()

    def _start_probes(self) -> None:
        now = time.monotonic()
        for ev in self._evaluators:
            if not ev.live and ev.probe is None and now >= ev.next_probe:
                ev.probe = self._probes.submit(ev.prober.methods)
                ev.probe.add_done_callback(lambda _: self._events.put(None))

    def _finish_probes(self) -> None:
        for ev in self._evaluators:
            if ev.probe is None or not ev.probe.done():
                continue
            probe, ev.probe = ev.probe, None
            if probe.exception() is None:
                ev.live, self._gone_since = True, None
                self._counts["rejoined"] += 1
            else:
                ev.next_probe = time.monotonic() + self._retry_interval

    def _wait_time(self, in_flight: dict[futures.Future, _Call], copies: collections.Counter) -> float | None:
        """Until the next probe or backup is due (a slice at most while any evaluator is lost),
        else until a call ends."""
        now = time.monotonic()
        due = [ev.next_probe for ev in self._evaluators if not ev.live and ev.probe is None]
        if self._backup_after is not None and any(ev.live and not ev.busy for ev in self._evaluators):
            due += [call.started + self._backup_after for call in in_flight.values() if copies[call.index] == 1]
        if not due and all(ev.live for ev in self._evaluators):
            return None
        return min(1.0, max(0.0, min(due, default=now + 1.0) - now))

    def _raise_if_gone(self, done: int, total: int) -> None:
        if self._gone_since is None or time.monotonic() - self._gone_since <= self._unavailable_timeout:
            return
        reasons = "; ".join(f"{ev.name}: {ev.last_error or 'no answer'}" for ev in self._evaluators)
        raise EvaluatorsUnavailableError(
            f"none of the pool's {len(self._evaluators)} evaluators answered for {self._unavailable_timeout:g} s "
            f"({done} of {total} tasks done); last errors: {reasons}. Check that the evaluator nodes are "
            f"running (their logs say why they stopped), or raise Pool(unavailable_timeout=...)")
