"""PriorityUpdater: the TD errors losses publish become the sampled windows' priorities, the
beta schedule advances per update, and priorities survive a checkpoint onto a refilled table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper
from emote_core.memory.priorities import PriorityUpdater, td_error_outputs
from emote_core.memory.strategies import (
    FifoEjectionStrategy,
    PrioritizedSampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable
from emote_core.schedules import LinearSchedule

ALPHA, EPSILON = 0.7, 0.01


def make_table(sampler=None) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (1,), np.float32),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (1,), np.float32, "obs", NextElementMapper()),
        ],
        maxlen=10_000,
        sampler=sampler or PrioritizedSampleStrategy(alpha=ALPHA, epsilon=EPSILON),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=3,
    )


def fill(table: ArrayMemoryTable, episodes: int = 4, length: int = 20) -> None:
    for identity in range(episodes):
        obs = np.arange(length + 1, dtype=np.float32).reshape(-1, 1) + 100 * identity
        table.add_sequence(
            identity, {"obs": obs, "actions": obs[:-1].copy(), "rewards": np.ones((length, 1))}
        )


def updater_step(updater: PriorityUpdater, bp_step: int, **errors: torch.Tensor) -> None:
    group = {}
    for name, value in errors.items():
        group.update(td_error_outputs(name, value, bp_step))
    updater.call_hook("end_batch", {"bp_step": bp_step, "default": group})


def test_priorities_follow_the_mean_absolute_td_error_of_the_named_losses() -> None:
    table = make_table()
    fill(table)
    updater = PriorityUpdater(table=table, losses=["q1", "q2"])
    table.sample(16, 1)
    identities, offsets = table.last_sample_indices
    q1 = torch.linspace(-2.0, 2.0, 16).reshape(-1, 1)
    q2 = torch.full((16, 1), 0.5)
    updater_step(updater, 1, q1=q1, q2=q2)
    expected = ((q1.abs() + q2.abs()).numpy().ravel() / 2 + EPSILON) ** ALPHA
    stored = {}
    for identity, offset, value in zip(identities, offsets, expected, strict=True):
        stored[(int(identity), int(offset))] = value  # a window drawn twice keeps one value
    for (identity, offset), value in stored.items():
        got = table.sampler.priorities(table.index.slot_of[identity])[offset]
        assert got == pytest.approx(value, rel=1e-6)
    # Windows never sampled keep the initial priority of new data (1).
    held = table.sampler.priorities(table.index.slot_of[int(identities[0])])
    untouched = set(range(20)) - {o for i, o in stored if i == int(identities[0])}
    assert all(held[o] == 1.0 for o in untouched)


def test_td_errors_of_another_step_are_refused_not_reused() -> None:
    table = make_table()
    fill(table)
    updater = PriorityUpdater(table=table, losses=["q"])
    table.sample(4, 1)
    with pytest.raises(ConfigurationError, match="loss 'q' published no TD errors"):
        updater.call_hook(
            "end_batch",
            {"bp_step": 2, "default": td_error_outputs("q", torch.ones(4, 1), 1)},
        )


def test_a_table_without_priorities_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="keeps no priorities"):
        PriorityUpdater(table=make_table(UniformSampleStrategy()), losses=["q"])
    with pytest.raises(ConfigurationError, match="at least one loss"):
        PriorityUpdater(table=make_table(), losses=[])


def test_beta_schedule_steps_per_update_and_reaches_the_weights() -> None:
    schedule = LinearSchedule(0.0, 1.0, 4)
    table = make_table(PrioritizedSampleStrategy(alpha=1.0, beta=schedule, epsilon=EPSILON))
    fill(table)
    updater = PriorityUpdater(table=table, losses=["q"])
    weights = []
    for step in range(1, 5):
        batch = table.sample(64, 1)
        weights.append(batch["importance_weights"])
        updater_step(updater, step, q=torch.rand(64, 1) * 10)
    assert schedule.steps_taken == 4
    assert torch.all(weights[0] == 1.0)  # beta 0: no correction
    assert weights[-1].min() < 1.0  # beta 0.75 on unequal priorities


def test_checkpoint_keeps_priorities_and_beta_for_the_refilled_table() -> None:
    schedule = LinearSchedule(0.4, 1.0, 100)
    table = make_table(PrioritizedSampleStrategy(alpha=ALPHA, beta=schedule, epsilon=EPSILON))
    fill(table)
    updater = PriorityUpdater(table=table, losses=["q"])
    for step in range(1, 6):
        table.sample(32, 1)
        updater_step(updater, step, q=torch.randn(32, 1))
    saved = updater.state_dict()
    before = {i: table.sampler.priorities(table.index.slot_of[i]) for i in range(4)}

    schedule_again = LinearSchedule(0.4, 1.0, 100)
    sampler = PrioritizedSampleStrategy(alpha=ALPHA, beta=schedule_again, epsilon=EPSILON)
    resumed = make_table(sampler)
    restored = PriorityUpdater(table=resumed, losses=["q"])
    restored.load_state_dict(saved)  # as the checkpoint loader does, before the memory refills
    fill(resumed)
    assert all(np.all(resumed.sampler.priorities(s) == 1.0) for s in resumed.index.live_slots())
    restored.call_hook("begin_training", {})
    for identity, priorities in before.items():
        slot = resumed.index.slot_of[identity]
        np.testing.assert_allclose(resumed.sampler.priorities(slot), priorities)
    assert schedule_again.steps_taken == 5
