"""Uniform sampling: length-weighted episodes, uniform offsets, windows inside episodes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.errors import SamplingError
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones
from emote_core.memory.strategies import (
    FifoEjectionStrategy,
    SampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable

STEPS_PER_ID = 1000  # observation value = identity * STEPS_PER_ID + step


def make_table(sampler: SampleStrategy, maxlen: int = 100_000, seed: int = 0) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (1,), np.float32),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (1,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
        ],
        maxlen=maxlen,
        sampler=sampler,
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=seed,
    )


def add_episode(table: ArrayMemoryTable, identity: int, length: int) -> None:
    """An episode whose observations encode (identity, step), so windows can be checked."""
    obs = (identity * STEPS_PER_ID + np.arange(length + 1, dtype=np.float32)).reshape(-1, 1)
    table.add_sequence(
        identity, {"obs": obs, "actions": obs[:-1].copy(), "rewards": np.ones((length, 1))}
    )


def check_windows(table: ArrayMemoryTable, batch: dict, count: int, length: int) -> None:
    """Every window is consecutive steps of one episode, matching the reported indices."""
    identities, offsets = table.last_sample_indices
    obs = batch["obs"].numpy().reshape(count, length).astype(np.int64)
    expected = identities[:, None] * STEPS_PER_ID + offsets[:, None] + np.arange(length)
    np.testing.assert_array_equal(obs, expected)
    np.testing.assert_array_equal(batch["next_obs"].numpy().reshape(count, length), obs + 1)
    lengths = np.array([table.index.lengths[table.index.slot_of[int(i)]] for i in identities])
    assert (offsets + length <= lengths).all()
    dones = batch["dones"].numpy().reshape(count, length).astype(bool)
    np.testing.assert_array_equal(
        dones, offsets[:, None] + np.arange(length) == lengths[:, None] - 1
    )


def test_single_steps_are_drawn_in_proportion_to_episode_length() -> None:
    table = make_table(UniformSampleStrategy())
    add_episode(table, 1, 30)
    add_episode(table, 2, 10)
    table.sample(40_000, 1)
    identities, _ = table.last_sample_indices
    ratio = (identities == 1).sum() / (identities == 2).sum()
    assert 2.85 < ratio < 3.15  # uniform over episodes would give 1


def test_windows_are_drawn_in_proportion_to_the_windows_an_episode_holds() -> None:
    table = make_table(UniformSampleStrategy())
    add_episode(table, 1, 30)
    add_episode(table, 2, 10)
    batch = table.sample(40_000, 5)
    check_windows(table, batch, 40_000, 5)
    identities, offsets = table.last_sample_indices
    assert abs((identities == 1).mean() - 26 / 32) < 0.01  # 26 windows against 6, not 30:10
    # Offsets are uniform over the windows of each episode.
    for identity, windows in ((1, 26), (2, 6)):
        counts = np.bincount(offsets[identities == identity], minlength=windows)
        assert len(counts) == windows
        expected = counts.sum() / windows
        assert np.abs(counts - expected).max() < 6 * np.sqrt(expected)


def test_episodes_shorter_than_the_window_are_never_sampled() -> None:
    table = make_table(UniformSampleStrategy())
    add_episode(table, 1, 3)
    add_episode(table, 2, 8)
    add_episode(table, 3, 4)
    batch = table.sample(5_000, 5)
    check_windows(table, batch, 5_000, 5)
    identities, offsets = table.last_sample_indices
    assert set(identities.tolist()) == {2}
    assert set(offsets.tolist()) == {0, 1, 2, 3}


def test_a_table_without_long_enough_episodes_refuses_to_sample() -> None:
    table = make_table(UniformSampleStrategy())
    with pytest.raises(SamplingError, match="empty"):
        table.sample(4, 1)
    add_episode(table, 1, 3)
    with pytest.raises(SamplingError, match="window of 4 transitions"):
        table.sample(4, 4)


def test_ejected_episodes_are_no_longer_sampled() -> None:
    table = make_table(UniformSampleStrategy(), maxlen=25)
    for identity in range(5):
        add_episode(table, identity, 10)
    batch = table.sample(2_000, 2)
    check_windows(table, batch, 2_000, 2)
    identities, _ = table.last_sample_indices
    assert set(identities.tolist()) == {3, 4}


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=8),
    sequence_length=st.integers(min_value=1, max_value=6),
    maxlen=st.integers(min_value=12, max_value=60),
)
def test_windows_never_cross_episodes(
    lengths: list[int], sequence_length: int, maxlen: int
) -> None:
    table = make_table(UniformSampleStrategy(), maxlen=maxlen)
    for identity, length in enumerate(lengths):
        add_episode(table, identity, length)
    held = table.index.lengths[table.index.live]
    if held.max() < sequence_length:
        with pytest.raises(SamplingError):
            table.sample(8, sequence_length)
        return
    batch = table.sample(64, sequence_length)
    check_windows(table, batch, 64, sequence_length)
