"""How much the callback engine costs per training step, against hand-written loops.

Two figures, each beside its baseline:
1. Engine overhead: 8 callbacks with three hooks each (named-parameter injection from the state),
   through ``Trainer``, against calling the same methods directly in a plain loop.
2. A realistic update: a LossCallback training a 256x256 MLP on batches of 256 through
   ``Trainer``, against the same zero_grad/backward/clip/step written by hand.

Run: ``python benchmarks/trainer_bench.py`` (or ``nox -s bench``). One torch thread, CPU.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.callbacks.loss import LossCallback
from emote_core.trainer import Trainer


class Light(Callback):
    def begin_batch(self, x, bp_step):
        return None

    def backward(self, x, y=0):
        return None

    def end_batch(self, bp_step):
        return None


def engine_overhead(steps: int = 20_000, count: int = 8) -> tuple[float, float]:
    batch = {"batch_size": 1, "default": {"x": 1.0}}
    callbacks = [Light(name=f"c{i}", data_group="default") for i in range(count)]
    start = time.perf_counter()
    Trainer(callbacks, (batch for _ in range(steps))).train()
    engine = (time.perf_counter() - start) / steps

    start = time.perf_counter()
    for step in range(1, steps + 1):
        for callback in callbacks:
            callback.begin_batch(1.0, step)
        for callback in callbacks:
            callback.backward(1.0)
        for callback in callbacks:
            callback.end_batch(step)
    direct = (time.perf_counter() - start) / steps
    return engine, direct


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 2))  # fmt: skip


class MlpLoss(LossCallback):
    def loss(self, observation, targets):
        return nn.functional.mse_loss(self.network(observation), targets)


def mlp_update(steps: int = 1_000) -> tuple[float, float]:
    observation, targets = torch.randn(256, 32), torch.randn(256, 2)
    batch = {"batch_size": 256, "default": {"observation": observation, "targets": targets}}

    network = mlp()
    loss = MlpLoss(name="q", network=network, optimizer=torch.optim.Adam(network.parameters()))
    start = time.perf_counter()
    Trainer([loss], (batch for _ in range(steps))).train()
    engine = (time.perf_counter() - start) / steps

    network = mlp()
    optimizer = torch.optim.Adam(network.parameters())
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        value = nn.functional.mse_loss(network(observation), targets)
        value.backward()
        nn.utils.clip_grad_norm_(network.parameters(), 10.0)
        optimizer.step()
        value.item()  # the engine logs the loss, which synchronises the same way
    direct = (time.perf_counter() - start) / steps
    return engine, direct


def main() -> None:
    torch.set_num_threads(1)
    engine, direct = engine_overhead()
    print("trainer_bench (CPU, 1 torch thread)")
    print(f"{'workload':<44}{'emote Trainer':>16}{'hand-written':>16}{'ratio':>8}")
    print(
        f"{'8 callbacks x 3 hooks, per step':<44}{engine * 1e6:>13.1f} us{direct * 1e6:>13.1f} us"
        f"{engine / direct:>8.2f}"
    )
    engine, direct = mlp_update()
    print(
        f"{'MLP 256x256 update, batch 256, per step':<44}{engine * 1e3:>13.3f} ms"
        f"{direct * 1e3:>13.3f} ms{engine / direct:>8.2f}"
    )


if __name__ == "__main__":
    main()
