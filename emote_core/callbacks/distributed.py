"""Data-parallel training for any algorithm: every loss's gradients averaged across ranks.

:class:`DataParallel` joins a run to the other ranks of a ``torchrun`` launch: each
:class:`~emote_core.callbacks.loss.LossCallback` averages its gradients before clipping; rank
0's weights are broadcast after a restore; other ranks reseed every random generator from the
recipe's seed, their rank and the starting update; and a stop request on any rank stops all
after the same update.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from emote_core.callback import Callback, Order
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.trainer import TrainingShutdownException
from emote_core.utils.distributed import (
    DistributedContext,
    average_gradients,
    broadcast_tensors,
    rank_seed,
)
from emote_core.utils.random_state import generators_of

log = logging.getLogger(__name__)


class _GradientAverager:
    """One loss's ``gradient_hook``: its optimiser's index and how often it stepped."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.steps = 0

    def __call__(self, parameters: Sequence[torch.Tensor]) -> None:
        average_gradients(parameters, index=self.index, step=self.steps)
        self.steps += 1


class DataParallel(Callback):
    """Keeps the ranks of a data-parallel run in step (see the module docstring).

    Args:
        context: This rank.
        callbacks: The callbacks every rank has alike (not rank 0's writers and loggers), in
            the same order on every rank; their losses get the gradient hook, their random
            generators (ranks above 0) are reseeded, and their networks are broadcast.
        networks: Objects holding the run's networks (the algorithm's ``Networks``); their
            ``nn.Module`` attributes, and those of the callbacks, are broadcast from rank 0.
        seed: The recipe's seed, from which ranks above 0 derive theirs.
        device: Where this rank trains (the stop flag's collective runs there).
        name: Unique name.

    Raises:
        ConfigurationError: If a callback holds an optimiser that it steps outside
            ``LossCallback``, whose gradients nothing would average.
    """

    order: ClassVar[int] = Order.RESTORE + 1  # after the CheckpointLoader's restore_state

    def __init__(
        self,
        *,
        context: DistributedContext,
        callbacks: Sequence[Callback],
        networks: Iterable[object] = (),
        seed: int,
        device: torch.device,
        name: str = "data_parallel",
    ) -> None:
        super().__init__(name=name, cycle=1)
        self.device = device
        self.stop_request = threading.Event()
        """Set (from any thread) to stop every rank after the update in progress; a rank must
        not set the trainer's own shutdown signal, which would stop it alone."""
        self.context = context
        self.callbacks = [c for c in callbacks if c is not self]
        self.holders = [*networks, *self.callbacks]
        self.seed = seed
        self.losses = [c for c in self.callbacks if isinstance(c, LossCallback)]
        for callback in self.callbacks:
            if isinstance(callback, LossCallback):
                continue
            for attribute, value in vars(callback).items():
                if isinstance(value, torch.optim.Optimizer):
                    raise ConfigurationError(
                        f"callback '{callback.name}' ({type(callback).__name__}) steps its own "
                        f"optimiser ('{attribute}'); under torchrun only LossCallback optimisers "
                        "have their gradients averaged across ranks — make it a LossCallback"
                    )
        for index, loss in enumerate(self.losses):
            loss.gradient_hook = _GradientAverager(index)

    def restore_state(self, bp_step: int) -> None:
        """Reseeds this rank's generators (ranks above 0), then takes rank 0's weights."""
        if not self.context.is_main:
            self._reseed(bp_step)
        count = broadcast_tensors(self._tensors())
        log.info(
            "rank %d of %d: %d tensors from rank 0, %d losses averaging their gradients",
            self.context.rank, self.context.world_size, count, len(self.losses),
        )  # fmt: skip

    def end_cycle(self) -> None:
        """Stops every rank after this update when any rank was asked to stop.

        Raises:
            TrainingShutdownException: On every rank, when any rank's stop request is set.
        """
        import torch.distributed as dist

        flag = torch.tensor([float(self.stop_request.is_set())], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            raise TrainingShutdownException

    def _reseed(self, bp_step: int) -> None:
        rank = self.context.rank
        torch.manual_seed(rank_seed(self.seed, rank, f"torch@{bp_step}"))
        for callback in self.callbacks:
            for name, generator in generators_of(callback, f"{callback.name}.").items():
                seed = rank_seed(self.seed, rank, f"{name}@{bp_step}")
                if isinstance(generator, np.random.Generator):
                    generator.bit_generator.state = type(generator.bit_generator)(seed).state
                else:
                    generator.manual_seed(seed)

    def _tensors(self) -> list[torch.Tensor]:
        """Every parameter and buffer of the networks and callbacks, and every optimised
        tensor, each once, in an order that is the same on every rank."""
        tensors: dict[int, torch.Tensor] = {}
        for holder in self.holders:
            for module in _modules(vars(holder).values()):
                for tensor in (*module.parameters(), *module.buffers()):
                    tensors.setdefault(id(tensor), tensor)
        for loss in self.losses:
            for tensor in loss.parameters:
                tensors.setdefault(id(tensor), tensor)
        return list(tensors.values())


def _modules(values: Iterable[Any]) -> list[nn.Module]:
    """The modules among ``values``, and in lists, tuples and dicts among them (one level)."""
    found: list[nn.Module] = []
    for value in values:
        if isinstance(value, nn.Module):
            found.append(value)
        elif isinstance(value, Mapping):
            found += [v for v in value.values() if isinstance(v, nn.Module)]
        elif isinstance(value, list | tuple):
            found += [v for v in value if isinstance(v, nn.Module)]
    return found


__all__ = ["DataParallel"]
