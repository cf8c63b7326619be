"""Q networks: shapes, what they depend on, and a shared encoder."""

from __future__ import annotations

import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.nn.action_value import (
    ActionValueMlp,
    DiscreteActionValueMlp,
    SharedEncoderActionValueNet,
)
from emote_core.nn.encoders import Conv2dEncoder
from emote_core.nn.policies import GaussianPolicy


def test_continuous_q_values_depend_on_observation_and_action() -> None:
    torch.manual_seed(0)
    q = ActionValueMlp(observation_dim=4, action_dim=2, hidden_dims=(16, 16))
    observation, actions = torch.randn(8, 4), torch.rand(8, 2) * 2 - 1
    values = q(observation=observation, actions=actions)
    assert values.shape == (8, 1)
    assert not torch.allclose(q(observation=observation, actions=-actions), values)
    assert not torch.allclose(q(observation=observation.flip(0), actions=actions), values)


def test_discrete_q_gives_one_value_per_action() -> None:
    q = DiscreteActionValueMlp(observation_dim=4, num_actions=3, hidden_dims=(16,))
    assert q(torch.randn(5, 4)).shape == (5, 3)


def test_q_fits_a_function_of_the_action(one_torch_thread: None) -> None:
    """A user-visible property: the critic can represent a reward that depends on the action."""
    torch.manual_seed(0)
    q = ActionValueMlp(observation_dim=1, action_dim=1, hidden_dims=(32, 32))
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-2)
    observation = torch.ones(256, 1)
    for _ in range(300):
        actions = torch.rand(256, 1) * 2 - 1
        loss = torch.nn.functional.mse_loss(
            q(observation=observation, actions=actions), -((actions - 0.5) ** 2)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    grid = torch.linspace(-1, 1, 41).unsqueeze(1)
    best = grid[q(observation=torch.ones(41, 1), actions=grid).argmax()].item()
    assert best == pytest.approx(0.5, abs=0.1)


def test_a_shared_encoder_is_one_module_for_policy_and_q() -> None:
    encoder = Conv2dEncoder(
        input_shape=(12, 12, 2), channels=[4, 8], kernels=[3, 3], strides=[2, 1]
    )
    q = SharedEncoderActionValueNet(
        encoder=encoder, encoder_output_dim=encoder.output_dim, action_dim=2, hidden_dims=(16,)
    )
    policy = GaussianPolicy(encoder=encoder, encoder_output_dim=encoder.output_dim, action_dim=2)
    images = torch.rand(3, 12, 12, 2)
    actions, _ = policy(images)
    values = q(observation=images, actions=actions)
    assert values.shape == (3, 1)
    shared = {id(p) for p in encoder.parameters()}
    assert shared <= {id(p) for p in q.parameters()}
    assert shared <= {id(p) for p in policy.parameters()}
    values.sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())


def test_non_positive_sizes_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="observation_dim"):
        ActionValueMlp(observation_dim=0, action_dim=1)
    with pytest.raises(ConfigurationError, match="num_actions"):
        DiscreteActionValueMlp(observation_dim=3, num_actions=0)


@pytest.mark.parametrize("make", ["mlp", "shared"])
def test_q_inputs_go_by_keyword_so_upstreams_order_fails_at_the_call(make: str) -> None:
    """Upstream emote's Q networks take (action, obs); with the same total width a positional call
    in either order would concatenate swapped inputs without an error."""
    if make == "mlp":
        q = ActionValueMlp(observation_dim=3, action_dim=3, hidden_dims=(8,))
    else:
        q = SharedEncoderActionValueNet(
            encoder=torch.nn.Identity(), encoder_output_dim=3, action_dim=3, hidden_dims=(8,)
        )
    observation, actions = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(TypeError, match="positional"):
        q(actions, observation)
    assert q(actions=actions, observation=observation).shape == (4, 1)
