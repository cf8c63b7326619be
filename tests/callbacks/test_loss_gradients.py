"""LossCallback's gradient norm and clipping are torch's, bit for bit, on every path, and an
unclipped norm is measured when the logs are read."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch
from torch import nn

from emote_core.callbacks import loss as loss_module
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


def test_an_unclipped_norm_is_measured_when_read_and_is_the_updates_own(monkeypatch) -> None:
    """Measuring only (no clipping), the norm is taken when the logs are read, from the last
    update's gradients, bit for bit the norm an update measuring at once logs; updates nobody
    reads cost no measurement."""
    later, now = regression(), regression()
    now.measure_later = False
    measured = []
    monkeypatch.setattr(loss_module, "gradient_norm",
                        lambda grads: measured.append(1) or gradient_norm(grads))  # fmt: skip
    for step in range(6):
        later.backward(**batch(step))
        now.backward(**batch(step))
        if step in (2, 5):
            assert later.scalar_logs[KEY] == now.scalar_logs[KEY]
            assert later.scalar_logs[KEY] > 0
    assert len(measured) == 6 + 2  # every update of ``now``, and the two reads of ``later``
    for mine, theirs in zip(later.parameters, now.parameters, strict=True):
        assert torch.equal(mine, theirs)


def test_the_last_updates_gradients_are_let_go_by_the_next_update() -> None:
    loss = regression()
    loss.backward(**batch(0))
    kept = weakref.ref(loss.parameters[0].grad)
    loss.backward(**batch(1))
    gc.collect()
    assert kept() is None
    expected = gradient_norm([p.grad for p in loss.parameters])
    assert loss.scalar_logs[KEY] == expected.item()


class ScalingAdam(torch.optim.Adam):
    """An optimizer that changes the gradients in place after its step."""

    def step(self, closure=None):
        result = super().step(closure)
        for group in self.param_groups:
            for parameter in group["params"]:
                parameter.grad.mul_(0.5)
        return result


def test_gradients_changed_after_the_step_are_never_reported_as_their_norm(caplog) -> None:
    """An optimizer that halves the gradients after its step: the halved norm is never logged.
    The first read finds the gradients changed and leaves the value out (saying so), and
    the loss measures at every update from then on, as one measuring at once does."""
    changed, reference = regression(ScalingAdam), regression(ScalingAdam)
    reference.measure_later = False
    for step in range(2):
        changed.backward(**batch(step))
        reference.backward(**batch(step))
    with caplog.at_level(logging.INFO, logger="emote_core.callbacks.loss"):
        assert KEY not in changed.scalar_logs
    assert "changed in place after its optimizer step" in caplog.text
    assert not changed.measure_later
    changed.backward(**batch(2))
    reference.backward(**batch(2))
    assert changed.scalar_logs[KEY] == reference.scalar_logs[KEY]


def test_a_clipping_loss_measures_at_every_update() -> None:
    loss = regression()
    loss.max_grad_norm = 1e-3
    loss.backward(**batch(0))
    pending = loss.__dict__.get("_pending_scalars") or {}
    assert not any(callable(value) for value in pending.values())
    assert loss.scalar_logs[KEY] > 1e-3  # the norm before clipping
