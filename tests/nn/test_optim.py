"""ModifiedAdamW: weight decay on linear and convolution weights only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.nn.optim import ModifiedAdamW
from emote_core.nn.policies import GaussianMlpPolicy


def test_only_layer_weights_are_in_the_decayed_group() -> None:
    network = nn.Sequential(nn.Conv1d(2, 4, 3), nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, 2))
    ln_alpha = torch.zeros(1, requires_grad=True)
    optimizer = ModifiedAdamW([network, ln_alpha], lr=1e-3, weight_decay=0.1)
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {id(p) for p in decayed["params"]} == {id(network[0].weight), id(network[3].weight)}
    expected_plain = [network[0].bias, network[2].weight, network[2].bias, network[3].bias]
    assert {id(p) for p in plain["params"]} == {id(p) for p in [*expected_plain, ln_alpha]}


def test_decay_shrinks_weights_but_not_biases_or_ln_alpha() -> None:
    layer = nn.Linear(3, 3)
    ln_alpha = torch.ones(1, requires_grad=True)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(1.0)
    optimizer = ModifiedAdamW([layer, ln_alpha], lr=0.1, weight_decay=0.5)
    for parameter in (*layer.parameters(), ln_alpha):
        parameter.grad = torch.zeros_like(parameter)  # no gradient: only decay can move them
    optimizer.step()
    assert layer.weight.detach().allclose(torch.full((3, 3), 0.95))
    assert layer.bias.detach().eq(1.0).all() and ln_alpha.item() == 1.0


def test_shared_parameters_are_listed_once() -> None:
    shared = nn.Linear(4, 4)
    policy = GaussianMlpPolicy(observation_dim=4, action_dim=1, hidden_dims=(8,))
    optimizer = ModifiedAdamW([shared, nn.Sequential(shared), policy], lr=1e-3, weight_decay=0.1)
    total = sum(len(group["params"]) for group in optimizer.param_groups)
    assert total == 2 + len(list(policy.parameters()))


def test_bad_inputs_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="no parameters"):
        ModifiedAdamW(nn.ReLU(), lr=1e-3, weight_decay=0.1)
    with pytest.raises(ConfigurationError, match="does not require gradients"):
        ModifiedAdamW([torch.zeros(1)], lr=1e-3, weight_decay=0.1)
    with pytest.raises(ConfigurationError, match="weight_decay"):
        ModifiedAdamW(nn.Linear(1, 1), lr=1e-3, weight_decay=-1.0)
