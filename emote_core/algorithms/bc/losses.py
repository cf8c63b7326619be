"""BCLoss: fits a policy to the stored (observation, action) pairs of a data group."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from emote_core.algorithms.base import key_list
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
_LOG_TWO = math.log(2.0)
ACTION_MARGIN = 1e-6
"""Stored actions are clamped to ``[-1 + margin, 1 - margin]`` before ``atanh``."""


class BcObjective(StrEnum):
    """What :class:`BCLoss` minimises."""

    GAUSSIAN = "gaussian"
    """The negative log-likelihood of the action under the tanh-squashed Gaussian."""
    DETERMINISTIC = "deterministic"
    """The squared error between the action and ``tanh(mean)``."""
    CATEGORICAL = "categorical"
    """The cross-entropy between the logits and the stored discrete action."""


def squashed_log_likelihood(mean: Tensor, log_std: Tensor, actions: Tensor) -> Tensor:
    """``(B, 1)`` log-densities of ``actions`` in ``(-1, 1)`` under ``tanh(N(mean, std))``."""
    actions = actions.clamp(-1.0 + ACTION_MARGIN, 1.0 - ACTION_MARGIN)
    pre_squash = torch.atanh(actions)
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), as GaussianPolicyHead.sample.
    squash_correction = 2.0 * (_LOG_TWO - pre_squash - F.softplus(-2.0 * pre_squash))
    standardised = (pre_squash - mean) * torch.exp(-log_std)
    log_density = -0.5 * standardised.square() - log_std - _HALF_LOG_TWO_PI
    return (log_density - squash_correction).sum(dim=-1, keepdim=True)


class BCLoss(LossCallback):
    """One optimisation step of the policy per batch towards the batch's stored actions.

    Reads ``observation`` (flattened with ``observation_keys``) and ``actions`` of its data
    group. ``gaussian`` and ``deterministic`` train a
    :class:`~emote_core.nn.policies.GaussianPolicy` on actions in ``[-1, 1]``; ``categorical``
    trains a network of ``(B, num_actions)`` logits on integer actions. Logs ``loss/<name>`` and,
    for ``gaussian``, ``<name>/log_likelihood`` (the batch's mean).

    Args:
        policy: The network trained.
        optimizer: The optimizer over its parameters.
        objective: What is minimised (:class:`BcObjective`).
        observation_keys: The observation keys the policy reads (``None``: all, sorted).
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        name: Unique name; keys logs and checkpoints.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.
    """

    def __init__(
        self,
        *,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        objective: BcObjective,
        observation_keys: Sequence[str] | None = None,
        max_grad_norm: float | None = 10.0,
        name: str = "policy",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=policy, optimizer=optimizer, max_grad_norm=max_grad_norm, **kwargs
        )
        self.policy = policy
        self.objective = BcObjective(objective)
        self.observation_keys = key_list(observation_keys)

    def loss(self, observation: dict[str, Tensor], actions: Tensor) -> Tensor:
        """The batch's mean negative log-likelihood, squared error or cross-entropy.

        Raises:
            ConfigurationError: If the batch has not one action per observation.
        """
        inputs = flatten_observation(observation, self.observation_keys)
        actions = actions.reshape(actions.shape[0], -1)
        if actions.shape[0] != inputs.shape[0]:
            raise ConfigurationError(
                f"{self.name}: the batch has {inputs.shape[0]} observations and "
                f"{actions.shape[0]} actions; the data group '{self.data_group}' must hold one "
                "action per observation"
            )
        if self.objective is BcObjective.CATEGORICAL:
            return F.cross_entropy(self.policy(inputs), actions[:, 0].long())
        actions = actions.to(inputs.dtype)
        mean, log_std = self.policy.head.distribution(self.policy.features(inputs))
        if self.objective is BcObjective.DETERMINISTIC:
            return F.mse_loss(torch.tanh(mean), actions)
        log_likelihood = squashed_log_likelihood(mean, log_std, actions).mean()
        self.log_scalar(f"{self.name}/log_likelihood", log_likelihood.detach())
        return -log_likelihood


__all__ = ["ACTION_MARGIN", "BCLoss", "BcObjective", "squashed_log_likelihood"]
