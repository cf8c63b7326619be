"""Behaviour cloning fits stored actions that are a known function of the observation: a
tanh-squashed Gaussian (by likelihood), its mean (by squared error) and a categorical choice (by
cross-entropy); what it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from emote_core.algorithms.bc import BcConfig, BCLoss, BcPolicy, BehaviourCloning
from emote_core.algorithms.bc.losses import squashed_log_likelihood
from emote_core.algorithms.registry import BuildContext, get_algorithm
from emote_core.errors import ConfigurationError
from emote_core.spaces import MDPSpace
from tests.algorithms.offline import BOX, CPU, assert_refuses_table, discrete_spaces, two_keys

DISCRETE = discrete_spaces(2)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fit(spaces: MDPSpace, config: BcConfig, expert, updates: int = 300):
    """Trains ``bc`` on batches of 64 random observations labelled by ``expert``; returns the
    networks, the loss callback and its first and last losses."""
    family = BehaviourCloning()
    torch.manual_seed(0)
    context = BuildContext(spaces=spaces, device=CPU, seed=0)
    networks = family.make_networks(config, context)
    (loss,) = family.training_parts(config, networks, context).callbacks
    assert isinstance(loss, BCLoss)
    generator = torch.Generator().manual_seed(1)
    width = spaces.state["obs"].shape[0]
    losses = []
    for _ in range(updates):
        obs = torch.rand((64, width), generator=generator) * 2.0 - 1.0
        loss.backward(observation={"obs": obs}, actions=expert(obs))
        with torch.no_grad():
            losses.append(float(loss.loss(observation={"obs": obs}, actions=expert(obs))))
    return family, networks, context, losses


def untrained_loss(spaces: MDPSpace, config: BcConfig) -> BCLoss:
    family = BehaviourCloning()
    context = BuildContext(spaces=spaces, device=CPU)
    networks = family.make_networks(config, context)
    (loss,) = family.training_parts(config, networks, context).callbacks
    return loss


def clipped_half(obs: torch.Tensor) -> torch.Tensor:
    return (0.5 * obs[:, :1]).clamp(-1.0, 1.0)


@pytest.mark.parametrize("policy", [BcPolicy.GAUSSIAN, BcPolicy.DETERMINISTIC])
def test_continuous_bc_fits_a_known_function_of_the_observation(policy: BcPolicy) -> None:
    config = BcConfig(hidden_dims=[32], learning_rate=3e-3, policy=policy)
    family, networks, context, losses = fit(BOX, config, clipped_half)
    assert losses[-1] < losses[0] - (1.0 if policy is BcPolicy.GAUSSIAN else 0.05)
    obs = torch.linspace(-1.0, 1.0, 21).reshape(-1, 1).repeat(1, 3)
    with torch.no_grad():
        networks.policy.eval()
        mean_action = networks.policy(obs, torch.zeros(21, 1))
        noisy_action = networks.policy(obs, torch.ones(21, 1))
    np.testing.assert_allclose(mean_action, clipped_half(obs), atol=0.08)
    # The acting agent and the exported graph act through this very network.
    agent = family.acting_agent(config, networks, context, deterministic=True)
    assert agent.policy is networks.policy
    if policy is BcPolicy.DETERMINISTIC:  # noise from outside does not move its actions
        np.testing.assert_allclose(noisy_action, mean_action, atol=1e-6)
    else:  # the fitted spread is narrow: the data has none
        assert networks.policy.head.distribution(networks.policy.features(obs))[1].max() < -1.0


def test_gaussian_bc_logs_the_mean_log_likelihood_it_maximises() -> None:
    mean, log_std = torch.zeros(1, 1), torch.zeros(1, 1)
    # Under tanh(N(0, 1)) the density of a = 0 is that of u = 0: 1 / sqrt(2 pi).
    value = squashed_log_likelihood(mean, log_std, torch.zeros(1, 1))
    assert float(value) == pytest.approx(-0.5 * math.log(2.0 * math.pi), abs=1e-6)
    # Elsewhere: the Gaussian density of atanh(a) over the tanh's slope 1 - a^2.
    mean, std, action = torch.tensor([[0.2]]), 0.5, torch.tensor([[0.5]])
    gaussian = torch.distributions.Normal(mean, std)
    expected = gaussian.log_prob(torch.atanh(action)) - torch.log(1.0 - action.square())
    value = squashed_log_likelihood(mean, torch.full((1, 1), math.log(std)), action)
    assert float(value) == pytest.approx(float(expected), abs=1e-5)
    loss = untrained_loss(BOX, BcConfig(hidden_dims=[16]))
    loss.backward(observation={"obs": torch.zeros(8, 3)}, actions=torch.full((8, 1), 0.5))
    logged = loss.scalar_logs
    assert float(logged["policy/log_likelihood"]) == pytest.approx(-float(logged["loss/policy"]))


def test_discrete_bc_fits_a_threshold_by_cross_entropy_and_acts_greedily() -> None:
    def expert(obs: torch.Tensor) -> torch.Tensor:
        return (obs[:, 2:3] > 0).long()

    config = BcConfig(hidden_dims=[32], learning_rate=3e-3)
    family, networks, context, losses = fit(DISCRETE, config, expert)
    assert losses[-1] < 0.25 < losses[0]
    obs = torch.rand((200, 4), generator=torch.Generator().manual_seed(7)) * 2.0 - 1.0
    clear = obs[:, 2].abs() > 0.1
    predicted = networks.policy(obs).argmax(dim=1, keepdim=True)
    assert (predicted == expert(obs))[clear].float().mean() > 0.97
    agent = family.acting_agent(config, networks, context, deterministic=False)
    assert agent.epsilon == 0.0  # greedy also when asked to sample


def test_bc_is_registered_offline_only_and_refuses_bad_tables() -> None:
    family = get_algorithm("bc")
    assert isinstance(family, BehaviourCloning) and family.offline_only
    for config, key in (
        (BcConfig(hidden_dims=[]), "'bc.hidden_dims'"),
        (BcConfig(learning_rate=0.0), "'bc.learning_rate'"),
        (BcConfig(max_grad_norm=-1.0), "'bc.max_grad_norm'"),
    ):
        assert_refuses_table(family, config, key)
    with pytest.raises(ConfigurationError, match="one observation key"):
        family.check_spaces(two_keys(DISCRETE), env_id="two-keys")


def test_a_batch_of_unequal_observations_and_actions_is_refused() -> None:
    loss = untrained_loss(BOX, BcConfig(hidden_dims=[8]))
    with pytest.raises(ConfigurationError, match="one action per observation"):
        loss.loss(observation={"obs": torch.zeros(4, 3)}, actions=torch.zeros(3, 1))
