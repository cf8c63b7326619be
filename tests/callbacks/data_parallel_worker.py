"""One rank of the two-rank checks in ``test_distributed.py`` (run as a script, two at once).

Usage: ``python data_parallel_worker.py RANK INIT_FILE OUT.pt``. Each rank starts a regression
network from its own seed and trains it on its own data through a real ``Trainer`` with the
``DataParallel`` callback, then records its weights, its generator and where it stopped.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.callbacks.distributed import DataParallel
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.loss import LossCallback
from emote_core.trainer import Trainer
from emote_core.utils import distributed

STEPS = 3


class Regression(LossCallback):
    def __init__(self, network: nn.Module) -> None:
        optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
        super().__init__(
            name="regression", network=network, optimizer=optimizer, max_grad_norm=None
        )

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.network(inputs), targets)


class Draws(Callback):
    """Something that draws random numbers, like a replay table."""

    def __init__(self) -> None:
        super().__init__(name="draws")
        self.generator = np.random.default_rng(5)

    def random_generators(self) -> dict[str, np.random.Generator]:
        return {"sampling": self.generator}


def batches(rank: int) -> Any:
    """Rank ``rank``'s data: batch ``k`` depends on the rank and ``k`` only."""
    for k in range(100):
        generator = torch.Generator().manual_seed(100 * rank + k)
        inputs = torch.randn(8, 3, generator=generator)
        yield {"batch_size": 8, "default": {"inputs": inputs, "targets": inputs.sum(1, True)}}


def main(rank: int, init_file: str, out: str) -> None:
    context = distributed.DistributedContext(rank=rank, world_size=2, local_rank=rank)
    cpu = torch.device("cpu")
    result: dict[str, Any] = {}
    with distributed.joined(context, cpu, init_method=f"file://{init_file}", timeout_s=60):
        torch.manual_seed(rank)  # each rank starts from other weights: rank 0's must win
        network = nn.Linear(3, 1)
        loss, draws = Regression(network), Draws()
        callbacks: list[Callback] = [loss, draws, BackPropStepsTerminator(bp_steps=STEPS)]
        parallel = DataParallel(context=context, callbacks=callbacks, seed=3, device=cpu)
        state = Trainer([*callbacks, parallel], batches(rank)).train()
        result["weights"] = {k: v.clone() for k, v in network.state_dict().items()}
        result["bp_step"] = state["bp_step"]
        result["draw"] = float(draws.generator.random())

        # A stop asked on rank 1 alone stops both ranks after the same update.
        loss, draws = Regression(network), Draws()
        callbacks = [loss, draws, BackPropStepsTerminator(bp_steps=50)]
        parallel = DataParallel(context=context, callbacks=callbacks, seed=3, device=cpu)
        if rank == 1:
            parallel.stop_request.set()
        state = Trainer([*callbacks, parallel], batches(rank)).train()
        result["stopped_at"] = state["bp_step"]
    torch.save(result, out)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
