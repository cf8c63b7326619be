"""Writes the tmrl ``data.pkl`` datasets in this folder with tmrl's own ``GenericTorchMemory``.

``import tmrl`` downloads game resources on first use, which this machine cannot reach, so the
script registers an empty ``tmrl`` package pointing at the installed sources and imports only
``tmrl.memory`` and ``tmrl.custom.custom_memories`` (plain numpy/torch code). Samples are made
the way tmrl's ``RolloutWorker`` makes them: ``reset`` appends ``(default action or None,
first observation, 0.0, False, False, info)``; each step appends ``(action, new observation,
reward, terminated, truncated, info)``, with ``truncated`` forced on at the worker's step cap.
``GenericTorchMemory.append_buffer`` turns them into its seven lists and trims the oldest entries
beyond ``memory_size``; ``memory.data`` is pickled as ``<name>.data.pkl``.

``<name>.record.npz`` holds every transition the env made (``env0_*`` as in the other scripts,
observations flattened part by part in ``env0_obs_<i>`` / ``env0_next_obs_<i>``).
"""

from __future__ import annotations

import importlib.util
import pickle
import sys
import types
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).parent


def load_tmrl_memories(site: Path):
    package = types.ModuleType("tmrl")
    package.__path__ = [str(site / "tmrl")]
    sys.modules["tmrl"] = package
    for name in ("tmrl.custom",):
        sub = types.ModuleType(name)
        sub.__path__ = [str(site / "tmrl" / "custom")]
        sys.modules[name] = sub
    spec = importlib.util.find_spec("tmrl.custom.custom_memories")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GenericTorchMemory


class Samples:
    """What tmrl's ``Buffer`` hands ``append_buffer``: a ``memory`` list plus statistics."""

    def __init__(self) -> None:
        self.memory = []
        self.stat_train_return = self.stat_test_return = 0.0
        self.stat_train_steps = self.stat_test_steps = 0

    def __len__(self) -> int:
        return len(self.memory)


def collect(env, observe, episodes, cap, placeholder, seed):
    samples, log = (
        Samples(),
        {k: [] for k in ("obs", "next_obs", "actions", "rewards", "terminated", "truncated")},
    )
    env.action_space.seed(seed)
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode)
        samples.memory.append((placeholder, observe(obs), 0.0, False, False, dict(info)))
        for step in range(cap):
            action = env.action_space.sample()
            new_obs, reward, terminated, truncated, info = env.step(action)
            if step == cap - 1 and not terminated:
                truncated = True  # the worker's step cap
            samples.memory.append(
                (action, observe(new_obs), reward, terminated, truncated, dict(info))
            )
            for key, value in (
                ("obs", obs),
                ("next_obs", new_obs),
                ("actions", action),
                ("rewards", reward),
                ("terminated", terminated),
                ("truncated", truncated),
            ):
                log[key].append(np.asarray(value))
            obs = new_obs
            if terminated or truncated:
                break
    return samples, log


def produce(memory_cls, name, env, observe, *, episodes, cap, placeholder, memory_size, seed):
    samples, log = collect(env, observe, episodes, cap, placeholder, seed)
    memory = memory_cls(memory_size=memory_size, dataset_path=str(HERE / "no-such-dataset"))
    memory.append(samples)
    with open(HERE / f"{name}.data.pkl", "wb") as file:
        pickle.dump(memory.data, file, protocol=pickle.HIGHEST_PROTOCOL)
    np.savez_compressed(
        HERE / f"{name}.record.npz", **{f"env0_{k}": np.stack(v) for k, v in log.items()}
    )
    print(name, "entries", len(memory.data[0]), "of", len(samples.memory))


def main() -> None:
    memory_cls = load_tmrl_memories(Path(sys.argv[1]))

    def pendulum_parts(obs):  # tmrl-style tuple of float32 arrays
        return (np.asarray(obs[:2], np.float32), np.asarray(obs[2:], np.float32))

    def cartpole_parts(obs):  # mixed dtypes: a float vector and a small uint8 "image"
        image = (np.clip(np.abs(obs), 0, 1) * 255).astype(np.uint8).reshape(2, 2)
        return (np.asarray(obs, np.float32), image)

    produce(
        memory_cls,
        "tmrl_pendulum",
        gym.make("Pendulum-v1", max_episode_steps=200),
        pendulum_parts,
        episodes=7,
        cap=15,
        placeholder=np.zeros(1, np.float32),
        memory_size=90,
        seed=40,
    )
    produce(
        memory_cls,
        "tmrl_cartpole_mixed",
        gym.make("CartPole-v1", max_episode_steps=200),
        cartpole_parts,
        episodes=6,
        cap=18,
        placeholder=None,
        memory_size=1000,
        seed=60,
    )


if __name__ == "__main__":
    sys.exit(main())
