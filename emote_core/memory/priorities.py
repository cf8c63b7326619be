"""Feeding TD errors back to prioritized replay, and keeping priorities across checkpoints.

A prioritized table (:class:`~emote_core.memory.strategies.PrioritizedSampleStrategy`) draws
windows by priority and puts importance-sampling weights in every batch; the losses that use
those weights publish their TD errors, one per sampled window, into the training state, and
:class:`PriorityUpdater` hands them to the table after the losses ran. The windows they belong to
are the table's most recent sample: the trainer samples the next batch only after every callback
of the current one has run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.schedules import BPStepScheduler

log = logging.getLogger(__name__)

TD_ERROR_SUFFIX = "_td_error"
"""A loss named ``q1`` publishes its TD errors as ``q1_td_error`` in its data group."""
TD_ERROR_STEP_SUFFIX = "_td_error_step"
"""... and the ``bp_step`` they belong to as ``q1_td_error_step``."""


def td_error_outputs(name: str, td_errors: torch.Tensor, bp_step: Any) -> dict[str, Any]:
    """The state entries a loss called ``name`` publishes for a :class:`PriorityUpdater`."""
    return {name + TD_ERROR_SUFFIX: td_errors, name + TD_ERROR_STEP_SUFFIX: bp_step}


class PrioritizedTable(Protocol):
    """What a :class:`PriorityUpdater` needs of a table (an ``ArrayMemoryTable`` has it)."""

    sampler: Any

    @property
    def prioritized(self) -> bool: ...

    def update_priorities(self, priorities: np.ndarray | torch.Tensor) -> None: ...


class PriorityUpdater(LoggingMixin, Callback):
    """Sets the priorities of each batch's windows from the TD errors its losses published.

    The priority of a window is the mean of ``|TD error|`` over the losses named by
    ``losses`` (SAC's two Q losses, say); the table stores ``(priority + epsilon) ** alpha``.
    When the table's beta is a :class:`~emote_core.schedules.BPStepScheduler`, this callback
    steps it once per update and keeps its position in checkpoints. Checkpoints also keep the
    priorities of the held episodes (by episode identity); they are put back at
    ``begin_training``, once a resumed run has refilled its table.

    Logs ``training/priority_beta`` and ``training/mean_abs_td_error``.

    Args:
        table: The prioritized table the loader samples.
        losses: Names of the losses whose ``<name>_td_error`` entries give the priorities.
        data_group: The data group those entries are in.
        name: Unique name (keys the checkpoint entry).

    Raises:
        ConfigurationError: If the table is not prioritized, or ``losses`` is empty.
    """

    order: ClassVar[int] = Order.DEFAULT + 10  # after the losses of the batch

    def __init__(
        self,
        *,
        table: PrioritizedTable,
        losses: Sequence[str],
        data_group: str = "default",
        name: str = "priorities",
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        if not getattr(table, "prioritized", False):
            raise ConfigurationError(
                f"{name}: the table samples with {type(table.sampler).__name__}, which keeps no "
                "priorities; build it with sampler=PrioritizedSampleStrategy(...)"
            )
        self.losses = list(losses)
        if not self.losses or not all(isinstance(n, str) and n for n in self.losses):
            raise ConfigurationError(
                f"{name}: losses must name at least one loss that publishes TD errors; got "
                f"{losses!r}"
            )
        self.table = table
        self._pending: dict[str, Any] | None = None

    @property
    def beta_schedule(self) -> BPStepScheduler | None:
        """The table's beta schedule, when its beta is one."""
        beta = getattr(self.table.sampler, "beta", None)
        return beta if isinstance(beta, BPStepScheduler) else None

    def begin_training(self) -> None:
        """Puts back the priorities a checkpoint recorded (the table is refilled by now)."""
        if self._pending is not None:
            sampler = self.table.sampler
            sampler.load_state(self._pending)
            saved = self._pending["priorities"]
            held = sum(int(identity) in sampler.index.slot_of for identity in saved)
            log.info("restored the priorities of %d of the %d episodes saved", held, len(saved))
            self._pending = None

    def end_batch(self, **state: Any) -> None:
        """Feeds this batch's TD errors to the table, then steps the beta schedule."""
        bp_step = state.get("bp_step")
        errors = []
        for loss in self.losses:
            key = loss + TD_ERROR_SUFFIX
            if key not in state or state.get(loss + TD_ERROR_STEP_SUFFIX) != bp_step:
                raise ConfigurationError(
                    f"{self.name}: loss '{loss}' published no TD errors ('{key}') at bp_step "
                    f"{bp_step}; prioritized replay needs every named loss to run each update "
                    "and return td_error_outputs(...) from its backward"
                )
            errors.append(torch.as_tensor(state[key]).detach().abs().reshape(-1))
        priorities = torch.stack(errors).mean(dim=0)
        self.table.update_priorities(priorities)
        self.log_scalar("training/mean_abs_td_error", priorities.mean())
        sampler = self.table.sampler
        self.log_scalar("training/priority_beta", float(sampler.current_beta()))
        schedule = self.beta_schedule
        if schedule is not None:
            schedule.step()

    def state_dict(self) -> dict[str, Any]:
        """The held episodes' priorities (as tensors, by identity) and the beta schedule."""
        state = super().state_dict()
        saved = self.table.sampler.state()
        identities = [int(key) for key in saved["priorities"]]
        values = [np.asarray(v, dtype=np.float64) for v in saved["priorities"].values()]
        state["priorities"] = {
            "alpha": float(saved["alpha"]),
            "max_priority": float(saved["max_priority"]),
            "identities": torch.tensor(identities, dtype=torch.int64),
            "lengths": torch.tensor([len(v) for v in values], dtype=torch.int64),
            "values": torch.from_numpy(np.concatenate(values) if values else np.zeros(0)),
        }
        schedule = self.beta_schedule
        if schedule is not None:
            state["beta_schedule"] = schedule.state_dict()
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Keeps the priorities for ``begin_training`` and restores the beta schedule (with
        ``load_hparams``)."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        saved = state_dict.get("priorities")
        if saved is not None:
            lengths = saved["lengths"].tolist()
            values = np.split(saved["values"].numpy(), np.cumsum(lengths)[:-1]) if lengths else []
            self._pending = {
                "alpha": saved["alpha"],
                "max_priority": saved["max_priority"],
                "priorities": {
                    str(identity): episode.tolist()
                    for identity, episode in zip(saved["identities"].tolist(), values, strict=True)
                },
            }
        schedule = self.beta_schedule
        if load_hparams and schedule is not None and "beta_schedule" in state_dict:
            schedule.load_state_dict(state_dict["beta_schedule"])


__all__ = [
    "TD_ERROR_STEP_SUFFIX",
    "TD_ERROR_SUFFIX",
    "PrioritizedTable",
    "PriorityUpdater",
    "td_error_outputs",
]
