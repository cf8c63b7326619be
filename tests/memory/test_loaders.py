"""Memory loaders feeding a real Trainer from tables of real gymnasium episodes."""

from __future__ import annotations

from itertools import islice
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from emote_core.callback import Callback
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError, SamplingError
from emote_core.memory.builders import DictObsMemoryTable, DictObsNStepMemoryTable
from emote_core.memory.loaders import (
    JointMemoryLoader,
    JointMemoryLoaderWithDataGroup,
    MemoryLoader,
)
from emote_core.spaces import MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState


def empty_table(env_id: str, table_type: type = DictObsMemoryTable) -> tuple[Any, gym.Env]:
    env = gym.make(env_id)
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    return table_type(spaces=spaces, maxlen=50_000, seed=0), env


def add_episodes(table: Any, env: gym.Env, episodes: int, seed: int, first_id: int = 0) -> None:
    """Steps ``env`` with random actions and adds each finished episode to ``table``."""
    env.action_space.seed(seed)
    for episode in range(episodes):
        observation, _ = env.reset(seed=seed + episode)
        observations, actions, rewards = [observation], [], []
        terminated = truncated = False
        while not (terminated or truncated):
            action = env.action_space.sample()
            observation, reward, terminated, truncated, _ = env.step(action)
            observations.append(observation)
            actions.append(action)
            rewards.append(reward)
        table.add_sequence(
            first_id + episode,
            {"obs": np.stack(observations), "actions": np.stack(actions), "rewards": rewards},
            end_state=EpisodeState.from_gymnasium(terminated=terminated, truncated=truncated),
        )


def pendulum_table(episodes: int = 2) -> Any:
    table, env = empty_table("Pendulum-v1")
    add_episodes(table, env, episodes, seed=0)
    return table


class ShapeRecorder(Callback):
    """Records, per step, the shapes a loss would see and the trainer's sample count."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple] = []

    def begin_batch(self, observation, next_observation, actions, masks, batch_size, bp_samples):
        self.seen.append(
            (
                tuple(observation["obs"].shape),
                tuple(next_observation["obs"].shape),
                tuple(actions.shape),
                tuple(masks.shape),
                batch_size,
                bp_samples,
            )
        )


def test_memory_loader_yields_the_design_batch_layout() -> None:
    loader = MemoryLoader(table=pendulum_table(), rollout_count=8, rollout_length=4)
    batch = next(iter(loader))
    assert sorted(batch) == ["batch_size", "default"]
    assert batch["batch_size"] == 32
    group = batch["default"]
    assert sorted(group) == [
        "actions", "batch_size", "dones", "masks", "next_observation", "observation", "rewards",
    ]  # fmt: skip
    assert group["batch_size"] == 32
    assert group["observation"]["obs"].shape == (32, 3)
    assert group["rewards"].shape == (32, 1)


def test_memory_loader_feeds_a_trainer_and_bp_samples_grows_by_the_batch_size() -> None:
    table, env = empty_table("CartPole-v1", DictObsNStepMemoryTable)
    add_episodes(table, env, 20, seed=0)
    loader = MemoryLoader(table=table, rollout_count=6, rollout_length=3, data_group="rl")
    recorder = ShapeRecorder(data_group="rl")
    state = Trainer([recorder, BackPropStepsTerminator(bp_steps=5)], loader).train()
    assert state["bp_step"] == 5
    assert state["bp_samples"] == 5 * 18
    assert recorder.seen == [
        ((18, 4), (6, 4), (18, 1), (18, 1), 18, 18 * step) for step in range(1, 6)
    ]


def add_balanced_episode(table: Any, env: gym.Env, identity: int) -> int:
    """A CartPole episode steered by a simple rule (push toward the pole's lean): long ones."""
    observation, _ = env.reset(seed=identity)
    observations, actions = [observation], []
    terminated = truncated = False
    while not (terminated or truncated):
        actions.append(int(observation[2] + observation[3] > 0))
        observation, _, terminated, truncated, _ = env.step(actions[-1])
        observations.append(observation)
    table.add_sequence(
        identity,
        {"obs": np.stack(observations), "actions": actions, "rewards": np.ones(len(actions))},
        end_state=EpisodeState.from_gymnasium(terminated=terminated, truncated=truncated),
    )
    return len(actions)


def test_is_ready_needs_a_batch_of_transitions_and_an_episode_long_enough() -> None:
    table, env = empty_table("CartPole-v1")
    loader = MemoryLoader(table=table, rollout_count=1, rollout_length=100)
    assert not loader.is_ready()
    with pytest.raises(SamplingError, match="empty"):
        next(iter(loader))
    add_episodes(table, env, 12, seed=0)  # random play: every episode far shorter than 100
    assert table.size() >= 100 and table.index.lengths.max() < 100
    assert not loader.is_ready()
    with pytest.raises(SamplingError, match="no episode holds a window of 100"):
        next(iter(loader))
    assert add_balanced_episode(table, env, identity=99) >= 100
    assert loader.is_ready()
    assert next(iter(loader))["default"]["observation"]["obs"].shape == (100, 4)


def test_is_ready_waits_for_a_full_batch_of_transitions() -> None:
    table = pendulum_table(episodes=1)  # 200 transitions
    assert MemoryLoader(table=table, rollout_count=50, rollout_length=4).is_ready()
    assert not MemoryLoader(table=table, rollout_count=51, rollout_length=4).is_ready()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_count": 0, "rollout_length": 1}, "rollout_count must be a positive integer"),
        ({"rollout_count": 1, "rollout_length": 2.5}, "rollout_length must be a positive"),
        ({"rollout_count": 1, "rollout_length": 1, "data_group": ""}, "non-empty string"),
        ({"rollout_count": 1, "rollout_length": 1, "data_group": "batch_size"}, "both"),
    ],
)
def test_memory_loader_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        MemoryLoader(table=pendulum_table(1), **kwargs)


def two_loaders() -> tuple[MemoryLoader, MemoryLoader]:
    cartpole, env = empty_table("CartPole-v1")
    add_episodes(cartpole, env, 10, seed=0)
    return (
        MemoryLoader(
            table=pendulum_table(1), rollout_count=4, rollout_length=2, data_group="swing"
        ),
        MemoryLoader(table=cartpole, rollout_count=5, rollout_length=1, data_group="balance"),
    )


def test_joint_loader_combines_groups_and_sums_sizes() -> None:
    swing, balance = two_loaders()
    joint = JointMemoryLoader([swing, balance])
    assert joint.is_ready()
    batch = next(iter(joint))
    assert sorted(batch) == ["balance", "batch_size", "swing"]
    assert batch["batch_size"] == 13
    assert batch["swing"]["batch_size"] == 8 and batch["balance"]["batch_size"] == 5
    assert batch["swing"]["observation"]["obs"].shape == (8, 3)
    assert batch["balance"]["observation"]["obs"].shape == (5, 4)


def test_joint_loader_rejects_a_repeated_data_group_by_name() -> None:
    swing, _ = two_loaders()
    again = MemoryLoader(table=swing.table, rollout_count=1, rollout_length=1, data_group="swing")
    with pytest.raises(ConfigurationError, match="two loaders with data group 'swing'"):
        JointMemoryLoader([swing, again])
    with pytest.raises(ConfigurationError, match="at least one loader"):
        JointMemoryLoader([])


def test_joint_loader_is_ready_only_when_every_loader_is() -> None:
    swing, _ = two_loaders()
    table, _ = empty_table("CartPole-v1")
    waiting = MemoryLoader(table=table, rollout_count=1, rollout_length=1, data_group="balance")
    joint = JointMemoryLoader([swing, waiting])
    assert swing.is_ready() and not joint.is_ready()
    with pytest.raises(SamplingError):
        next(iter(joint))


def test_joint_loader_with_data_group_nests_and_keeps_yielding_into_a_trainer() -> None:
    swing, balance = two_loaders()
    loader = JointMemoryLoaderWithDataGroup([swing, balance], "sources")
    assert loader.is_ready()
    batches = list(islice(iter(loader), 50))
    assert len(batches) == 50
    assert all(sorted(b) == ["batch_size", "sources"] for b in batches)
    assert sorted(batches[0]["sources"]) == ["balance", "batch_size", "swing"]
    assert batches[0]["sources"]["batch_size"] == batches[0]["batch_size"] == 13

    class SourcesReader(Callback):
        def __init__(self) -> None:
            super().__init__(data_group="sources")
            self.rows: list[tuple[int, int]] = []

        def begin_batch(self, swing, balance):
            self.rows.append((len(swing["actions"]), len(balance["actions"])))

    reader = SourcesReader()
    state = Trainer([reader, BackPropStepsTerminator(bp_steps=3)], loader).train()
    assert reader.rows == [(8, 5)] * 3
    assert state["bp_samples"] == 39


@pytest.mark.parametrize("rollout_length", [1, 3])
def test_several_batches_per_sample_split_one_sample_into_batches_used_in_turn(
    rollout_length: int,
) -> None:
    def table() -> Any:
        made, env = empty_table("Pendulum-v1", DictObsNStepMemoryTable)
        add_episodes(made, env, 3, seed=0)
        return made

    one_draw = table().sample(4 * 8, rollout_length)
    loader = MemoryLoader(
        table=table(), rollout_count=8, rollout_length=rollout_length, batches_per_sample=4
    )
    batches = [group["default"] for group in islice(loader, 5)]
    steps, windows = 8 * rollout_length, 8
    for i, batch in enumerate(batches[:4]):
        assert batch["batch_size"] == steps
        assert np.array_equal(batch["actions"], one_draw["actions"][i * steps : (i + 1) * steps])
        for key in ("observation", "next_observation"):
            rows = steps if len(one_draw[key]["obs"]) == 4 * steps else windows
            expected = one_draw[key]["obs"][i * rows : (i + 1) * rows]
            assert np.array_equal(batch[key]["obs"], expected), key
    assert not np.array_equal(batches[4]["actions"], batches[0]["actions"])  # a second draw


def test_several_batches_per_sample_are_refused_for_a_prioritized_table() -> None:
    from emote_core.memory.strategies import PrioritizedSampleStrategy

    env = gym.make("Pendulum-v1")
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    table = DictObsMemoryTable(spaces=spaces, maxlen=1000, sampler=PrioritizedSampleStrategy())
    with pytest.raises(ConfigurationError, match="prioritized table takes batches_per_sample = 1"):
        MemoryLoader(table=table, rollout_count=8, rollout_length=1, batches_per_sample=2)
