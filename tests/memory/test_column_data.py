"""Public views of a table's values: column_data snapshots and NextNElementWrapper reads."""

from __future__ import annotations

import numpy as np
import pytest

from emote_core.errors import ConfigurationError, MemoryTableError, SchemaError
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, OnlyLastMapper, SyntheticDones
from emote_core.memory.storage import (
    BaseStorage,
    NextNElementWrapper,
    TagStorage,
    VirtualStorage,
)
from emote_core.memory.strategies import (
    CoverageBasedSampleStrategy,
    FifoEjectionStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import EpisodeState


def make_table(sampler=None, tag_dtype=np.float32, action_dtype=np.int32) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (2,), np.float32),
            Column("actions", (1,), action_dtype),
            TagColumn("goal", (), tag_dtype),
            VirtualColumn("next_obs", (2,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("last_obs", (2,), np.float32, "obs", OnlyLastMapper()),
            VirtualColumn("masks", (1,), np.float32, "actions", SyntheticDones.as_mask()),
        ],
        maxlen=100,
        sampler=sampler or UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="actions",
    )


def episode(identity: int, length: int) -> dict[str, np.ndarray]:
    obs = identity * 100 + np.arange((length + 1) * 2, dtype=np.float32).reshape(-1, 2)
    return {"obs": obs, "actions": np.arange(length).reshape(-1, 1), "goal": identity}


def test_column_data_gives_each_kind_of_column_per_episode_as_a_snapshot() -> None:
    table = make_table()
    table.add_sequence(7, episode(7, 3))
    table.add_sequence(-2, episode(-2, 2), end_state=EpisodeState.INTERRUPTED)
    obs = table.column_data("obs")
    assert isinstance(obs, BaseStorage) and list(obs) == [7, -2]
    np.testing.assert_array_equal(obs[7], episode(7, 3)["obs"])
    assert obs.shape == (2,) and obs.dtype == np.float32
    goal = table.column_data("goal")
    assert isinstance(goal, TagStorage) and goal[-2] == -2
    next_obs = table.column_data("next_obs")
    assert isinstance(next_obs, VirtualStorage) and not isinstance(next_obs, BaseStorage)
    np.testing.assert_array_equal(next_obs[7], obs[7][1:])
    np.testing.assert_array_equal(table.column_data("last_obs")[7], obs[7][3:])
    masks = table.column_data("masks")
    assert masks[7].ravel().tolist() == [1, 1, 0] and masks[-2].ravel().tolist() == [1, 1]
    obs[7][:] = -1  # a copy: the table keeps its values
    assert table.column_data("obs")[7][0, 0] == 700
    with pytest.raises(MemoryTableError, match="no column 'rewards'"):
        table.column_data("rewards")


def test_next_n_element_wrapper_reads_n_steps_ahead_and_refuses_past_the_end() -> None:
    table = make_table()
    table.add_sequence(1, episode(1, 5))
    obs = table.column_data("obs")  # 6 rows
    ahead = NextNElementWrapper.with_n(2)(obs, (2,), np.float32)[1]
    np.testing.assert_array_equal(ahead[0], obs[1][2])
    np.testing.assert_array_equal(ahead[1:4], obs[1][3:6])
    np.testing.assert_array_equal(ahead[:], obs[1][2:])
    next_one = NextNElementWrapper(obs, (2,), np.float32)[1]  # n=1 by default
    assert next_one[(1, 0)] == obs[1][2, 1]  # every index of a tuple is shifted, as upstream's
    for key in (4, slice(3, 5), slice(4, None), -1):
        with pytest.raises(IndexError):
            ahead[key]
    with pytest.raises(TypeError, match="integers, slices or tuples"):
        ahead[[0, 1]]
    with pytest.raises(ConfigurationError, match="non-negative integer"):
        NextNElementWrapper.with_n(-1)


def test_a_tag_takes_per_step_values_only_when_they_agree() -> None:
    table = make_table()
    table.add_sequence(1, {**episode(1, 2), "goal": [5.0, 5.0, 5.0]})
    assert table.column_data("goal")[1] == 5.0
    with pytest.raises(
        SchemaError, match=r"tag column 'goal' .* differ \(step 0: 5.0, step 2: 6.0\)"
    ):
        table.add_sequence(2, {**episode(2, 2), "goal": [5.0, 5.0, 6.0]})


def test_values_of_another_kind_are_cast_only_when_exact() -> None:
    table = make_table()
    table.add_sequence(1, {**episode(1, 2), "actions": np.array([[3.0], [1.0]])})
    assert table.column_data("actions")[1].dtype == np.int32
    assert table.column_data("actions")[1].ravel().tolist() == [3, 1]
    for bad in (0.5, np.nan, 1e20):
        with pytest.raises(SchemaError, match=r"float64 values that change .* int32"):
            table.add_sequence(2, {**episode(2, 2), "actions": np.array([[1.0], [bad]])})
    assert table.episode_count == 1


def test_draws_by_episode_counts_per_episode_id() -> None:
    table = make_table(sampler=CoverageBasedSampleStrategy(alpha=1.0))
    table.add_sequence(3, episode(3, 4))
    table.add_sequence(8, episode(8, 4))
    table.sample(50, 2)
    draws = table.sampler.draws_by_episode()
    assert sorted(draws) == [3, 8] and sum(draws.values()) == 50
