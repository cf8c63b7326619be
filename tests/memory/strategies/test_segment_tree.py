"""Sum and min segment trees agree with brute-force numpy over any sequence of updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError, MemoryTableError
from emote_core.memory.strategies.segment_tree import (
    MinSegmentTree,
    SumSegmentTree,
    next_power_of_two,
    update_trees,
)

# Small integer leaf values keep every sum exact, so prefix searches can be compared exactly.
_values = st.integers(min_value=0, max_value=9).map(float)


@st.composite
def _update_batches(draw: st.DrawFn) -> tuple[int, int, list[tuple[list[int], list[float]]]]:
    capacity = 1 << draw(st.integers(min_value=0, max_value=7))
    top_width = 1 << draw(st.integers(min_value=0, max_value=8))
    batches = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        # Few distinct indices per batch, so repeats (siblings, equal indices) are common.
        indices = draw(
            st.lists(st.integers(min_value=0, max_value=capacity - 1), min_size=1, max_size=24)
        )
        values = draw(st.lists(_values, min_size=len(indices), max_size=len(indices)))
        batches.append((indices, values))
    return capacity, top_width, batches


def _assign_like_numpy(reference: np.ndarray, indices: list[int], values: list[float]) -> None:
    reference[np.asarray(indices)] = np.asarray(values)


def _check_sum_tree(tree: SumSegmentTree, reference: np.ndarray) -> None:
    np.testing.assert_array_equal(tree.leaves[: len(reference)], reference)
    assert tree.total() == reference.sum()
    total = int(reference.sum())
    if total == 0:
        return
    prefixes = np.arange(total) + 0.5  # one query inside every unit of mass
    expected = np.searchsorted(np.cumsum(reference), prefixes, side="right")
    found = tree.find_prefix_sum(prefixes)
    np.testing.assert_array_equal(found, expected)
    assert (reference[found] > 0).all()


@settings(max_examples=200, deadline=None)
@given(_update_batches())
def test_sum_tree_matches_brute_force_under_batched_updates(case) -> None:
    capacity, top_width, batches = case
    tree = SumSegmentTree(capacity, top_width=top_width)
    reference = np.zeros(capacity)
    for indices, values in batches:
        tree.update(np.asarray(indices), np.asarray(values))
        _assign_like_numpy(reference, indices, values)
        _check_sum_tree(tree, reference)


@settings(max_examples=200, deadline=None)
@given(_update_batches())
def test_min_tree_matches_brute_force_under_batched_updates(case) -> None:
    capacity, top_width, batches = case
    tree = MinSegmentTree(capacity, top_width=top_width)
    reference = np.full(capacity, np.inf)
    assert tree.min() == np.inf
    for indices, values in batches:
        tree.update(np.asarray(indices), np.asarray(values))
        _assign_like_numpy(reference, indices, values)
        np.testing.assert_array_equal(tree.leaves, reference)
        assert tree.min() == reference.min()


@settings(max_examples=100, deadline=None)
@given(_update_batches(), st.data())
def test_trees_updated_together_match_separate_brute_force(case, data: st.DataObject) -> None:
    capacity, top_width, batches = case
    sums = SumSegmentTree(capacity, top_width=top_width)
    mins = MinSegmentTree(capacity, top_width=top_width)
    sum_reference, min_reference = np.zeros(capacity), np.full(capacity, np.inf)
    for indices, values in batches:
        update_trees((sums, mins), indices, values)
        _assign_like_numpy(sum_reference, indices, values)
        _assign_like_numpy(min_reference, indices, values)
        start = data.draw(st.integers(min_value=0, max_value=capacity - 1))
        run = data.draw(st.lists(_values, max_size=capacity - start))
        sums.set_range(start, np.asarray(run))
        mins.set_range(start, np.asarray(run))
        sum_reference[start : start + len(run)] = run
        min_reference[start : start + len(run)] = run
        _check_sum_tree(sums, sum_reference)
        assert mins.min() == min_reference.min()


def test_repeated_indices_keep_one_value_and_the_tree_agrees_with_its_leaves() -> None:
    tree = SumSegmentTree(8, top_width=1)
    mins = MinSegmentTree(8, top_width=1)
    update_trees((tree, mins), [3, 3, 3, 2], [5.0, 1.0, 7.0, 2.0])
    kept = tree.leaves[3]
    assert kept in (5.0, 1.0, 7.0)
    assert kept == 7.0  # numpy assignment keeps the last value in practice
    assert tree.total() == kept + 2.0
    assert mins.min() == 2.0
    assert tree.find_prefix_sum(np.array([1.0, 2.5])).tolist() == [2, 3]


@settings(max_examples=50, deadline=None)
@given(
    st.integers(min_value=0, max_value=5),
    st.integers(min_value=0, max_value=4),
    st.lists(_values, min_size=1, max_size=32),
)
def test_grow_keeps_values(capacity_bits: int, extra_bits: int, values: list[float]) -> None:
    capacity = 1 << capacity_bits
    values = values[:capacity]
    sums, mins = SumSegmentTree(capacity, top_width=2), MinSegmentTree(capacity, top_width=2)
    sums.update(np.arange(len(values)), values)
    mins.update(np.arange(len(values)), values)
    sums.grow(capacity << extra_bits)
    mins.grow(capacity << extra_bits)
    assert sums.capacity == mins.capacity == capacity << extra_bits
    reference = np.zeros(sums.capacity)
    reference[: len(values)] = values
    _check_sum_tree(sums, reference)
    assert mins.min() == min(values)
    sums.update([sums.capacity - 1], [3.0])  # the new leaves work like the old ones
    reference[-1] = 3.0
    _check_sum_tree(sums, reference)


def test_large_tree_draws_in_proportion_to_values() -> None:
    rng = np.random.default_rng(0)
    tree = SumSegmentTree(1 << 16)  # default top width: flat top plus binary levels
    tree.update([10, 20_000, 65_535], [1.0, 3.0, 6.0])
    draws = tree.find_prefix_sum(rng.random(100_000) * tree.total())
    assert set(np.unique(draws).tolist()) == {10, 20_000, 65_535}
    shares = np.array([(draws == leaf).mean() for leaf in (10, 20_000, 65_535)])
    np.testing.assert_allclose(shares, [0.1, 0.3, 0.6], atol=0.01)


def test_clear_empties_the_tree() -> None:
    sums, mins = SumSegmentTree(16), MinSegmentTree(16)
    update_trees((sums, mins), [1, 2], [4.0, 5.0])
    sums.clear()
    mins.clear()
    assert sums.total() == 0.0
    assert mins.min() == np.inf


def test_leaves_view_is_read_only() -> None:
    tree = SumSegmentTree(4)
    with pytest.raises(ValueError):
        tree.leaves[0] = 1.0


@pytest.mark.parametrize("capacity", [0, 3, 12, -4])
def test_capacity_must_be_a_power_of_two(capacity: int) -> None:
    with pytest.raises(ConfigurationError, match="power of two"):
        SumSegmentTree(capacity)


def test_out_of_range_updates_and_shrinking_are_refused() -> None:
    tree = SumSegmentTree(8)
    with pytest.raises(MemoryTableError, match="leaf index 8"):
        tree.update([1, 8], [1.0, 1.0])
    with pytest.raises(MemoryTableError, match="outside"):
        tree.set_range(6, np.ones(3))
    with pytest.raises(ConfigurationError, match="only grows"):
        tree.grow(4)
    with pytest.raises(MemoryTableError, match="same capacity"):
        update_trees((tree, MinSegmentTree(16)), [0], [1.0])
    assert tree.total() == 0.0  # refused updates changed nothing


def test_next_power_of_two() -> None:
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 1000, 1024, 1025)] == [
        1,
        1,
        2,
        4,
        1024,
        1024,
        2048,
    ]
