"""Real skrl agents train from SkrlMemory; its episodes then go to an emote store."""

from __future__ import annotations

import json
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.integrations.skrl.memory import SkrlMemory
from emote_core.integrations.upstream import store_table
from emote_core.stores.zarr_store import MemoryStore
from emote_core.typing import EpisodeState

pytest.importorskip("skrl", reason="skrl is in the dev and skrl extras")
from skrl.agents.torch.ppo import PPO
from skrl.agents.torch.sac import SAC
from skrl.envs.wrappers.torch import wrap_env
from skrl.models.torch import DeterministicMixin, GaussianMixin, Model
from skrl.trainers.torch import SequentialTrainer


def _mlp(inputs: int, outputs: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, outputs),
    )  # fmt: skip


class Policy(GaussianMixin, Model):
    def __init__(self, observation_space, action_space, device, hidden=64):
        Model.__init__(
            self, observation_space=observation_space, action_space=action_space, device=device
        )
        GaussianMixin.__init__(self, clip_actions=True, clip_log_std=True)
        self.net = _mlp(self.num_observations, self.num_actions, hidden)
        self.log_std = torch.nn.Parameter(torch.zeros(self.num_actions))

    def compute(self, inputs, role):
        # Pendulum's torque is in [-2, 2].
        return 2 * torch.tanh(self.net(inputs["observations"])), {"log_std": self.log_std}


class Critic(DeterministicMixin, Model):
    def __init__(self, observation_space, action_space, device, hidden=64, with_actions=True):
        Model.__init__(
            self, observation_space=observation_space, action_space=action_space, device=device
        )
        DeterministicMixin.__init__(self)
        self.with_actions = with_actions
        width = self.num_observations + (self.num_actions if with_actions else 0)
        self.net = _mlp(width, 1, hidden)

    def compute(self, inputs, role):
        if not self.with_actions:
            return self.net(inputs["observations"]), {}
        return self.net(torch.cat([inputs["observations"], inputs["taken_actions"]], dim=1)), {}


def _sac(memory, env, tmp_path, hidden=64, **cfg):
    spaces = {"observation_space": env.observation_space, "action_space": env.action_space}
    models = {"policy": Policy(**spaces, device="cpu", hidden=hidden)}
    for role in ("critic_1", "critic_2", "target_critic_1", "target_critic_2"):
        models[role] = Critic(**spaces, device="cpu", hidden=hidden)
    experiment = {"directory": str(tmp_path), "write_interval": 0, "checkpoint_interval": 0}
    return SAC(
        models=models, memory=memory, device="cpu", cfg={**cfg, "experiment": experiment},
        **spaces,
    )  # fmt: skip


def _train(agent, env, timesteps: int) -> None:
    cfg = {
        "timesteps": timesteps, "headless": True, "disable_progressbar": True,
        "close_environment_at_exit": False,
    }  # fmt: skip
    SequentialTrainer(env=env, agents=agent, cfg=cfg).train()
    env.close()


def test_skrl_sac_trains_from_it_and_its_episodes_verify_as_an_emote_store(runner, tmp_path):
    torch.manual_seed(0)
    raw = gym.make("Pendulum-v1", max_episode_steps=60)
    raw.reset(seed=0)
    env = wrap_env(raw, wrapper="gymnasium")
    memory = SkrlMemory(memory_size=1000, device="cpu", seed=0)
    agent = _sac(memory, env, tmp_path, hidden=16, batch_size=32, learning_starts=100)
    before = [p.detach().clone() for p in agent.policy.parameters()]
    _train(agent, env, 150)
    assert len(memory) == 150 and memory.memory_index == 150 and not memory.filled
    assert any(
        not torch.equal(a, b) for a, b in zip(before, agent.policy.parameters(), strict=True)
    )
    # skrl 2.x SAC passes no `truncated`: the two time limits were found as resets.
    assert memory.inferred_cuts == 2
    memory.flush()
    episodes = list(memory.table.episodes())
    assert [len(d["rewards"]) for _, d, _ in episodes] == [60, 60, 30]
    assert {end for *_, end in episodes} == {EpisodeState.INTERRUPTED}
    # The same transitions as skrl sees them, from the table's derived next observations.
    (observations, following) = memory.sample_by_index(
        ["observations", "next_observations"], indexes=np.arange(59)
    )[0]
    np.testing.assert_array_equal(following[:-1].numpy(), observations[1:].numpy())
    np.testing.assert_array_equal(observations.numpy(), episodes[0][1]["observations"][:59])

    archive = tmp_path / "sac.zip"
    store_table(memory.table, archive)
    store = tmp_path / "sac.zarr"
    converted = runner.invoke(app, ["memory", "convert", str(archive), str(store), "-q"])
    assert converted.exit_code == ExitCode.OK, converted.stderr
    verified = runner.invoke(app, ["memory", "verify", str(store), "--json"])
    assert verified.exit_code == ExitCode.OK, verified.stderr
    assert json.loads(verified.stdout)["ok"] is True
    stored = MemoryStore(str(store))
    assert stored.episode_count == 3


def test_skrl_ppo_runs_its_rollouts_through_get_and_set_tensor(tmp_path):
    torch.manual_seed(1)
    raw = gym.make("Pendulum-v1", max_episode_steps=40)
    raw.reset(seed=1)
    env = wrap_env(raw, wrapper="gymnasium")
    memory = SkrlMemory(memory_size=64, device="cpu", seed=1)
    spaces = {"observation_space": env.observation_space, "action_space": env.action_space}
    models = {
        "policy": Policy(**spaces, device="cpu"),
        "value": Critic(**spaces, device="cpu", with_actions=False),
    }
    experiment = {"directory": str(tmp_path), "write_interval": 0, "checkpoint_interval": 0}
    cfg = {"rollouts": 64, "mini_batches": 4, "learning_epochs": 2, "experiment": experiment}
    agent = PPO(models=models, memory=memory, device="cpu", cfg=cfg, **spaces)
    _train(agent, env, 128)
    assert memory.filled and len(memory) == 64
    # PPO set returns and advantages after each rollout: they reached the table's episodes.
    advantages = memory.get_tensor_by_name("advantages")
    assert not torch.isnan(advantages).any()
    held = [d["advantages"] for _, d, _ in memory.table.episodes()]
    assert held and not any(np.isnan(h).any() for h in held)
    ends = {end for *_, end in memory.table.episodes()}
    assert ends == {EpisodeState.INTERRUPTED}  # PPO passes `truncated` at the time limits


@pytest.mark.slow
def test_skrl_sac_learns_pendulum_from_it(tmp_path):
    torch.manual_seed(42)
    raw = gym.make("Pendulum-v1")
    raw.reset(seed=42)
    env = wrap_env(raw, wrapper="gymnasium")
    memory = SkrlMemory(memory_size=20_000, device="cpu", seed=42)
    agent = _sac(
        memory, env, tmp_path, hidden=128, batch_size=256, learning_starts=500,
        random_timesteps=500, learning_rate=1e-3, discount_factor=0.99, polyak=0.005,
    )  # fmt: skip
    started = time.perf_counter()
    _train(agent, env, 10_000)
    minutes = (time.perf_counter() - started) / 60
    agent.enable_training_mode(False, apply_to_models=True)
    evaluation = gym.make("Pendulum-v1")
    returns = []
    for episode in range(10):
        observation, _ = evaluation.reset(seed=1000 + episode)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                inputs = {"observations": torch.as_tensor(observation[None], dtype=torch.float32)}
                _, outputs = agent.policy.act(inputs, role="policy")
            action = outputs["mean_actions"][0].numpy()
            observation, reward, terminated, truncated, _ = evaluation.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    print(f"skrl SAC on SkrlMemory: mean return {np.mean(returns):.1f} in {minutes:.1f} min")
    assert np.mean(returns) >= -300, returns
