"""LossCallback's gradient norm and clipping are torch's, bit for bit, on every path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.callbacks.loss import clip_gradients_, gradient_norm


def gradients(dtypes: tuple[torch.dtype, ...], scale: float) -> list[nn.Parameter]:
    torch.manual_seed(0)
    parameters = []
    for shape, dtype in zip([(64, 32), (64,), (1, 64)], dtypes * 3, strict=False):
        parameter = nn.Parameter(torch.randn(shape, dtype=dtype))
        parameter.grad = torch.randn(shape, dtype=dtype) * scale
        parameters.append(parameter)
    parameters.append(nn.Parameter(torch.zeros(3)))  # no gradient: left out
    return parameters


@pytest.mark.parametrize("dtypes", [(torch.float32,), (torch.float32, torch.float64)])
def test_the_norm_is_torchs(dtypes: tuple[torch.dtype, ...]) -> None:
    parameters = gradients(dtypes, scale=1.0)
    grads = [p.grad for p in parameters if p.grad is not None]
    expected = nn.utils.get_total_norm(grads)
    norm = gradient_norm(grads)
    assert torch.equal(norm, expected) and norm.dtype == expected.dtype
    assert gradient_norm([]) == 0.0


@pytest.mark.parametrize("dtypes", [(torch.float32,), (torch.float32, torch.float64)])
@pytest.mark.parametrize("scale", [0.01, 10.0])  # below and above the clipping norm
def test_clipping_is_torchs(dtypes: tuple[torch.dtype, ...], scale: float) -> None:
    ours, theirs = gradients(dtypes, scale), gradients(dtypes, scale)
    grads = [p.grad for p in ours if p.grad is not None]
    norm = clip_gradients_(ours, grads, 1.0)
    expected = nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.equal(norm, expected)
    for mine, reference in zip(ours, theirs, strict=True):
        assert (mine.grad is None) == (reference.grad is None)
        if mine.grad is not None:
            assert torch.equal(mine.grad, reference.grad)
    clipped = torch.linalg.vector_norm(torch.stack([g.double().norm() for g in grads]))
    assert clipped.item() <= 1.0 + 1e-5
    assert (clipped.item() < 0.9) == (scale == 0.01)


def test_gradients_with_history_are_measured_as_torch_does() -> None:
    """Gradients from ``backward(create_graph=True)`` record history; the norm must not."""
    weight = nn.Parameter(torch.randn(4, 3))
    (grad,) = torch.autograd.grad(weight.square().sum() * 3.0, weight, create_graph=True)
    assert grad.requires_grad
    norm = gradient_norm([grad])
    assert torch.equal(norm, nn.utils.get_total_norm([grad]))
    assert not norm.requires_grad
