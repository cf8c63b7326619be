"""DQN callbacks: (double) Q targets by hand, target-network updates, and a bandit it learns."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.algorithms.dqn import QLoss, QTarget
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import ConfigurationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.loaders import MemoryLoader
from emote_core.nn.action_value import DiscreteActionValueMlp
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.trainer import Trainer
from emote_core.typing import EpisodeState

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=DiscreteSpace(n=2),
    state=DictSpace({"obs": BoxSpace(np.float32, (1,))}),
)


class ScaledValues(nn.Module):
    """``Q(s) = s * w``: one value per action, easy to work out by hand."""

    def __init__(self, weights: list[float]) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.tensor([weights]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation * self.weights


def add_episode(table, identity, observations, actions, rewards, end_state) -> None:
    table.add_sequence(
        identity,
        {
            "obs": np.asarray(observations, np.float32).reshape(-1, 1),
            "actions": np.asarray(actions, np.int64).reshape(-1, 1),
            "rewards": np.asarray(rewards, np.float32),
        },
        end_state=end_state,
    )


def two_episodes() -> dict:
    table = DictObsMemoryTable(spaces=SPACES, maxlen=100)
    add_episode(table, 0, [1.0, 2.0], [0], [1.0], EpisodeState.INTERRUPTED)
    add_episode(table, 1, [1.0, 2.0], [1], [1.0], EpisodeState.TERMINAL)
    return table.sample_all()


@pytest.mark.parametrize(("double_dqn", "bootstrap"), [(True, 2.0 * 1.0), (False, 2.0 * 5.0)])
def test_targets_by_hand(double_dqn: bool, bootstrap: float) -> None:
    q = ScaledValues([1.0, 3.0])  # the online network prefers action 1 ...
    callback = QTarget(
        q=q, q_target_network=ScaledValues([0.0, 0.0]), gamma=0.5, tau=0.1, double_dqn=double_dqn
    )
    with torch.no_grad():
        callback.q_target_network.weights.copy_(torch.tensor([[5.0, 1.0]]))  # ... the target 0
    batch = two_episodes()
    result = callback.begin_batch(batch["next_observation"], batch["rewards"], batch["masks"])
    # INTERRUPTED: 1 + 0.5 * Q'(s'=2)[a*]; TERMINAL: 1 only.
    expected = torch.tensor([[1.0 + 0.5 * bootstrap], [1.0]])
    torch.testing.assert_close(result["default"]["q_target"], expected)


def test_hard_copies_happen_every_interval() -> None:
    q = ScaledValues([1.0, 2.0])
    target = ScaledValues([0.0, 0.0])
    callback = QTarget(q=q, q_target_network=target, target_update_interval=3)
    assert torch.equal(target.weights, q.weights)  # starts as a copy
    with torch.no_grad():
        q.weights.add_(1.0)
    callback.end_batch(bp_step=2)
    assert target.weights.tolist() == [[1.0, 2.0]]
    callback.end_batch(bp_step=3)
    assert target.weights.tolist() == [[2.0, 3.0]]


def test_polyak_updates_every_step() -> None:
    q = ScaledValues([4.0, 4.0])
    target = ScaledValues([0.0, 0.0])
    callback = QTarget(q=q, q_target_network=target, tau=0.5)
    with torch.no_grad():
        target.weights.zero_()
    callback.end_batch(bp_step=1)
    assert target.weights.tolist() == [[2.0, 2.0]]


def test_exactly_one_update_rule_is_required() -> None:
    q = ScaledValues([1.0, 2.0])
    with pytest.raises(ConfigurationError, match="exactly one"):
        QTarget(q=q, q_target_network=copy.deepcopy(q))
    with pytest.raises(ConfigurationError, match="exactly one"):
        QTarget(q=q, q_target_network=copy.deepcopy(q), tau=0.1, target_update_interval=10)


def test_q_loss_reads_the_taken_actions() -> None:
    q = ScaledValues([1.0, 3.0])
    loss = QLoss(q=q, optimizer=torch.optim.SGD(q.parameters(), lr=0.0), huber=False)
    value = loss.loss(
        observation={"obs": torch.tensor([[1.0], [2.0]])},
        actions=torch.tensor([[1], [0]]),
        q_target=torch.tensor([[3.0], [0.0]]),
    )
    assert value.item() == pytest.approx((0.0 + 4.0) / 2)  # predictions 3 and 2
    assert loss.scalar_logs["training/q_prediction"] == pytest.approx(2.5)


@pytest.mark.parametrize("huber", [True, False])
def test_q_loss_weights_each_window_by_its_importance_weight(huber: bool) -> None:
    q = ScaledValues([1.0, 3.0])
    loss = QLoss(q=q, optimizer=torch.optim.SGD(q.parameters(), lr=0.0), huber=huber)
    batch = {
        "observation": {"obs": torch.tensor([[1.0], [2.0]])},
        "actions": torch.tensor([[1], [0]]),
        "q_target": torch.tensor([[3.0], [0.0]]),  # predictions 3 and 2: errors 0 and 2
    }
    per_window = 1.5 if huber else 4.0  # Huber of 2 is 2 - 0.5
    weighted = loss.loss(**batch, importance_weights=torch.tensor([[1.0], [0.25]]))
    assert weighted.item() == pytest.approx(0.25 * per_window / 2)
    assert loss.loss(**batch).item() == pytest.approx(per_window / 2)
    published = loss.backward(**batch, bp_step=3)["default"]
    torch.testing.assert_close(published["q_td_error"], torch.tensor([[0.0], [2.0]]))
    assert published["q_td_error_step"] == 3


def bandit_table(episodes: int, seed: int = 0) -> DictObsMemoryTable:
    """One-step episodes of a two-armed bandit: arm 1 pays about 1, arm 0 about 0.2."""
    table = DictObsMemoryTable(spaces=SPACES, maxlen=10_000, seed=seed)
    rng = np.random.default_rng(seed)
    for identity in range(episodes):
        arm = int(rng.integers(2))
        reward = (1.0 if arm == 1 else 0.2) + rng.normal(0.0, 0.1)
        add_episode(table, identity, [0.5, 0.5], [arm], [reward], EpisodeState.TERMINAL)
    return table


def test_dqn_learns_the_better_arm_of_a_bandit(one_torch_thread: None) -> None:
    table = bandit_table(400)
    torch.manual_seed(0)
    q = DiscreteActionValueMlp(observation_dim=1, num_actions=2, hidden_dims=(32,))
    callbacks = [
        QTarget(q=q, q_target_network=copy.deepcopy(q), target_update_interval=20),
        QLoss(q=q, optimizer=torch.optim.Adam(q.parameters(), lr=1e-2)),
        BackPropStepsTerminator(bp_steps=300),
    ]
    Trainer(callbacks, MemoryLoader(table=table, rollout_count=32, rollout_length=1)).train()
    values = q(torch.tensor([[0.5]])).detach().flatten()
    assert values.argmax().item() == 1
    assert values.tolist() == pytest.approx([0.2, 1.0], abs=0.1)


def test_compiled_dqn_is_one_graph_a_callback_and_trains_as_eager_dqn(
    one_torch_thread: None, graph_counts: Callable[[], tuple[int, int]]
) -> None:
    from emote_core.callbacks.compiled import compile_methods

    def trained(compiled: bool) -> nn.Module:
        torch.manual_seed(0)
        q = DiscreteActionValueMlp(observation_dim=1, num_actions=2, hidden_dims=(16,))
        callbacks = [
            QTarget(q=q, q_target_network=copy.deepcopy(q), target_update_interval=4),
            QLoss(q=q, optimizer=torch.optim.Adam(q.parameters(), lr=1e-2)),
        ]
        if compiled:
            assert compile_methods(callbacks, backend="aot_eager") == 2  # target and loss
        loader = MemoryLoader(table=bandit_table(100), rollout_count=16, rollout_length=1)
        Trainer([*callbacks, BackPropStepsTerminator(bp_steps=10)], loader).train()
        return q

    eager = trained(compiled=False)
    compiled = trained(compiled=True)
    assert graph_counts() == (2, 0)
    for a, b in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(a, b)
