"""Checkpointing with upstream emote's arguments: restorees, run_root, checkpoint_index,
storage_subdirectory, load_weights/load_optimizers, and load_hparams deciding the step counters."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from emote_core.callbacks.checkpointing import (
    Checkpointer,
    CheckpointLoader,
    InvalidCheckpointLocation,
    Restoree,
    is_torch_file,
    list_checkpoints,
    load_checkpoint,
)
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.trainer import Trainer


class Regression(LossCallback):
    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        network = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        optimizer = torch.optim.Adam(network.parameters(), lr=0.05)
        super().__init__(name="regression", network=network, optimizer=optimizer)

    def loss(self, inputs, targets):
        return nn.functional.mse_loss(self.network(inputs), targets)


class StepCounter:
    """A restoree that is not a callback: it only has a name and a state."""

    def __init__(self) -> None:
        self.name = "counter"
        self.count = torch.zeros(())

    def state_dict(self):
        return {"count": self.count.clone()}

    def load_state_dict(
        self, state_dict, load_network=True, load_optimizer=True, load_hparams=True
    ):
        self.count = state_dict["count"].clone()


def batches(steps: int):
    weights = torch.tensor([[1.5], [-2.0], [0.5]])
    for k in range(steps):
        inputs = torch.randn(16, 3, generator=torch.Generator().manual_seed(k))
        yield {"batch_size": 16, "default": {"inputs": inputs, "targets": inputs @ weights}}


def train_upstream_style(run_root, steps: int, **checkpointer_arguments):
    loss = Regression()
    checkpointer = Checkpointer(
        restorees=[loss], run_root=run_root, checkpoint_interval=10, **checkpointer_arguments
    )
    state = Trainer(
        [loss, BackPropStepsTerminator(bp_steps=steps), checkpointer], batches(99)
    ).train()
    return loss, checkpointer, state


def test_a_restoree_need_not_be_a_callback(tmp_path) -> None:
    counter = StepCounter()
    counter.count += 7
    assert isinstance(counter, Restoree)
    Checkpointer(restorees=[counter], run_root=tmp_path, checkpoint_interval=1).save(
        bp_step=3, bp_samples=30
    )
    restored = StepCounter()
    CheckpointLoader(restorees=[restored], run_root=tmp_path).restore_state()
    assert restored.count.item() == 7
    with pytest.raises(ConfigurationError, match=r"is not a Restoree.*needs a 'name'"):
        Checkpointer(restorees=[object()], run_root=tmp_path, checkpoint_interval=1)


def test_checkpoints_record_their_index_and_the_state_names_the_latest(tmp_path) -> None:
    _, checkpointer, state = train_upstream_style(tmp_path, 30, checkpoint_index=5)
    recorded = [load_checkpoint(path)["checkpoint_index"] for _, path in list_checkpoints(tmp_path)]
    assert recorded == [5, 6, 7]
    assert state["checkpoint_index"] == 7
    assert state["latest_checkpoint"] == str(tmp_path / "checkpoints" / "checkpoint_30.tar")
    assert checkpointer.checkpoint_index == 8


def test_the_loader_finds_a_checkpoint_by_its_index(tmp_path) -> None:
    trained, _, _ = train_upstream_style(tmp_path, 30)
    at_index_1 = load_checkpoint(tmp_path / "checkpoints" / "checkpoint_20.tar")
    fresh = Regression(seed=1)
    loader = CheckpointLoader(restorees=[fresh], run_root=tmp_path, checkpoint_index=1)
    restored = loader.restore_state()
    assert restored["bp_step"] == 20 and restored["checkpoint_index"] == 1
    saved = at_index_1["callbacks"]["regression"]["network_state_dict"]
    assert torch.equal(fresh.network.state_dict()["0.weight"], saved["0.weight"])
    assert not torch.equal(fresh.network[0].weight, trained.network[0].weight)
    with pytest.raises(
        CheckpointError, match=r"no checkpoint with checkpoint_index 9.*\[0, 1, 2\]"
    ):
        CheckpointLoader(restorees=[fresh], run_root=tmp_path, checkpoint_index=9).restore_state()
    with pytest.raises(ConfigurationError, match="pass only one"):
        CheckpointLoader(restorees=[fresh], run_root=tmp_path, checkpoint_index=1, checkpoint=20)


def test_a_pipe_among_the_checkpoints_is_refused_and_never_opened(tmp_path, no_hang) -> None:
    train_upstream_style(tmp_path, 20)
    pipe = tmp_path / "checkpoints" / "checkpoint_30.tar"
    os.mkfifo(pipe, 0o600)  # opening it for reading would wait for a writer forever

    fresh = Regression(seed=1)
    loader = CheckpointLoader(restorees=[fresh], run_root=tmp_path, checkpoint_index=1)
    assert loader.restore_state()["bp_step"] == 20  # every checkpoint's index was asked
    assert not is_torch_file(pipe)
    with pytest.raises(CheckpointError, match=r"checkpoint_30.tar' is not a file \(mode prw"):
        load_checkpoint(pipe)


def test_a_resumed_run_numbers_on_after_the_checkpoint_it_resumed_from(tmp_path) -> None:
    train_upstream_style(tmp_path, 20)
    loss = Regression()
    callbacks = [
        loss,
        BackPropStepsTerminator(bp_steps=40),
        Checkpointer(restorees=[loss], run_root=tmp_path, checkpoint_interval=10),
        CheckpointLoader(restorees=[loss], run_root=tmp_path, checkpoint_index=1),
    ]
    Trainer(callbacks, batches(20)).train()
    recorded = [load_checkpoint(path)["checkpoint_index"] for _, path in list_checkpoints(tmp_path)]
    assert recorded == [0, 1, 2, 3]


def test_storage_subdirectory_moves_checkpoints_for_writer_and_loader(tmp_path) -> None:
    train_upstream_style(tmp_path, 10, storage_subdirectory="saved")
    assert (tmp_path / "saved" / "checkpoint_10.tar").is_file()
    assert not (tmp_path / "checkpoints").exists()
    assert [step for step, _ in list_checkpoints(tmp_path, "saved")] == [10]
    loader = CheckpointLoader(restorees=[Regression()], run_root=tmp_path, checkpoint_index=0,
                              storage_subdirectory="saved")  # fmt: skip
    assert loader.restore_state()["bp_step"] == 10
    with pytest.raises(InvalidCheckpointLocation, match=r"'.*checkpoints' does not exist"):
        CheckpointLoader(restorees=[Regression()], run_root=tmp_path).restore_state()
    assert issubclass(InvalidCheckpointLocation, ValueError)  # what upstream raised


def test_load_weights_and_load_optimizers_are_upstreams_names(tmp_path) -> None:
    train_upstream_style(tmp_path, 10)
    fresh = Regression(seed=1)
    before = fresh.network[0].weight.clone()
    CheckpointLoader(
        restorees=[fresh], run_root=tmp_path, checkpoint_index=0, load_weights=False,
        load_optimizers=True,
    ).restore_state()  # fmt: skip
    assert torch.equal(fresh.network[0].weight, before)
    assert fresh.optimizer.state  # the moments came back
    other = Regression(seed=1)
    CheckpointLoader(
        restorees=[other], run_root=tmp_path, load_weights=True, load_optimizers=False
    ).restore_state()
    assert not torch.equal(other.network[0].weight, before) and not other.optimizer.state
    with pytest.raises(ConfigurationError, match="both load_network= and load_weights="):
        CheckpointLoader(restorees=[fresh], run_root=tmp_path, load_network=True, load_weights=True)
    with pytest.raises(ConfigurationError, match="both callbacks= and restorees="):
        CheckpointLoader(callbacks=[fresh], restorees=[fresh], run_root=tmp_path)
    with pytest.raises(ConfigurationError, match="both run_dir= and run_root="):
        Checkpointer(restorees=[fresh], run_dir=tmp_path, run_root=tmp_path, checkpoint_interval=1)


def test_without_load_hparams_training_counts_from_zero_as_upstream(tmp_path) -> None:
    train_upstream_style(tmp_path, 20)
    loss = Regression()
    loader = CheckpointLoader(restorees=[loss], run_root=tmp_path, load_hparams=False)
    assert loader.restore_state() is None  # the step counters are not restored
    kept = CheckpointLoader(
        restorees=[loss], run_root=tmp_path, load_hparams=False, reset_training_steps=False
    )
    assert kept.restore_state()["bp_step"] == 20
    state = Trainer([loss, BackPropStepsTerminator(bp_steps=5), loader], batches(99)).train()
    assert state["bp_step"] == 5
