"""PackedBatch packs a batch exactly as a plain per-episode loop would: the same rows, returns and
checksums, whatever form each episode's arrays come in; a bad episode is still refused. A batch a
collector has joined packs the same, and one that does not fit is left to those checks."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

from emote_core.errors import SchemaError
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store.packing import PackedBatch, conform
from emote_core.stores.zarr_store.writer import store_columns
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (1,), np.dtype(np.int64)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ColumnSchema("level", "TagColumn", (2,), np.dtype(np.float32)),
]
COLUMNS = store_columns(SCHEMAS, None, "rewards", observation_like=["obs"])


def reference(episodes: list[tuple]) -> dict:
    """One episode at a time: each column conformed, its bytes checksummed, its rewards summed."""
    parts: dict[str, list[np.ndarray]] = {c.name: [] for c in COLUMNS}
    checksums, returns = [], []
    for identity, data, _ in episodes:
        length = len(data["rewards"])
        checksum = 0
        for column in COLUMNS:
            array = conform(identity, column, data[column.name], length)
            parts[column.name].append(array)
            checksum = zlib.crc32(memoryview(array).cast("B"), checksum)
        checksums.append(checksum)
        returns.append(float(np.sum(data["rewards"], dtype=np.float64)))
    return {
        "columns": {name: np.concatenate(arrays) for name, arrays in parts.items()},
        "checksums": np.array(checksums, dtype=np.uint32),
        "returns": np.array(returns),
        "lengths": np.array([len(e[1]["rewards"]) for e in episodes]),
    }


def mixed_episodes(reward_dtype: type) -> list[tuple]:
    """Episodes of 1 to 9,000 transitions whose arrays come as the store keeps them, as strided
    views, flat (N,) rewards, rewards of another dtype, lists, and tags as flat vectors."""
    rng = np.random.default_rng(7)
    episodes = []
    for identity, length in enumerate([1, 23, 9_000, 2, 64, 300, 17]):
        wide = rng.standard_normal((length + 1, 6)).astype(np.float32)
        obs = wide[:, ::2] if identity % 2 else np.ascontiguousarray(wide[:, :3])
        actions = rng.integers(0, 2, (length, 1))
        rewards = (rng.standard_normal(length) * 50).astype(reward_dtype)
        if identity % 3 == 0:
            rewards = rewards.reshape(-1, 1)
        level = rng.standard_normal(2).astype(np.float32)
        data = {
            "obs": obs,
            "actions": actions.tolist() if identity == 4 else actions,
            "rewards": rewards,
            "level": level if identity % 2 else level.reshape(1, 2),
        }
        end = EpisodeState.TERMINAL if identity % 2 else EpisodeState.INTERRUPTED
        episodes.append((100 + identity, data, end))
    return episodes


@pytest.mark.parametrize("reward_dtype", [np.float32, np.float64])
def test_a_packed_batch_equals_packing_one_episode_at_a_time(reward_dtype: type) -> None:
    episodes = mixed_episodes(reward_dtype)
    packed = PackedBatch(COLUMNS, "rewards", episodes)
    expected = reference(episodes)
    for name, rows in expected["columns"].items():
        assert packed.columns[name].dtype == rows.dtype, name
        np.testing.assert_array_equal(packed.columns[name], rows, err_msg=name)
    np.testing.assert_array_equal(packed.checksums, expected["checksums"])
    np.testing.assert_array_equal(packed.returns, expected["returns"])  # bit for bit
    np.testing.assert_array_equal(packed.lengths, expected["lengths"])
    np.testing.assert_array_equal(packed.identities, [e[0] for e in episodes])
    np.testing.assert_array_equal(packed.end_states, [int(e[2]) for e in episodes])
    np.testing.assert_array_equal(
        packed.step_offsets, np.cumsum(expected["lengths"]) - expected["lengths"]
    )


def test_a_bad_episode_anywhere_in_a_batch_is_refused_and_named() -> None:
    episodes = mixed_episodes(np.float32)
    short = dict(episodes[3][1], obs=episodes[3][1]["obs"][:-1])
    with pytest.raises(SchemaError, match="column 'obs' of episode 103 has shape"):
        PackedBatch(COLUMNS, "rewards", [*episodes[:3], (103, short, EpisodeState.TERMINAL)])
    floats = dict(episodes[2][1], actions=np.zeros((9_000, 1), np.float32))
    with pytest.raises(SchemaError, match="column 'actions' of episode 102 has dtype float32"):
        PackedBatch(COLUMNS, "rewards", [episodes[0], (102, floats, EpisodeState.TERMINAL)])
    missing = {k: v for k, v in episodes[1][1].items() if k != "level"}
    with pytest.raises(SchemaError, match="episode 101 has no 'level' column"):
        PackedBatch(COLUMNS, "rewards", [(101, missing, EpisodeState.TERMINAL)])
    with pytest.raises(SchemaError, match="episode 100 ends RUNNING"):
        PackedBatch(COLUMNS, "rewards", [(100, episodes[0][1], EpisodeState.RUNNING)])


STEP_COLUMNS = store_columns(SCHEMAS[:3], None, "rewards", observation_like=["obs"])
EXTRA_ROWS = {"obs": 1, "actions": 0, "rewards": 0}


def step_episodes() -> list[tuple]:
    """Episodes as a collector hands them out: every column as the store keeps it."""
    episodes = []
    for k, data, end in mixed_episodes(np.float32):
        rewards = np.ascontiguousarray(np.reshape(data["rewards"], (-1, 1)))
        episodes.append((k, {"obs": data["obs"], "actions": np.asarray(data["actions"]),
                             "rewards": rewards}, end))  # fmt: skip
    return episodes


@pytest.mark.parametrize("form", ["as stored", "flat rewards", "int32 actions", "float64 obs"])
def test_a_joined_batch_packs_as_its_episodes_would(form: str) -> None:
    episodes = step_episodes()
    for _, data, _ in episodes:
        if form == "flat rewards":
            data["rewards"] = data["rewards"].reshape(-1)
        elif form == "int32 actions":  # cast to the store's int64, as conform casts
            data["actions"] = data["actions"].astype(np.int32)
        elif form == "float64 obs":  # cast down (same kind), as conform casts
            data["obs"] = data["obs"].astype(np.float64)
    joined = PackedBatch.joined(STEP_COLUMNS, "rewards", EpisodeBatch.of(episodes, EXTRA_ROWS))
    expected = PackedBatch(STEP_COLUMNS, "rewards", episodes)
    assert joined is not None and len(joined) == len(episodes)
    for name, rows in expected.columns.items():
        assert joined.columns[name].dtype == rows.dtype, name
        np.testing.assert_array_equal(joined.columns[name], rows, err_msg=name)
    for field in ("checksums", "returns", "lengths", "identities", "end_states", "step_offsets"):
        np.testing.assert_array_equal(getattr(joined, field), getattr(expected, field), field)


def test_a_joined_batch_that_does_not_fit_is_left_to_the_episode_checks() -> None:
    batch = EpisodeBatch.of(step_episodes(), EXTRA_ROWS)

    def changed(**fields) -> EpisodeBatch:
        return dataclasses.replace(batch, **fields)

    columns = dict(batch.columns)
    assert PackedBatch.joined(STEP_COLUMNS, "rewards", batch) is not None
    assert PackedBatch.joined(COLUMNS, "rewards", batch) is None  # a tag column to fill
    unfit = [
        changed(columns={n: v for n, v in columns.items() if n != "actions"}),
        changed(columns=dict(columns, actions=columns["actions"].astype(np.float32))),
        changed(columns=dict(columns, obs=columns["obs"][:-1])),
        changed(columns=dict(columns, obs=np.zeros((len(columns["obs"]), 4), np.float32))),
        changed(extra_rows=dict(EXTRA_ROWS, obs=0)),
        changed(end_states=np.full(len(batch), int(EpisodeState.RUNNING), np.int8)),
    ]
    for bad in unfit:
        assert PackedBatch.joined(STEP_COLUMNS, "rewards", bad) is None
