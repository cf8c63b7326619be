"""AMP's discriminator loss, gradient penalty and style reward against hand-computed values."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn

from emote_core.algorithms.amp import (
    AMPReward,
    DiscriminatorLoss,
    gradient_loss_function,
    style_reward,
    transition_pairs,
)
from emote_core.callback import Callback, Order
from emote_core.callbacks.compiled import compile_methods
from emote_core.errors import ConfigurationError
from emote_core.recipes import load_recipe
from emote_core.trainer import Trainer


def linear_discriminator(w1: float, w2: float) -> nn.Linear:
    """``D([s, s']) = w1 s + w2 s'``: two parameters, one-number states."""
    network = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        network.weight.copy_(torch.tensor([[w1, w2]]))
    return network


class SquareAndLine(nn.Module):
    """``D(x) = a x1^2 + b x2``, so ``dD/dx = (2 a x1, b)``."""

    def __init__(self, a: float, b: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))
        self.b = nn.Parameter(torch.tensor(b))

    def forward(self, x: Tensor) -> Tensor:
        return (self.a * x[:, 0] ** 2 + self.b * x[:, 1]).unsqueeze(-1)


def group(states: list[float], next_states: list[float]) -> dict[str, Any]:
    return {
        "observation": {"obs": torch.tensor(states).reshape(-1, 1)},
        "next_observation": {"obs": torch.tensor(next_states).reshape(-1, 1)},
    }


def test_the_gradient_penalty_is_the_batch_mean_of_squared_input_gradients() -> None:
    model = SquareAndLine(a=0.5, b=-2.0)
    inputs = torch.tensor([[1.0, 5.0], [3.0, -1.0]], requires_grad=True)
    penalty = gradient_loss_function(model(inputs), inputs)
    # rows: (2 * 0.5 * 1)^2 + 4 = 5 and (2 * 0.5 * 3)^2 + 4 = 13
    assert penalty.item() == pytest.approx((5.0 + 13.0) / 2)
    penalty.backward()  # kept in the graph: d/da mean(4 a^2 x1^2 + b^2) = mean(8 a x1^2)
    assert model.a.grad.item() == pytest.approx((8 * 0.5 * 1 + 8 * 0.5 * 9) / 2)
    assert model.b.grad.item() == pytest.approx(2 * -2.0)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "training.compile"])
def test_the_discriminator_loss_and_its_step_match_a_hand_computation(compiled: bool) -> None:
    discriminator = linear_discriminator(0.5, -1.0)
    loss = DiscriminatorLoss(
        discriminator=discriminator, grad_loss_weight=10.0, max_grad_norm=None,
        optimizer=torch.optim.SGD(discriminator.parameters(), lr=0.1),
    )  # fmt: skip
    if compiled:  # its gradient penalty cannot go through a compiled backward pass: left eager
        assert compile_methods([loss], backend="aot_eager") == 0
    state = {
        # reference inputs [1, 0], [2, 1]: D = 0.5, 0.0 -> mean((D - 1)^2) = (0.25 + 1) / 2
        "amp_reference": group([1.0, 2.0], [0.0, 1.0]),
        # policy inputs [0, 1], [2, 0]: D = -1, 1 -> mean((D + 1)^2) = (0 + 4) / 2
        "default": group([0.0, 2.0], [1.0, 0.0]),
    }
    loss.backward(**state)
    # penalty: |dD/dx|^2 = w1^2 + w2^2 = 1.25 on every reference row, times 10
    assert loss.scalar_logs["loss/discriminator"] == pytest.approx(0.625 + 2.0 + 12.5)
    assert loss.scalar_logs["amp/loss/reference"] == pytest.approx(0.625)
    assert loss.scalar_logs["amp/loss/policy"] == pytest.approx(2.0)
    assert loss.scalar_logs["amp/loss/gradient_penalty"] == pytest.approx(1.25)
    # gradient: reference mean(2 (D - 1) x) = (-2.5, -1), policy mean(2 (D + 1) x) = (4, 0),
    # penalty 10 * 2 w = (10, -20): (11.5, -21); one SGD step of 0.1
    assert discriminator.weight.detach().tolist() == [pytest.approx([0.5 - 1.15, -1.0 + 2.1])]


def test_the_discriminator_loss_names_a_missing_data_group() -> None:
    discriminator = linear_discriminator(1.0, 1.0)
    loss = DiscriminatorLoss(
        discriminator=discriminator, optimizer=torch.optim.SGD(discriminator.parameters(), lr=0.1)
    )
    with pytest.raises(ConfigurationError, match="no data group 'amp_reference'"):
        loss.backward(default=group([0.0], [1.0]))


@pytest.mark.parametrize(
    ("score", "reward"),
    [(1.0, 1.0), (0.0, 0.75), (2.0, 0.75), (-1.0, 0.0), (3.0, 0.0), (-3.0, 0.0), (0.5, 0.9375)],
)
def test_the_style_reward_is_one_minus_a_quarter_squared_distance_to_one_clamped_at_zero(
    score: float, reward: float
) -> None:
    assert style_reward(torch.tensor([score])).item() == pytest.approx(reward)


def test_the_amp_reward_weights_task_and_style_rewards_and_logs_both() -> None:
    # D = s - s': inputs [1, 1] -> 0 (style 0.75), [2, 0] -> 2 (0.75), [0, 3] -> -3 (0, clamped)
    reward = AMPReward(
        discriminator=linear_discriminator(1.0, -1.0), style_reward_weight=2.0,
        task_reward_weight=0.5,
    )  # fmt: skip
    batch = group([1.0, 2.0, 0.0], [1.0, 0.0, 3.0])
    rewards = torch.tensor([[-4.0], [2.0], [1.0]])
    out = reward.begin_batch(rewards=rewards, **batch)["default"]["rewards"]
    assert out.shape == rewards.shape
    assert out.flatten().tolist() == pytest.approx([-2.0 + 1.5, 1.0 + 1.5, 0.5 + 0.0])
    assert reward.scalar_logs["amp/task_reward"] == pytest.approx(-1 / 3)
    assert reward.scalar_logs["amp/style_reward"] == pytest.approx(0.5)
    style_only = AMPReward(discriminator=linear_discriminator(1.0, -1.0), task_reward_weight=0.0)
    out = style_only.begin_batch(rewards=rewards, **batch)["default"]["rewards"]
    assert out.flatten().tolist() == pytest.approx([0.75, 0.75, 0.0])
    top_level = AMPReward(discriminator=linear_discriminator(1.0, -1.0), data_group=None)
    assert set(top_level.begin_batch(rewards=rewards, **batch)) == {"rewards"}


def test_n_step_batches_pair_each_step_with_the_next_row_of_its_window() -> None:
    observation = torch.tensor([[0.0], [1.0], [10.0], [11.0]])  # two windows of 2
    after_windows = torch.tensor([[2.0], [12.0]])  # one next observation per window
    now, after = transition_pairs(observation, after_windows, 2, owner="test")
    assert now.flatten().tolist() == [0.0, 1.0, 10.0, 11.0]
    assert after.flatten().tolist() == [1.0, 2.0, 11.0, 12.0]
    with pytest.raises(ConfigurationError, match="4 observations and 3 next observations"):
        transition_pairs(observation, torch.zeros(3, 1), 2, owner="test")


class RewardsSeenByTheTarget(Callback):
    order: ClassVar[int] = Order.TARGET
    seen: list[list[float]] = []

    def begin_batch(self, rewards: Tensor) -> None:
        self.seen.append(rewards.flatten().tolist())


def test_the_style_reward_is_in_the_batch_before_the_targets_read_it() -> None:
    target = RewardsSeenByTheTarget(data_group="default")
    target.seen = []
    reward = AMPReward(discriminator=linear_discriminator(0.0, 0.0))  # D = 0: style 0.75
    batch = {"default": {**group([1.0], [2.0]), "rewards": torch.tensor([[1.0]])}, "batch_size": 1}
    Trainer([target, reward], [batch]).train()
    assert target.seen == [[pytest.approx(1.75)]]


def test_amp_tables_are_checked_when_the_recipe_is_loaded() -> None:
    with pytest.raises(ConfigurationError, match=r"'amp\.reference' must name the store"):
        load_recipe("amp_pendulum", ['amp.reference=""'])
    with pytest.raises(ConfigurationError, match="both 0, which leaves no reward"):
        load_recipe("amp_pendulum", ["amp.task_reward_weight=0", "amp.style_reward_weight=0"])
    with pytest.raises(ConfigurationError, match=r"'amp\.gradient_penalty_weight' must be finite"):
        load_recipe("amp_pendulum", ["amp.gradient_penalty_weight=-1"])
    recipe = load_recipe("amp_pendulum", ["amp.task_reward_weight=0.0"])
    assert recipe.section("amp").task_reward_weight == 0.0
    assert recipe.section("amp").reference == "expert.zarr"
