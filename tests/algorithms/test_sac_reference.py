"""SAC through the Trainer is the same arithmetic as a straightforward hand-written update loop.

The engine's fast paths (hook dispatch, gradient-norm measurement, logging, sampling) must not
change a single bit: from the same seeds and the same batches, the Trainer-driven callbacks and a
plain torch loop end with identical weights, temperatures and logged values.
"""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from emote_core.algorithms.sac import AlphaLoss, PolicyLoss, QLoss, QTarget
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.nn.action_value import ActionValueMlp
from emote_core.nn.policies import GaussianMlpPolicy
from emote_core.spaces import MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState

HIDDEN = (32, 32)
LR = 1e-2
GAMMA = 0.99
TAU = 0.005
BATCH = 16
UPDATES = 25


def pendulum_table(seed: int = 0) -> DictObsMemoryTable:
    """Random-policy Pendulum-v1 episodes cut short, every other one ended TERMINAL (so masks of
    0 appear in the batches)."""
    env = gym.make("Pendulum-v1")
    env.action_space.seed(seed)
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    table = DictObsMemoryTable(spaces=spaces, maxlen=10_000, seed=seed)
    for identity in range(12):
        observation, _ = env.reset(seed=seed + identity)
        observations, actions, rewards = [observation], [], []
        for _ in range(5 + identity):
            action = env.action_space.sample()
            observation, reward, _, _, _ = env.step(action)
            observations.append(observation)
            actions.append(action / 2.0)
            rewards.append(reward)
        end_state = EpisodeState.TERMINAL if identity % 2 else EpisodeState.INTERRUPTED
        table.add_sequence(
            identity,
            {"obs": np.asarray(observations, np.float32),
             "actions": np.asarray(actions, np.float32),
             "rewards": np.asarray(rewards, np.float32)},
            end_state=end_state,
        )  # fmt: skip
    env.close()
    return table


def networks() -> dict[str, nn.Module | torch.Tensor]:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=HIDDEN)
    q1 = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=HIDDEN)
    q2 = ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=HIDDEN)
    ln_alpha = torch.zeros(1, requires_grad=True)
    return {"policy": policy, "q1": q1, "q2": q2, "q1_target": copy.deepcopy(q1),
            "q2_target": copy.deepcopy(q2), "ln_alpha": ln_alpha}  # fmt: skip


def run_emote(max_grad_norm: float | None) -> tuple[dict, list]:
    parts = networks()
    policy, q1, q2, ln_alpha = parts["policy"], parts["q1"], parts["q2"], parts["ln_alpha"]
    clip = {"max_grad_norm": max_grad_norm}
    callbacks = [
        QTarget(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2, q1_target=parts["q1_target"],
                q2_target=parts["q2_target"], gamma=GAMMA, target_q_tau=TAU),
        QLoss(name="q1", q=q1, optimizer=torch.optim.Adam(q1.parameters(), lr=LR), **clip),
        QLoss(name="q2", q=q2, optimizer=torch.optim.Adam(q2.parameters(), lr=LR), **clip),
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2,
                   optimizer=torch.optim.Adam(policy.parameters(), lr=LR), **clip),
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=1,
                  optimizer=torch.optim.Adam([ln_alpha], lr=LR), **clip),
    ]  # fmt: skip
    loader = MemoryLoader(table=pendulum_table(), rollout_count=BATCH, rollout_length=1)
    torch.manual_seed(1)
    Trainer([*callbacks, BackPropStepsTerminator(bp_steps=UPDATES)], loader).train()
    return parts, callbacks


def step(
    loss: torch.Tensor, parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer,
    max_grad_norm: float | None,
) -> float:  # fmt: skip
    """backward, clip (or measure), step; returns the gradient norm before clipping."""
    loss.backward()
    grads = [p.grad for p in parameters if p.grad is not None]
    if max_grad_norm is None:
        norm = nn.utils.get_total_norm(grads)
    else:
        norm = nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()
    return norm.item()


def run_reference(max_grad_norm: float | None) -> tuple[dict, dict[str, float]]:
    """SAC written out plainly: the batches are the same table's samples (same seed)."""
    parts = networks()
    policy, q1, q2, ln_alpha = parts["policy"], parts["q1"], parts["q2"], parts["ln_alpha"]
    q1_target, q2_target = parts["q1_target"], parts["q2_target"]
    optimizers = {
        "q1": torch.optim.Adam(q1.parameters(), lr=LR),
        "q2": torch.optim.Adam(q2.parameters(), lr=LR),
        "policy": torch.optim.Adam(policy.parameters(), lr=LR),
        "alpha": torch.optim.Adam([ln_alpha], lr=LR),
    }
    table = pendulum_table()
    torch.manual_seed(1)
    logs: dict[str, float] = {}
    for _ in range(UPDATES):
        batch = table.sample(BATCH, 1)
        obs, next_obs = batch["observation"]["obs"], batch["next_observation"]["obs"]
        actions, rewards, masks = batch["actions"], batch["rewards"], batch["masks"]
        with torch.no_grad():
            next_actions, next_log_probs = policy.sample(next_obs)
            q_next = torch.min(q1_target(observation=next_obs, actions=next_actions),
                               q2_target(observation=next_obs, actions=next_actions))  # fmt: skip
            q_target = rewards + GAMMA * masks * (q_next - ln_alpha.exp() * next_log_probs)
        logs["training/q_target"] = q_target.mean().item()
        for name, q in (("q1", q1), ("q2", q2)):
            optimizers[name].zero_grad(set_to_none=True)
            prediction = q(observation=obs, actions=actions)
            loss = (prediction - q_target).square().mean()
            logs[f"{name}:training/{name}_gradient_norm"] = step(
                loss, list(q.parameters()), optimizers[name], max_grad_norm
            )
            logs[f"{name}:loss/{name}"] = loss.item()
            logs[f"{name}:training/{name}_prediction"] = prediction.mean().item()
        optimizers["policy"].zero_grad(set_to_none=True)
        new_actions, log_probs = policy.sample(obs)
        q_values = torch.min(q1(observation=obs, actions=new_actions),
                             q2(observation=obs, actions=new_actions))  # fmt: skip
        loss = (ln_alpha.detach().exp() * log_probs - q_values).mean()
        logs["policy:training/policy_gradient_norm"] = step(
            loss, list(policy.parameters()), optimizers["policy"], max_grad_norm
        )
        logs["policy:loss/policy"] = loss.item()
        logs["policy:training/policy_entropy"] = -log_probs.mean().item()
        optimizers["alpha"].zero_grad(set_to_none=True)
        loss = -(ln_alpha * (log_probs.detach() - 1.0)).mean()
        logs["alpha:training/alpha_gradient_norm"] = step(
            loss, [ln_alpha], optimizers["alpha"], max_grad_norm
        )
        logs["alpha:loss/alpha"] = loss.item()
        with torch.no_grad():
            ln_alpha.clamp_(max=math.log(10.0))
            for target, source in ((q1_target, q1), (q2_target, q2)):
                for target_parameter, parameter in zip(
                    target.parameters(), source.parameters(), strict=True
                ):
                    target_parameter.lerp_(parameter, TAU)
        logs["alpha:training/alpha"] = ln_alpha.exp().item()
        # Q networks collect weight gradients from the policy loss here (SB3 does the same);
        # the next Q step zeroes them first, so the arithmetic matches emote's frozen Q networks.
    return parts, logs


@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
def test_trainer_driven_sac_matches_a_hand_written_loop_bit_for_bit(
    one_torch_thread: None, max_grad_norm: float | None
) -> None:
    emote, callbacks = run_emote(max_grad_norm)
    reference, reference_logs = run_reference(max_grad_norm)
    for name in ("policy", "q1", "q2", "q1_target", "q2_target"):
        for (key, value), expected in zip(
            emote[name].state_dict().items(), reference[name].state_dict().values(), strict=True
        ):
            assert torch.equal(value, expected), f"{name}.{key} differs"
    assert torch.equal(emote["ln_alpha"], reference["ln_alpha"])
    by_name = {callback.name: callback for callback in callbacks}
    for key, expected in reference_logs.items():
        owner, _, log_key = key.rpartition(":")
        logged = by_name[owner or "q_target"].scalar_logs[log_key]
        assert logged == pytest.approx(expected, rel=1e-6, abs=1e-7), key
    if max_grad_norm is not None:  # clipping happened, or the test would not test it
        assert reference_logs["q1:training/q1_gradient_norm"] > max_grad_norm
    keys = {key for callback in callbacks for key in callback.scalar_logs}
    assert keys == {
        "training/q_target", "loss/q1", "training/q1_lr", "training/q1_gradient_norm",
        "training/q1_prediction", "loss/q2", "training/q2_lr", "training/q2_gradient_norm",
        "training/q2_prediction", "loss/policy", "training/policy_lr",
        "training/policy_gradient_norm", "training/policy_entropy", "loss/alpha",
        "training/alpha_lr", "training/alpha_gradient_norm", "training/alpha",
        "training/alpha_target_entropy",
    }  # fmt: skip
