"""ModifiedAdamW: weight decay on linear and convolution weights only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.nn.optim import ModifiedAdamW, separate_modules_for_weight_decay
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


def q_network() -> nn.Sequential:
    """Linear, LayerNorm, ReLU, a nested block and a last layer, as Q networks are built."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), block, nn.Linear(8, 1))


def test_separation_follows_upstreams_rules_on_a_real_network() -> None:
    network = q_network()
    decayed, plain = separate_modules_for_weight_decay(
        network, (nn.Linear,), (nn.LayerNorm,), layers_to_exclude={"4"}
    )
    assert decayed == {"0.weight", "3.0.weight"}
    assert plain == {
        "0.bias", "1.weight", "1.bias", "3.0.bias", "3.1.weight", "3.1.bias", "4.weight",
        "4.bias",
    }  # fmt: skip
    # An excluded block takes every parameter inside it out of decay.
    decayed, _ = separate_modules_for_weight_decay(network, (nn.Linear,), (), {"3"})
    assert decayed == {"0.weight", "4.weight"}


def test_upstreams_positional_call_builds_groups_by_its_rules() -> None:
    network = q_network()
    optimizer = ModifiedAdamW(network, 1e-3, 0.1, (nn.Linear,), (nn.LayerNorm,), {"4"})
    named = {id(p): name for name, p in network.named_parameters()}
    decayed, plain = optimizer.param_groups
    assert {named[id(p)] for p in decayed["params"]} == {"0.weight", "3.0.weight"}
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert len(plain["params"]) == len(named) - 2
    # betas is keyword-only: a tuple of floats in the fourth place is a wrong whitelist, loudly.
    with pytest.raises(ConfigurationError, match=r"whitelist_weight_modules must be.*0\.9"):
        ModifiedAdamW(network, 1e-3, 0.1, (0.9, 0.99))


def test_parameters_upstream_left_untrained_are_trained_without_decay_and_named(caplog) -> None:
    network = nn.Sequential(nn.Conv1d(2, 2, 1), nn.Flatten(), nn.Linear(2, 1))
    assert separate_modules_for_weight_decay(network, (nn.Linear,), ()) == (
        {"2.weight"}, {"0.bias", "2.bias"},
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="emote_core.nn.optim"):
        optimizer = ModifiedAdamW(
            network, lr=1e-3, weight_decay=0.1, whitelist_weight_modules=[nn.Linear]
        )
    assert any(p is network[0].weight for p in optimizer.param_groups[1]["params"])
    assert "['0.weight']" in caplog.text and "left such parameters out" in caplog.text


def test_malformed_lists_and_layers_are_configuration_errors() -> None:
    network = q_network()
    with pytest.raises(ConfigurationError, match=r"\['Linear'\] are both in"):
        separate_modules_for_weight_decay(network, (nn.Linear,), (nn.Linear,))
    with pytest.raises(ConfigurationError, match=r"names \['9'\], which the network does not"):
        ModifiedAdamW(network, layers_to_exclude={"9"})
    with pytest.raises(ConfigurationError, match=r"must be torch\.nn\.Module classes"):
        ModifiedAdamW(network, whitelist_weight_modules=["Linear"])
    with pytest.raises(ConfigurationError, match="pass that network as a single module"):
        ModifiedAdamW([network], layers_to_exclude={"4"})
