"""Coverage-based sampling: episodes drawn less than their share are favoured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import ConfigurationError, SamplingError
from emote_core.integrations.upstream import restore_table, store_table
from emote_core.memory.columns import Column
from emote_core.memory.strategies import (
    CoverageBasedSampleStrategy,
    FifoEjectionStrategy,
    SampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable

STEPS_PER_ID = 1000


def make_table(sampler: SampleStrategy, maxlen: int = 10_000, seed: int = 0) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (1,), np.float32),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
        ],
        maxlen=maxlen,
        sampler=sampler,
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=seed,
    )


def add_episode(table: ArrayMemoryTable, identity: int, length: int) -> None:
    obs = (identity * STEPS_PER_ID + np.arange(length + 1, dtype=np.float32)).reshape(-1, 1)
    table.add_sequence(
        identity, {"obs": obs, "actions": obs[:-1].copy(), "rewards": np.ones((length, 1))}
    )


def sample(table: ArrayMemoryTable, count: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    batch = table.sample(count, length)
    identities, offsets = table.last_sample_indices
    obs = batch["obs"].numpy().reshape(count, length).astype(np.int64)
    np.testing.assert_array_equal(
        obs, identities[:, None] * STEPS_PER_ID + offsets[:, None] + np.arange(length)
    )
    lengths = np.array([table.index.lengths[table.index.slot_of[int(i)]] for i in identities])
    assert (offsets + length <= lengths).all()
    return identities, offsets


def drawn(table: ArrayMemoryTable, sampler: CoverageBasedSampleStrategy, identity: int) -> int:
    return sampler.drawn(table.index.slot_of[identity])


def test_a_new_episode_is_favoured_after_heavy_sampling_of_the_old_ones() -> None:
    alpha = 0.5
    sampler = CoverageBasedSampleStrategy(alpha=alpha)
    table = make_table(sampler)
    for identity in range(10):
        add_episode(table, identity, 20)
    for _ in range(20):
        sample(table, 1_000, 1)
    add_episode(table, 10, 20)
    # Expected probabilities from the formula and the counts so far.
    draws = np.array([drawn(table, sampler, i) for i in range(11)])
    assert draws[10] == 0 and draws[:10].sum() == 20_000
    weights = 20 * (draws + 1.0) ** -alpha
    expected_share = weights[10] / weights.sum()  # about 0.8, against a length share of 1/11

    identities, _ = sample(table, 4_000, 1)
    share = (identities == 10).mean()
    assert abs(share - expected_share) < 0.03
    assert share > 4 / 11


def test_weights_count_windows_and_draws() -> None:
    sampler = CoverageBasedSampleStrategy(alpha=1.0)
    table = make_table(sampler)
    add_episode(table, 1, 12)  # 9 windows of 4
    add_episode(table, 2, 6)  # 3 windows of 4
    identities, _ = sample(table, 600, 4)
    assert drawn(table, sampler, 1) == (identities == 1).sum()
    assert drawn(table, sampler, 2) == (identities == 2).sum()
    # The first draw is uniform over windows: 9 to 3, not 12 to 6.
    assert abs((identities == 1).mean() - 0.75) < 0.05
    # Afterwards each episode's weight is windows / (drawn + 1), upstream's weighting.
    weights = np.array([9 / (drawn(table, sampler, 1) + 1), 3 / (drawn(table, sampler, 2) + 1)])
    identities, _ = sample(table, 20_000, 4)
    assert abs((identities == 1).mean() - weights[0] / weights.sum()) < 0.015


def test_alpha_zero_samples_exactly_like_uniform() -> None:
    coverage_table = make_table(CoverageBasedSampleStrategy(alpha=0.0))
    uniform_table = make_table(UniformSampleStrategy())
    for table in (coverage_table, uniform_table):
        add_episode(table, 1, 30)
        add_episode(table, 2, 10)
        add_episode(table, 3, 3)
    for _ in range(10):  # heavy sampling changes nothing with alpha = 0
        sample(coverage_table, 2_000, 1)
    for length, expected in ((1, [30, 10, 3]), (5, [26, 6, 0])):
        shares = []
        for table in (coverage_table, uniform_table):
            identities, _ = sample(table, 40_000, length)
            shares.append(np.bincount(identities, minlength=4)[1:] / 40_000)
        np.testing.assert_allclose(shares[0], np.array(expected) / sum(expected), atol=0.01)
        np.testing.assert_allclose(shares[0], shares[1], atol=0.015)


def test_offsets_are_uniform_within_the_chosen_episode() -> None:
    table = make_table(CoverageBasedSampleStrategy(alpha=2.0))
    add_episode(table, 1, 9)
    _, offsets = sample(table, 14_000, 3)
    counts = np.bincount(offsets, minlength=7)
    assert len(counts) == 7  # offsets 0..6 only
    assert np.abs(counts - 2_000).max() < 200


def test_short_episodes_are_never_drawn_and_empty_tables_refuse() -> None:
    table = make_table(CoverageBasedSampleStrategy())
    with pytest.raises(SamplingError, match="empty"):
        table.sample(3, 1)
    add_episode(table, 1, 2)
    with pytest.raises(SamplingError, match="window of 3"):
        table.sample(3, 3)
    add_episode(table, 2, 5)
    identities, _ = sample(table, 500, 3)
    assert set(identities.tolist()) == {2}


def test_an_episode_in_a_reused_slot_starts_uncovered() -> None:
    sampler = CoverageBasedSampleStrategy(alpha=1.0)
    table = make_table(sampler, maxlen=20)
    add_episode(table, 1, 10)
    add_episode(table, 2, 10)
    sample(table, 1_000, 1)
    add_episode(table, 3, 10)  # ejects 1; its slot is reused
    assert drawn(table, sampler, 3) == 0
    assert drawn(table, sampler, 2) > 0
    identities, _ = sample(table, 2_000, 1)
    assert (identities == 3).mean() > 0.6


def test_state_round_trips_through_json() -> None:
    sampler = CoverageBasedSampleStrategy(alpha=1.0)
    table = make_table(sampler)
    add_episode(table, -7, 10)
    add_episode(table, 2**50, 10)
    table.sample(300, 2)  # (observations cannot encode such large identities exactly)
    state = json.loads(json.dumps(sampler.state()))
    assert sum(state["drawn"].values()) == 300

    restored_sampler = CoverageBasedSampleStrategy(alpha=1.0)
    restored = make_table(restored_sampler)
    add_episode(restored, 5, 10)
    add_episode(restored, 2**50, 10)
    add_episode(restored, -7, 10)
    restored_sampler.load_state(state)
    assert restored_sampler.state()["drawn"] == {**state["drawn"], "5": 0}
    table.clear()
    assert sampler.state() == {"drawn": {}}


def test_draw_counts_survive_a_table_store_and_restore(tmp_path: Path) -> None:
    sampler = CoverageBasedSampleStrategy(alpha=1.0)
    table = make_table(sampler)
    add_episode(table, 1, 10)
    add_episode(table, 2, 4)
    sample(table, 100, 1)
    store_table(table, tmp_path / "memory.zip")

    restored_sampler = CoverageBasedSampleStrategy(alpha=1.0)
    restored = make_table(restored_sampler)
    restore_table(restored, tmp_path / "memory.zip")
    assert restored_sampler.state() == sampler.state()
    assert sum(sampler.state()["drawn"].values()) == 100


@pytest.mark.parametrize("alpha", [-0.5, float("inf"), "1"])
def test_invalid_alpha_is_refused(alpha: object) -> None:
    with pytest.raises(ConfigurationError, match="alpha"):
        CoverageBasedSampleStrategy(alpha=alpha)  # type: ignore[arg-type]
