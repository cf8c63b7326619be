"""Double DQN as callbacks: the Q target (with n-step returns and a followed target network)
and the Q loss; :mod:`emote_core.algorithms.dqn` describes how they fit together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from emote_core.algorithms.base import (
    NStepTarget,
    TargetFollower,
    TargetNetworkCheckpoints,
    TdErrorPublisher,
    importance_weighted_mean,
    key_list,
    prepare_target,
    window_count,
    window_ends,
    window_starts,
)
from emote_core.algorithms.hlgauss import HLGaussLossCallback, QNet
from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import finite_number, positive_int


class QTarget(TargetNetworkCheckpoints, LoggingMixin, Callback):
    """Computes the DQN ``q_target`` for each batch and keeps the target network up to date.

    For a window of ``L`` transitions (``L = 1`` normally)::

        q_target = reward_scale * sum_i gamma^i r_i + gamma^L * mask * Q'(s', a*)

    where ``Q'`` is the target network, ``a*`` the argmax of ``Q`` (``double_dqn``) or ``Q'`` at
    ``s'`` among the actions its mask allows (none allowed: bootstrap 0), and ``mask`` the
    ``masks`` at the window's last transition. The target starts as a copy of ``q`` and follows
    it by a hard copy every ``target_update_interval`` steps or a Polyak step of ``tau`` after
    every batch.

    Args:
        q: The online network, ``q(observation) -> (B, num_actions)``.
        q_target_network: Its target copy.
        gamma: The discount factor.
        target_update_interval: Copy ``q`` into the target every this many steps.
        tau: Move the target a fraction ``tau`` (in ``(0, 1]``) toward ``q`` every step.
        double_dqn: Choose the bootstrap action with the online network.
        reward_scale: Multiplies the rewards.
        rollout_length: Transitions per sampled window (n-step returns for ``L > 1``).
        observation_keys: The observation keys the network reads (``None``: all, sorted).
        use_masks: Multiply the bootstrap by ``masks``.
        action_mask_key: The next observation's discrete action mask (``(B, num_actions)``,
            nonzero where allowed; ``None``: every action is allowed).
        data_group: The data group read and written.
        name: Unique name.

    Raises:
        ConfigurationError: If not exactly one of ``target_update_interval`` and ``tau`` is
            given, a number is out of range, or the target is not a separate copy of ``q``; in a
            batch, if the next observation lacks ``action_mask_key``.
    """

    order: ClassVar[int] = Order.TARGET
    compiled_methods: ClassVar[tuple[str, ...]] = ("begin_batch",)

    def __init__(
        self,
        *,
        q: nn.Module,
        q_target_network: nn.Module,
        gamma: float = 0.99,
        target_update_interval: int | None = None,
        tau: float | None = None,
        double_dqn: bool = True,
        reward_scale: float = 1.0,
        rollout_length: int = 1,
        observation_keys: Sequence[str] | None = None,
        use_masks: bool = True,
        action_mask_key: str | None = None,
        data_group: str = "default",
        name: str = "q_target",
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        if (target_update_interval is None) == (tau is None):
            raise ConfigurationError(
                f"{name}: give exactly one of target_update_interval (a hard copy every N steps) "
                f"and tau (a Polyak step every step); got target_update_interval="
                f"{target_update_interval!r} and tau={tau!r}"
            )
        if target_update_interval is not None:
            positive_int(name, "target_update_interval", target_update_interval)
        if tau is not None:
            tau = finite_number(name, "tau", tau, 0.0, 1.0)
            if tau == 0.0:
                raise ConfigurationError(f"{name}: tau=0 never updates the target; use (0, 1]")
        self.n_step = NStepTarget(name, gamma, rollout_length, reward_scale)
        prepare_target(name, q_target_network, q)
        self.q = q
        self.q_target_network = q_target_network
        self._follower = TargetFollower(q_target_network, q)
        self.target_update_interval = target_update_interval
        self.tau = tau
        self.double_dqn = double_dqn
        self.observation_keys = key_list(observation_keys)
        self.use_masks = use_masks
        self.action_mask_key = action_mask_key

    def begin_batch(
        self, next_observation: dict[str, Tensor], rewards: Tensor, masks: Tensor | None = None
    ) -> dict[str, Any]:
        """Returns ``{data_group: {"q_target": (count, 1)}}`` for this batch."""
        if self.use_masks and masks is None:
            raise ConfigurationError(
                f"{self.name}: the batch has no 'masks' (needed to stop bootstrapping after "
                "TERMINAL observations); sample from an emote memory table, or pass "
                "use_masks=False"
            )
        length = self.n_step.rollout_length
        with torch.no_grad():
            count = window_count(self.name, rewards, length)
            observation = flatten_observation(next_observation, self.observation_keys)
            observation = window_ends(self.name, observation, count, length)
            target_values = self.q_target_network(observation)
            allowed = self._allowed(next_observation, count, length)
            chooser = self.q(observation) if self.double_dqn else target_values
            if allowed is not None:
                chooser = chooser.masked_fill(~allowed, -torch.inf)
            best = chooser.argmax(dim=-1, keepdim=True)
            bootstrap = target_values.gather(-1, best)
            if allowed is not None:  # no allowed action: no future value
                bootstrap = bootstrap * allowed.any(dim=-1, keepdim=True)
            q_target = self.n_step(rewards, masks if self.use_masks else None, bootstrap)
        self.log_scalar(f"training/{self.name}", q_target.mean())  # "q_target" unless renamed
        return {self.data_group: {"q_target": q_target}}

    def _allowed(
        self, next_observation: dict[str, Tensor], count: int, length: int
    ) -> Tensor | None:
        """``(count, num_actions)`` booleans: the actions each window's next observation
        allows (``None`` without a mask)."""
        if self.action_mask_key is None:
            return None
        if self.action_mask_key not in next_observation:
            raise ConfigurationError(
                f"{self.name}: the batch's next_observation has no action mask "
                f"'{self.action_mask_key}' (it has {sorted(next_observation)}); sample from a "
                "table of the masked environment, or pass action_mask_key=None"
            )
        mask = window_ends(self.name, next_observation[self.action_mask_key], count, length)
        return mask != 0

    def end_batch(self, bp_step: int) -> None:
        """Updates the target network (hard copy when due, or a Polyak step)."""
        if self.tau is not None:
            self._follower.polyak_(self.tau)
        elif bp_step % self.target_update_interval == 0:
            self._follower.copy_()

    def target_networks(self) -> dict[str, nn.Module]:
        """The target network, saved in checkpoints as ``q_target_state_dict``."""
        return {"q_target": self.q_target_network}


class QLoss(TdErrorPublisher, LossCallback):
    """Regresses ``Q(s)[a]`` of the taken actions onto the batch's ``q_target``.

    Uses the Huber (smooth L1) loss by default, else the squared error. Logs the mean predicted
    value as ``training/<name>_prediction``.

    Args:
        q: The online network, ``q(observation) -> (B, num_actions)``.
        optimizer: The optimizer over ``q``'s parameters.
        name: Unique name.
        huber: Use the Huber loss instead of the squared error.
        lr_schedule: A torch learning-rate scheduler stepped after every update.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the network reads (``None``: all, sorted).
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.
    """

    def __init__(
        self,
        *,
        q: nn.Module,
        optimizer: torch.optim.Optimizer,
        name: str = "q",
        huber: bool = True,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=q, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group, **kwargs,
        )  # fmt: skip
        self.q_network = q
        self.huber = huber
        self.observation_keys = key_list(observation_keys)
        self._td_errors: Tensor | None = None

    def loss(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """The Huber (or squared) error between ``Q(s)[a]`` and ``q_target``, each window's
        weighted by the batch's importance-sampling weights (prioritized replay; 1 without)."""
        inputs = flatten_observation(observation, self.observation_keys)
        inputs, actions = window_starts(self.name, [inputs, actions], q_target.shape[0])
        if actions.dtype != torch.int64:
            actions = actions.long()
        q_values = self.q_network(inputs).gather(-1, actions.reshape(-1, 1))
        errors = self.regression(q_values, q_target)
        return importance_weighted_mean(self.name, errors, importance_weights, q_target.shape[0])

    def regression(self, q_values: Tensor, q_target: Tensor) -> Tensor:
        """The Huber (or squared) error of each window's ``q_values`` (the taken actions') to
        ``q_target``, ``(count, 1)``; logs the mean prediction and keeps the TD errors for
        :meth:`backward` to publish."""
        self.log_scalar(f"training/{self.name}_prediction", q_values.detach().mean())
        self._td_errors = (q_values - q_target).detach()
        if self.huber:
            return F.smooth_l1_loss(q_values, q_target, reduction="none")
        return F.mse_loss(q_values, q_target, reduction="none")


class HLGaussQLoss(HLGaussLossCallback):
    """DQN's Q loss for an HL-Gauss :class:`~emote_core.algorithms.hlgauss.QNet` with one
    categorical head per action (``q.logits(observation) -> (B, num_actions, num_bins)``): the
    cross-entropy between the taken action's head and the histogram of ``q_target`` clipped to
    the support.

    :class:`QTarget` needs no change: calling the ``QNet`` gives every action's expected value,
    which it picks by the online network's argmax as usual. Takes the arguments of
    :class:`~emote_core.algorithms.hlgauss.HLGaussLossCallback`, ``name`` defaulting to
    ``"q"``; logs and publishes what it says.
    """

    def __init__(
        self, *, q: QNet, optimizer: torch.optim.Optimizer, name: str = "q", **kwargs: Any
    ) -> None:
        super().__init__(name=name, q=q, optimizer=optimizer, **kwargs)

    def loss(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """``mean(w * CE(logits(s)[a], histogram(clip(q_target))))``."""
        inputs = flatten_observation(observation, self.observation_keys)
        inputs, actions = window_starts(self.name, [inputs, actions], q_target.shape[0])
        logits = self.q_network.logits(inputs)
        rows = torch.arange(logits.shape[0], device=logits.device)
        taken = logits[rows, actions.reshape(-1).long()]  # (count, num_bins)
        return self.categorical_loss(taken, q_target, importance_weights)


__all__ = ["HLGaussQLoss", "QLoss", "QTarget"]
