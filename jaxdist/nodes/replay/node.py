"""ReplayNode: replay tables served over courier, with bounded waits and Orbax checkpoints.

    queue = p.add_node(jd.ReplayNode(jd.replay.Fifo(max_size=64)))            # table "default"
    replay = p.add_node(jd.ReplayNode({"onpolicy": Fifo(64), "offpolicy": Uniform(10_000)},
                                      checkpoint_every_seconds=60))

Served methods: ``insert(item, priority=None, table="default", timeout=None) -> key``,
``insert_many(items, priorities=None, table=..., timeout=None) -> keys`` (one call, atomic),
``insert_batch(batch, ...)`` (the same, items stacked along a leading axis),
``sample(batch_size, table=..., timeout=None, info=False) -> {"keys", "data", "probabilities",
"stacked"}`` (``stacked``: whether ``data`` is one pytree of stacked leaves, or a list of the items
when their signatures differ; with ``info``, also ``"info": {"priorities", "times_sampled",
"table_size"}``),
``update_priorities(keys, priorities, table=...)``, ``delete(keys, table=...) -> count``,
``reset(table=...)``, ``can_sample(n, table=...)``, ``can_insert(n, table=..., wait=..., hold=...)``,
``info(table=...)``, ``size(table=...)``, ``stats()`` (per table) and ``checkpoint() -> step``.
The inserts take a list of table names for ``table`` (and a ``{name: priorities}`` dict for
the priorities, or one value for all): the batch goes into every one of them atomically, and
the keys come back as ``{name: keys}``; the node's tables share one lock for this. Call them
through ``ReplayClient`` (``client.py``), which turns the node's "try again" answers into waits
as long as the caller asked for.

Tables travel as specs. A program holds the table objects it was given only as their class and
constructor arguments (``table.spec``): the node's process builds fresh tables from them (a live
table holds a lock and cannot be pickled), and launching a program twice never shares a table.
A table that was already used is refused, since its contents would not travel.

The server's threads are never all asleep. A table call that has to wait would hold one of the
courier server's threads, and with every thread waiting, the insert that would wake them could
not even be read: a deadlock that only a timeout ends. So:

- a call waits inside the node at most ``max_wait`` seconds (one slice); when the caller's
  timeout is longer (or None) and the slice ends unserved, the answer is a ``TimeoutError``
  starting with ``NOT_READY``, and the client asks again;
- at most ``max_waiting`` calls (fewer than ``thread_pool_size``) wait at once, counted by a
  semaphore; a call that finds no free waiting place does not wait at all: it proceeds if the
  table is ready now (a sample of a full queue, an insert into a table with room), else it is
  answered ``BUSY`` at once and the client backs off briefly before asking again.

Calls that can proceed never need a waiting place, so at least ``thread_pool_size -
max_waiting`` threads always serve them, however many callers are blocked.

Checkpoints (``<run_dir>/checkpoints/<node name>``, see ``checkpointing.py``) are taken every
``checkpoint_every_seconds`` and/or after every ``checkpoint_every_inserts`` inserts (by a
background thread, so no call waits for a save), when ``checkpoint()`` is called, and at
shutdown; a node that starts restores the latest complete one. An insert is *acknowledged* when
its call returned a key; every insert acknowledged before a checkpoint's snapshot was taken
(``checkpoint()`` returning proves it for all earlier acknowledgements) is in that checkpoint,
unless it had already been taken out of a Fifo or evicted. Items sampled from a Fifo after the
last checkpoint come back after a restore: on-policy data may be delivered twice across a crash,
never lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Mapping

import numpy as np

from jaxdist import courier
from jaxdist.launch import context
from jaxdist.launch.restart import Restart
from jaxdist.nodes.replay.client import BUSY, DEFAULT_TABLE, MAX_SERVER_WAIT, NOT_READY
from jaxdist.nodes.replay.tables import (Table, TableSpec, insert_rows_into, rows_of_batch, rows_of_item,
                                         rows_of_items)
from jaxdist.program import AddressTable, Executable, Handle, Node, NodeContext

log = logging.getLogger(__name__)

MAX_HOLD = 60.0
"""The longest ``can_insert(..., hold=...)`` a peer may ask for."""


class ReplayNode(Node):
    """Serves one table (named "default") or a dict of named tables; see the module docstring.

    ``checkpoint`` turns checkpointing on (restore at start, a save at shutdown and on
    ``checkpoint()``); it is on by default when an interval is given. ``registered_types`` are
    NamedTuple classes / dataclasses that items hold (or ``(class, codec name)`` pairs), registered
    with the courier codec in the node's process under the names the senders use.
    """

    def __init__(
        self,
        tables: Table | Mapping[str, Table],
        *,
        checkpoint: bool | None = None,
        checkpoint_every_seconds: float | None = None,
        checkpoint_every_inserts: int | None = None,
        keep_checkpoints: int = 2,
        thread_pool_size: int = 16,
        max_waiting: int | None = None,
        max_wait: float = 1.0,
        registered_types: tuple[type | tuple[type, str], ...] = (),
    ) -> None:
        if not isinstance(tables, Mapping):
            tables = {DEFAULT_TABLE: tables}
        if not tables:
            raise ValueError("ReplayNode needs at least one table, e.g. ReplayNode(jd.replay.Fifo(64))")
        self.specs: dict[str, TableSpec] = {name: _spec_of(name, table) for name, table in tables.items()}
        if checkpoint_every_seconds is not None and not checkpoint_every_seconds > 0:
            raise ValueError(f"checkpoint_every_seconds must be > 0, got {checkpoint_every_seconds!r}")
        if checkpoint_every_inserts is not None and not (
            isinstance(checkpoint_every_inserts, int) and checkpoint_every_inserts >= 1
        ):
            raise ValueError(f"checkpoint_every_inserts must be an int >= 1, got {checkpoint_every_inserts!r}")
        intervals = checkpoint_every_seconds is not None or checkpoint_every_inserts is not None
        if checkpoint is False and intervals:
            raise ValueError("checkpoint=False contradicts a checkpoint interval; drop one of them")
        self.checkpointing = bool(checkpoint) or intervals
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.checkpoint_every_inserts = checkpoint_every_inserts
        self.keep_checkpoints = keep_checkpoints
        if thread_pool_size < 2:
            raise ValueError(f"thread_pool_size must be >= 2 (one to wait, one to serve), got {thread_pool_size}")
        max_waiting = thread_pool_size // 2 if max_waiting is None else max_waiting
        if not 1 <= max_waiting < thread_pool_size:
            raise ValueError(f"max_waiting must be in [1, thread_pool_size={thread_pool_size}), got {max_waiting}: "
                             "some threads must stay free for the calls that wake the waiting ones")
        if not 0 < max_wait <= MAX_SERVER_WAIT:
            raise ValueError(f"max_wait must be in (0, {MAX_SERVER_WAIT}] seconds, got {max_wait!r}")
        self.thread_pool_size, self.max_waiting, self.max_wait = thread_pool_size, max_waiting, max_wait
        self.registered_types = tuple(registered_types)

    def default_label(self) -> str:
        return "replay"

    def default_restart(self) -> Restart:
        return Restart(max_restarts=10, backoff=1.0)  # it restores its last checkpoint

    def create_handle(self) -> Handle:
        return Handle(self)

    def executable(self, context: NodeContext) -> Executable:
        return _ReplayExecutable(self, context)

    def shipped_arguments(self) -> dict[str, Any]:
        return {"tables": self.specs, "registered_types": self.registered_types}

    def __repr__(self) -> str:
        tables = ", ".join(f"{name}: {spec.cls.__name__}" for name, spec in self.specs.items())
        return f"ReplayNode({self.name or '(not added)'}; {tables})"


def _spec_of(name: Any, table: Any) -> TableSpec:
    if not isinstance(name, str) or not name:
        raise ValueError(f"table names must be non-empty strings, got {name!r}")
    if not isinstance(table, Table):
        raise TypeError(f"table {name!r} must be a replay table (Fifo, Lifo, Uniform, Prioritized, MaxHeap, "
                        f"MinHeap), got {table!r}")
    stats = table.stats()
    if stats["inserts"] or stats["samples"] or stats["closed"]:
        raise ValueError(f"table {name!r} ({table!r}) has been used; a ReplayNode builds its tables afresh in its "
                         "own process (contents come from its checkpoints), so give it a new table")
    return table.spec


class _ReplayExecutable(Executable):
    def __init__(self, node: ReplayNode, context: NodeContext) -> None:
        self._node, self._context = node, context
        for entry in node.registered_types:
            cls, name = entry if isinstance(entry, tuple) else (entry, None)
            courier.register(cls, name)
        self._server: courier.Server | None = None
        self._tables: dict[str, Table] = {}
        self._saver: _Saver | None = None

    def bind(self) -> AddressTable:
        self._server = courier.Server(None, self._context.address_for(self._node.name), token=self._context.token,
                                      thread_pool_size=self._node.thread_pool_size).start()
        return {self._node.name: self._server.address}

    def construct(self, addresses: AddressTable, make_client: Callable[[str], Any]) -> None:
        node = self._node
        self._tables = {name: spec.build() for name, spec in node.specs.items()}
        first, *others = self._tables.values()
        first.share_lock(*others)  # so one insert can go into several tables atomically
        if node.checkpointing:
            from jaxdist.learning.layout import checkpoint_dir
            from jaxdist.nodes.replay.checkpointing import TableCheckpointer

            checkpointer = TableCheckpointer(checkpoint_dir(self._context.run_dir, node.name), node.keep_checkpoints)
            step = checkpointer.restore(self._tables)
            if step is not None:
                sizes = ", ".join(f"{name}: {table.size()}" for name, table in self._tables.items())
                print(f"replay node {node.name} restored checkpoint step {step} ({sizes})", flush=True)
            self._saver = _Saver(checkpointer, self._tables, node.checkpoint_every_seconds,
                                 node.checkpoint_every_inserts)
        service = _ReplayService(self._tables, node.max_waiting, node.max_wait, self._saver)
        self._server.attach(service)

    def shutdown(self) -> None:
        for table in self._tables.values():
            table.close()  # waiters wake now; nothing changes the tables after this
        if self._server is not None:
            self._server.stop(grace=0.5)
        if self._saver is not None:
            self._saver.close(final_save=True)


class _ReplayService:
    """The object the courier server serves: every public method is an RPC."""

    def __init__(self, tables: dict[str, Table], max_waiting: int, max_wait: float, saver: "_Saver | None") -> None:
        self._tables = tables
        self._max_waiting = max_waiting
        self._max_wait = max_wait
        self._waiting = threading.BoundedSemaphore(max_waiting)
        self._saver = saver
        self._answers = {name: {"busy_answers": 0, "not_ready_answers": 0} for name in tables}
        self._answers_lock = threading.Lock()

    def insert(self, item: Any, priority: Any = None, table: str | list[str] = DEFAULT_TABLE,
               timeout: float | None = None) -> int | dict[str, int]:
        keys = self._insert(rows_of_item(item), 1, self._per_table(priority, table, lambda p: [p]), table, timeout)
        return {name: int(k[0]) for name, k in keys.items()} if isinstance(keys, dict) else int(keys[0])

    def insert_many(self, items: list, priorities: Any = None, table: str | list[str] = DEFAULT_TABLE,
                    timeout: float | None = None) -> list[int] | dict[str, list[int]]:
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"insert_many takes a list of items, got {type(items).__name__}")
        return self._insert(rows_of_items(items), len(items), self._per_table(priorities, table), table, timeout,
                            as_lists=True)

    def insert_batch(self, batch: Any, priorities: Any = None, table: str | list[str] = DEFAULT_TABLE,
                     timeout: float | None = None) -> list[int] | dict[str, list[int]]:
        rows = rows_of_batch(batch)
        return self._insert(rows, len(rows[0].index), self._per_table(priorities, table), table, timeout,
                            as_lists=True)

    def sample(self, batch_size: int, table: str = DEFAULT_TABLE, timeout: float | None = None,
               info: bool = False) -> dict[str, Any]:
        """``{"keys", "data", "probabilities", "stacked"}``, and with ``info`` Reverb's sample info: ``"info":
        {"priorities", "times_sampled", "table_size"}`` (off by default: most learners need none of
        it, it costs 12 bytes a draw on the wire, and ranking repeated draws costs the table time)."""
        target = self._table(table)
        sample = self._bounded(table, lambda wait: target.sample(batch_size, wait, info), timeout)
        answer = {"keys": sample.keys, "data": sample.data, "probabilities": sample.probabilities,
                  "stacked": sample.stacked}
        if info:
            answer["info"] = sample.info._asdict()
        return answer

    def update_priorities(self, keys: Any, priorities: Any, table: str = DEFAULT_TABLE) -> None:
        self._table(table).update_priorities(np.asarray(keys), np.asarray(priorities))

    def delete(self, keys: Any, table: str = DEFAULT_TABLE) -> int:
        """Removes the items with these keys (those already gone are skipped); returns how many went."""
        return self._table(table).delete(np.asarray(keys))

    def reset(self, table: str = DEFAULT_TABLE) -> None:
        """Empties the table and zeroes its rate limiter's counts."""
        self._table(table).reset()

    def can_sample(self, n: int = 1, table: str = DEFAULT_TABLE) -> bool:
        return self._table(table).can_sample(n)

    def can_insert(self, n: int = 1, table: str = DEFAULT_TABLE, wait: float = 0.0, hold: float = 0.0) -> bool:
        """Whether an insert of n would proceed now, or within ``wait`` seconds (at most one wait
        slice, and only while a waiting place is free: else it answers at once); with ``hold``,
        a True answer keeps the room for the next inserts that long (see ``Table.can_insert``)."""
        if not hold <= MAX_HOLD:
            raise ValueError(f"hold must be at most {MAX_HOLD} s (room held longer starves the table's other "
                             f"producers), got {hold!r}")
        target = self._table(table)
        return self._bounded(table, lambda slice_: target.can_insert(n, slice_, hold), wait)

    def info(self, table: str = DEFAULT_TABLE) -> dict[str, Any]:
        return self._table(table).info()

    def size(self, table: str = DEFAULT_TABLE) -> int:
        return self._table(table).size()

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per table: its counters (``timeouts`` counts ended wait slices), kind, and ask-again answers."""
        with self._answers_lock:
            answers = {name: dict(counts) for name, counts in self._answers.items()}
        return {name: dict(table.stats(), kind=type(table).__name__, **answers[name])
                for name, table in self._tables.items()}

    def checkpoint(self) -> int:
        """Checkpoints every table now and returns the committed step."""
        if self._saver is None:
            raise RuntimeError("this replay node does not checkpoint; build it with ReplayNode(..., checkpoint=True) "
                               "or a checkpoint interval")
        return self._saver.save()

    def _insert(self, rows: list, n: int, priorities: list, table: str | list[str], timeout: float | None,
                as_lists: bool = False) -> Any:
        """One batch into one table, or into each of a list of tables atomically (a dict of keys)."""
        names = [table] if isinstance(table, str) else list(table)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"table must name a table or list distinct tables, got {table!r}")
        targets = [self._table(name) for name in names]
        keys = self._bounded(names[0], lambda wait: insert_rows_into(targets, rows, n, priorities, wait), timeout)
        self._inserted(n * len(names))
        keys = [k.tolist() for k in keys] if as_lists else keys
        return keys[0] if isinstance(table, str) else dict(zip(names, keys))

    @staticmethod
    def _per_table(priorities: Any, table: str | list[str], wrap: Callable[[Any], Any] = lambda p: p) -> list:
        """One priorities entry per named table: a dict names them (missing: the default), else all share it."""
        names = [table] if isinstance(table, str) else list(table)
        if not isinstance(priorities, dict):
            return [None if priorities is None else wrap(priorities)] * len(names)
        unknown = set(priorities) - set(names)
        if unknown:
            raise ValueError(f"priorities name tables {sorted(unknown)} that this insert does not go to ({names})")
        return [None if priorities.get(name) is None else wrap(priorities[name]) for name in names]

    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            raise KeyError(f"no table {name!r} in this replay node; its tables: {', '.join(self._tables)}")
        return table

    def _bounded(self, table: str, call: Callable[[float], Any], timeout: float | None) -> Any:
        """``call(wait)`` waiting at most one slice, and only while a waiting place is free."""
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
        final = timeout is not None and timeout <= self._max_wait  # the caller asked for no more than a slice
        if timeout == 0:
            return call(0.0)
        if not self._waiting.acquire(blocking=False):
            try:
                return call(0.0)
            except TimeoutError as exc:
                self._count(table, "busy_answers")
                raise TimeoutError(f"{BUSY}: {self._max_waiting} calls already wait in this node; {exc}") from None
        try:
            return call(self._max_wait if timeout is None else min(timeout, self._max_wait))
        except TimeoutError as exc:
            if final:
                raise
            self._count(table, "not_ready_answers")
            raise TimeoutError(f"{NOT_READY}: {exc}") from None
        finally:
            self._waiting.release()

    def _count(self, table: str, what: str) -> None:
        with self._answers_lock:
            self._answers[table][what] += 1

    def _inserted(self, count: int) -> None:
        if self._saver is not None:
            self._saver.inserted(count)


class _Saver:
    """Takes checkpoints: on request, and from a background thread on its intervals."""

    def __init__(self, checkpointer: Any, tables: dict[str, Table], every_seconds: float | None,
                 every_inserts: int | None) -> None:
        self._checkpointer = checkpointer
        self._tables = tables
        self._every_seconds, self._every_inserts = every_seconds, every_inserts
        self._save_lock = threading.Lock()  # one save at a time
        self._count_lock = threading.Lock()
        self._inserts_since = 0
        self._last_save = time.monotonic()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        if every_seconds is not None or every_inserts is not None:
            self._thread = threading.Thread(target=self._loop, name="replay-checkpoints", daemon=True)
            self._thread.start()

    def inserted(self, count: int) -> None:
        with self._count_lock:
            self._inserts_since += count
            due = self._every_inserts is not None and self._inserts_since >= self._every_inserts
        if due:
            self._wake.set()

    def save(self) -> int:
        with self._save_lock:
            with self._count_lock:
                self._inserts_since = 0  # inserts from here on may miss this snapshot
            step = self._checkpointer.save(self._tables)
            self._last_save = time.monotonic()
            return step

    def close(self, final_save: bool) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if final_save:
                with context.saving_checkpoint():
                    self.save()
        finally:
            self._checkpointer.close()

    def _loop(self) -> None:
        while True:
            wait = None
            if self._every_seconds is not None:
                wait = max(0.0, self._last_save + self._every_seconds - time.monotonic())
            self._wake.wait(wait)
            self._wake.clear()
            if self._stopping:
                return
            with self._count_lock:
                by_inserts = self._every_inserts is not None and self._inserts_since >= self._every_inserts
            by_time = self._every_seconds is not None and time.monotonic() - self._last_save >= self._every_seconds
            if by_inserts or by_time:
                try:
                    self.save()
                except Exception:  # the node keeps serving; the next interval tries again
                    log.exception("replay checkpoint in %s failed", self._checkpointer.directory)
                    self._last_save = time.monotonic()
