"""SAC with its twin Q networks stacked in one module (``sac.stacked_q``): the stacked network
computes what its members would, and SAC trained on it learns exactly as with two networks."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.algorithms.sac import (
    AlphaLoss,
    PolicyLoss,
    QLoss,
    QTarget,
    StackedQLoss,
)
from emote_core.callback import Callback
from emote_core.callbacks.compiled import compile_methods
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.memory.priorities import PriorityUpdater
from emote_core.nn import ActionValueMlp, GaussianMlpPolicy, StackedActionValueMlp
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState
from tests.callbacks.test_compiled import SPACES, random_table


def test_a_stacked_network_computes_and_learns_what_its_members_do() -> None:
    torch.manual_seed(0)
    q1, q2 = (ActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(16, 8)) for _ in "ab")
    torch.manual_seed(0)
    built = StackedActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(16, 8))
    stacked = StackedActionValueMlp.from_networks([q1, q2])
    for a, b in zip(built.parameters(), stacked.parameters(), strict=True):
        assert torch.equal(a, b)  # built from the same seed: the same weights as q1 and q2
    observation, actions = torch.randn(10, 3), torch.randn(10, 2)
    values = stacked(observation=observation, actions=actions)
    assert values.shape == (2, 10, 1)
    separate = [q(observation=observation, actions=actions) for q in (q1, q2)]
    for member in range(2):
        torch.testing.assert_close(values[member], separate[member])
        copied = stacked.member(member)(observation=observation, actions=actions)
        torch.testing.assert_close(copied, separate[member])
    # Each member gets the gradient its own network would.
    (values.square().sum()).backward()
    sum(s.square().sum() for s in separate).backward()
    assert stacked.weights[1].grad is not None
    torch.testing.assert_close(stacked.weights[1].grad[1], q2.encoder.layers[2].weight.grad.T)
    torch.testing.assert_close(stacked.biases[2].grad[0, 0], q1.final_layer.bias.grad)
    with pytest.raises(ConfigurationError, match="ActionValueMlp networks of one shape"):
        StackedActionValueMlp.from_networks([q1, ActionValueMlp(observation_dim=3, action_dim=2)])
    with pytest.raises(ConfigurationError, match="activation must have no parameters"):
        StackedActionValueMlp(observation_dim=3, action_dim=2, activation=torch.nn.PReLU)


def sac(*, stacked: bool, clip: float | None, device: str = "cpu") -> list[Callback]:
    """SAC's callbacks on small seeded networks: the same initial weights either way."""
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=(32, 32)).to(device)
    q1, q2 = (ActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(32, 32)).to(device)
              for _ in "ab")  # fmt: skip
    ln_alpha = torch.zeros(1, requires_grad=True, device=device)

    def adam(parameters) -> torch.optim.Adam:
        return torch.optim.Adam(parameters, lr=3e-3)

    if stacked:
        critics = StackedActionValueMlp.from_networks([q1, q2])
        networks = {"critics": critics}
        targets = {"critics_target": copy.deepcopy(critics)}
        q_losses = [StackedQLoss(critics=critics, optimizer=adam(critics.parameters()),
                                 max_grad_norm=clip)]  # fmt: skip
    else:
        networks = {"q1": q1, "q2": q2}
        targets = {"q1_target": copy.deepcopy(q1), "q2_target": copy.deepcopy(q2)}
        q_losses = [QLoss(name=name, q=q, optimizer=adam(q.parameters()), max_grad_norm=clip)
                    for name, q in networks.items()]  # fmt: skip
    return [
        QTarget(policy=policy, ln_alpha=ln_alpha, **networks, **targets),
        *q_losses,
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, **networks, max_grad_norm=clip,
                   optimizer=adam(policy.parameters())),
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=2, optimizer=adam([ln_alpha]),
                  max_grad_norm=clip),
    ]  # fmt: skip


def q_weights(callbacks: list[Callback]) -> list[list[torch.Tensor]]:
    """Both online Q networks' and both targets' parameters, as separate networks have them."""
    target = callbacks[0]
    if target.online.stacked is None:
        networks = [target.q1, target.q2, target.q1_target, target.q2_target]
    else:
        online, stacked_target = target.online.stacked, target.target.stacked
        networks = [online.member(0), online.member(1)]
        networks += [stacked_target.member(0), stacked_target.member(1)]
    return [[p.detach().clone() for p in network.parameters()] for network in networks]


def train(callbacks: list[Callback], updates: int, device: str = "cpu") -> None:
    loader = MemoryLoader(table=random_table(device), rollout_count=64, rollout_length=1)
    torch.manual_seed(1)
    Trainer([*callbacks, BackPropStepsTerminator(bp_steps=updates)], loader).train()


@pytest.mark.parametrize("clip", [0.05, None])  # every step clipped, and never
def test_stacked_sac_trains_as_sac_with_two_q_networks_does(
    clip: float | None, one_torch_thread: None
) -> None:
    separate, stacked = sac(stacked=False, clip=clip), sac(stacked=True, clip=clip)
    train(separate, 8)
    train(stacked, 8)
    for mine, theirs in zip(q_weights(separate), q_weights(stacked), strict=True):
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6)
    policy_pairs = zip(separate[0].policy.parameters(), stacked[0].policy.parameters(), strict=True)
    for a, b in policy_pairs:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6)
    torch.testing.assert_close(separate[0].ln_alpha, stacked[0].ln_alpha)
    logs = stacked[1].scalar_logs
    for name, loss in (("q1", separate[1]), ("q2", separate[2])):
        theirs = loss.scalar_logs
        for key in (f"loss/{name}", f"training/{name}_prediction",
                    f"training/{name}_gradient_norm"):  # fmt: skip
            assert logs[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    assert logs["loss/q"] == pytest.approx(logs["loss/q1"] + logs["loss/q2"], rel=1e-5)
    if clip is not None:  # clipping bit: the norms were far above it
        assert min(logs["training/q1_gradient_norm"], logs["training/q2_gradient_norm"]) > clip


def test_stacked_q_losses_publish_each_member_s_td_errors_for_priorities() -> None:
    separate, stacked = sac(stacked=False, clip=10.0), sac(stacked=True, clip=10.0)
    batch = random_table("cpu").sample(16, 1)
    published: list[dict] = []
    for callbacks in (separate, stacked):
        torch.manual_seed(5)  # the same policy samples in both targets
        state = {**batch, **callbacks[0].begin_batch(**{k: batch[k] for k in
                 ("next_observation", "rewards", "masks")})["default"], "bp_step": 3}  # fmt: skip
        outputs: dict = {}
        for loss in callbacks[1:-2]:
            outputs.update(loss.backward(**state)["default"])
        published.append(outputs)
    assert set(published[1]) == {"q1_td_error", "q1_td_error_step", "q2_td_error",
                                 "q2_td_error_step"}  # fmt: skip
    for key, value in published[0].items():
        if key.endswith("_step"):
            assert published[1][key] == value == 3
        else:
            torch.testing.assert_close(published[1][key], value, rtol=1e-4, atol=1e-6)


def test_prioritized_stacked_sac_moves_the_priorities_of_what_it_sampled() -> None:
    from emote_core.memory.strategies import PrioritizedSampleStrategy

    strategy = PrioritizedSampleStrategy(alpha=1.0)
    table = DictObsMemoryTable(spaces=SPACES, maxlen=10_000, seed=0, sampler=strategy)
    source = random_table("cpu", episodes=10, length=5)
    for slot in source.index.live_slots():
        identity = int(source.index.ids[slot])
        episode = source.sample_by_index([identity] * 5, list(range(5)), 1)
        table.add_sequence(identity, {
            "obs": np.concatenate([episode["observation"]["obs"].numpy(),
                                   episode["next_observation"]["obs"][-1:].numpy()]),
            "actions": episode["actions"].numpy(), "rewards": episode["rewards"].numpy(),
        }, end_state=EpisodeState.TERMINAL)  # fmt: skip
    callbacks = sac(stacked=True, clip=10.0)
    callbacks += [PriorityUpdater(table=table, losses=["q1", "q2"]),
                  BackPropStepsTerminator(bp_steps=20)]  # fmt: skip
    Trainer(callbacks, MemoryLoader(table=table, rollout_count=16, rollout_length=1)).train()
    priorities = np.concatenate([table.sampler.priorities(s) for s in table.index.live_slots()])
    assert (priorities != 1.0).sum() > 30  # most sampled windows took their TD error


def test_stacked_sac_compiles_to_one_graph_per_callback(graph_counts: Callable) -> None:
    callbacks = sac(stacked=True, clip=10.0)
    assert compile_methods(callbacks, backend="aot_eager") == 4
    train(callbacks, 6)
    assert graph_counts() == (4, 0)  # the target, the stacked Q loss, the policy, alpha


@pytest.mark.gpu
def test_stacked_sac_recorded_in_a_cuda_graph_trains_as_two_eager_q_networks_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._inductor.config as inductor

    from emote_core.callbacks.compiled import CapturedUpdate, compiled_training_callbacks

    monkeypatch.setattr(inductor, "fallback_random", True)
    separate = sac(stacked=False, clip=1.0, device="cuda")
    train(separate, 12, device="cuda")
    stacked = sac(stacked=True, clip=1.0, device="cuda")
    running, applied = compiled_training_callbacks(
        stacked, mode="compile+cuda_graphs", device=torch.device("cuda")
    )
    assert applied == "compile+cuda_graphs" and isinstance(running[0], CapturedUpdate)
    train(running, 12, device="cuda")
    for mine, theirs in zip(q_weights(separate), q_weights(stacked), strict=True):
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(separate[0].ln_alpha, stacked[0].ln_alpha, rtol=1e-4, atol=1e-5)


def test_the_two_forms_of_q_networks_are_not_mixed() -> None:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=(8,))
    q = ActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(8,))
    critics = StackedActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(8,))
    ln_alpha = torch.zeros(1, requires_grad=True)
    adam = torch.optim.Adam(policy.parameters())
    with pytest.raises(ConfigurationError, match="give q1 and q2, or critics"):
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, q1=q, q2=q, critics=critics, optimizer=adam)
    with pytest.raises(ConfigurationError, match="give both q1 and q2, or critics"):
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, q1=q, optimizer=adam)
    with pytest.raises(ConfigurationError, match="both be stacked or both not"):
        QTarget(policy=policy, ln_alpha=ln_alpha, critics=critics, q1_target=copy.deepcopy(q),
                q2_target=copy.deepcopy(q))  # fmt: skip
    three = StackedActionValueMlp(observation_dim=3, action_dim=2, hidden_dims=(8,), members=3)
    with pytest.raises(ConfigurationError, match="stacked module of two members"):
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, critics=three, optimizer=adam)
    with pytest.raises(ConfigurationError, match="member_names must give each"):
        StackedQLoss(critics=critics, optimizer=adam, member_names=["q1"])


FAST = ("--set", "memory.warmup_steps=64", "--threads", "1", "--device", "cpu")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_stacked_q_recipe_trains_resumes_and_refuses_what_it_cannot_stack(
    in_tmp: Path, restore_torch_threads: None
) -> None:
    runner = CliRunner()
    stacked = ("--set", "sac.stacked_q=true")
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "40", "--run-dir", "r", *FAST, *stacked]
    )
    assert result.exit_code == 0, result.output
    checkpoint = torch.load(next((in_tmp / "r" / "checkpoints").glob("checkpoint_*.tar")),
                            weights_only=False)  # fmt: skip
    names = set(checkpoint["callbacks"])
    assert {"q_target", "q", "policy", "alpha"} <= names and not {"q1", "q2"} & names
    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "r", "--steps", "60", *FAST])
    assert resumed.exit_code == 0, resumed.output
    changed = runner.invoke(
        app, ["train", "--resume", "--run-dir", "r", "--steps", "80", *FAST,
              "--set", "sac.stacked_q=false"],
    )  # fmt: skip
    assert changed.exit_code != 0 and "sac.stacked_q" in changed.output
    refused = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "40", "--run-dir", "h", *FAST, *stacked,
              "--set", "sac.critic=hl_gauss"],
    )  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert "'sac.stacked_q = true' stacks MLP regression critics" in refused.output
    assert not (in_tmp / "h").exists()
