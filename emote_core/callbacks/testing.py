"""Callbacks that judge a finished training run: did the losses fall, did the reward rise?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError, TestCheckFailed
from emote_core.trainer import TrainingShutdownException


class FinalLossTestCheck(Callback):
    """After ``test_length`` steps, checks each loss is at most its cutoff, then stops training.

    Args:
        callbacks: The losses to check (their latest ``loss/<name>`` value).
        cutoffs: One upper bound per loss.
        test_length: The step at which to check and stop.
        name: Unique name.

    Raises:
        TestCheckFailed: (at the check) naming each loss above its cutoff.
    """

    order: ClassVar[int] = Order.TEST_CHECK

    def __init__(
        self,
        *,
        callbacks: Sequence[LossCallback],
        cutoffs: Sequence[float],
        test_length: int,
        name: str = "final_loss_test_check",
    ) -> None:
        if len(callbacks) != len(cutoffs):
            raise ConfigurationError(
                f"FinalLossTestCheck needs one cutoff per loss; got {len(callbacks)} losses and "
                f"{len(cutoffs)} cutoffs"
            )
        super().__init__(name=name, cycle=test_length)
        self.callbacks = list(callbacks)
        self.cutoffs = [float(c) for c in cutoffs]

    def end_cycle(self, bp_step: int) -> None:
        failures = []
        for callback, cutoff in zip(self.callbacks, self.cutoffs, strict=True):
            key = f"loss/{callback.name}"
            value = callback.scalar_logs.get(key)
            if value is None or not value <= cutoff:
                failures.append(f"{key} = {value} (cutoff {cutoff})")
        if failures:
            raise TestCheckFailed(
                f"at bp_step {bp_step} these losses are above their cutoffs: {'; '.join(failures)}"
            )
        raise TrainingShutdownException(f"losses below their cutoffs at bp_step {bp_step}")


class FinalRewardTestCheck(Callback):
    """After ``test_length`` steps, checks a logged reward reached ``cutoff``, then stops training.

    Args:
        callback: The object that logs the reward (a memory proxy wrapper, say).
        cutoff: The lowest acceptable value.
        test_length: The step at which to check and stop.
        key: The logged key to read.
        use_windowed: Read the mean of the windowed scalar ``key`` instead of its latest value.
        name: Unique name.

    Raises:
        TestCheckFailed: (at the check) when the reward is below the cutoff or was never logged.
    """

    order: ClassVar[int] = Order.TEST_CHECK

    def __init__(
        self,
        *,
        callback: LoggingMixin,
        cutoff: float,
        test_length: int,
        key: str = "training/scaled_reward",
        use_windowed: bool = False,
        name: str = "final_reward_test_check",
    ) -> None:
        super().__init__(name=name, cycle=test_length)
        self.callback = callback
        self.cutoff = float(cutoff)
        self.key = key
        self.use_windowed = use_windowed

    def end_cycle(self, bp_step: int) -> None:
        if self.use_windowed:
            window = self.callback.windowed_scalar.get(self.key)
            value = float(np.mean(window)) if window else None
        else:
            value = self.callback.scalar_logs.get(self.key)
        if value is None:
            raise TestCheckFailed(
                f"at bp_step {bp_step} no value was logged for '{self.key}'; nothing to check"
            )
        if not value >= self.cutoff:
            raise TestCheckFailed(
                f"at bp_step {bp_step} '{self.key}' is {value:.4g}, below the cutoff "
                f"{self.cutoff:.4g}"
            )
        raise TrainingShutdownException(f"'{self.key}' reached {value:.4g} at bp_step {bp_step}")


__all__ = ["FinalLossTestCheck", "FinalRewardTestCheck"]
