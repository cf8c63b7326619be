"""The step terminator and the final loss/reward checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.callbacks.testing import FinalLossTestCheck, FinalRewardTestCheck
from emote_core.errors import ConfigurationError, TestCheckFailed
from emote_core.trainer import Trainer


def endless():
    while True:
        yield {"batch_size": 2}


def test_terminator_stops_at_exactly_the_step() -> None:
    state = Trainer([BackPropStepsTerminator(bp_steps=17)], endless()).train()
    assert state["bp_step"] == 17


def test_terminator_rejects_nonpositive_steps() -> None:
    with pytest.raises(ConfigurationError, match="bp_steps must be a positive integer"):
        BackPropStepsTerminator(bp_steps=0)


class Constant(LossCallback):
    def __init__(self, value: float) -> None:
        self.parameter = nn.Parameter(torch.tensor(value))
        super().__init__(
            name="constant", network=None, optimizer=torch.optim.SGD([self.parameter], lr=0.0)
        )

    def loss(self):
        return self.parameter * 1.0


def test_final_loss_check_passes_and_stops_training() -> None:
    loss = Constant(0.1)
    check = FinalLossTestCheck(callbacks=[loss], cutoffs=[0.5], test_length=12)
    assert Trainer([loss, check], endless()).train()["bp_step"] == 12


def test_final_loss_check_fails_naming_the_loss() -> None:
    loss = Constant(2.0)
    check = FinalLossTestCheck(callbacks=[loss], cutoffs=[0.5], test_length=3)
    with pytest.raises(TestCheckFailed, match=r"loss/constant = 2.0 \(cutoff 0.5\)"):
        Trainer([loss, check], endless()).train()


def test_final_loss_check_needs_one_cutoff_per_loss() -> None:
    with pytest.raises(ConfigurationError, match="one cutoff per loss"):
        FinalLossTestCheck(callbacks=[Constant(1.0)], cutoffs=[1.0, 2.0], test_length=3)


class RewardLogger(LoggingMixin, Callback):
    def __init__(self, rewards: list[float]) -> None:
        super().__init__(name="rewards")
        self.rewards = rewards

    def end_batch(self, bp_step):
        reward = self.rewards[bp_step - 1]
        self.log_scalar("training/scaled_reward", reward)
        self.log_windowed_scalar("training/scaled_reward", reward)


def test_final_reward_check_reads_latest_or_windowed_value() -> None:
    rewards = [0.0, 0.0, 0.0, 10.0]
    logger = RewardLogger(rewards)
    check = FinalRewardTestCheck(callback=logger, cutoff=5.0, test_length=4)
    assert Trainer([logger, check], endless()).train()["bp_step"] == 4

    logger = RewardLogger(rewards)
    windowed = FinalRewardTestCheck(callback=logger, cutoff=5.0, test_length=4, use_windowed=True)
    with pytest.raises(TestCheckFailed, match=r"is 2\.5, below the cutoff 5"):
        Trainer([logger, windowed], endless()).train()


def test_final_reward_check_fails_when_nothing_was_logged() -> None:
    silent = RewardLogger([])
    check = FinalRewardTestCheck(callback=silent, cutoff=0.0, test_length=1, key="nothing")
    with pytest.raises(TestCheckFailed, match="no value was logged for 'nothing'"):
        Trainer([check], endless()).train()
