"""FIFO ejection (oldest episode first) and FIFO sampling (episodes in arrival order)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from emote_core.errors import MemoryTableError
from emote_core.memory.columns import Column
from emote_core.memory.strategies import (
    FifoEjectionStrategy,
    FifoSampleStrategy,
    SampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable

STEPS_PER_ID = 1000


def make_table(
    sampler: SampleStrategy, maxlen: int = 10_000, ejector: FifoEjectionStrategy | None = None
) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (1,), np.float32),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
        ],
        maxlen=maxlen,
        sampler=sampler,
        ejector=ejector or FifoEjectionStrategy(),
        length_key="rewards",
        seed=0,
    )


def add_episode(table: ArrayMemoryTable, identity: int, length: int) -> None:
    obs = (identity * STEPS_PER_ID + np.arange(length + 1, dtype=np.float32)).reshape(-1, 1)
    table.add_sequence(
        identity, {"obs": obs, "actions": obs[:-1].copy(), "rewards": np.ones((length, 1))}
    )


def sample_windows(table: ArrayMemoryTable, count: int, length: int) -> list[tuple[int, int]]:
    """Samples and returns (identity, offset) per window, checking the data is that window."""
    batch = table.sample(count, length)
    identities, offsets = table.last_sample_indices
    obs = batch["obs"].numpy().reshape(count, length).astype(np.int64)
    expected = identities[:, None] * STEPS_PER_ID + offsets[:, None] + np.arange(length)
    np.testing.assert_array_equal(obs, expected)  # consecutive steps of one episode
    return list(zip(identities.tolist(), offsets.tolist(), strict=True))


def held(table: ArrayMemoryTable) -> list[int]:
    return [identity for identity, _, _ in table.episodes()]


# Ejection.


def test_ejection_removes_the_oldest_episodes_first() -> None:
    table = make_table(UniformSampleStrategy(), maxlen=30)
    for identity, length in ((0, 10), (1, 5), (2, 10), (3, 5)):
        add_episode(table, identity, length)
    assert held(table) == [0, 1, 2, 3] and table.full()
    add_episode(table, 4, 12)  # needs 12 of 30: episodes 0 then 1 must go, not more
    assert held(table) == [2, 3, 4]
    assert table.size() == 27
    add_episode(table, 5, 3)
    assert held(table) == [2, 3, 4, 5]
    add_episode(table, 6, 30)  # a maximal episode ejects everything else
    assert held(table) == [6]


def test_ejection_state_round_trips_in_identities() -> None:
    ejector = FifoEjectionStrategy()
    table = make_table(UniformSampleStrategy(), maxlen=20, ejector=ejector)
    for identity in (7, -3, 12):
        add_episode(table, identity, 5)
    state = json.loads(json.dumps(ejector.state()))
    assert state == {"identities": [7, -3, 12]}

    restored_ejector = FifoEjectionStrategy()
    restored = make_table(UniformSampleStrategy(), maxlen=20, ejector=restored_ejector)
    for identity in (12, 7, -3):  # re-added in another order
        add_episode(restored, identity, 5)
    restored_ejector.load_state(state)
    add_episode(restored, 99, 10)  # must eject the saved order's oldest, 7 (not 12)
    assert sorted(held(restored)) == [-3, 12, 99]


def test_ejecting_from_an_empty_table_is_an_error() -> None:
    ejector = FifoEjectionStrategy()
    make_table(UniformSampleStrategy(), ejector=ejector)
    with pytest.raises(MemoryTableError, match="empty"):
        ejector.choose()


# Sampling.


def test_per_episode_sampling_serves_episodes_oldest_first_and_cycles() -> None:
    table = make_table(FifoSampleStrategy(per_episode=True, random_offset=False))
    for identity in (10, 11, 12):
        add_episode(table, identity, 5)
    assert sample_windows(table, 2, 1) == [(10, 0), (11, 0)]
    assert sample_windows(table, 2, 1) == [(12, 0), (10, 0)]
    assert sample_windows(table, 2, 1) == [(11, 0), (12, 0)]
    add_episode(table, 13, 5)  # a new episode joins the back of the queue
    assert sample_windows(table, 4, 1) == [(10, 0), (11, 0), (12, 0), (13, 0)]


def test_per_episode_sampling_skips_episodes_shorter_than_the_window() -> None:
    table = make_table(FifoSampleStrategy(per_episode=True, random_offset=False))
    for identity, length in ((1, 6), (2, 2), (3, 4), (4, 3)):
        add_episode(table, identity, length)
    windows = sample_windows(table, 4, 4)
    assert windows == [(1, 0), (3, 0), (1, 0), (3, 0)]


def test_random_offsets_cover_every_window_start_and_stay_inside_episodes() -> None:
    table = make_table(FifoSampleStrategy(per_episode=True, random_offset=True))
    add_episode(table, 1, 8)
    add_episode(table, 2, 5)
    seen: dict[int, set[int]] = {1: set(), 2: set()}
    for _ in range(200):
        for identity, offset in sample_windows(table, 2, 3):
            seen[identity].add(offset)
    assert seen == {1: set(range(6)), 2: set(range(3))}


def test_consecutive_windows_of_an_episode_come_before_the_next_episode() -> None:
    table = make_table(FifoSampleStrategy(per_episode=False))
    add_episode(table, 1, 10)  # windows of 3 start at 0..7: handed out at 0, 3, 6
    add_episode(table, 2, 7)
    assert sample_windows(table, 5, 3) == [(1, 0), (1, 3), (1, 6), (2, 0), (2, 3)]


def test_consecutive_windows_continue_across_samples() -> None:
    table = make_table(FifoSampleStrategy(per_episode=False))
    add_episode(table, 1, 10)
    add_episode(table, 2, 7)
    assert sample_windows(table, 4, 3) == [(1, 0), (1, 3), (1, 6), (2, 0)]
    assert sample_windows(table, 2, 3) == [(2, 3), (1, 0)]


def test_consecutive_windows_never_cross_episodes_across_samples() -> None:
    table = make_table(FifoSampleStrategy(per_episode=False))
    add_episode(table, 1, 6)
    add_episode(table, 2, 20)
    for _ in range(4):
        sample_windows(table, 2, 5)  # raises on a window that mixes two episodes


def test_fifo_sampling_state_round_trips() -> None:
    sampler = FifoSampleStrategy(per_episode=True, random_offset=False)
    table = make_table(sampler)
    for identity in (1, 2, 3):
        add_episode(table, identity, 4)
    sample_windows(table, 2, 1)  # serves 1 and 2; 3 is next
    state = json.loads(json.dumps(sampler.state()))

    restored_sampler = FifoSampleStrategy(per_episode=True, random_offset=False)
    restored = make_table(restored_sampler)
    for identity in (1, 2, 3):
        add_episode(restored, identity, 4)
    restored_sampler.load_state(state)
    assert sample_windows(restored, 3, 1) == [(3, 0), (1, 0), (2, 0)]
