"""The engine on CUDA: a loss trains on the GPU and its checkpoint resumes on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.callbacks.checkpointing import Checkpointer, CheckpointLoader
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.loss import LossCallback
from emote_core.trainer import Trainer

pytestmark = pytest.mark.gpu


class Regression(LossCallback):
    def loss(self, inputs, targets):
        return nn.functional.mse_loss(self.network(inputs), targets)


def batches(device: str):
    generator = torch.Generator(device=device).manual_seed(0)
    while True:
        inputs = torch.randn(64, 3, device=device, generator=generator)
        yield {"batch_size": 64, "default": {"inputs": inputs, "targets": inputs.sum(1, True)}}


def make(device: str) -> Regression:
    network = nn.Linear(3, 1).to(device)
    optimizer = torch.optim.Adam(network.parameters(), lr=0.05)
    return Regression(name="regression", network=network, optimizer=optimizer)


def test_loss_trains_on_cuda_and_resumes_on_cpu(tmp_path) -> None:
    loss = make("cuda")
    checkpointer = Checkpointer(callbacks=[loss], run_dir=tmp_path, checkpoint_interval=100)
    Trainer([loss, BackPropStepsTerminator(bp_steps=300), checkpointer], batches("cuda")).train()
    assert loss.scalar_logs["loss/regression"] < 1e-3
    assert next(loss.network.parameters()).is_cuda

    on_cpu = make("cpu")
    state = Trainer(
        [on_cpu, CheckpointLoader(callbacks=[on_cpu], run_dir=tmp_path),
         BackPropStepsTerminator(bp_steps=301)],
        batches("cpu"),
    ).train()  # fmt: skip
    assert state["bp_step"] == 301
    torch.testing.assert_close(on_cpu.network.weight, torch.ones(1, 3), atol=0.05, rtol=0)
