"""``DataParallel``: two real gloo ranks (``data_parallel_worker.py``) train as one network
trained on the mean gradient of both ranks' batches, and stop together."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.callbacks.distributed import DataParallel
from emote_core.errors import ConfigurationError
from emote_core.utils.distributed import DistributedContext, rank_seed

WORKER = Path(__file__).with_name("data_parallel_worker.py")
ROOT = Path(__file__).parents[2]


def _worker_module():
    spec = importlib.util.spec_from_file_location("data_parallel_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_ranks_train_like_one_network_on_both_batches(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    init = tmp_path / "rendezvous"
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(init), str(tmp_path / f"{rank}.pt")],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr
    ranks = [torch.load(tmp_path / f"{rank}.pt", weights_only=True) for rank in range(2)]

    # What one process gets: rank 0's initial weights, each step on the mean of both losses.
    worker = _worker_module()
    torch.manual_seed(0)
    network = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
    streams = [worker.batches(0), worker.batches(1)]
    for _ in range(worker.STEPS):
        optimizer.zero_grad()
        losses = []
        for stream in streams:
            batch = next(stream)["default"]
            losses.append(nn.functional.mse_loss(network(batch["inputs"]), batch["targets"]))
        (sum(losses) / 2).backward()
        optimizer.step()
    for rank in ranks:
        assert rank["bp_step"] == worker.STEPS
        for name, tensor in network.state_dict().items():
            torch.testing.assert_close(rank["weights"][name], tensor)
    assert torch.equal(ranks[0]["weights"]["weight"], ranks[1]["weights"]["weight"])

    # Rank 0 draws what a one-process run draws; rank 1 was reseeded with its own stream.
    assert ranks[0]["draw"] == np.random.default_rng(5).random()
    reseeded = np.random.default_rng(rank_seed(3, 1, "draws.sampling@0"))
    assert ranks[1]["draw"] == reseeded.random()

    assert ranks[0]["stopped_at"] == ranks[1]["stopped_at"] == 1


def test_an_optimiser_stepped_outside_a_loss_is_refused() -> None:
    class OwnStep(Callback):
        def __init__(self) -> None:
            super().__init__(name="own_step")
            self.optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)

    with pytest.raises(ConfigurationError, match=r"own_step.*LossCallback"):
        DataParallel(
            context=DistributedContext(rank=0, world_size=2, local_rank=0),
            callbacks=[OwnStep()], seed=0, device=torch.device("cpu"),
        )  # fmt: skip
