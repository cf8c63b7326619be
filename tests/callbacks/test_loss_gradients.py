"""LossCallback's gradient norm and clipping are torch's, bit for bit, on every path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.callbacks.loss import LossCallback, clip_gradients_, gradient_norm


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


class Regression(LossCallback):
    def __init__(self, network: nn.Module, optimizer: torch.optim.Optimizer, **kwargs) -> None:
        super().__init__(name="fit", network=network, optimizer=optimizer, **kwargs)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.network(inputs), targets)


def regression(optimizer=torch.optim.Adam, **kwargs) -> Regression:
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    return Regression(network, optimizer(network.parameters(), lr=0.01), max_grad_norm=None,
                      **kwargs)  # fmt: skip


def batch(step: int) -> dict[str, torch.Tensor]:
    inputs = torch.randn(32, 3, generator=torch.Generator().manual_seed(step))
    return {"inputs": inputs, "targets": inputs.sum(dim=1, keepdim=True) * 3.0}


KEY = "training/fit_gradient_norm"


def test_an_unclipped_norm_is_torchs_norm_of_each_updates_gradients() -> None:
    """Measuring only (no clipping), every update logs torch's norm of its own gradients, which
    it leaves as they were: the parameters move as an unclipped torch loop moves them."""
    loss, reference = regression(), regression()
    optimizer = torch.optim.Adam(reference.network.parameters(), lr=0.01)
    for step in range(4):
        loss.backward(**batch(step))
        grads = [p.grad for p in loss.parameters]
        assert loss.scalar_logs[KEY] == nn.utils.get_total_norm(grads).item() > 0
        optimizer.zero_grad(set_to_none=True)
        reference.loss(**batch(step)).backward()
        optimizer.step()
        for mine, theirs in zip(loss.parameters, reference.network.parameters(), strict=True):
            assert torch.equal(mine, theirs)


class ScalingAdam(torch.optim.Adam):
    """An optimizer that changes the gradients in place after its step."""

    def step(self, closure=None):
        result = super().step(closure)
        for group in self.param_groups:
            for parameter in group["params"]:
                parameter.grad.mul_(0.5)
        return result


def test_the_norm_logged_is_the_one_before_an_optimizer_changes_the_gradients() -> None:
    """An optimizer that halves the gradients after its step: the norm logged is the one the
    update's backward pass gave, never the halved one."""
    loss = regression(ScalingAdam)
    for step in range(3):
        loss.backward(**batch(step))
        halved = gradient_norm([p.grad for p in loss.parameters])
        assert loss.scalar_logs[KEY] == pytest.approx(2 * halved.item(), rel=1e-6)


def test_a_clipping_loss_measures_at_every_update() -> None:
    loss = regression()
    loss.max_grad_norm = 1e-3
    loss.backward(**batch(0))
    assert loss.scalar_logs[KEY] > 1e-3  # the norm before clipping
