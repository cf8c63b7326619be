"""Initialisers applied with module.apply: only linear and convolution layers change."""

from __future__ import annotations

import functools

import torch
from torch import nn

from emote_core.nn.initialization import normal_init_, orthogonal_init_, xavier_uniform_init_


def network() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LayerNorm(16), nn.Linear(16, 8))


def test_orthogonal_weights_have_orthonormal_rows_scaled_by_the_gain() -> None:
    model = network()
    model.apply(functools.partial(orthogonal_init_, gain=2.0))
    weight = model[3].weight.detach()  # 8 x 16: rows orthogonal
    torch.testing.assert_close(weight @ weight.T, 4.0 * torch.eye(8), atol=1e-5, rtol=1e-5)
    assert model[3].bias.eq(0).all() and model[0].bias.eq(0).all()


def test_norm_layers_are_left_alone() -> None:
    model = network()
    with torch.no_grad():
        model[2].weight.fill_(3.0)
    model.apply(xavier_uniform_init_)
    assert model[2].weight.eq(3.0).all()
    bound = (6.0 / (16 + 8)) ** 0.5
    assert model[3].weight.abs().max() <= bound


def test_normal_init_without_a_scale_uses_upstreams_per_layer_scales() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(300, 300), nn.Conv1d(40, 40, 5), nn.BatchNorm1d(7), nn.Conv2d(3, 3, 3)
    )
    with torch.no_grad():
        model[2].weight.fill_(3.0)
        model[2].bias.fill_(2.0)
    conv2d_before = model[3].weight.clone()
    model.apply(normal_init_)
    assert abs(model[0].weight.std().item() - 1e-3) < 1e-4
    assert abs(model[1].weight.std().item() - 0.01) < 1e-3
    assert model[0].bias.eq(0).all() and model[1].bias.eq(0).all()
    assert model[2].weight.eq(1).all() and model[2].bias.eq(0).all()
    assert torch.equal(model[3].weight, conv2d_before)  # upstream leaves Conv2d alone


def test_normal_init_uses_the_given_scale() -> None:
    layer = nn.Linear(200, 200)
    layer.apply(functools.partial(normal_init_, std=0.01))
    assert abs(layer.weight.std().item() - 0.01) < 0.001
