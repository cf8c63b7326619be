"""The ensemble layer against a loop over its members, and MBPO's truncated-normal init."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.models import EnsembleLinearLayer, truncated_normal_init


def test_each_member_computes_its_own_affine_map_in_one_batched_call() -> None:
    layer = EnsembleLinearLayer(3, 2, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        layer.bias.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(2))
    out = layer(x)
    assert out.shape == (4, 5, 2)
    for member in range(4):
        expected = x[member] @ layer.weight[member] + layer.bias[member]
        torch.testing.assert_close(out[member], expected)
    shared = x[0]
    torch.testing.assert_close(layer(shared), layer(shared.expand(4, -1, -1)))
    assert not torch.allclose(layer(shared)[0], layer(shared)[1])


def test_a_layer_without_bias_is_a_pure_matmul() -> None:
    layer = EnsembleLinearLayer(3, 2, 2, bias=False)
    assert layer.bias is None
    x = torch.randn(2, 4, 3)
    torch.testing.assert_close(layer(x), torch.bmm(x, layer.weight))


def test_truncated_normal_init_draws_within_two_std_zeroes_biases_and_is_reproducible() -> None:
    def build() -> nn.Module:
        network = nn.Sequential(nn.Linear(50, 30), nn.Tanh(), EnsembleLinearLayer(40, 20, 3))
        with torch.no_grad():
            for parameter in network.parameters():
                parameter.fill_(7.0)
        return network

    first, second, other = build(), build(), build()
    truncated_normal_init(first, generator=torch.Generator().manual_seed(3))
    truncated_normal_init(second, generator=torch.Generator().manual_seed(3))
    truncated_normal_init(other, generator=torch.Generator().manual_seed(4))
    linear, ensemble = first[0], first[2]
    for weight, fan_in in ((linear.weight, 50), (ensemble.weight, 40)):
        std = 1.0 / (2.0 * math.sqrt(fan_in))
        assert weight.abs().max().item() <= 2.0 * std
        # A normal truncated at 2 std has 0.88 of its std; far from the 7.0 it replaced.
        assert weight.std().item() == pytest.approx(0.88 * std, rel=0.1)
    assert torch.count_nonzero(linear.bias) == 0
    assert torch.count_nonzero(ensemble.bias) == 0
    for mine, same in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(mine, same)
    assert not torch.equal(linear.weight, other[0].weight)
    assert not torch.equal(ensemble.weight, other[2].weight)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EnsembleLinearLayer(0, 2, 3), "in_size must be a positive integer; got 0"),
        (lambda: EnsembleLinearLayer(2, 2, 0), "ensemble_size must be a positive integer; got 0"),
        (
            lambda: EnsembleLinearLayer(2, 2, 3)(torch.zeros(2, 4, 2)),
            r"inputs of shape \(B, 2\) or \(3, B, 2\); got \(2, 4, 2\)",
        ),
        (
            lambda: EnsembleLinearLayer(2, 2, 3)(torch.zeros(4, 5)),
            r"inputs of shape \(B, 2\) or \(3, B, 2\); got \(4, 5\)",
        ),
    ],
)
def test_bad_sizes_and_shapes_are_refused_in_one_line(build, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        build()
    assert "\n" not in str(raised.value)
