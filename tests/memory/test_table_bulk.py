"""Filling an empty table in bulk: the table add_sequence builds, episode for episode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.errors import MemoryTableError, SchemaError
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.strategies import (
    CoverageBasedEjectionStrategy,
    CoverageBasedSampleStrategy,
    FifoEjectionStrategy,
    FifoSampleStrategy,
    PrioritizedSampleStrategy,
    UniformEjectionStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable
from emote_core.memory.table_bulk import block_starts
from emote_core.typing import EpisodeState
from emote_core.utils.arrays import PAGE_BYTES


def table(
    maxlen: int = 200,
    device: str = "cpu",
    sampler=UniformSampleStrategy,
    ejector=FifoEjectionStrategy,
) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (2,), np.float32),
            Column("rewards", (1,), np.float32),
            TagColumn("goal", (), np.int64),
            VirtualColumn("next_obs", (2,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=maxlen,
        sampler=sampler(),
        ejector=ejector(),
        length_key="rewards",
        device=device,
        seed=0,
    )


LENGTHS = [3, 1, 7, 2, 5]


def episode(j: int) -> dict[str, np.ndarray]:
    length = LENGTHS[j]
    obs = np.arange(2 * (length + 1), dtype=np.float32).reshape(-1, 2) + 100 * j
    rewards = np.full((length, 1), j, np.float32)
    return {"obs": obs, "rewards": rewards, "goal": np.int64(10 + j)}


def fill(target: ArrayMemoryTable) -> None:
    def write(destinations: dict[str, np.ndarray], starts: np.ndarray) -> None:
        for j, start in enumerate(starts.tolist()):
            data = episode(j)
            destinations["obs"][start : start + LENGTHS[j] + 1] = data["obs"]
            destinations["rewards"][start : start + LENGTHS[j]] = data["rewards"]

    target.fill_empty(
        identities=np.arange(40, 45),
        lengths=np.array(LENGTHS),
        terminal=np.array([True, False, True, True, False]),
        extra_rows={"obs": 1, "rewards": 0},
        tags={"goal": np.arange(10, 15)},
        write=write,
    )


def added(device: str = "cpu", maxlen: int = 200) -> ArrayMemoryTable:
    target = table(maxlen, device)
    for j in range(len(LENGTHS)):
        end = EpisodeState.TERMINAL if j in (0, 2, 3) else EpisodeState.INTERRUPTED
        target.add_sequence(40 + j, episode(j), end_state=end)
    return target


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)],
)
def test_a_filled_table_is_the_table_added_episode_by_episode(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    bulk, one_by_one = table(device=device), added(device)
    fill(bulk)
    assert (bulk.size(), bulk.episode_count) == (one_by_one.size(), one_by_one.episode_count)
    for (i, a, e), (j, b, f) in zip(bulk.episodes(), one_by_one.episodes(), strict=True):
        assert (i, e) == (j, f)
        for name in b:
            np.testing.assert_array_equal(a[name], b[name])
    a, b = bulk.sample(16, 1), one_by_one.sample(16, 1)
    for name in b:
        torch.testing.assert_close(a[name], b[name])
    for target in (bulk, one_by_one):  # and both go on alike: ejecting the oldest first
        target.add_sequence(99, {**episode(2), "rewards": np.zeros((190, 1), np.float32),
                                 "obs": np.zeros((191, 2), np.float32)})  # fmt: skip
    assert [i for i, _, _ in bulk.episodes()] == [i for i, _, _ in one_by_one.episodes()]


def test_a_block_larger_than_the_rows_allocated_grows_the_table():
    lengths = np.ones(150, dtype=np.int64)  # 300 rows for 150 transitions: past the headroom
    target = table(maxlen=150)

    def write(destinations: dict[str, np.ndarray], starts: np.ndarray) -> None:
        destinations["obs"][starts] = np.arange(150)[:, None]
        destinations["obs"][starts + 1] = -1
        destinations["rewards"][starts] = 1

    target.fill_empty(
        identities=np.arange(150), lengths=lengths, terminal=np.zeros(150, bool),
        extra_rows={"obs": 1, "rewards": 0}, tags={"goal": np.zeros(150, np.int64)}, write=write,
    )  # fmt: skip
    assert target.size() == 150 and target.full()
    assert [int(d["obs"][0, 0]) for _, d, _ in target.episodes()] == list(range(150))


def test_a_cpu_tables_rows_start_on_a_page_before_and_after_it_grows():
    # Loads copy file bytes into these rows: about twice as fast on a page boundary.
    def starts(target: ArrayMemoryTable) -> list[int]:
        return [array.host.ctypes.data % PAGE_BYTES for array in target._arrays.values()]

    target = table(maxlen=150)
    assert starts(target) == [0, 0]
    target.fill_empty(
        identities=np.arange(150), lengths=np.ones(150, dtype=np.int64),
        terminal=np.zeros(150, bool), extra_rows={"obs": 1, "rewards": 0},
        tags={"goal": np.zeros(150, np.int64)}, write=lambda destinations, at: None,
    )  # fmt: skip
    assert starts(target) == [0, 0]  # grown past its first allocation


def test_a_table_holding_episodes_is_refused_unchanged():
    target = added()
    with pytest.raises(MemoryTableError, match="empty table"):
        fill(target)
    assert target.episode_count == len(LENGTHS)


def test_a_writer_that_fails_leaves_the_table_empty_and_usable():
    target = table()

    def write(destinations: dict[str, np.ndarray], starts: np.ndarray) -> None:
        raise OSError("a chunk could not be read")

    with pytest.raises(OSError, match="chunk"):
        target.fill_empty(
            identities=np.arange(2), lengths=np.array([2, 2]), terminal=np.ones(2, bool),
            extra_rows={"obs": 1, "rewards": 0}, tags={"goal": np.zeros(2, np.int64)},
            write=write,
        )  # fmt: skip
    assert target.episode_count == 0 and target.size() == 0
    fill(target)
    assert target.episode_count == len(LENGTHS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"identities": np.array([1, 1, 2, 3, 4])}, "unique ids"),
        ({"lengths": np.array([3, 0, 7, 2, 5])}, "1 or more transitions"),
        ({"lengths": np.array([300, 1, 7, 2, 5])}, "at most maxlen"),
        ({"extra_rows": {"obs": 0, "rewards": 0}}, "virtual column 'next_obs'"),
        ({"extra_rows": {"obs": 1}}, "stored columns"),
        ({"tags": {}}, "tag columns"),
    ],
)
def test_a_block_breaking_the_tables_rules_is_refused_and_nothing_is_written(change, message):
    target = table()
    written = []
    arguments = {
        "identities": np.arange(5),
        "lengths": np.array(LENGTHS),
        "terminal": np.ones(5, bool),
        "extra_rows": {"obs": 1, "rewards": 0},
        "tags": {"goal": np.zeros(5, np.int64)},
        "write": lambda destinations, starts: written.append(starts),
    }
    with pytest.raises(SchemaError, match=message):
        target.fill_empty(**{**arguments, **change})
    assert not written and target.episode_count == 0


def test_block_starts_leave_one_row_after_each_episode():
    np.testing.assert_array_equal(block_starts(np.array([3, 1, 2])), [0, 4, 6])


@pytest.mark.parametrize(
    ("sampler", "ejector"),
    [
        (UniformSampleStrategy, FifoEjectionStrategy),
        (PrioritizedSampleStrategy, FifoEjectionStrategy),
        (CoverageBasedSampleStrategy, CoverageBasedEjectionStrategy),
        (FifoSampleStrategy, UniformEjectionStrategy),
    ],
)
def test_past_the_first_64_slots_the_filled_table_samples_as_the_added_one(sampler, ejector):
    count = 70  # more episodes than the episode index starts with slots for
    lengths = np.array([1 + j % 4 for j in range(count)])
    data = [
        {
            "obs": np.full((length + 1, 2), j, np.float32),
            "rewards": np.full((length, 1), j, np.float32),
            "goal": np.int64(j),
        }
        for j, length in enumerate(lengths.tolist())
    ]
    one_by_one = table(maxlen=1_000, sampler=sampler, ejector=ejector)
    for j in range(count):
        one_by_one.add_sequence(j, data[j], end_state=EpisodeState.INTERRUPTED)

    def write(destinations: dict[str, np.ndarray], starts: np.ndarray) -> None:
        for j, start in enumerate(starts.tolist()):
            destinations["obs"][start : start + lengths[j] + 1] = data[j]["obs"]
            destinations["rewards"][start : start + lengths[j]] = data[j]["rewards"]

    filled = table(maxlen=1_000, sampler=sampler, ejector=ejector)
    filled.fill_empty(
        identities=np.arange(count),
        lengths=lengths,
        terminal=np.zeros(count, dtype=bool),
        extra_rows={"obs": 1, "rewards": 0},
        tags={"goal": np.arange(count)},
        write=write,
    )
    for _ in range(3):  # the same seed draws the same episodes: slots handed out alike
        a, b = filled.sample(16, 1), one_by_one.sample(16, 1)
        np.testing.assert_array_equal(a["obs"], b["obs"])
        np.testing.assert_array_equal(a["goal"], b["goal"])
    longer = {"obs": np.zeros((301, 2), np.float32), "rewards": np.zeros((300, 1), np.float32)}
    for target in (filled, one_by_one):  # past maxlen: both strategies eject the same episodes
        target.add_sequence(1_000, {**longer, "goal": np.int64(0)}, end_state=EpisodeState.TERMINAL)
    assert [i for i, _, _ in filled.episodes()] == [i for i, _, _ in one_by_one.episodes()]
    a, b = filled.sample(16, 1), one_by_one.sample(16, 1)
    np.testing.assert_array_equal(a["obs"], b["obs"])
