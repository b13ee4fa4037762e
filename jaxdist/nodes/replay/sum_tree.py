"""A proportional-priority sum-tree over a fixed number of slots, in NumPy.

Every operation is vectorised over a batch: updates walk the tree one level at a time for all
touched leaves together, and sampling descends one level at a time for all draws together.
Internal nodes are always recomputed as ``left + right`` (never adjusted by deltas), so no
rounding drift accumulates and the tree is a pure function of its leaves.
"""

from __future__ import annotations

import numpy as np


def last_write_wins(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drops all but the last occurrence of each index (NumPy leaves repeated writes unordered)."""
    unique, first_in_reversed = np.unique(indices[::-1], return_index=True)
    return unique, values[len(indices) - 1 - first_in_reversed]


def check_priorities(priorities: np.ndarray) -> np.ndarray:
    """Returns the priorities as float64, or raises naming the first one that is negative or not finite."""
    priorities = np.asarray(priorities, dtype=np.float64)
    bad = ~np.isfinite(priorities) | (priorities < 0)
    if bad.any():
        raise ValueError(f"priority must be finite and >= 0, got {float(priorities[bad][0])}")
    return priorities


class SumTree:
    """Leaves hold non-negative priorities; ``sample`` picks leaf i with probability p_i / total."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self._first_leaf = 1 << (self.capacity - 1).bit_length()  # leaves at [P, P + capacity)
        self._depth = self._first_leaf.bit_length() - 1
        self._nodes = np.zeros(2 * self._first_leaf, dtype=np.float64)  # node 1 is the root

    def set(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Sets leaf priorities; with repeated indices the last write wins."""
        indices = self._check_indices(indices)
        priorities = np.broadcast_to(check_priorities(priorities), indices.shape).ravel()
        indices = indices.ravel()
        if indices.size == 0:
            return
        leaves, values = last_write_wins(indices, priorities)
        nodes = leaves + self._first_leaf
        self._nodes[nodes] = values
        if nodes.size == 1:  # one leaf (every insert): scalar steps beat NumPy's per-call cost ~10x
            node = int(nodes[0]) // 2
            while node:
                self._nodes[node] = self._nodes[2 * node] + self._nodes[2 * node + 1]
                node //= 2
            return
        for _ in range(self._depth):  # a parent listed twice gets the same sum twice: no dedup needed
            nodes = nodes // 2
            self._nodes[nodes] = self._nodes[2 * nodes] + self._nodes[2 * nodes + 1]

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self._nodes[self._check_indices(indices) + self._first_leaf]

    def total(self) -> float:
        return float(self._nodes[1])

    def sample(self, uniforms: np.ndarray) -> np.ndarray:
        """Maps draws in [0, 1) to leaf indices by prefix-sum search over the tree.

        A draw never lands on a zero-priority leaf, even when rounding puts ``u * total`` at or
        past a boundary: the descent only enters subtrees whose sum is positive.
        """
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if ((uniforms < 0) | (uniforms >= 1)).any():
            raise ValueError("uniforms must lie in [0, 1)")
        if self.total() <= 0:
            raise ValueError("cannot sample: every priority is 0")
        targets = uniforms * self.total()
        nodes = np.ones(uniforms.shape, dtype=np.int64)
        for _ in range(self._depth):
            children = 2 * nodes
            left = self._nodes[children]
            go_right = (targets >= left) & (self._nodes[children + 1] > 0)
            targets -= left * go_right
            nodes = children + go_right
        return nodes - self._first_leaf

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        indices = np.asarray(indices)
        if indices.size and not np.issubdtype(indices.dtype, np.integer):
            raise TypeError(f"indices must be integers, got dtype {indices.dtype}")
        indices = indices.astype(np.int64, copy=False)
        if indices.size and (indices.min() < 0 or indices.max() >= self.capacity):
            raise IndexError(f"indices must lie in [0, {self.capacity}), got {indices.min()}..{indices.max()}")
        return indices
