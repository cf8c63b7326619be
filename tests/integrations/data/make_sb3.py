"""Writes the Stable-Baselines3 replay buffers in this folder and what the envs really did.

Run with stable-baselines3 2.x installed (see README.md). Each ``<name>.pkl`` is
``model.save_replay_buffer``'s own output; ``<name>.record.npz`` holds, per env, every transition
the env made during collection (``env<i>_obs``, ``env<i>_next_obs``, ``env<i>_actions`` as the
env received them, ``env<i>_rewards``, ``env<i>_terminated``, ``env<i>_truncated``), recorded by
a gymnasium wrapper inside the vectorised env.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.vec_env import DummyVecEnv

HERE = Path(__file__).parent


class Recorder(gym.Wrapper):
    """Logs every transition of one env: observation, action, reward, next observation, flags."""

    def __init__(self, env: gym.Env, log: dict[str, list]) -> None:
        super().__init__(env)
        self.log = log
        self.last = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.last = obs
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        for key, value in (
            ("obs", self.last),
            ("next_obs", obs),
            ("actions", np.asarray(action)),
            ("rewards", reward),
            ("terminated", terminated),
            ("truncated", truncated),
        ):
            self.log[key].append(value)
        self.last = obs
        return obs, reward, terminated, truncated, info


class SplitObservation(gym.ObservationWrapper):
    """Pendulum's observation as a dict (``angle``: cos and sin, ``velocity``)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Dict(
            {
                "angle": gym.spaces.Box(box.low[:2], box.high[:2], dtype=np.float32),
                "velocity": gym.spaces.Box(box.low[2:], box.high[2:], dtype=np.float32),
            }
        )

    def observation(self, observation):
        return {"angle": observation[:2], "velocity": observation[2:]}


def make_env(env_id: str, steps: int, log: dict[str, list], seed: int, split: bool = False):
    def build() -> gym.Env:
        env = gym.make(env_id, max_episode_steps=steps)
        if split:
            env = SplitObservation(env)
        env = Recorder(env, log)
        env.reset(seed=seed)
        env.action_space.seed(seed)
        return env

    return build


def produce(
    name: str, algorithm, env_id: str, *, steps: int, envs: int, total: int, split=False, **kwargs
) -> None:
    logs = [
        {k: [] for k in ("obs", "next_obs", "actions", "rewards", "terminated", "truncated")}
        for _ in range(envs)
    ]
    venv = DummyVecEnv([make_env(env_id, steps, logs[i], 10 + i, split) for i in range(envs)])
    policy = "MultiInputPolicy" if split else "MlpPolicy"
    model = algorithm(policy, venv, learning_starts=1_000_000, seed=7, verbose=0, **kwargs)
    model.learn(total_timesteps=total)
    model.save_replay_buffer(HERE / f"{name}.pkl")
    record = {}
    for i, log in enumerate(logs):
        for key, values in log.items():
            if values and isinstance(values[0], dict):
                for sub in values[0]:
                    record[f"env{i}_{key}_{sub}"] = np.stack([v[sub] for v in values])
            else:
                record[f"env{i}_{key}"] = np.stack([np.asarray(v) for v in values])
    np.savez_compressed(HERE / f"{name}.record.npz", **record)
    buffer = model.replay_buffer
    print(name, "pos", buffer.pos, "full", buffer.full, "steps per env", len(logs[0]["rewards"]))


def main() -> None:
    # SAC, one env, ring buffer wrapped (430 steps into 300 rows); episodes are cut at 50 steps.
    produce(
        "sb3_sac_pendulum_wrapped", SAC, "Pendulum-v1", steps=50, envs=1, total=430, buffer_size=300
    )
    # DQN, two envs (150 steps each into 200 rows per env): terminations and time limits.
    produce(
        "sb3_dqn_cartpole_2envs", DQN, "CartPole-v1", steps=40, envs=2, total=300, buffer_size=400
    )
    # DQN with optimize_memory_usage (no next_observations array), wrapped.
    produce(
        "sb3_dqn_cartpole_optimized",
        DQN,
        "CartPole-v1",
        steps=40,
        envs=1,
        total=160,
        buffer_size=120,
        optimize_memory_usage=True,
        replay_buffer_kwargs={"handle_timeout_termination": False},
    )
    # DQN with n-step returns (NStepReplayBuffer: the same storage, n-step sums at sampling).
    produce(
        "sb3_dqn_cartpole_nstep",
        DQN,
        "CartPole-v1",
        steps=40,
        envs=1,
        total=70,
        buffer_size=100,
        n_steps=3,
    )
    # SAC on dict observations (DictReplayBuffer), two envs, wrapped.
    produce(
        "sb3_sac_dict_2envs",
        SAC,
        "Pendulum-v1",
        steps=30,
        envs=2,
        total=200,
        split=True,
        buffer_size=160,
    )


if __name__ == "__main__":
    sys.exit(main())
