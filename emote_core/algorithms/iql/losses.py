"""IQL's callbacks: the batch's targets, the expectile value loss and the advantage-weighted
policy loss. The Q networks regress onto ``q_target`` with SAC's
:class:`~emote_core.algorithms.sac.QLoss` (one per network) or
:class:`~emote_core.algorithms.sac.StackedQLoss` (both stacked, as the ``iql`` family trains
them).

Per batch, in this order: :class:`IqlTarget` (``Order.TARGET``) puts ``q_target`` and
``iql_target_q`` in the data group; :class:`ExpectileValueLoss` steps ``V`` and leaves the
advantages in ``iql_advantage``; the Q losses step ``Q1`` and ``Q2``;
:class:`AdvantageWeightedPolicyLoss` steps the policy; ``end_batch`` moves the target Q networks.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms.base import (
    NStepTarget,
    key_list,
    window_count,
    window_ends,
    window_starts,
)
from emote_core.algorithms.bc.losses import squashed_log_likelihood
from emote_core.algorithms.sac.targets import FollowedTwinQ
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import finite_number

TARGET_Q_KEY = "iql_target_q"
"""Where :class:`IqlTarget` leaves ``min(Q1', Q2')(s, a)`` of the batch's stored actions."""
ADVANTAGE_KEY = "iql_advantage"
"""Where :class:`ExpectileValueLoss` leaves ``min(Q1', Q2')(s, a) - V(s)`` for the policy."""


class IqlPolicy(StrEnum):
    """The policy IQL extracts (``[iql] policy``): what :class:`AdvantageWeightedPolicyLoss`
    weighs by the advantages."""

    GAUSSIAN = "gaussian"
    """A tanh-squashed Gaussian, by the weighted log-likelihood of the stored actions."""
    DETERMINISTIC = "deterministic"
    """``tanh(mean)``, by the weighted squared error to the stored actions."""


def check_expectile(owner: str, what: str, value: Any) -> float:
    """``value`` as a float if it is a number strictly between 0 and 1.

    Raises:
        ConfigurationError: ``"<owner>: <what> must be in (0, 1); got ..."``.
    """
    if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1):
        raise ConfigurationError(
            f"{owner}: {what} must be in (0, 1) (0.7 to 0.9 are usual); got {value!r}"
        )
    return float(value)


def expectile_loss(difference: Tensor, expectile: float) -> Tensor:
    """``mean(|expectile - 1(difference < 0)| * difference^2)``: the asymmetric squared loss
    whose minimiser over ``V`` in ``difference = target - V`` is the target's expectile."""
    weight = torch.where(difference < 0, 1.0 - expectile, expectile)
    return (weight * difference.square()).mean()


def advantage_weights(advantage: Tensor, temperature: float, max_weight: float) -> Tensor:
    """``min(exp(temperature * advantage), max_weight)``, without gradients."""
    with torch.no_grad():
        return torch.exp(temperature * advantage).clamp(max=max_weight)


class IqlTarget(FollowedTwinQ):
    """Computes IQL's regression targets for each batch and Polyak-averages the target Qs.

    For a window of ``L`` transitions (``L = 1`` for one-step batches)::

        q_target     = sum_i gamma^i r_i + gamma^L * mask * V(s_L)
        iql_target_q = min(Q1'(s_0, a_0), Q2'(s_0, a_0))

    with ``mask`` the ``masks`` at the window's last transition (0 only after TERMINAL, so
    INTERRUPTED episodes bootstrap) and ``Q1'``, ``Q2'`` the target networks. ``begin_batch``
    writes both, without gradients, to the data group; ``end_batch`` moves each target network
    ``target_q_tau`` toward its online one. Logs ``training/<name>`` (the mean ``q_target``).

    Args:
        q1: The first online Q network, ``q(observation=..., actions=...) -> (B, 1)``.
        q2: The second online Q network.
        q1_target: The target copy of ``q1`` (starts as a copy; never requires gradients).
        q2_target: The target copy of ``q2``.
        critics: Instead of ``q1`` and ``q2``: both in one stacked module,
            ``critics(observation=..., actions=...) -> (2, B, 1)``.
        critics_target: The target copy of ``critics``.
        value: The state-value network, ``value(observation) -> (B, 1)``.
        gamma: The discount factor, in ``[0, 1]``.
        target_q_tau: The Polyak step, in ``(0, 1]``.
        rollout_length: Transitions per sampled window.
        observation_keys: The observation keys the networks read (``None``: all, sorted).
        data_group: The data group read and written.
        name: Unique name; keys logs and checkpoints.

    Raises:
        ConfigurationError: If a number is out of range, the Q networks are not given in one
            form (twin or stacked) for both roles, or a target network is not a separate copy of
            its online network.
    """

    def __init__(
        self,
        *,
        value: nn.Module,
        q1: nn.Module | None = None,
        q2: nn.Module | None = None,
        q1_target: nn.Module | None = None,
        q2_target: nn.Module | None = None,
        critics: nn.Module | None = None,
        critics_target: nn.Module | None = None,
        gamma: float = 0.99,
        target_q_tau: float = 0.005,
        rollout_length: int = 1,
        observation_keys: Sequence[str] | None = None,
        data_group: str = "default",
        name: str = "iql_target",
    ) -> None:
        super().__init__(
            name=name, data_group=data_group,
            target_q_tau=finite_number(name, "target_q_tau", target_q_tau, 0, 1.0, low_open=True),
            q1=q1, q2=q2, critics=critics, q1_target=q1_target, q2_target=q2_target,
            critics_target=critics_target,
        )  # fmt: skip
        self.n_step = NStepTarget(name, gamma, rollout_length, 1.0)
        self.value = value
        self.observation_keys = key_list(observation_keys)

    def begin_batch(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        next_observation: dict[str, Tensor],
        rewards: Tensor,
        masks: Tensor,
    ) -> dict[str, Any]:
        """Returns ``{data_group: {"q_target": (count, 1), "iql_target_q": (count, 1)}}``."""
        with torch.no_grad():
            length = self.n_step.rollout_length
            count = window_count(self.name, rewards, length)
            inputs = flatten_observation(observation, self.observation_keys)
            inputs, actions = window_starts(self.name, [inputs, actions], count)
            target_q = self.target.minimum(inputs, actions.reshape(count, -1).to(inputs.dtype))
            following = flatten_observation(next_observation, self.observation_keys)
            following = window_ends(self.name, following, count, length)
            q_target = self.n_step(rewards, masks, self.value(following))
        self.log_scalar(f"training/{self.name}", q_target.mean())
        return {self.data_group: {"q_target": q_target, TARGET_Q_KEY: target_q}}


class ExpectileValueLoss(LossCallback):
    """Fits ``V(s)`` to the ``expectile`` of ``min(Q1', Q2')(s, a)`` over the stored actions.

    Reads ``observation`` and ``iql_target_q`` (from :class:`IqlTarget`); the loss is
    :func:`expectile_loss` of ``iql_target_q - V(s)``. Logs ``training/<name>_mean`` (mean
    ``V(s)``) and ``training/<name>_advantage`` (the mean advantage), and leaves the batch's
    advantages, detached, in ``iql_advantage`` for :class:`AdvantageWeightedPolicyLoss`.

    Args:
        value: The state-value network, ``value(observation) -> (B, 1)``.
        optimizer: The optimizer over its parameters.
        expectile: In ``(0, 1)``; above 0.5 the value leans toward the best stored actions.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the network reads (``None``: all, sorted).
        name: Unique name; keys logs and checkpoints.
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If ``expectile`` is not in ``(0, 1)``.
    """

    graph_safe: ClassVar[bool] = True

    def __init__(
        self,
        *,
        value: nn.Module,
        optimizer: torch.optim.Optimizer,
        expectile: float = 0.7,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        name: str = "value",
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=value, optimizer=optimizer, max_grad_norm=max_grad_norm,
            data_group=data_group, **kwargs,
        )  # fmt: skip
        self.value = value
        self.expectile = check_expectile(name, "expectile", expectile)
        self.observation_keys = key_list(observation_keys)
        self._advantage: Tensor | None = None

    def loss(self, observation: dict[str, Tensor], iql_target_q: Tensor) -> Tensor:
        """:func:`expectile_loss` of ``iql_target_q - V(s)`` over the batch's windows."""
        inputs = flatten_observation(observation, self.observation_keys)
        (inputs,) = window_starts(self.name, [inputs], iql_target_q.shape[0])
        values = self.value(inputs)
        difference = iql_target_q - values
        self._advantage = difference.detach()
        self.log_scalar(f"training/{self.name}_mean", values.detach().mean())
        self.log_scalar(f"training/{self.name}_advantage", self._advantage.mean())
        return expectile_loss(difference, self.expectile)

    def backward(self, **state: Any) -> dict[str, Any]:
        """One value step; hands the advantages on: ``{data_group: {"iql_advantage": (B, 1)}}``."""
        super().backward(**state)
        advantage, self._advantage = self._advantage, None
        return {self.data_group: {ADVANTAGE_KEY: advantage}}


class AdvantageWeightedPolicyLoss(LossCallback):
    """Extracts IQL's policy: the stored actions' likelihood (or squared error) weighted by
    ``min(exp(temperature * A), max_weight)``.

    Reads ``observation``, ``actions`` (in ``[-1, 1]``) and ``iql_advantage`` (from
    :class:`ExpectileValueLoss`, which must run first). Logs ``training/<name>_weight`` (the mean
    weight) and, for ``gaussian``, ``<name>/log_likelihood`` (the unweighted mean).

    Args:
        policy: A :class:`~emote_core.nn.policies.GaussianPolicy`.
        optimizer: The optimizer over its parameters.
        objective: :class:`IqlPolicy`.
        temperature: The inverse temperature of the weights, at least 0 (0 is behaviour cloning).
        max_weight: The largest weight, above 0.
        max_grad_norm: Clip the gradient norm to this (``None``: no clipping).
        observation_keys: The observation keys the policy reads (``None``: all, sorted).
        name: Unique name; keys logs and checkpoints.
        data_group: The data group read.
        **kwargs: Passed to :class:`~emote_core.callbacks.loss.LossCallback`.

    Raises:
        ConfigurationError: If ``temperature`` or ``max_weight`` is out of range.
    """

    graph_safe: ClassVar[bool] = True

    def __init__(
        self,
        *,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        objective: IqlPolicy = IqlPolicy.GAUSSIAN,
        temperature: float = 3.0,
        max_weight: float = 100.0,
        max_grad_norm: float | None = 10.0,
        observation_keys: Sequence[str] | None = None,
        name: str = "policy",
        data_group: str = "default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name, network=policy, optimizer=optimizer, max_grad_norm=max_grad_norm,
            data_group=data_group, **kwargs,
        )  # fmt: skip
        self.policy = policy
        self.objective = IqlPolicy(objective)
        self.temperature = finite_number(name, "temperature", temperature, 0)
        self.max_weight = finite_number(name, "max_weight", max_weight, 0, low_open=True)
        self.observation_keys = key_list(observation_keys)

    def loss(
        self, observation: dict[str, Tensor], actions: Tensor, iql_advantage: Tensor
    ) -> Tensor:
        """``-mean(w * log pi(a|s))`` or ``mean(w * mean_i (tanh(mean_i(s)) - a_i)^2)``."""
        inputs = flatten_observation(observation, self.observation_keys)
        count = iql_advantage.shape[0]
        inputs, actions = window_starts(self.name, [inputs, actions], count)
        actions = actions.reshape(count, -1).to(inputs.dtype)
        weights = advantage_weights(iql_advantage, self.temperature, self.max_weight)
        self.log_scalar(f"training/{self.name}_weight", weights.mean())
        mean, log_std = self.policy.head.distribution(self.policy.features(inputs))
        if self.objective is IqlPolicy.DETERMINISTIC:
            errors = (torch.tanh(mean) - actions).square().mean(dim=-1, keepdim=True)
            return (weights * errors).mean()
        log_likelihood = squashed_log_likelihood(mean, log_std, actions)
        self.log_scalar(f"{self.name}/log_likelihood", log_likelihood.detach().mean())
        return -(weights * log_likelihood).mean()


__all__ = [
    "ADVANTAGE_KEY",
    "TARGET_Q_KEY",
    "AdvantageWeightedPolicyLoss",
    "ExpectileValueLoss",
    "IqlPolicy",
    "IqlTarget",
    "advantage_weights",
    "check_expectile",
    "expectile_loss",
]
