"""Reading Minari datasets: ones made by Minari's own collector, and spaces emote refuses."""

from __future__ import annotations

import itertools
import shutil
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.minari.datasets import (
    is_minari_dataset,
    read_minari,
)
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.spaces import MDPSpace
from emote_core.stores.stored import StoredTable, restore_stored
from emote_core.typing import EpisodeState

minari = pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
pytest.importorskip(
    "h5py", reason="h5py (Minari's HDF5 backend) comes with the dev and minari extras"
)


DATA = Path(__file__).parent / "data"
COLLECTED = {"cartpole/random-v0": "CartPole-v1", "pendulum/random-v0": "Pendulum-v1"}


def _truth(truth: Any, dataset_id: str) -> list[dict[str, np.ndarray]]:
    """Per episode, what the environment returned while the collector recorded it."""
    episodes = []
    for index in itertools.count():
        prefix = f"{dataset_id}/{index}/"
        if prefix + "rewards" not in truth:
            return episodes
        episodes.append(
            {
                name: truth[prefix + name]
                for name in ("observations", "actions", "rewards", "terminated", "truncated")
            }
        )


def _check_against_truth(stored: StoredTable, truth: list[dict[str, np.ndarray]], env_id: str):
    env = gym.make(env_id)
    assert stored.format == "minari"
    assert [column.name for column in stored.columns] == ["obs", "actions", "rewards"]
    assert (
        stored.spaces == MDPSpace.from_gymnasium(env.observation_space, env.action_space).to_json()
    )
    assert stored.metadata["env_id"] == env_id
    assert stored.metadata["total_episodes"] == len(truth) == len(stored.episodes)
    assert stored.metadata["total_steps"] == sum(len(t["rewards"]) for t in truth)
    for index, ((identity, data, end_state), expected) in enumerate(
        zip(stored.episodes, truth, strict=True)
    ):
        steps = len(expected["rewards"])
        assert identity == index
        assert len(data["actions"]) == steps and len(data["obs"]) == steps + 1
        np.testing.assert_array_equal(data["obs"], expected["observations"])
        np.testing.assert_array_equal(
            data["actions"].reshape(steps, -1), expected["actions"].reshape(steps, -1)
        )
        np.testing.assert_array_equal(data["rewards"][:, 0], expected["rewards"].astype(np.float32))
        assert data["rewards"].sum() == pytest.approx(expected["rewards"].sum(), rel=1e-5)
        # The env's terminated flag makes a TERMINAL episode; a time limit or an unfinished tail
        # (which the collector closes without the env saying so) an INTERRUPTED one.
        terminal = bool(expected["terminated"][-1])
        assert end_state == (EpisodeState.TERMINAL if terminal else EpisodeState.INTERRUPTED)


@pytest.mark.parametrize("dataset_id", sorted(COLLECTED))
def test_reads_datasets_made_by_minaris_data_collector(tmp_path: Path, dataset_id: str) -> None:
    shutil.copytree(DATA, tmp_path / "root")
    stored = read_minari(dataset_id, root=tmp_path / "root")
    truth = _truth(np.load(DATA / "truth.npz"), dataset_id)
    _check_against_truth(stored, truth, COLLECTED[dataset_id])
    states = {end_state for _, _, end_state in stored.episodes}
    if dataset_id.startswith("cartpole"):
        assert states == {EpisodeState.TERMINAL, EpisodeState.INTERRUPTED}
    assert stored.metadata["author"] == ["emote tests"]
    # The same dataset by directory, as `emote memory convert DIR` would pass it.
    for path in (tmp_path / "root" / dataset_id, tmp_path / "root" / dataset_id / "data"):
        assert is_minari_dataset(path)
        by_path = read_minari(path)
        assert [i for i, _, _ in by_path.episodes] == [i for i, _, _ in stored.episodes]
    assert not is_minari_dataset(tmp_path / "root")


def test_read_episodes_fill_an_emote_table_that_samples(tmp_path: Path) -> None:
    shutil.copytree(DATA, tmp_path / "root")
    stored = read_minari("pendulum/random-v0", root=tmp_path / "root")
    table = DictObsMemoryTable(spaces=MDPSpace.from_json(stored.spaces), maxlen=1_000, seed=0)
    restore_stored(table, stored)
    assert table.episode_count == len(stored.episodes)
    batch = table.sample(8, 3)
    assert batch["observation"]["obs"].shape == (24, 3)
    assert batch["masks"].min() == 1.0  # every Pendulum episode was cut by its time limit


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_reads_what_a_live_data_collector_records(root: Path, env_id: str, data_format: str):
    pytest.importorskip(
        "jax", reason="minari's DataCollector needs jax: minari[create], in the dev extra"
    )
    if data_format == "arrow":
        pytest.importorskip(
            "pyarrow", reason="pyarrow (Minari's Arrow backend) comes with minari[arrow]"
        )
    env = minari.DataCollector(gym.make(env_id, max_episode_steps=15), data_format=data_format)
    env.action_space.seed(3)
    truth = []
    for episode, limit in enumerate([None, None, None, 4]):
        obs, _ = env.reset(seed=episode)
        record: dict[str, list[Any]] = {
            "observations": [obs],
            "actions": [],
            "rewards": [],
            "terminated": [],
            "truncated": [],
        }
        while limit is None or len(record["actions"]) < limit:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            for name, value in zip(
                list(record), (obs, action, reward, terminated, truncated), strict=True
            ):
                record[name].append(value)
            if terminated or truncated:
                break
        truth.append({name: np.asarray(values) for name, values in record.items()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari warns about every unset authorship field
        env.create_dataset(f"live/{env_id.lower()}-v0", algorithm_name="random")
    env.close()
    stored = read_minari(f"live/{env_id.lower()}-v0")  # found through MINARI_DATASETS_PATH
    _check_against_truth(stored, truth, env_id)
    assert stored.metadata["data_format"] == data_format


def _foreign_dataset(
    root: Path,
    dataset_id: str,
    observation_space: Any,
    observations: Any,
    action_space: Any,
    actions: Any,
    steps: int,
) -> None:
    from minari.data_collector import EpisodeBuffer

    buffer = EpisodeBuffer(
        observations=observations,
        actions=actions,
        rewards=np.arange(steps, dtype=np.float64),
        terminations=[False] * steps,
        truncations=[False] * steps,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            dataset_id, [buffer], observation_space=observation_space, action_space=action_space
        )


def test_reads_a_flat_dict_observation_dataset_made_by_minari(root: Path) -> None:
    space = gym.spaces.Dict({"b": gym.spaces.Box(-1, 1, (1,)), "a": gym.spaces.Box(0, 9, (2,))})
    obs = {
        "a": np.arange(8, dtype=np.float32).reshape(4, 2),
        "b": np.linspace(-1, 1, 4, dtype=np.float32).reshape(4, 1),
    }
    _foreign_dataset(
        root, "other/dict-v0", space, obs, gym.spaces.Discrete(3), np.array([0, 2, 1]), 3
    )
    stored = read_minari("other/dict-v0")
    assert [c.name for c in stored.columns] == ["a", "b", "actions", "rewards"]
    ((identity, data, end),) = stored.episodes
    np.testing.assert_array_equal(data["a"], obs["a"])
    np.testing.assert_array_equal(data["b"], obs["b"])
    np.testing.assert_array_equal(data["actions"], [[0], [2], [1]])
    np.testing.assert_array_equal(data["rewards"], [[0.0], [1.0], [2.0]])
    assert (identity, end) == (0, EpisodeState.INTERRUPTED)  # no flag at all: an unfinished tail


@pytest.mark.parametrize(
    "observation_space, observations, action_space, actions, message",
    [
        (
            gym.spaces.Dict({"inner": gym.spaces.Dict({"x": gym.spaces.Box(0, 1, (2,))})}),
            {"inner": {"x": np.zeros((3, 2), np.float32)}},
            gym.spaces.Discrete(2),
            np.zeros(2, int),
            "Dict observation 'inner'",
        ),
        (
            gym.spaces.Discrete(5),
            np.array([0, 1, 2]),
            gym.spaces.Discrete(2),
            np.zeros(2, int),
            "Discrete observations",
        ),
        (
            gym.spaces.Box(0, 1, (2,)),
            np.zeros((3, 2), np.float32),
            gym.spaces.MultiBinary(3),
            np.zeros((2, 3), np.int8),
            "MultiBinary actions",
        ),
    ],
)
def test_unsupported_spaces_are_refused_with_the_rule(
    root: Path, observation_space: Any, observations: Any, action_space: Any, actions: Any, message
) -> None:
    _foreign_dataset(
        root, "other/odd-v0", observation_space, observations, action_space, actions, 2
    )
    with pytest.raises(FormatError, match=message) as caught:
        read_minari("other/odd-v0")
    assert "Box" in str(caught.value)
