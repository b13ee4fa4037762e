"""Orbax checkpoints of a replay node's tables: ``<run_dir>/checkpoints/<node name>/<step>``.

Each step holds two Orbax items: ``arrays`` (``StandardSave`` of every non-empty array: the
items' leaves per signature, their keys, times sampled and priorities, the slots' key history
and free order, the selector's state, RNG words) and ``meta`` (``JsonSave`` of the rest:
counters, table kinds, and each signature's structure). Saves are synchronous, so a step that ``save`` returned
is committed; a save cut short by SIGKILL leaves only Orbax's temporary directory, which is never
restored.

Why not ``jaxdist.learning.checkpoint.Checkpointer``: its ``restore`` needs a template of the exact
shapes, but a table's shapes (how many items are live, what an item looks like) are only known
from the checkpoint itself; and Orbax refuses zero-size arrays and empty trees (an empty table)
and gives tuples and NamedTuples back as lists and dicts. So this module saves the structure on
the side and restores without a template.

The structure is an *empty skeleton* of the items (their pytree with every leaf a zero-row array
of the right dtype and shape) encoded with the courier codec: restoring it rebuilds exactly the
container types the items had (dict, list, tuple, registered NamedTuples) and nothing else, by
the same whitelist as the wire, never by importing names or unpickling.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Any, Iterator

import numpy as np

from jaxdist.courier import codec

log = logging.getLogger(__name__)

_FORMAT = 2  # 2: items per signature, keys by slot, times sampled, deletes


class TableCheckpointer:
    """Saves and restores a dict of named tables; keeps the latest ``keep`` steps."""

    def __init__(self, directory: str | os.PathLike, keep: int = 2) -> None:
        import orbax.checkpoint as ocp  # heavy (imports JAX): only nodes that checkpoint pay for it

        self._ocp = ocp
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, tables: dict[str, Any]) -> int:
        """Snapshots every table and commits the snapshot as the next step, which it returns."""
        arrays, meta = to_checkpoint({name: table.state() for name, table in tables.items()},
                                     {name: type(table).__name__ for name, table in tables.items()})
        step = (self.latest_step() or 0) + 1
        ocp = self._ocp
        from jaxdist.learning.checkpoint import SAVES  # in turn with the learner's saves in the same process

        SAVES.save(self._manager, step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                               meta=ocp.args.JsonSave(meta)), force=True)
        self._manager.wait_until_finished()
        return step

    def restore(self, tables: dict[str, Any]) -> int | None:
        """Loads the latest step into ``tables`` (fresh ones); returns the step, or None if there is none."""
        step = self.latest_step()
        if step is None:
            return None
        ocp = self._ocp
        restored = self._manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(),
                                                                       meta=ocp.args.JsonRestore()))
        states, kinds = from_checkpoint(restored["arrays"], restored["meta"])
        for name, state in states.items():
            table = tables.get(name)
            if table is None:
                log.warning("checkpoint step %d in %s holds table %r, which this node no longer has; "
                            "its %d items are dropped", step, self.directory, name,
                            len(state["keys"]))
                continue
            if type(table).__name__ != kinds[name]:
                raise ValueError(f"checkpoint step {step} in {self.directory} holds table {name!r} as a "
                                 f"{kinds[name]}, but the node now builds a {type(table).__name__}; use another "
                                 "run_dir or table name")
            table.load_state(_upgraded(state, table) if "next_key" in state else state)
        return step

    def close(self) -> None:
        self._manager.close()


def to_checkpoint(states: dict[str, dict[str, Any]], kinds: dict[str, str]) -> tuple[dict, dict]:
    """Table snapshots (``table.state()``) as an Orbax array tree and a JSON document."""
    arrays: dict[str, dict[str, np.ndarray]] = {}
    meta: dict[str, Any] = {"format": _FORMAT, "tables": {}}
    for index, (name, state) in enumerate(states.items()):
        group = f"t{index}"  # table names may hold characters Orbax gives meaning to
        tree: dict[str, np.ndarray] = {}
        entry: dict[str, Any] = {"group": group, "kind": kinds[name], "values": {}, "arrays": {}, "groups": []}
        for key, value in state.items():
            if key == "groups":  # the items, one stack per signature
                entry["groups"] = [{"index": _save_array(f"g{i}_index", g["index"], tree),
                                    "items": _save_items(g["items"], tree, f"g{i}_")} for i, g in enumerate(value)]
            elif isinstance(value, np.ndarray):
                entry["arrays"][key] = _save_array(key, value, tree)
            else:
                entry["values"][key] = _plain(value)
        arrays[group] = tree
        meta["tables"][name] = entry
    return arrays, meta


def from_checkpoint(arrays: dict, meta: dict) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The inverse of ``to_checkpoint``: table snapshots ready for ``load_state``, and their kinds."""
    if meta.get("format") not in (1, _FORMAT):
        raise ValueError(f"replay checkpoint format {meta.get('format')!r} is not one this jaxdist reads (1, "
                         f"{_FORMAT}); restore it with the jaxdist that wrote it, or start afresh in a new run_dir")
    states, kinds = {}, {}
    for name, entry in meta["tables"].items():
        tree = arrays.get(entry["group"], {})
        state: dict[str, Any] = dict(entry["values"])
        for key, spec in entry["arrays"].items():
            state[key] = _load_array(spec, tree)
        if meta["format"] == 1:  # live keys [first, next), one signature; made whole by _upgraded
            first, state["next_key"] = (int(k) for k in tree["keys"])
            state["keys"] = np.arange(first, state["next_key"], dtype=np.int64)
            count = len(state["keys"])
            state["groups"] = [] if entry["items"] is None else [
                {"index": np.arange(count), "items": _load_items(entry["items"], tree, count)}]
        else:
            state["groups"] = []
            for group in entry["groups"]:
                index = _load_array(group["index"], tree)
                state["groups"].append({"index": index, "items": _load_items(group["items"], tree, len(index))})
        states[name], kinds[name] = state, entry["kind"]
    return states, kinds


def _upgraded(state: dict[str, Any], table: Any) -> dict[str, Any]:
    """A format-1 snapshot (written before tables had deletes) as ``load_state`` takes it now: its
    keys were consecutive, key k in slot ``k % max_size``, nothing sampled was counted."""
    size, keys, next_key = table.max_size, state["keys"], state["next_key"]
    fresh = table.state()
    slots = np.arange(size)
    upgraded = dict(fresh, priorities=np.ones(len(keys)))
    upgraded.update((k, v) for k, v in state.items() if k not in ("next_key", "counters"))
    upgraded.update(counters=dict(fresh["counters"], **state["counters"]),
                    since_reset={"inserts": state["counters"]["inserts"], "samples": state["counters"]["samples"]},
                    slot_keys=next_key - 1 - (next_key - 1 - slots) % size,  # the newest key each slot held
                    free=np.arange(next_key, next_key - len(keys) + size) % size,  # in the order they come next
                    times_sampled=np.zeros(len(keys), np.int64))
    return upgraded


def _save_array(name: str, array: np.ndarray, tree: dict[str, np.ndarray]) -> dict[str, Any]:
    """Orbax refuses zero-size arrays: those are kept as their shape and dtype alone."""
    array = np.asarray(array)
    if array.size:
        tree[name] = array
    return {"name": name, "shape": list(array.shape), "dtype": array.dtype.str}


def _load_array(spec: dict[str, Any], tree: dict) -> np.ndarray:
    if spec["name"] in tree:
        return np.asarray(tree[spec["name"]])
    return np.empty(spec["shape"], np.dtype(spec["dtype"]))


def _save_items(items: Any, tree: dict[str, np.ndarray], prefix: str) -> dict[str, Any]:
    leaves = list(_leaves(items))
    skeleton = _map_leaves(items, iter([np.empty((0, *leaf.shape[1:]), leaf.dtype) for leaf in leaves]))
    return {
        "skeleton": base64.b64encode(codec.encode(skeleton)).decode("ascii"),
        "leaves": [_save_array(f"{prefix}leaf_{i:05d}", leaf, tree) for i, leaf in enumerate(leaves)],
    }


def _load_items(entry: dict[str, Any], tree: dict, count: int) -> Any:
    skeleton = codec.decode(base64.b64decode(entry["skeleton"]))
    leaves = []
    for spec, empty in zip(entry["leaves"], _leaves(skeleton), strict=True):
        if spec["name"] not in tree:  # zero-size: the skeleton knows its dtype (bfloat16 too)
            leaves.append(np.empty((count, *empty.shape[1:]), empty.dtype))
            continue
        leaf = np.asarray(tree[spec["name"]])
        if leaf.shape != (count, *empty.shape[1:]) or leaf.dtype != empty.dtype:
            raise ValueError(f"checkpoint leaf {spec['name']} is {leaf.shape} {leaf.dtype}, not "
                             f"{(count, *empty.shape[1:])} {empty.dtype} as its skeleton says")
        leaves.append(leaf)
    return _map_leaves(skeleton, iter(leaves))


def _leaves(tree: Any) -> Iterator[np.ndarray]:
    """Leaves in the tables' order: dict keys sorted, sequences in order."""
    if isinstance(tree, dict):
        for key in sorted(tree):
            yield from _leaves(tree[key])
    elif isinstance(tree, (list, tuple)):
        for child in tree:
            yield from _leaves(child)
    else:
        yield np.asarray(tree)


def _map_leaves(tree: Any, leaves: Iterator[np.ndarray]) -> Any:
    """``tree`` with its leaves replaced, in ``_leaves`` order, by the next ones from ``leaves``."""
    if isinstance(tree, dict):
        return {key: _map_leaves(tree[key], leaves) for key in sorted(tree)}
    if isinstance(tree, (list, tuple)):
        children = [_map_leaves(child, leaves) for child in tree]
        if isinstance(tree, list):
            return children
        return type(tree)(*children) if hasattr(tree, "_fields") else tuple(children)
    return next(leaves)


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars become Python numbers, dicts recurse."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"a table snapshot holds {type(value).__name__} {value!r:.80}, which a checkpoint cannot hold")
