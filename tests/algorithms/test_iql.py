"""Implicit Q-Learning: its expectile loss, weight clip and Q target by hand; a store of two
actions where IQL keeps the better one and behaviour cloning averages them; checkpoints that
resume the same update; what it refuses."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from emote_core.algorithms.iql import (
    AdvantageWeightedPolicyLoss,
    ImplicitQLearning,
    IqlConfig,
    IqlPolicy,
    IqlTarget,
    StateValueMlp,
    advantage_weights,
    expectile_loss,
)
from emote_core.algorithms.registry import BuildContext, get_algorithm
from emote_core.errors import ConfigurationError
from emote_core.nn import ActionValueMlp, StackedActionValueMlp
from emote_core.spaces import DiscreteSpace, MDPSpace
from tests.algorithms.offline import BOX, CPU, assert_refuses_table, update

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build(config: IqlConfig, seed: int = 0):
    family = ImplicitQLearning()
    torch.manual_seed(seed)
    context = BuildContext(spaces=BOX, device=CPU, seed=seed)
    networks = family.make_networks(config, context)
    return family, networks, context, family.training_parts(config, networks, context).callbacks


def test_the_expectile_loss_weighs_errors_below_and_above_as_a_hand_computation() -> None:
    difference = torch.tensor([[2.0], [-1.0], [0.5], [-3.0]])
    # 0.7 * 4 + 0.3 * 1 + 0.7 * 0.25 + 0.3 * 9, over 4.
    expected = (2.8 + 0.3 + 0.175 + 2.7) / 4
    assert float(expectile_loss(difference, 0.7)) == pytest.approx(expected)
    assert float(expectile_loss(difference, 0.5)) == pytest.approx(0.5 * (4 + 1 + 0.25 + 9) / 4)
    # Its minimiser over a constant V is the expectile: for {0, 1} at 0.7 that is 0.7.
    values = torch.linspace(0.0, 1.0, 101)
    losses = [float(expectile_loss(torch.tensor([[0.0], [1.0]]) - v, 0.7)) for v in values]
    assert float(values[int(np.argmin(losses))]) == pytest.approx(0.7)


def test_advantage_weights_are_clipped_at_max_weight_and_carry_no_gradient() -> None:
    advantage = torch.tensor([[-1.0], [0.0], [0.5], [50.0]], requires_grad=True)
    weights = advantage_weights(advantage, temperature=3.0, max_weight=100.0)
    expected = [np.exp(-3.0), 1.0, np.exp(1.5), 100.0]  # exp(150) is inf before the clip
    np.testing.assert_allclose(weights.squeeze(1).numpy(), expected, rtol=1e-6)
    assert not weights.requires_grad
    # The policy loss logs the mean weight it used.
    callbacks = build(IqlConfig(hidden_dims=[8], max_weight=2.0))[3]
    policy_loss = callbacks[-1]
    assert isinstance(policy_loss, AdvantageWeightedPolicyLoss)
    policy_loss.backward(observation={"obs": torch.zeros(4, 3)}, actions=torch.zeros(4, 1),
                         iql_advantage=advantage.detach())  # fmt: skip
    logged = float(policy_loss.scalar_logs["training/policy_weight"])
    assert logged == pytest.approx((np.exp(-3.0) + 1.0 + 2.0 + 2.0) / 4, rel=1e-5)


@pytest.mark.parametrize("stacked", [False, True])
def test_the_q_target_bootstraps_v_of_the_next_state_except_after_terminal(stacked: bool) -> None:
    torch.manual_seed(0)
    q1, q2 = (ActionValueMlp(observation_dim=3, action_dim=1, hidden_dims=[8]) for _ in range(2))
    value = StateValueMlp(observation_dim=3, hidden_dims=[8])
    if stacked:  # as the family builds them: the same values from one module
        critics = StackedActionValueMlp.from_networks([q1, q2])
        networks = {"critics": critics, "critics_target": copy.deepcopy(critics)}
    else:
        networks = {"q1": q1, "q2": q2, "q1_target": copy.deepcopy(q1),
                    "q2_target": copy.deepcopy(q2)}  # fmt: skip
    target = IqlTarget(**networks, value=value, gamma=0.9)
    observation, following = torch.randn(3, 3), torch.randn(3, 3)
    actions = torch.tensor([[0.5], [-0.5], [0.1]])
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    masks = torch.tensor([[1.0], [0.0], [1.0]])  # running, TERMINAL, INTERRUPTED (mask 1)
    out = target.begin_batch(observation={"obs": observation}, actions=actions,
                             next_observation={"obs": following}, rewards=rewards,
                             masks=masks)["default"]  # fmt: skip
    with torch.no_grad():
        v_next = value(following)
        q_min = torch.min(q1(observation=observation, actions=actions),
                          q2(observation=observation, actions=actions))  # fmt: skip
    np.testing.assert_allclose(out["q_target"], rewards + 0.9 * masks * v_next, rtol=1e-6)
    assert float(out["q_target"][1]) == 2.0  # no bootstrap after TERMINAL
    np.testing.assert_allclose(out["iql_target_q"], q_min, rtol=1e-5)
    assert not out["q_target"].requires_grad and not out["iql_target_q"].requires_grad


def two_action_store(generator: torch.Generator, count: int = 64) -> dict:
    """One-step episodes: each state took +0.8 (reward 1) or -0.8 (reward 0), half and half."""
    better = torch.rand((count, 1), generator=generator) < 0.5
    return {
        "observation": {"obs": torch.rand((count, 3), generator=generator) * 2.0 - 1.0},
        "next_observation": {"obs": torch.zeros(count, 3)},
        "actions": torch.where(better, 0.8, -0.8),
        "rewards": better.float(),
        "masks": torch.zeros(count, 1),
    }


@pytest.mark.parametrize("policy", [IqlPolicy.GAUSSIAN, IqlPolicy.DETERMINISTIC])
def test_iql_keeps_the_better_of_two_stored_actions_where_bc_averages_them(
    policy: IqlPolicy,
) -> None:
    actions = {}
    for temperature in (0.0, 10.0):  # temperature 0 weighs every action alike: cloning
        config = IqlConfig(hidden_dims=[16], learning_rate=3e-3, tau=0.05,
                           temperature=temperature, policy=policy)  # fmt: skip
        _, networks, _, callbacks = build(config)
        generator = torch.Generator().manual_seed(1)
        for step in range(1, 121):
            update(callbacks, two_action_store(generator), step)
        networks.policy.eval()
        with torch.no_grad():
            obs = torch.rand((50, 3), generator=generator) * 2.0 - 1.0
            actions[temperature] = networks.policy(obs, torch.zeros(50, 1))
    assert actions[0.0].abs().mean() < 0.25  # the average of +0.8 and -0.8
    assert actions[10.0].min() > 0.6  # near the better action everywhere


def test_a_restored_checkpoint_makes_the_same_next_update() -> None:
    config = IqlConfig(hidden_dims=[16])
    _, trained, _, callbacks = build(config, seed=0)
    generator = torch.Generator().manual_seed(2)
    for step in range(1, 4):
        update(callbacks, two_action_store(generator), step)
    saved = [copy.deepcopy(callback.state_dict()) for callback in callbacks]
    _, restored, _, fresh = build(config, seed=5)
    for callback, state in zip(fresh, saved, strict=True):
        callback.load_state_dict(state)
    batch = two_action_store(generator)
    update(callbacks, batch, 4)
    update(fresh, batch, 4)
    for name in ("policy", "critics", "value"):
        for a, b in zip(getattr(trained, name).parameters(),
                        getattr(restored, name).parameters(), strict=True):  # fmt: skip
            torch.testing.assert_close(a, b)
    for a, b in zip(trained.targets["critics"].parameters(),
                    restored.targets["critics"].parameters(), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b)


def test_iql_is_registered_offline_only_and_refuses_bad_tables_and_discrete_actions() -> None:
    family = get_algorithm("iql")
    assert isinstance(family, ImplicitQLearning) and family.offline_only
    for config, key in (
        (IqlConfig(hidden_dims=[]), "'iql.hidden_dims'"),
        (IqlConfig(learning_rate=0.0), "'iql.learning_rate'"),
        (IqlConfig(gamma=1.5), "'iql.gamma'"),
        (IqlConfig(tau=0.0), "'iql.tau'"),
        (IqlConfig(expectile=0.0), "'iql.expectile'"),
        (IqlConfig(expectile=float("nan")), "'iql.expectile'"),
        (IqlConfig(expectile=1.0), "'iql.expectile' must be in \\(0, 1\\)"),
        (IqlConfig(temperature=-1.0), "'iql.temperature'"),
        (IqlConfig(max_weight=0.0), "'iql.max_weight'"),
        (IqlConfig(max_grad_norm=float("nan")), "'iql.max_grad_norm'"),
    ):
        assert_refuses_table(family, config, key)
    discrete = MDPSpace(rewards=BOX.rewards, actions=DiscreteSpace(n=2), state=BOX.state)
    with pytest.raises(ConfigurationError, match=r"discrete actions — use .*cql.* or .*bc"):
        family.check_spaces(discrete, env_id="CartPole-v1")
