"""Prioritized sampling: draws follow priorities, weights follow the formula, priorities follow
their episodes through ejection, reallocation and store/restore of the strategy state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError, SamplingError
from emote_core.integrations.upstream import restore_table, store_table
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper
from emote_core.memory.strategies import FifoEjectionStrategy, PrioritizedSampleStrategy
from emote_core.memory.table import IMPORTANCE_WEIGHTS_KEY, ArrayMemoryTable
from emote_core.schedules import LinearSchedule

STEPS_PER_ID = 1000
EPSILON = 1e-6


def make_table(
    sampler: PrioritizedSampleStrategy, maxlen: int = 10_000, seed: int = 0
) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (1,), np.float32),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (1,), np.float32, "obs", NextElementMapper()),
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


def set_priorities(table: ArrayMemoryTable, identity: int, priorities: list[float]) -> None:
    """Sets every transition's priority of one episode through the table's own API."""
    offsets = np.arange(len(priorities))
    table.sample_by_index(np.full(len(priorities), identity), offsets, 1)
    table.update_priorities(np.asarray(priorities))


def sample(table: ArrayMemoryTable, count: int, length: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Samples, checks every window is consecutive steps of one episode, returns the windows."""
    batch = table.sample(count, length)
    identities, offsets = table.last_sample_indices
    obs = batch["obs"].numpy().reshape(count, length).astype(np.int64)
    np.testing.assert_array_equal(
        obs, identities[:, None] * STEPS_PER_ID + offsets[:, None] + np.arange(length)
    )
    return identities, offsets, batch


def stored(sampler: PrioritizedSampleStrategy) -> dict[int, list[float]]:
    return {int(k): v for k, v in sampler.state()["priorities"].items()}


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_a_window_with_a_hundred_times_the_priority_is_drawn_at_the_expected_rate(
    alpha: float,
) -> None:
    table = make_table(PrioritizedSampleStrategy(alpha=alpha, epsilon=EPSILON))
    for identity in range(10):
        add_episode(table, identity, 10)
        set_priorities(table, identity, [1.0] * 10)
    set_priorities(table, 3, [1.0] * 4 + [100.0] + [1.0] * 5)
    identities, offsets, _ = sample(table, 20_000, 1)
    special = (identities == 3) & (offsets == 4)
    expected = 100.0**alpha / (100.0**alpha + 99.0)  # 100/199, 10/109, 1/100
    assert abs(special.mean() - expected) < 0.015
    # The other 99 windows share the rest evenly.
    others = np.bincount((identities * 10 + offsets)[~special], minlength=100)
    others = np.delete(others, 34)
    mean = others.mean()
    assert np.abs(others - mean).max() < 6 * np.sqrt(mean)


def test_importance_weights_follow_the_formula() -> None:
    alpha, beta = 0.6, 0.7
    table = make_table(PrioritizedSampleStrategy(alpha=alpha, beta=beta, epsilon=EPSILON))
    raw = {1: [0.5, 2.0, 3.0, 0.1], 2: [1.0, 4.0, 0.0, 2.5, 9.0, 1.0]}
    for identity, priorities in raw.items():
        add_episode(table, identity, len(priorities))
        set_priorities(table, identity, priorities)
    identities, offsets, batch = sample(table, 2_000, 1)
    # Brute force over all 10 windows: P(i) = p_i^alpha / sum, w = (N P(i))^-beta / max.
    keys = [(i, o) for i, p in raw.items() for o in range(len(p))]
    powered = np.array([(abs(raw[i][o]) + EPSILON) ** alpha for i, o in keys])
    probability = powered / powered.sum()
    weight = (len(keys) * probability) ** -beta
    weight /= weight.max()
    lookup = {key: w for key, w in zip(keys, weight, strict=True)}
    expected = np.array(
        [lookup[(int(i), int(o))] for i, o in zip(identities, offsets, strict=True)]
    )
    got = batch[IMPORTANCE_WEIGHTS_KEY]
    assert got.dtype == torch.float32 and got.shape == (2_000, 1)
    np.testing.assert_allclose(got.numpy()[:, 0], expected, rtol=1e-5)
    # And the draws follow P(i).
    counts = np.array(
        [np.sum((identities == i) & (offsets == o)) for i, o in keys], dtype=np.float64
    )
    np.testing.assert_allclose(counts / counts.sum(), probability, atol=0.03)


def test_weights_are_repeated_over_the_steps_of_a_window() -> None:
    table = make_table(PrioritizedSampleStrategy(alpha=1.0, beta=1.0, epsilon=EPSILON))
    add_episode(table, 1, 6)
    set_priorities(table, 1, [1.0, 2.0, 4.0, 8.0, 8.0, 8.0])
    _, offsets, batch = sample(table, 6_000, 3)
    weights = batch[IMPORTANCE_WEIGHTS_KEY].numpy().reshape(6_000, 3)
    assert (weights == weights[:, :1]).all()
    # Only offsets 0..3 start windows of 3, drawn 1:2:4:8; the min over all stored priorities
    # is 1.
    shares = np.bincount(offsets, minlength=4) / 6_000
    np.testing.assert_allclose(shares, np.array([1, 2, 4, 8]) / 15, atol=0.02)
    np.testing.assert_allclose(
        weights[:, 0], 1.0 / np.array([1.0, 2.0, 4.0, 8.0])[offsets], rtol=1e-5
    )


def test_beta_may_be_a_schedule_read_at_every_sample() -> None:
    schedule = LinearSchedule(0.0, 1.0, 4)
    table = make_table(PrioritizedSampleStrategy(alpha=1.0, beta=schedule, epsilon=EPSILON))
    add_episode(table, 1, 2)
    set_priorities(table, 1, [1.0, 4.0])
    for step in range(5):
        beta = schedule.value
        assert beta == min(step / 4, 1.0)
        _, offsets, batch = sample(table, 200, 1)
        expected = np.array([1.0, 4.0**-beta])[offsets]
        np.testing.assert_allclose(batch[IMPORTANCE_WEIGHTS_KEY].numpy()[:, 0], expected, rtol=1e-6)
        schedule.step()


def test_new_episodes_start_at_the_largest_priority_so_far() -> None:
    sampler = PrioritizedSampleStrategy(alpha=0.5, epsilon=EPSILON)
    table = make_table(sampler)
    add_episode(table, 1, 3)
    assert stored(sampler)[1] == [1.0, 1.0, 1.0]  # nothing seen yet
    set_priorities(table, 1, [16.0, 1.0, 0.25])
    add_episode(table, 2, 2)
    np.testing.assert_allclose(stored(sampler)[2], [(16.0 + EPSILON) ** 0.5] * 2)


def test_initial_priority_is_given_to_every_new_episode() -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, epsilon=EPSILON, initial_priority=3.0)
    table = make_table(sampler)
    add_episode(table, 1, 2)
    set_priorities(table, 1, [50.0, 50.0])
    add_episode(table, 2, 2)
    np.testing.assert_allclose(stored(sampler)[2], [3.0 + EPSILON] * 2)


@pytest.mark.parametrize("tail_priority", [1.0, 1e6])
def test_windows_never_start_too_close_to_the_end_of_an_episode(tail_priority: float) -> None:
    """With tails of huge priority, rejection gives up and the exact masked draw is used."""
    table = make_table(PrioritizedSampleStrategy(alpha=1.0, epsilon=EPSILON))
    add_episode(table, 1, 10)
    add_episode(table, 2, 3)  # shorter than the window: never drawn
    add_episode(table, 3, 5)
    set_priorities(table, 1, [1.0] * 7 + [tail_priority] * 3)
    set_priorities(table, 2, [tail_priority] * 3)
    set_priorities(table, 3, [1.0, 1.0] + [tail_priority] * 3)
    identities, offsets, _ = sample(table, 9_000, 4)
    windows = identities * 10 + offsets
    counts = np.bincount(windows, minlength=40)
    valid = [10 + o for o in range(7)] + [30, 31]
    assert counts[valid].sum() == 9_000  # nothing else was ever drawn
    assert np.abs(counts[valid] - 1_000).max() < 150  # and the valid ones evenly


def test_priorities_follow_their_episode_when_others_are_ejected() -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, beta=1.0, epsilon=EPSILON)
    table = make_table(sampler, maxlen=30)
    for identity in range(3):
        add_episode(table, identity, 10)
    set_priorities(table, 0, [50.0] * 10)
    set_priorities(table, 2, [float(k + 1) for k in range(10)])
    add_episode(table, 3, 10)  # ejects 0, whose rows are reused later
    add_episode(table, 4, 10)  # ejects 1
    priorities = stored(sampler)
    assert sorted(priorities) == [2, 3, 4]
    np.testing.assert_allclose(priorities[2], np.arange(1, 11) + EPSILON)
    np.testing.assert_allclose(priorities[3], [50.0 + EPSILON] * 10)  # the max so far
    check_weights_match_episodes(table, sampler)


def check_weights_match_episodes(table: ArrayMemoryTable, sampler: PrioritizedSampleStrategy):
    """Each drawn window's weight is computed from the priority stored for that very window."""
    priorities = stored(sampler)
    smallest = min(min(p) for p in priorities.values())
    identities, offsets, batch = sample(table, 3_000, 1)
    expected = [
        smallest / priorities[int(i)][int(o)] for i, o in zip(identities, offsets, strict=True)
    ]
    beta = sampler.current_beta()
    np.testing.assert_allclose(
        batch[IMPORTANCE_WEIGHTS_KEY].numpy()[:, 0], np.asarray(expected) ** beta, rtol=1e-5
    )


def test_priorities_follow_their_episodes_through_a_reallocation() -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, beta=1.0, epsilon=EPSILON)
    table = make_table(sampler, maxlen=30)
    for identity in range(9):  # the ring wraps: the newest episode sits before the older ones
        add_episode(table, identity, 10)
    for identity in (6, 7, 8):
        set_priorities(table, identity, [identity * 10.0 + k + 1 for k in range(10)])
    before = stored(sampler)
    starts_before = {i: int(table.index.starts[table.index.slot_of[i]]) for i in (6, 7, 8)}

    table.resize(60)  # reallocates, packing the held episodes at the start, oldest first
    starts_after = {i: int(table.index.starts[table.index.slot_of[i]]) for i in (6, 7, 8)}
    assert starts_after != starts_before  # the episodes really moved
    assert stored(sampler) == before
    check_weights_match_episodes(table, sampler)

    add_episode(table, 9, 10)  # lands on fresh rows; gets the largest priority, 90
    np.testing.assert_allclose(stored(sampler)[9], [90.0 + EPSILON] * 10)
    set_priorities(table, 7, [1.0] * 3 + [1e5] + [1.0] * 6)
    identities, offsets, _ = sample(table, 2_000, 1)
    assert ((identities == 7) & (offsets == 3)).mean() > 0.9

    table.resize(20)  # shrinking ejects 6 and 7 and moves the rest again
    assert sorted(stored(sampler)) == [8, 9]
    np.testing.assert_allclose(stored(sampler)[8], before[8])
    check_weights_match_episodes(table, sampler)


@settings(max_examples=40, deadline=None)
@given(
    operations=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(min_value=1, max_value=12)),
            st.tuples(st.just("sample"), st.integers(min_value=1, max_value=5)),
            st.tuples(st.just("resize"), st.integers(min_value=12, max_value=80)),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_adds_ejections_and_reallocations_keep_windows_and_priorities_consistent(
    operations: list[tuple[str, int]],
) -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, beta=1.0, epsilon=EPSILON)
    table = make_table(sampler, maxlen=30)
    expected: dict[int, list[float]] = {}
    for step, (operation, value) in enumerate(operations):
        if operation == "add" and value <= table.maxlen:
            add_episode(table, step, value)
            set_priorities(table, step, [step + 1.0 + k for k in range(value)])
            expected[step] = [step + 1.0 + k + EPSILON for k in range(value)]
        elif operation == "resize":
            table.resize(value)
        elif operation == "sample":
            lengths = table.index.lengths[table.index.live]
            if lengths.size and lengths.max() >= value:
                identities, offsets, _ = sample(table, 32, value)  # checks every window
                for identity, offset in zip(identities, offsets, strict=True):
                    assert offset + value <= len(expected[int(identity)])
        held = {identity for identity, _, _ in table.episodes()}
        priorities = stored(sampler)
        assert set(priorities) == held
        for identity in held:
            np.testing.assert_allclose(priorities[identity], expected[identity])


def test_state_round_trips_through_json_into_a_fresh_table() -> None:
    sampler = PrioritizedSampleStrategy(alpha=0.5, epsilon=EPSILON)
    table = make_table(sampler)
    for identity, length in ((-5, 4), (2**40, 3)):
        add_episode(table, identity, length)
    set_priorities(table, -5, [1.0, 9.0, 0.0, 4.0])
    set_priorities(table, 2**40, [25.0, 2.0, 3.0])
    state = json.loads(json.dumps(sampler.state()))

    restored_sampler = PrioritizedSampleStrategy(alpha=0.5, epsilon=EPSILON)
    restored = make_table(restored_sampler)
    add_episode(restored, 7, 6)  # shifts the rows of the re-added episodes
    add_episode(restored, 2**40, 3)
    add_episode(restored, -5, 4)
    restored_sampler.load_state(state)
    assert stored(restored_sampler)[-5] == stored(sampler)[-5]
    assert stored(restored_sampler)[2**40] == stored(sampler)[2**40]
    add_episode(restored, 8, 1)  # the saved largest priority carries over
    np.testing.assert_allclose(stored(restored_sampler)[8], [(25.0 + EPSILON) ** 0.5])


def test_priorities_survive_a_table_store_and_restore(tmp_path: Path) -> None:
    sampler = PrioritizedSampleStrategy(alpha=0.5, epsilon=EPSILON)
    table = make_table(sampler)
    add_episode(table, -5, 4)
    add_episode(table, 3, 3)
    set_priorities(table, -5, [1.0, 9.0, 0.0, 4.0])
    store_table(table, tmp_path / "memory.zip")

    restored_sampler = PrioritizedSampleStrategy(alpha=0.5, epsilon=EPSILON)
    restored = make_table(restored_sampler)
    restore_table(restored, tmp_path / "memory.zip")
    assert stored(restored_sampler) == stored(sampler)


def test_state_saved_under_another_alpha_is_converted() -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, epsilon=EPSILON)
    table = make_table(sampler)
    add_episode(table, 1, 2)
    set_priorities(table, 1, [4.0, 16.0])
    restored_sampler = PrioritizedSampleStrategy(alpha=0.5, epsilon=EPSILON)
    restored = make_table(restored_sampler)
    add_episode(restored, 1, 2)
    restored_sampler.load_state(sampler.state())
    np.testing.assert_allclose(stored(restored_sampler)[1], [2.0, 4.0], rtol=1e-6)


def test_clear_forgets_priorities() -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, epsilon=EPSILON)
    table = make_table(sampler)
    add_episode(table, 1, 3)
    set_priorities(table, 1, [7.0, 7.0, 7.0])
    table.clear()
    add_episode(table, 1, 2)
    assert stored(sampler) == {1: [1.0, 1.0]}


def test_non_finite_priorities_are_refused_and_change_nothing() -> None:
    sampler = PrioritizedSampleStrategy(alpha=1.0, epsilon=EPSILON)
    table = make_table(sampler)
    add_episode(table, 1, 3)
    table.sample_by_index([1, 1], [0, 1], 1)
    with pytest.raises(SamplingError, match="finite"):
        table.update_priorities(np.array([2.0, np.nan]))
    assert stored(sampler) == {1: [1.0, 1.0, 1.0]}


def test_sampling_an_empty_or_too_short_table_is_an_error() -> None:
    table = make_table(PrioritizedSampleStrategy())
    with pytest.raises(SamplingError, match="empty"):
        table.sample(2, 1)
    add_episode(table, 1, 2)
    with pytest.raises(SamplingError, match="window of 3"):
        table.sample(2, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": -0.1}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"initial_priority": float("nan")}, "initial_priority"),
    ],
)
def test_invalid_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        PrioritizedSampleStrategy(**kwargs)
