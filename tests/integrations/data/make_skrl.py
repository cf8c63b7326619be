"""Writes the skrl ``Memory.save`` exports in this folder and what the envs really did.

Two modes (see README.md for the exact environments):

- ``agent``  (skrl 2.x): skrl's SAC agent and ``SequentialTrainer`` collect Pendulum-v1 (time limit
  50) into a ``RandomMemory``; the memory is saved as ``.pt``, ``.npz`` and ``.csv``.
- ``memory`` (skrl 1.x, the ``states``/``next_states`` layout rofunc shares): a two-env
  ``RandomMemory`` with the tensors skrl 1.x's DQN creates, filled from two CartPole-v1 envs
  (time limit 25, random actions) and saved before it is full.

``<name>.record.npz`` holds, per env, every transition the env made (``env<i>_obs``,
``env<i>_next_obs``, ``env<i>_actions``, ``env<i>_rewards``, ``env<i>_terminated``,
``env<i>_truncated``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

HERE = Path(__file__).parent
KEYS = ("obs", "next_obs", "actions", "rewards", "terminated", "truncated")


class Recorder(gym.Wrapper):
    """Logs every transition of one env."""

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
        values = (self.last, obs, np.asarray(action), reward, terminated, truncated)
        for key, value in zip(KEYS, values, strict=True):
            self.log[key].append(value)
        self.last = obs
        return obs, reward, terminated, truncated, info


def save_record(name: str, logs: list[dict[str, list]]) -> None:
    record = {
        f"env{i}_{key}": np.stack([np.asarray(v) for v in log[key]])
        for i, log in enumerate(logs)
        for key in KEYS
    }
    np.savez_compressed(HERE / f"{name}.record.npz", **record)


def save_all_formats(memory, name: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        for fmt in ("pt", "npz", "csv"):
            memory.save(scratch, format=fmt)
        for file in (Path(scratch) / "memories").iterdir():
            shutil.copy(file, HERE / f"{name}{file.suffix}")


def agent_mode() -> None:
    from skrl.agents.torch.sac import SAC
    from skrl.envs.wrappers.torch import wrap_env
    from skrl.memories.torch import RandomMemory
    from skrl.models.torch import DeterministicMixin, GaussianMixin, Model
    from skrl.trainers.torch import SequentialTrainer

    class Policy(GaussianMixin, Model):
        def __init__(self, observation_space, action_space, device):
            Model.__init__(
                self, observation_space=observation_space, action_space=action_space, device=device
            )
            GaussianMixin.__init__(self, clip_actions=True)
            self.net = torch.nn.Linear(self.num_observations, self.num_actions)
            self.log_std = torch.nn.Parameter(torch.zeros(self.num_actions))

        def compute(self, inputs, role):
            return self.net(inputs["observations"]), {"log_std": self.log_std}

    class Critic(DeterministicMixin, Model):
        def __init__(self, observation_space, action_space, device):
            Model.__init__(
                self, observation_space=observation_space, action_space=action_space, device=device
            )
            DeterministicMixin.__init__(self)
            self.net = torch.nn.Linear(self.num_observations + self.num_actions, 1)

        def compute(self, inputs, role):
            joined = torch.cat([inputs["observations"], inputs["taken_actions"]], dim=1)
            return self.net(joined), {}

    torch.manual_seed(3)
    log = {key: [] for key in KEYS}
    raw = Recorder(gym.make("Pendulum-v1", max_episode_steps=50), log)
    raw.reset(seed=5)
    raw.action_space.seed(5)
    env = wrap_env(raw, wrapper="gymnasium")
    memory = RandomMemory(memory_size=130, num_envs=env.num_envs, device="cpu")
    spaces = {
        "observation_space": env.observation_space,
        "action_space": env.action_space,
        "device": "cpu",
    }
    models = {"policy": Policy(**spaces)}
    for role in ("critic_1", "critic_2", "target_critic_1", "target_critic_2"):
        models[role] = Critic(**spaces)
    cfg = {"random_timesteps": 10_000, "learning_starts": 10_000}
    agent = SAC(models=models, memory=memory, cfg=cfg, **spaces)
    trainer = SequentialTrainer(
        env=env, agents=agent, cfg={"timesteps": 130, "headless": True, "disable_progressbar": True}
    )
    trainer.train()
    print(
        "memory_index",
        memory.memory_index,
        "filled",
        memory.filled,
        "names",
        memory.get_tensor_names(),
    )
    save_all_formats(memory, "skrl2_sac_pendulum")
    save_record("skrl2_sac_pendulum", [log])


def memory_mode() -> None:
    from skrl.memories.torch import RandomMemory

    envs, logs = [], []
    for i in range(2):
        log = {key: [] for key in KEYS}
        env = Recorder(gym.make("CartPole-v1", max_episode_steps=25), log)
        env.action_space.seed(20 + i)
        envs.append(env)
        logs.append(log)
    memory = RandomMemory(memory_size=80, num_envs=2, device="cpu")
    space = envs[0].observation_space
    memory.create_tensor(name="states", size=space, dtype=torch.float32)
    memory.create_tensor(name="next_states", size=space, dtype=torch.float32)
    memory.create_tensor(name="actions", size=envs[0].action_space, dtype=torch.int64)
    memory.create_tensor(name="rewards", size=1, dtype=torch.float32)
    memory.create_tensor(name="terminated", size=1, dtype=torch.bool)
    memory.create_tensor(name="truncated", size=1, dtype=torch.bool)
    observations = [env.reset(seed=30 + i)[0] for i, env in enumerate(envs)]
    for _ in range(57):
        rows = {
            key: []
            for key in ("states", "next_states", "actions", "rewards", "terminated", "truncated")
        }
        for i, env in enumerate(envs):
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            for key, value in (
                ("states", observations[i]),
                ("next_states", obs),
                ("actions", [action]),
                ("rewards", [reward]),
                ("terminated", [terminated]),
                ("truncated", [truncated]),
            ):
                rows[key].append(value)
            observations[i] = env.reset()[0] if terminated or truncated else obs
        memory.add_samples(**{key: torch.tensor(np.asarray(value)) for key, value in rows.items()})
    print("memory_index", memory.memory_index, "filled", memory.filled)
    save_all_formats(memory, "skrl1_memory_2envs")
    save_record("skrl1_memory_2envs", logs)


def ppo_mode() -> None:
    """skrl 2.x's PPO fills a ``RandomMemory(export=True)``, which saves itself when full."""
    from skrl.agents.torch.ppo import PPO
    from skrl.envs.wrappers.torch import wrap_env
    from skrl.memories.torch import RandomMemory
    from skrl.models.torch import DeterministicMixin, GaussianMixin, Model
    from skrl.trainers.torch import SequentialTrainer

    class Policy(GaussianMixin, Model):
        def __init__(self, observation_space, action_space, device):
            Model.__init__(
                self, observation_space=observation_space, action_space=action_space, device=device
            )
            GaussianMixin.__init__(self, clip_actions=True)
            self.net = torch.nn.Linear(self.num_observations, self.num_actions)
            self.log_std = torch.nn.Parameter(torch.zeros(self.num_actions))

        def compute(self, inputs, role):
            return self.net(inputs["observations"]), {"log_std": self.log_std}

    class Value(DeterministicMixin, Model):
        def __init__(self, observation_space, action_space, device):
            Model.__init__(
                self, observation_space=observation_space, action_space=action_space, device=device
            )
            DeterministicMixin.__init__(self)
            self.net = torch.nn.Linear(self.num_observations, 1)

        def compute(self, inputs, role):
            return self.net(inputs["observations"]), {}

    torch.manual_seed(4)
    for fmt in ("pt", "npz", "csv"):
        raw = gym.make("Pendulum-v1", max_episode_steps=20)
        raw.reset(seed=6)
        env = wrap_env(raw, wrapper="gymnasium")
        with tempfile.TemporaryDirectory() as scratch:
            memory = RandomMemory(
                memory_size=48, num_envs=1, device="cpu", export=True, export_format=fmt,
                export_directory=scratch,
            )  # fmt: skip
            spaces = {
                "observation_space": env.observation_space,
                "action_space": env.action_space,
                "device": "cpu",
            }
            models = {"policy": Policy(**spaces), "value": Value(**spaces)}
            cfg = {"rollouts": 48, "mini_batches": 2, "learning_epochs": 1}
            agent = PPO(models=models, memory=memory, cfg=cfg, **spaces)
            trainer = SequentialTrainer(
                env=env, agents=agent, cfg={"timesteps": 48, "headless": True,
                                            "disable_progressbar": True},
            )  # fmt: skip
            trainer.train()
            print("names", memory.get_tensor_names())
            (written,) = (Path(scratch) / "memories").iterdir()
            shutil.copy(written, HERE / f"skrl2_ppo_pendulum{written.suffix}")


if __name__ == "__main__":
    modes = {"agent": agent_mode, "memory": memory_mode, "ppo": ppo_mode}
    sys.exit(modes[sys.argv[1]]())
