"""Dict-observation tables built from real gymnasium spaces, filled with real episodes."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import TransformObservation

from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable, DictObsNStepMemoryTable
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, OnlyLastMapper
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.typing import EpisodeState

BATCH_KEYS = ["actions", "dones", "masks", "next_observation", "observation", "rewards"]


def dict_pendulum() -> gym.Env:
    """Pendulum with a dict observation: the angle as (cos, sin) and the angular velocity."""
    env = gym.make("Pendulum-v1")
    space = gym.spaces.Dict(
        {
            "angle": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            "velocity": gym.spaces.Box(-8.0, 8.0, (1,), np.float32),
        }
    )
    return TransformObservation(env, lambda o: {"angle": o[:2], "velocity": o[2:]}, space)


def collect(env: gym.Env, episodes: int, seed: int) -> list[tuple[dict[str, Any], EpisodeState]]:
    """Steps ``env`` with random actions; each episode as add_sequence data and its end state."""
    env.action_space.seed(seed)
    collected = []
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
        if isinstance(observations[0], dict):
            data = {k: np.stack([o[k] for o in observations]) for k in observations[0]}
        else:
            data = {"obs": np.stack(observations)}
        data["actions"] = np.stack(actions)
        data["rewards"] = np.asarray(rewards, dtype=np.float32)
        state = EpisodeState.from_gymnasium(terminated=terminated, truncated=truncated)
        collected.append((data, state))
    return collected


def filled(table_type: type, env: gym.Env, episodes: int, seed: int = 0, **kwargs: Any) -> tuple:
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    table = table_type(spaces=spaces, maxlen=100_000, seed=seed, **kwargs)
    data = collect(env, episodes, seed)
    for identity, (sequence, state) in enumerate(data):
        table.add_sequence(identity, sequence, end_state=state)
    return table, data


def window_positions(table: DictObsMemoryTable, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Episode identity and position within it of every sampled step of the last sample."""
    identities, offsets = table.last_sample_indices
    positions = offsets[:, None] + np.arange(length)[None, :]
    return np.repeat(identities, length), positions.reshape(-1)


def test_pendulum_table_has_the_documented_columns() -> None:
    env = gym.make("Pendulum-v1")
    table = DictObsMemoryTable(
        spaces=MDPSpace.from_gymnasium(env.observation_space, env.action_space), maxlen=1000
    )
    columns = table.columns
    assert columns["obs"] == Column("obs", (3,), np.float32)
    assert columns["actions"] == Column("actions", (1,), np.float32)
    assert columns["rewards"] == Column("rewards", (1,), np.float32)
    assert isinstance(columns["next_obs"], VirtualColumn)
    assert isinstance(columns["next_obs"].mapper, NextElementMapper)
    assert columns["dones"].shape == columns["masks"].shape == (1,)
    assert "terminal" not in columns


def test_pendulum_batch_has_the_design_layout_and_next_observations() -> None:
    table, data = filled(DictObsMemoryTable, gym.make("Pendulum-v1"), episodes=3)
    batch = table.sample(32, 4)
    assert sorted(batch) == BATCH_KEYS
    assert list(batch["observation"]) == list(batch["next_observation"]) == ["obs"]
    for key in ("actions", "rewards", "dones", "masks"):
        assert batch[key].shape == (128, 1) and batch[key].dtype == torch.float32, key
    assert batch["observation"]["obs"].shape == batch["next_observation"]["obs"].shape == (128, 3)
    identities, positions = window_positions(table, 4)
    episodes = [data[i][0] for i in identities]
    expected_obs = np.stack([e["obs"][p] for e, p in zip(episodes, positions, strict=True)])
    expected_next = np.stack([e["obs"][p + 1] for e, p in zip(episodes, positions, strict=True)])
    expected_actions = np.stack([e["actions"][p] for e, p in zip(episodes, positions, strict=True)])
    assert np.array_equal(batch["observation"]["obs"].numpy(), expected_obs)
    assert np.array_equal(batch["next_observation"]["obs"].numpy(), expected_next)
    assert np.array_equal(batch["actions"].numpy(), expected_actions)


def test_pendulum_time_limit_is_interrupted_so_masks_stay_one_at_the_end() -> None:
    table, data = filled(DictObsMemoryTable, gym.make("Pendulum-v1"), episodes=2)
    assert [state for _, state in data] == [EpisodeState.INTERRUPTED] * 2
    assert table.size() == 400  # TimeLimit cuts Pendulum at 200 steps
    batch = table.sample_all()
    dones = batch["dones"].flatten()
    assert torch.equal(torch.nonzero(dones).flatten(), torch.tensor([199, 399]))
    assert torch.all(batch["masks"] == 1.0)
    final = data[0][0]["obs"][200]
    assert np.array_equal(batch["next_observation"]["obs"][199].numpy(), final)


def test_cartpole_terminations_zero_the_mask_of_the_last_transition_only() -> None:
    table, data = filled(DictObsMemoryTable, gym.make("CartPole-v1"), episodes=6)
    assert all(state == EpisodeState.TERMINAL for _, state in data)
    assert table.columns["actions"] == Column("actions", (1,), np.int64)
    batch = table.sample_all()
    ends = np.cumsum([len(sequence["rewards"]) for sequence, _ in data]) - 1
    dones = batch["dones"].flatten().numpy()
    masks = batch["masks"].flatten().numpy()
    assert np.array_equal(np.flatnonzero(dones), ends)
    assert np.array_equal(np.flatnonzero(masks == 0), ends)
    assert batch["actions"].dtype == torch.int64
    actions = np.concatenate([sequence["actions"] for sequence, _ in data])
    assert np.array_equal(batch["actions"].flatten().numpy(), actions)


@pytest.mark.parametrize("table_type", [DictObsMemoryTable, DictObsNStepMemoryTable])
def test_dones_and_masks_dtypes_are_upstreams_arguments(table_type: type) -> None:
    table, data = filled(
        table_type, gym.make("CartPole-v1"), episodes=3, dones_dtype=bool, masks_dtype=np.float64
    )
    batch = table.sample_all()
    assert batch["dones"].dtype == torch.bool and batch["masks"].dtype == torch.float64
    ends = np.cumsum([len(sequence["rewards"]) for sequence, _ in data]) - 1
    assert np.array_equal(np.flatnonzero(batch["dones"].flatten().numpy()), ends)
    assert np.array_equal(np.flatnonzero(batch["masks"].flatten().numpy() == 0), ends)
    with pytest.raises(ConfigurationError, match=r"dones_dtype must be a numpy bool, integer or"):
        filled(table_type, gym.make("CartPole-v1"), episodes=1, dones_dtype="not a dtype")
    with pytest.raises(ConfigurationError, match=r"masks_dtype .* got <class 'str'>"):
        filled(table_type, gym.make("CartPole-v1"), episodes=1, masks_dtype=str)


def test_dict_observation_space_gives_one_entry_per_key() -> None:
    table, data = filled(DictObsMemoryTable, dict_pendulum(), episodes=2)
    assert table.observation_keys == ["angle", "velocity"]
    batch = table.sample(16, 3)
    assert sorted(batch) == BATCH_KEYS
    assert batch["observation"]["angle"].shape == (48, 2)
    assert batch["next_observation"]["velocity"].shape == (48, 1)
    identities, positions = window_positions(table, 3)
    for key in ("angle", "velocity"):
        expected = np.stack(
            [data[i][0][key][p + 1] for i, p in zip(identities, positions, strict=True)]
        )
        assert np.array_equal(batch["next_observation"][key].numpy(), expected)


def test_n_step_table_bootstraps_from_the_observation_right_after_each_window() -> None:
    table, data = filled(DictObsNStepMemoryTable, gym.make("CartPole-v1"), episodes=10)
    assert isinstance(table.columns["next_obs"].mapper, OnlyLastMapper)
    batch = table.sample(20, 5)
    assert sorted(batch) == BATCH_KEYS
    assert batch["observation"]["obs"].shape == (100, 4)
    assert batch["next_observation"]["obs"].shape == (20, 4)
    assert batch["masks"].shape == batch["dones"].shape == (100, 1)
    identities, offsets = table.last_sample_indices
    expected = np.stack(
        [data[i][0]["obs"][o + 5] for i, o in zip(identities, offsets, strict=True)]
    )
    assert np.array_equal(batch["next_observation"]["obs"].numpy(), expected)
    # A window that reaches its episode's end has its last step done and (CartPole) unmasked.
    lengths = np.array([len(data[i][0]["rewards"]) for i in identities])
    at_end = offsets + 5 == lengths
    dones = batch["dones"].reshape(20, 5)
    assert torch.equal(dones[:, -1].bool(), torch.from_numpy(at_end))
    assert torch.equal(batch["masks"].reshape(20, 5)[:, -1].bool(), torch.from_numpy(~at_end))


def terminal_flags(sequence: dict[str, Any], final: float) -> dict[str, Any]:
    flags = np.zeros(len(sequence["rewards"]) + 1, dtype=np.float32)
    flags[-1] = final
    flags[len(flags) // 2] = 1.0  # mid-episode flags do not end anything
    return {**sequence, "terminal": flags}


@pytest.mark.parametrize("table_type", [DictObsMemoryTable, DictObsNStepMemoryTable])
def test_terminal_column_decides_masks_over_the_end_state(table_type: type) -> None:
    env = gym.make("CartPole-v1")
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    table = table_type(spaces=spaces, maxlen=10_000, use_terminal=True, seed=0)
    (first, _), (second, _) = collect(env, 2, seed=1)
    # Both episodes really terminated; the flags say only the first did.
    table.add_sequence(0, terminal_flags(first, 1.0), end_state=EpisodeState.TERMINAL)
    table.add_sequence(1, terminal_flags(second, 0.0), end_state=EpisodeState.TERMINAL)
    count = len(first["rewards"]) + len(second["rewards"])
    batch = table.sample_by_index([0, 1], [0, 0], min(len(first["rewards"]), 8))
    assert sorted(batch) == BATCH_KEYS  # the flag columns are consumed
    batch = table.sample_all()
    masks = batch["masks"].flatten()
    assert masks.shape == (count,)
    assert torch.nonzero(masks == 0).flatten().tolist() == [len(first["rewards"]) - 1]


def test_tables_built_with_default_strategies_do_not_share_them() -> None:
    env = gym.make("CartPole-v1")
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    first = DictObsMemoryTable(spaces=spaces, maxlen=1000, seed=0)
    second = DictObsMemoryTable(spaces=spaces, maxlen=1000, seed=0)
    assert first.sampler is not second.sampler and first.ejector is not second.ejector
    for identity, (sequence, state) in enumerate(collect(env, 3, seed=0)):
        first.add_sequence(identity, sequence, end_state=state)
    assert first.sample(4, 1)["actions"].shape == (4, 1)


def spaces_with(**changes: Any) -> MDPSpace:
    fields = {
        "rewards": BoxSpace(np.float32, (1,)),
        "actions": DiscreteSpace(n=3),
        "state": DictSpace({"obs": BoxSpace(np.float32, (4,))}),
    }
    fields.update(changes)
    return MDPSpace(**fields)


@pytest.mark.parametrize(
    ("spaces", "message"),
    [
        ("not spaces", "MDPSpace.from_gymnasium"),
        (spaces_with(state=DictSpace({})), "at least one key"),
        (spaces_with(state=DictSpace({"actions": BoxSpace(np.float32, (2,))})), "'actions'"),
        (
            spaces_with(
                state=DictSpace(
                    {"x": BoxSpace(np.float32, (2,)), "next_x": BoxSpace(np.float32, (2,))}
                )
            ),
            "next-observation column of 'x'",
        ),
        (
            spaces_with(state=DictSpace({"text": BoxSpace(np.str_, (2,))})),
            "bool, integer and float",
        ),
        (spaces_with(rewards=BoxSpace(np.float32, (2,))), "one reward per transition"),
        (spaces_with(actions=DictSpace({"a": BoxSpace(np.float32, (1,))})), "BoxSpace or Discrete"),
    ],
)
def test_builder_rejects_spaces_it_cannot_store(spaces: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        DictObsMemoryTable(spaces=spaces, maxlen=100)


def test_terminal_key_is_reserved_only_with_use_terminal() -> None:
    spaces = spaces_with(state=DictSpace({"terminal": BoxSpace(np.float32, (1,))}))
    assert DictObsMemoryTable(spaces=spaces, maxlen=10).observation_keys == ["terminal"]
    with pytest.raises(ConfigurationError, match="'terminal' clashes"):
        DictObsMemoryTable(spaces=spaces, maxlen=10, use_terminal=True)


def test_a_non_callable_preprocessor_is_rejected() -> None:
    with pytest.raises(ConfigurationError, match="callables"):
        DictObsMemoryTable(spaces=spaces_with(), maxlen=10, preprocessor="random_shift")


@pytest.mark.gpu
def test_cuda_table_samples_the_design_layout_on_the_device() -> None:
    table, data = filled(DictObsNStepMemoryTable, dict_pendulum(), episodes=2, device="cuda")
    batch = table.sample(64, 3)
    for key in ("actions", "rewards", "dones", "masks"):
        assert batch[key].device.type == "cuda"
    assert batch["next_observation"]["angle"].shape == (64, 2)
    identities, offsets = table.last_sample_indices
    expected = np.stack(
        [data[i][0]["angle"][o + 3] for i, o in zip(identities, offsets, strict=True)]
    )
    assert np.array_equal(batch["next_observation"]["angle"].cpu().numpy(), expected)


def test_dict_memory_table_nests_the_given_observation_columns_as_upstreams_dict_table() -> None:
    from emote_core.memory.builders import DictMemoryTable
    from emote_core.memory.mappers import SyntheticDones, SyntheticMasks

    columns = [
        Column("pos", (2,), np.float32),
        VirtualColumn("next_pos", (2,), np.float32, "pos", NextElementMapper()),
        Column("actions", (1,), np.float32),
        VirtualColumn("dones", (1,), np.float32, "actions", SyntheticDones()),
        VirtualColumn("masks", (1,), np.float32, "actions", SyntheticMasks()),
    ]
    given = list(columns)
    table = DictMemoryTable(columns=columns, obs_keys=["pos"], maxlen=100, use_terminal=True)
    assert columns == given  # upstream's DictTable appended to the caller's list; this one copies
    assert table.length_key == "actions"
    pos = np.arange(8, dtype=np.float32).reshape(4, 2)
    terminal = np.array([0, 0, 0, 1], np.float32)
    table.add_sequence(
        7,
        {"pos": pos, "actions": np.zeros((3, 1), np.float32), "terminal": terminal},
        end_state=EpisodeState.INTERRUPTED,
    )
    batch = table.sample(16, 1)
    assert set(batch["observation"]) == {"pos"} and set(batch["next_observation"]) == {"pos"}
    nxt = batch["next_observation"]["pos"]
    obs = batch["observation"]["pos"]
    torch.testing.assert_close(nxt, obs + 2)
    # The flag of the final observation ends bootstrapping although the episode was interrupted.
    assert torch.equal(batch["masks"].flatten(), (obs[:, 0] != 4).float())
    with pytest.raises(ConfigurationError, match="obs_keys naming its columns"):
        DictMemoryTable(columns=columns, obs_keys=["velocity"], maxlen=100)
    with pytest.raises(TypeError, match="use_terminal_column"):
        DictMemoryTable(columns=columns, obs_keys=["pos"], maxlen=100, use_terminal_column=True)  # type: ignore[call-arg]
