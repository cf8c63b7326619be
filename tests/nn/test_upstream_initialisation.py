"""The networks that share upstream emote's names start from upstream's initialisation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.nn import LayerInit
from emote_core.nn.action_value import ActionValueMlp, StackedActionValueMlp
from emote_core.nn.encoders import Conv1dEncoder, Conv2dEncoder
from emote_core.nn.policies import MEAN_LIMIT, GaussianMlpPolicy


def _is_orthogonal(weight: torch.Tensor, gain: float) -> bool:
    flat = weight.detach().reshape(weight.shape[0], -1)
    rows, cols = flat.shape
    product = flat @ flat.T if rows <= cols else flat.T @ flat
    return torch.allclose(product, gain**2 * torch.eye(min(rows, cols)), atol=1e-4)


def test_gaussian_mlp_policy_has_orthogonal_hidden_layers_and_a_small_xavier_head() -> None:
    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=5, action_dim=2, hidden_dims=(32, 16))
    linears = [m for m in policy.hidden.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2
    for layer in linears:
        assert _is_orthogonal(layer.weight, math.sqrt(2.0))
        assert layer.bias.eq(0).all()
    head = policy.head.linear
    bound = 0.01 * math.sqrt(6.0 / (head.in_features + head.out_features))
    assert 0 < head.weight.abs().max() <= bound and head.bias.eq(0).all()


def test_the_pre_squash_mean_is_clamped_as_upstreams() -> None:
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=2, hidden_dims=(4,)).eval()
    with torch.no_grad():
        policy.head.linear.weight.fill_(100.0)
    mean, _ = policy.head.distribution(policy.features(torch.ones(1, 3)))
    assert mean.eq(MEAN_LIMIT).all()
    action = policy(torch.ones(1, 3), torch.zeros(1, 2))
    torch.testing.assert_close(action, torch.full((1, 2), math.tanh(MEAN_LIMIT)))


def test_action_value_mlp_is_orthogonal_with_a_unit_gain_output_layer() -> None:
    torch.manual_seed(1)
    q = ActionValueMlp(observation_dim=6, action_dim=2, hidden_dims=(24, 24))
    hidden = [m for m in q.encoder.modules() if isinstance(m, nn.Linear)]
    assert len(hidden) == 2
    assert all(_is_orthogonal(layer.weight, math.sqrt(2.0)) for layer in hidden)
    assert _is_orthogonal(q.final_layer.weight, 1.0) and q.final_layer.bias.eq(0).all()


def test_conv2d_encoder_starts_orthogonal_and_conv1d_keeps_torchs_default() -> None:
    torch.manual_seed(2)
    conv2d = Conv2dEncoder(input_shape=(16, 16, 3), channels=[8, 8], kernels=[3, 3])
    for layer in (m for m in conv2d.modules() if isinstance(m, nn.Conv2d)):
        assert _is_orthogonal(layer.weight, math.sqrt(2.0))
    # Upstream's initialiser skipped Conv1d layers, so its Conv1dEncoder kept PyTorch's default.
    conv1d = Conv1dEncoder(input_shape=(20, 4), channels=[8], kernels=[3])
    layer = next(m for m in conv1d.modules() if isinstance(m, nn.Conv1d))
    assert not _is_orthogonal(layer.weight, math.sqrt(2.0))
    assert layer.bias.ne(0).any()


def _starts_as_torch_builds(network: nn.Module, seed: int, build) -> bool:
    """Whether ``network`` holds the weights the same seed gives a plain PyTorch build."""
    torch.manual_seed(seed)
    plain = build()
    return all(
        torch.equal(a, b)
        for a, b in zip(network.state_dict().values(), plain.state_dict().values(), strict=True)
    )


def test_torch_initialization_leaves_every_layer_as_pytorch_built_it() -> None:
    shape = {"observation_dim": 6, "action_dim": 2, "hidden_dims": (24, 24)}
    torch.manual_seed(3)
    q = ActionValueMlp(**shape, initialization="torch")
    torch.manual_seed(3)
    orthogonal = ActionValueMlp(**shape)
    assert q.final_layer.bias.ne(0).all() and not _is_orthogonal(q.final_layer.weight, 1.0)
    assert not torch.equal(q.final_layer.weight, orthogonal.final_layer.weight)
    plain = lambda: nn.Sequential(nn.Linear(8, 24), nn.Linear(24, 24), nn.Linear(24, 1))  # noqa: E731
    assert _starts_as_torch_builds(q, 3, plain)
    torch.manual_seed(4)
    policy = GaussianMlpPolicy(observation_dim=5, action_dim=2, hidden_dims=(32,),
                               initialization=LayerInit.TORCH)  # fmt: skip
    head = policy.head.linear
    # PyTorch's bound, 1/sqrt(fan_in), is far above the near-zero head of upstream's start.
    assert head.weight.abs().max() > 0.01 * math.sqrt(6.0 / (32 + 4)) and head.bias.ne(0).any()
    assert _starts_as_torch_builds(
        policy, 4, lambda: nn.Sequential(nn.Linear(5, 32), nn.Linear(32, 4))
    )
    stacked = StackedActionValueMlp(**shape, initialization="torch")
    assert stacked.biases[0].ne(0).any()


@pytest.mark.parametrize("build", [ActionValueMlp, GaussianMlpPolicy, StackedActionValueMlp])
def test_an_unknown_initialization_is_refused_naming_the_choices(build) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"initialization must be one of 'orthogonal', 'torch'; got 'xavier'",
    ):
        build(observation_dim=3, action_dim=1, hidden_dims=(4,), initialization="xavier")
