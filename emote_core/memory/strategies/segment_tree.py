"""Sum and min segment trees over a power-of-two number of leaves, updated and searched in batches.

The trees back prioritized sampling: the sum tree draws leaves in proportion to their values, the
min tree gives the smallest value for normalising importance weights. Every operation takes whole
arrays of leaves or queries and runs one set of numpy operations per tree level, never a Python
loop per item.

Layout: a binary heap in one array (node ``k`` has children ``2k`` and ``2k + 1``; leaf ``i`` is
node ``capacity + i``), cut off ``top_width`` nodes below the root. The top level is searched
flat — a cumulative sum over ``top_width`` values, cached until the next change — which saves the
levels above it, where binary descent costs as much per level as it does anywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from emote_core.errors import ConfigurationError, MemoryTableError

DEFAULT_TOP_WIDTH = 2048
"""Nodes of the flat top level; about where one more binary level costs as much as the flat scan."""


def _power_of_two(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigurationError(f"{name} must be a positive power of two; got {value!r}")
    value = int(value)
    if value & (value - 1):
        raise ConfigurationError(
            f"{name} must be a positive power of two; got {value} (next one: "
            f"{1 << value.bit_length()})"
        )
    return value


def next_power_of_two(value: int) -> int:
    """The smallest power of two that is at least ``value`` (and at least 1)."""
    return 1 if value <= 1 else 1 << (int(value) - 1).bit_length()


class SegmentTree:
    """Leaves combined pairwise by an associative, commutative operation, level by level.

    Use :class:`SumSegmentTree` or :class:`MinSegmentTree`.

    Args:
        capacity: Number of leaves, a power of two.
        top_width: Width of the flat top level, a power of two (capped at ``capacity``); 1 makes
            a classic binary tree with a single root.

    Raises:
        ConfigurationError: If ``capacity`` or ``top_width`` is not a positive power of two.
    """

    neutral: ClassVar[float]
    """The value of an empty leaf: 0 for sums, +inf for minimums."""
    _op: ClassVar[np.ufunc]

    def __init__(self, capacity: int, *, top_width: int = DEFAULT_TOP_WIDTH) -> None:
        self._top_limit = _power_of_two("top_width", top_width)
        self._allocate(_power_of_two("capacity", capacity))

    def _allocate(self, capacity: int) -> None:
        self._capacity = capacity
        self._top_width = min(self._top_limit, capacity)
        self._depth = capacity.bit_length() - self._top_width.bit_length()
        self._nodes = np.full(2 * capacity, self.neutral, dtype=np.float64)
        self._cached_top: np.ndarray | None = None

    @property
    def capacity(self) -> int:
        """Number of leaves."""
        return self._capacity

    @property
    def leaves(self) -> np.ndarray:
        """A read-only view of the leaf values."""
        view = self._nodes[self._capacity :]
        view.flags.writeable = False
        return view

    def __getitem__(self, indices: np.ndarray | int) -> np.ndarray:
        """The values of leaves ``indices``."""
        return self._nodes[np.asarray(indices) + self._capacity]

    def _top(self) -> np.ndarray:
        return self._nodes[self._top_width : 2 * self._top_width]

    def _changed(self) -> None:
        self._cached_top = None

    def update(self, indices: np.ndarray | Sequence[int], values: np.ndarray | float) -> None:
        """Sets leaves ``indices`` to ``values`` and updates their ancestors.

        A repeated index ends up with one of the values given for it, as with numpy assignment
        (in practice the last), and the tree always agrees with its leaves.

        Args:
            indices: Leaf indices, any shape (flattened), repeats allowed.
            values: One value per index, or a scalar for all of them.

        Raises:
            MemoryTableError: If an index is outside ``[0, capacity)``.
        """
        update_trees((self,), indices, values)

    def set_range(self, start: int, values: np.ndarray) -> None:
        """Sets the consecutive leaves ``start, start + 1, ...`` to ``values`` (slice updates).

        Raises:
            MemoryTableError: If the range does not lie within ``[0, capacity)``.
        """
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        stop = start + len(values)
        if start < 0 or stop > self._capacity:
            raise MemoryTableError(
                f"leaves {start}:{stop} lie outside the tree's {self._capacity} leaves; grow the "
                "tree first"
            )
        if len(values) == 0:
            return
        nodes, op = self._nodes, self._op
        low, high = start + self._capacity, stop - 1 + self._capacity
        nodes[low : high + 1] = values
        for _ in range(self._depth):
            low, high = low >> 1, high >> 1
            children = nodes[2 * low : 2 * high + 2]
            op(children[0::2], children[1::2], out=nodes[low : high + 1])
        self._changed()

    def clear(self) -> None:
        """Resets every leaf to :attr:`neutral`."""
        self._nodes.fill(self.neutral)
        self._changed()

    def grow(self, capacity: int) -> None:
        """Enlarges the tree to ``capacity`` leaves, keeping the values of the existing ones.

        Raises:
            ConfigurationError: If ``capacity`` is not a power of two at least the current one.
        """
        capacity = _power_of_two("capacity", capacity)
        if capacity < self._capacity:
            raise ConfigurationError(
                f"a segment tree only grows: asked for {capacity} leaves, it has {self._capacity}"
            )
        if capacity == self._capacity:
            return
        leaves = self._nodes[self._capacity :].copy()
        self._allocate(capacity)
        self.load(leaves)

    def load(self, leaves: np.ndarray) -> None:
        """Replaces all leaves (the first ``len(leaves)``; the rest become neutral) and rebuilds.

        Raises:
            MemoryTableError: If more values than leaves are given.
        """
        leaves = np.asarray(leaves, dtype=np.float64).reshape(-1)
        if len(leaves) > self._capacity:
            raise MemoryTableError(
                f"{len(leaves)} values do not fit the tree's {self._capacity} leaves; grow it first"
            )
        nodes, capacity = self._nodes, self._capacity
        nodes[capacity : capacity + len(leaves)] = leaves
        nodes[capacity + len(leaves) :] = self.neutral
        width = capacity
        while width > self._top_width:
            children = nodes[width : 2 * width]
            self._op(children[0::2], children[1::2], out=nodes[width // 2 : width])
            width //= 2
        self._changed()


class SumSegmentTree(SegmentTree):
    """A segment tree of sums: totals and draws in proportion to leaf values.

    Leaf values should be non-negative for :meth:`find_prefix_sum` to be meaningful.
    """

    neutral: ClassVar[float] = 0.0
    _op: ClassVar[np.ufunc] = np.add

    def _top_cumulative(self) -> np.ndarray:
        if self._cached_top is None:
            self._cached_top = np.cumsum(self._top())
        return self._cached_top

    def total(self) -> float:
        """The sum of all leaves."""
        return float(self._top_cumulative()[-1])

    def find_prefix_sum(self, prefixes: np.ndarray) -> np.ndarray:
        """For each prefix, the leaf ``i`` where the running sum of leaves passes it.

        That is ``sum(leaves[:i]) <= prefix < sum(leaves[:i + 1])``, so drawing prefixes
        uniformly in ``[0, total())`` draws leaves in proportion to their values. Leaves of value
        0 are skipped; a prefix at or past the total (or one that floating-point rounding pushes
        past its subtree's sum) can land on the last leaf of the subtree, whatever its value —
        callers that must never draw empty leaves check the result.

        Args:
            prefixes: Query values, any shape.

        Returns:
            Leaf indices (int64), same shape as ``prefixes``.
        """
        prefixes = np.asarray(prefixes, dtype=np.float64)
        shape = prefixes.shape
        prefixes = prefixes.reshape(-1)
        cumulative = self._top_cumulative()
        top = self._top()
        blocks = np.searchsorted(cumulative, prefixes, side="right")
        np.minimum(blocks, self._top_width - 1, out=blocks)
        # The prefix left within the chosen top node; clipped at 0 so that rounding never steers
        # it into a left subtree of zero mass.
        rest = np.maximum(prefixes - (cumulative[blocks] - top[blocks]), 0.0)
        nodes = blocks + self._top_width
        tree = self._nodes
        for _ in range(self._depth):
            nodes = nodes + nodes
            left = tree[nodes]
            right = rest >= left
            rest = rest - left * right
            nodes = nodes + right
        return (nodes - self._capacity).reshape(shape)


class MinSegmentTree(SegmentTree):
    """A segment tree of minimums; empty leaves hold +inf."""

    neutral: ClassVar[float] = float("inf")
    _op: ClassVar[np.ufunc] = np.minimum

    def min(self) -> float:
        """The smallest leaf value (+inf when every leaf is empty)."""
        if self._cached_top is None:
            self._cached_top = np.asarray(self._top().min())
        return float(self._cached_top)


def update_trees(
    trees: Sequence[SegmentTree], indices: np.ndarray | Sequence[int], values: np.ndarray | float
) -> None:
    """Sets the same leaves of several trees of equal shape to the same values, in one pass.

    The ancestor indices are computed once for all trees (a sum and a min tree of priorities are
    updated together). Each level costs a few numpy operations on ``len(indices)`` items.

    Raises:
        MemoryTableError: If an index is outside ``[0, capacity)``, or the trees differ in shape.
    """
    first = trees[0]
    capacity, depth = first._capacity, first._depth
    for tree in trees[1:]:
        if tree._capacity != capacity or tree._depth != depth:
            raise MemoryTableError(
                "trees updated together must have the same capacity and top width; got "
                f"{capacity}/{first._top_width} and {tree._capacity}/{tree._top_width}"
            )
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if len(indices) == 0:
        return
    values = np.broadcast_to(np.asarray(values, dtype=np.float64).reshape(-1), indices.shape)
    if indices.min() < 0 or indices.max() >= capacity:
        bad = indices[(indices < 0) | (indices >= capacity)][0]
        raise MemoryTableError(
            f"leaf index {int(bad)} is outside the tree's {capacity} leaves; grow the tree first"
        )
    nodes = indices + capacity
    carried = []
    for tree in trees:
        tree._nodes[nodes] = values
        # Read back: with repeated indices every copy now carries the value that was kept, so the
        # ancestors computed from them agree with each other.
        carried.append(tree._nodes[nodes])
        tree._changed()
    ones = np.ones_like(nodes)  # array operands: much faster than a scalar on small arrays
    for _ in range(depth):
        siblings = nodes ^ ones
        nodes = nodes >> ones
        for k, tree in enumerate(trees):
            combined = tree._op(carried[k], tree._nodes[siblings])
            tree._nodes[nodes] = combined
            carried[k] = combined


__all__ = [
    "DEFAULT_TOP_WIDTH",
    "MinSegmentTree",
    "SegmentTree",
    "SumSegmentTree",
    "next_power_of_two",
    "update_trees",
]
