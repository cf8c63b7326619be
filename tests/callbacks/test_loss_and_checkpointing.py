"""LossCallback optimisation steps, and checkpoints that resume a run exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.callbacks.checkpointing import (
    Checkpointer,
    CheckpointLoader,
    list_checkpoints,
    load_checkpoint,
)
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import CallbackDefinitionError, CheckpointError, ConfigurationError
from emote_core.trainer import Trainer


class RegressionLoss(LossCallback):
    def __init__(self, *, network: nn.Module, lr: float = 0.05, **kwargs) -> None:
        optimizer = torch.optim.Adam(network.parameters(), lr=lr)
        super().__init__(name="regression", network=network, optimizer=optimizer, **kwargs)

    def loss(self, inputs, targets):
        return nn.functional.mse_loss(self.network(inputs), targets)


def regression_batches(steps: int, first_step: int = 0):
    """A deterministic stream: batch k depends only on k, so a resumed run sees the same data."""
    weights = torch.tensor([[1.5], [-2.0], [0.5]])
    for k in range(first_step, steps):
        generator = torch.Generator().manual_seed(k)
        inputs = torch.randn(16, 3, generator=generator)
        yield {"batch_size": 16, "default": {"inputs": inputs, "targets": inputs @ weights}}


def make_network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def test_loss_callback_trains_and_logs() -> None:
    loss = RegressionLoss(network=make_network())
    Trainer([loss, BackPropStepsTerminator(bp_steps=300)], regression_batches(1000)).train()
    assert loss.scalar_logs["loss/regression"] < 0.05
    assert loss.scalar_logs["training/regression_lr"] == pytest.approx(0.05)
    assert loss.scalar_logs["training/regression_gradient_norm"] >= 0


def test_gradient_norm_is_clipped() -> None:
    network = nn.Linear(3, 1)
    loss = RegressionLoss(network=network, lr=0.0, max_grad_norm=1e-3)
    batch = next(regression_batches(1))
    batch["default"]["targets"] = batch["default"]["targets"] * 1000
    loss.backward(**batch["default"])
    total = torch.norm(torch.stack([p.grad.norm() for p in network.parameters()]))
    assert loss.scalar_logs["training/regression_gradient_norm"] > 1.0  # reported before clipping
    assert total.item() == pytest.approx(1e-3, rel=1e-3)


def test_lr_schedule_steps_with_the_optimizer() -> None:
    network = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(network.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    class Loss(LossCallback):
        def loss(self, inputs, targets):
            return nn.functional.mse_loss(network(inputs), targets)

    callback = Loss(name="l", network=network, optimizer=optimizer, lr_schedule=schedule)
    Trainer([callback], regression_batches(3)).train()
    assert callback.scalar_logs["training/l_lr"] == pytest.approx(0.125)


def test_a_loss_that_is_not_a_scalar_is_a_clear_error() -> None:
    network = nn.Linear(3, 1)

    class Vector(LossCallback):
        def loss(self, inputs):
            return network(inputs)

    callback = Vector(name="v", network=network, optimizer=torch.optim.SGD(network.parameters()))
    with pytest.raises(ConfigurationError, match="must return a scalar tensor"):
        Trainer([callback], regression_batches(1)).train()


def test_per_parameter_histograms_are_logged_when_asked() -> None:
    loss = RegressionLoss(
        network=make_network(), log_per_param_weights=True, log_per_param_grads=True
    )
    Trainer([loss], regression_batches(1)).train()
    assert "regression_weights/0.weight" in loss.hist_logs
    assert "regression_grads/2.bias" in loss.hist_logs


def run(run_dir, steps: int, *, resume: bool, interval: int = 10) -> tuple[nn.Module, dict]:
    loss = RegressionLoss(network=make_network())
    callbacks = [
        loss,
        BackPropStepsTerminator(bp_steps=steps),
        Checkpointer(callbacks=[loss], run_dir=run_dir, checkpoint_interval=interval),
    ]
    first_step = 0
    if resume:
        callbacks.append(CheckpointLoader(callbacks=[loss], run_dir=run_dir))
        first_step = list_checkpoints(run_dir)[-1][0]
    state = Trainer(callbacks, regression_batches(10_000, first_step)).train()
    return loss.network, state


def test_resumed_run_equals_an_uninterrupted_one(tmp_path) -> None:
    straight, straight_state = run(tmp_path / "straight", 40, resume=False)
    run(tmp_path / "split", 20, resume=False)
    resumed, resumed_state = run(tmp_path / "split", 40, resume=True)
    assert resumed_state["bp_step"] == straight_state["bp_step"] == 40
    assert resumed_state["bp_samples"] == straight_state["bp_samples"] == 40 * 16
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    steps = [step for step, _ in list_checkpoints(tmp_path / "split")]
    assert steps == [10, 20, 30, 40]


def test_checkpoints_load_with_weights_only(tmp_path) -> None:
    run(tmp_path, 10, resume=False)
    path = tmp_path / "checkpoints" / "checkpoint_10.tar"
    data = torch.load(path, weights_only=True)
    assert data["bp_step"] == 10
    assert "network_state_dict" in data["callbacks"]["regression"]
    assert "optimizer_state_dict" in data["callbacks"]["regression"]
    assert not list((tmp_path / "checkpoints").glob(".*tmp"))  # no temporary files left


def test_final_checkpoint_written_when_interval_does_not_divide_the_run(tmp_path) -> None:
    run(tmp_path, 25, resume=False, interval=10)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10, 20, 25]


def test_no_final_checkpoint_after_an_error(tmp_path) -> None:
    loss = RegressionLoss(network=make_network())

    def failing_loader():
        yield from regression_batches(12)
        raise RuntimeError("loader died")

    checkpointer = Checkpointer(callbacks=[loss], run_dir=tmp_path, checkpoint_interval=10)
    with pytest.raises(RuntimeError, match="loader died"):
        Trainer([loss, checkpointer], failing_loader()).train()
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10]


def test_a_new_run_never_overwrites_an_old_checkpoint(tmp_path) -> None:
    run(tmp_path, 10, resume=False)
    before = (tmp_path / "checkpoints" / "checkpoint_10.tar").read_bytes()
    with pytest.raises(CheckpointError, match="already exists"):
        run(tmp_path, 10, resume=False)
    assert (tmp_path / "checkpoints" / "checkpoint_10.tar").read_bytes() == before


def test_resuming_at_the_end_trains_no_more_steps(tmp_path) -> None:
    run(tmp_path, 20, resume=False)
    _, state = run(tmp_path, 20, resume=True)
    assert state["bp_step"] == 20
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10, 20]


def test_keep_last_prunes_old_checkpoints(tmp_path) -> None:
    loss = RegressionLoss(network=make_network())
    checkpointer = Checkpointer(
        callbacks=[loss], run_dir=tmp_path, checkpoint_interval=5, keep_last=2
    )
    Trainer([loss, checkpointer], regression_batches(30)).train()
    assert [step for step, _ in list_checkpoints(tmp_path)] == [25, 30]


def test_loader_errors_name_what_is_missing(tmp_path) -> None:
    loss = RegressionLoss(network=make_network())
    with pytest.raises(CheckpointError, match="holds no checkpoints"):
        CheckpointLoader(callbacks=[loss], run_dir=tmp_path).restore_state()
    run(tmp_path, 10, resume=False)
    with pytest.raises(CheckpointError, match=r"no checkpoint for bp_step 7; it has \[10\]"):
        CheckpointLoader(callbacks=[loss], run_dir=tmp_path, checkpoint=7).restore_state()
    other = RegressionLoss(network=make_network())
    other.name = "other"
    with pytest.raises(CheckpointError, match=r"no state for callbacks \['other'\]"):
        CheckpointLoader(callbacks=[other], run_dir=tmp_path).restore_state()


def test_garbage_and_foreign_files_are_refused(tmp_path) -> None:
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable emote checkpoint"):
        load_checkpoint(garbage)
    foreign = tmp_path / "foreign.tar"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not an emote checkpoint"):
        load_checkpoint(foreign)
    newer = tmp_path / "newer.tar"
    torch.save({"format": "emote-checkpoint", "format_version": 99}, newer)
    with pytest.raises(CheckpointError, match="format_version 99; this emote reads up to 1"):
        load_checkpoint(newer)


def test_load_flags_choose_what_is_restored(tmp_path) -> None:
    run(tmp_path, 10, resume=False)
    data = load_checkpoint(list_checkpoints(tmp_path)[-1][1])["callbacks"]["regression"]

    fresh = RegressionLoss(network=make_network(), lr=0.5)
    untouched = [p.clone() for p in fresh.network.parameters()]
    fresh.load_state_dict(data, load_network=False, load_optimizer=True, load_hparams=False)
    for a, b in zip(untouched, fresh.network.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh.optimizer.param_groups[0]["lr"] == 0.5  # configured lr kept
    assert fresh.optimizer.state  # moments loaded

    hparams_only = RegressionLoss(network=make_network(), lr=0.5)
    hparams_only.load_state_dict(data, load_network=True, load_optimizer=False, load_hparams=True)
    assert hparams_only.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert not hparams_only.optimizer.state
    saved = data["network_state_dict"]
    assert torch.equal(hparams_only.network.state_dict()["0.weight"], saved["0.weight"])


def test_a_plain_loss_callback_holds_a_network_for_checkpoints(tmp_path) -> None:
    network = make_network()
    holder = LossCallback(name="holder", network=network,
                          optimizer=torch.optim.Adam(network.parameters()))  # fmt: skip
    Trainer([Checkpointer(callbacks=[holder], run_dir=tmp_path, checkpoint_interval=1)],
            [{"batch_size": 1}]).train()  # fmt: skip
    fresh = make_network()
    with torch.no_grad():
        for parameter in fresh.parameters():
            parameter.zero_()
    holder.network = fresh
    Trainer([CheckpointLoader(callbacks=[holder], run_dir=tmp_path)], []).train()
    for saved, loaded in zip(network.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(saved, loaded)
    with pytest.raises(NotImplementedError, match="plain LossCallback"):
        Trainer([holder], [{"batch_size": 1}]).train()


def test_a_loss_subclass_without_loss_is_refused() -> None:
    class Forgot(LossCallback):
        pass

    network = make_network()
    with pytest.raises(CallbackDefinitionError, match="Forgot does not implement loss"):
        Forgot(name="f", network=network, optimizer=torch.optim.Adam(network.parameters()))


def test_max_grad_norm_zero_warns_and_zeroes_gradients() -> None:
    network = make_network()
    with pytest.warns(UserWarning, match="max_grad_norm=0"):
        loss = RegressionLoss(network=network, lr=0.1, max_grad_norm=0)
    before = [p.detach().clone() for p in network.parameters()]
    Trainer([loss], regression_batches(1)).train()
    for old, new in zip(before, network.parameters(), strict=True):
        torch.testing.assert_close(old, new)
