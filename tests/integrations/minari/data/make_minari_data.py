"""Makes the Minari datasets in this folder with minari's own DataCollector (see README.md).

Run from this folder in a venv with ``minari[hdf5,create]==0.5.4`` and gymnasium 1.4:
``python make_minari_data.py``. It writes ``cartpole/random-v0`` and ``pendulum/random-v0``
(Minari datasets, HDF5) and ``truth.npz``: what the environments returned, recorded beside the
collector, for the tests to compare against.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).parent
PLAN = {"cartpole/random-v0": ("CartPole-v1", 14, 4), "pendulum/random-v0": ("Pendulum-v1", 20, 2)}


def collect(dataset_id: str, env_id: str, time_limit: int, episodes: int) -> dict[str, np.ndarray]:
    import minari

    env = minari.DataCollector(gym.make(env_id, max_episode_steps=time_limit), data_format="hdf5")
    env.action_space.seed(7)
    truth: dict[str, np.ndarray] = {}

    def run(episode: int, steps: int | None) -> None:
        obs, _ = env.reset(seed=100 + episode)
        rows, actions, rewards, terminated, truncated = [obs], [], [], [], []
        while steps is None or len(actions) < steps:
            action = env.action_space.sample()
            obs, reward, term, trunc, _ = env.step(action)
            rows.append(obs)
            actions.append(action)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            if term or trunc:
                break
        prefix = f"{dataset_id}/{episode}/"
        for name, values in (("observations", rows), ("actions", actions), ("rewards", rewards),
                             ("terminated", terminated), ("truncated", truncated)):  # fmt: skip
            truth[prefix + name] = np.asarray(values)

    for episode in range(episodes):
        run(episode, None)
    run(episodes, 3)  # an unfinished tail: the collector marks it truncated
    env.create_dataset(
        dataset_id, algorithm_name="random", author="emote tests", author_email="none@example.com",
        code_permalink="tests/integrations/minari/data/make_minari_data.py",
        description=f"{env_id}, uniform random actions, time limit {time_limit}",
    )  # fmt: skip
    env.close()
    return truth


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        os.environ["MINARI_DATASETS_PATH"] = root
        truth = {}
        for dataset_id, (env_id, time_limit, episodes) in PLAN.items():
            truth.update(collect(dataset_id, env_id, time_limit, episodes))
            shutil.rmtree(HERE / dataset_id.split("/")[0], ignore_errors=True)
            shutil.copytree(Path(root) / dataset_id.split("/")[0], HERE / dataset_id.split("/")[0])
        np.savez_compressed(HERE / "truth.npz", **truth)


if __name__ == "__main__":
    main()
