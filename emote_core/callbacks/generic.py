"""General-purpose callbacks that steer a run."""

from __future__ import annotations

from typing import Any, ClassVar

from emote_core.callback import Callback, Order
from emote_core.errors import ConfigurationError
from emote_core.trainer import BudgetReached, TrainingShutdownException


class BackPropStepsTerminator(Callback):
    """Stops training after ``bp_steps`` backpropagation steps.

    It asks for shutdown in ``end_cycle`` of the last step; every other callback still runs that
    ``end_cycle`` (so a checkpointer writes the final checkpoint). A run resumed at or past the
    limit stops before its first batch.

    Args:
        bp_steps: The step count at which training ends.
        name: Unique name.
    """

    order: ClassVar[int] = Order.TERMINATOR

    def __init__(self, *, bp_steps: int, name: str = "bp_steps_terminator") -> None:
        if not isinstance(bp_steps, int) or bp_steps < 1:
            raise ConfigurationError(f"bp_steps must be a positive integer; got {bp_steps!r}")
        super().__init__(name=name, cycle=1)
        self.bp_steps = bp_steps
        self.start_step = 0
        """The ``bp_step`` training began at: 0, or where a resumed run's checkpoint left off."""

    def begin_training(self, bp_step: int) -> None:
        self.start_step = bp_step
        if bp_step >= self.bp_steps:
            raise TrainingShutdownException(f"already at bp_step {bp_step} of {self.bp_steps}")

    def end_cycle(self, bp_step: int) -> None:
        if bp_step >= self.bp_steps:
            raise BudgetReached(f"reached {self.bp_steps} bp_steps")


class ScheduleStepper(Callback):
    """Steps value schedules (an exploration rate, say) once per training step; checkpointed.

    Args:
        schedules: Named schedules (``emote_core.schedules.BPStepScheduler``).
        name: Unique name.
    """

    order: ClassVar[int] = Order.DEFAULT

    def __init__(self, *, schedules: dict[str, Any], name: str = "schedules") -> None:
        super().__init__(name=name)
        self.schedules = dict(schedules)

    def end_batch(self) -> None:
        for schedule in self.schedules.values():
            schedule.step()

    def state_dict(self) -> dict[str, Any]:
        return {key: schedule.state_dict() for key, schedule in self.schedules.items()}

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        for key, schedule in self.schedules.items():
            if key in state_dict:
                schedule.load_state_dict(state_dict[key])


__all__ = ["BackPropStepsTerminator", "ScheduleStepper"]
