"""EpisodeBatch: episodes joined column by column give back each episode's rows, join with other
batches in order, and sum each episode's rewards as one np.sum per episode would."""

from __future__ import annotations

import numpy as np
import pytest

from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.typing import EpisodeState

EXTRA = {"obs": 1, "actions": 0, "rewards": 0}


def records(lengths: list[int], first: int = 0, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    for k, length in enumerate(lengths):
        data = {
            "obs": rng.standard_normal((length + 1, 3)).astype(np.float32),
            "actions": rng.integers(0, 4, (length, 1)),
            "rewards": (rng.standard_normal(length) * 100).astype(np.float32),
        }
        state = EpisodeState.TERMINAL if k % 2 else EpisodeState.INTERRUPTED
        out.append((first + k, data, state))
    return out


def assert_records_equal(got: list[tuple], expected: list[tuple]) -> None:
    assert [(i, s) for i, _, s in got] == [(i, s) for i, _, s in expected]
    for (_, data, _), (_, reference, _) in zip(got, expected, strict=True):
        assert sorted(data) == sorted(reference)
        for name, rows in reference.items():
            assert data[name].dtype == rows.dtype
            np.testing.assert_array_equal(data[name], rows, err_msg=name)


def test_episodes_are_views_of_the_joined_rows_in_order() -> None:
    expected = records([5, 1, 12, 3])
    batch = EpisodeBatch.of(expected, EXTRA)
    assert len(batch) == 4 and batch.transitions == 21
    assert batch.columns["obs"].shape == (25, 3)  # one final observation per episode
    got = list(batch.episodes())
    assert_records_equal(got, expected)
    for _, data, _ in got:
        for name, rows in data.items():
            assert np.shares_memory(rows, batch.columns[name])
    assert batch.nbytes == sum(v.nbytes for _, data, _ in expected for v in data.values())


def test_an_empty_episode_keeps_its_final_observation_row() -> None:
    expected = records([2, 0, 4])
    batch = EpisodeBatch.of(expected, EXTRA)
    np.testing.assert_array_equal(batch.row_ends("obs"), [3, 4, 9])
    np.testing.assert_array_equal(batch.row_ends("actions"), [2, 2, 6])
    assert_records_equal(list(batch.episodes()), expected)
    np.testing.assert_array_equal(batch.returns("rewards")[1], 0.0)


@pytest.mark.parametrize("lengths", [[1], [7, 1, 300, 2], [0, 5, 0]])
def test_returns_are_float64_sums_per_episode(lengths: list[int]) -> None:
    expected = records(lengths, seed=3)
    batch = EpisodeBatch.of(expected, EXTRA)
    sums = [float(np.sum(data["rewards"], dtype=np.float64)) for _, data, _ in expected]
    np.testing.assert_allclose(batch.returns("rewards"), sums, rtol=1e-12)


def test_joined_batches_keep_every_episode_in_order() -> None:
    first, second = records([4, 2], first=10), records([1, 6, 3], first=12, seed=1)
    joined = EpisodeBatch.join([EpisodeBatch.of(first, EXTRA), EpisodeBatch.of(second, EXTRA)])
    assert_records_equal(list(joined.episodes()), first + second)
    single = EpisodeBatch.of(first, EXTRA)
    assert EpisodeBatch.join([single]) is single
