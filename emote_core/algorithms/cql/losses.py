"""CQL's callbacks: the actions its continuous penalty samples, and the Q losses of SAC and DQN
with the conservative penalty added.

The penalty pushes Q down on actions the data did not take and up on the ones it took:
``conservative_weight * (logsumexp_a Q(s, a) - Q(s, a_data))``. For discrete actions the
logsumexp runs over every (allowed) action; for Box actions it is estimated from sampled
actions, each weighted by its proposal density (CQL(H)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms import dqn, sac
from emote_core.algorithms.base import (
    importance_weighted_mean,
    key_list,
    window_count,
    window_ends,
    window_starts,
)
from emote_core.algorithms.bc.losses import squashed_log_likelihood
from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import non_negative_int, non_negative_number, positive_int

CQL_ACTIONS_KEY = "cql_actions"
"""Where :class:`CqlProposals` leaves the sampled actions, ``(3N, B, A)``."""
CQL_LOG_DENSITIES_KEY = "cql_log_densities"
"""Where :class:`CqlProposals` leaves their proposal log-densities, ``(3N, B, 1)``."""


def conservative_penalty(
    sampled_q: Tensor, data_q: Tensor, log_densities: Tensor | None = None
) -> Tensor:
    """Per-row ``logsumexp_j(Q_j - log mu_j) - Q(s, a_data)``, ``(B, 1)``.

    Args:
        sampled_q: ``(S, B, 1)`` values of the sampled (or of every) action.
        data_q: ``(B, 1)`` values of the actions the data took.
        log_densities: ``(S, B, 1)`` log-densities of the proposals that drew the samples
            (importance correction); ``None`` for an exact sum over every action.
    """
    if log_densities is not None:
        sampled_q = sampled_q - log_densities
    return torch.logsumexp(sampled_q, dim=0) - data_q


class CqlProposals(LoggingMixin, Callback):
    """Samples the actions that continuous CQL's penalty evaluates, once per batch, for every Q
    loss to share.

    Per window, ``sampled_actions`` (``N``) actions of each of three proposals: uniform on
    ``[-1, 1]^A``, the policy at the window's observation ``s``, and the policy at the
    observation it bootstraps from (``s'`` for one-step windows). Puts them in the data group as
    ``cql_actions`` ``(3N, B, A)`` with their log-densities ``cql_log_densities`` ``(3N, B, 1)``
    (``-A log 2`` for the uniform ones), without gradients.

    Args:
        policy: A :class:`~emote_core.nn.policies.GaussianPolicy` (its ``features`` and
            ``head`` are read, so each observation goes through the network once).
        action_dim: The number of action dimensions.
        sampled_actions: ``N``, the actions drawn per proposal and observation.
        rollout_length: Transitions per sampled window.
        observation_keys: The observation keys the policy reads (``None``: all, sorted).
        data_group: The data group read and written.
        name: Unique name.

    Raises:
        ConfigurationError: If ``action_dim`` or ``sampled_actions`` is not a positive integer,
            or the policy has no ``features`` and ``head``.
    """

    order: ClassVar[int] = Order.TARGET
    graph_safe: ClassVar[bool] = True
    compiled_methods: ClassVar[tuple[str, ...]] = ("begin_batch",)

    def __init__(
        self,
        *,
        policy: nn.Module,
        action_dim: int,
        sampled_actions: int = 10,
        rollout_length: int = 1,
        observation_keys: Sequence[str] | None = None,
        data_group: str = "default",
        name: str = "cql_actions",
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        if not (callable(getattr(policy, "features", None)) and hasattr(policy, "head")):
            raise ConfigurationError(
                f"{name}: the policy must be a GaussianPolicy (with features and head); got "
                f"{type(policy).__name__}"
            )
        self.policy = policy
        self.action_dim = positive_int(name, "action_dim", action_dim)
        self.sampled_actions = positive_int(name, "sampled_actions", sampled_actions)
        self.rollout_length = positive_int(name, "rollout_length", rollout_length)
        self.observation_keys = key_list(observation_keys)
        self.uniform_log_density = -self.action_dim * math.log(2.0)

    def begin_batch(
        self, observation: dict[str, Tensor], next_observation: dict[str, Tensor], rewards: Tensor
    ) -> dict[str, Any]:
        """Returns ``{data_group: {"cql_actions": (3N, B, A), "cql_log_densities":
        (3N, B, 1)}}``."""
        length = self.rollout_length
        with torch.no_grad():
            count = window_count(self.name, rewards, length)
            (inputs,) = window_starts(
                self.name, [flatten_observation(observation, self.observation_keys)], count
            )
            next_inputs = flatten_observation(next_observation, self.observation_keys)
            next_inputs = window_ends(self.name, next_inputs, count, length)
            # The policy's layers once per observation; only its head per sample.
            features = self.policy.features(torch.cat([inputs, next_inputs]))
            features = features.expand(self.sampled_actions, *features.shape)
            policy_actions, log_probs = self.policy.head.sample(features)
            shape = (self.sampled_actions, count, self.action_dim)
            uniform = torch.rand(shape, device=inputs.device, dtype=inputs.dtype) * 2.0 - 1.0
            actions = torch.cat([uniform, *policy_actions.split(count, dim=1)])
            log_densities = torch.cat([
                torch.full((self.sampled_actions, count, 1), self.uniform_log_density,
                           device=inputs.device, dtype=inputs.dtype),
                *log_probs.split(count, dim=1),
            ])  # fmt: skip
        return {self.data_group: {CQL_ACTIONS_KEY: actions, CQL_LOG_DENSITIES_KEY: log_densities}}


class CqlQLoss(sac.QLoss):
    """SAC's Q regression plus CQL's penalty on sampled actions, for one Q network.

    The loss is ``mean(w * ((Q(s, a) - q_target)^2 + conservative_weight * penalty))`` with
    ``penalty = logsumexp_j(Q(s, a_j) - log mu_j) - Q(s, a)`` over the ``cql_actions`` of
    :class:`CqlProposals` (``log mu_j`` their ``cql_log_densities``) and ``w`` the batch's
    importance weights (1 without). The data actions and the sampled ones go through the network
    in one pass. Logs, besides :class:`~emote_core.algorithms.sac.QLoss`'s,
    ``training/<name>_cql_penalty`` (the batch's mean penalty, unweighted) and
    ``training/<name>_sampled_q`` (the mean value of the sampled actions).

    Args:
        conservative_weight: The penalty's weight, at least 0.
        **kwargs: As :class:`~emote_core.algorithms.sac.QLoss`.

    Raises:
        ConfigurationError: If ``conservative_weight`` is negative or not finite.
    """

    def __init__(self, *, conservative_weight: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conservative_weight = non_negative_number(
            self.name, "conservative_weight", conservative_weight
        )

    def loss(  # type: ignore[override]
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        cql_actions: Tensor,
        cql_log_densities: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """The squared error plus the weighted penalty, averaged over the batch."""
        inputs = flatten_observation(observation, self.observation_keys)
        count = q_target.shape[0]
        inputs, actions = window_starts(self.name, [inputs, actions], count)
        samples = cql_actions.shape[0]
        if cql_actions.shape[1] != count:
            raise ConfigurationError(
                f"{self.name}: cql_actions hold {cql_actions.shape[1]} rows per sample and "
                f"q_target {count}; the proposals and the loss must see the same batch"
            )
        every_action = torch.cat([actions.reshape(1, count, -1).to(inputs.dtype), cql_actions])
        repeated = inputs.expand(samples + 1, *inputs.shape).reshape(-1, inputs.shape[-1])
        q_values = self.q_network(
            observation=repeated, actions=every_action.reshape(-1, every_action.shape[-1])
        ).reshape(samples + 1, count, 1)
        data_q, sampled_q = q_values[0], q_values[1:]
        penalty = conservative_penalty(sampled_q, data_q, cql_log_densities)
        self.log_scalar(f"training/{self.name}_sampled_q", sampled_q.detach().mean())
        self.log_scalar(f"training/{self.name}_cql_penalty", penalty.detach().mean())
        per_window = self.regression(data_q, q_target) + self.conservative_weight * penalty
        return importance_weighted_mean(self.name, per_window, importance_weights, count)


class CqlPolicyLoss(sac.PolicyLoss):
    """SAC's policy loss after a warm-up of behaviour cloning, as CQL's authors train it.

    For the first ``bc_warmup_updates`` updates the loss is ``mean(alpha * log pi(a|s) -
    log pi(a_data|s))`` with ``a ~ pi(.|s)``: the stored actions' log-likelihood under the
    tanh-squashed Gaussian, with SAC's entropy term (the temperature keeps tuning on the
    samples' log-probabilities). From then on it is :class:`~emote_core.algorithms.sac.PolicyLoss`'s
    ``mean(alpha * log pi(a|s) - min Q)``. The Q networks train with their penalty from the
    first update, so the policy starts on Q values learned under a policy already near the
    data. The phase follows the training state's ``bp_step``, so a resumed run is in the phase
    its step says. Logs ``<name>/log_likelihood`` (the batch's mean) while cloning.

    Args:
        bc_warmup_updates: Updates that clone the stored actions before the policy follows Q;
            ``0`` follows Q from the start (SAC's loss).
        **kwargs: As :class:`~emote_core.algorithms.sac.PolicyLoss`.

    Raises:
        ConfigurationError: If ``bc_warmup_updates`` is not a non-negative integer; in a batch,
            if it does not hold one action per observation.
    """

    def __init__(self, *, bc_warmup_updates: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bc_warmup_updates = non_negative_int(self.name, "bc_warmup_updates", bc_warmup_updates)
        self._cloning = self.bc_warmup_updates > 0

    def capture_blocker(self) -> str | None:
        """As :class:`~emote_core.algorithms.sac.PolicyLoss`'s, and not while the loss is to
        switch from cloning to Q (one recorded graph would replay one of the two)."""
        reason = super().capture_blocker()
        if reason is None and self.bc_warmup_updates > 0:
            reason = "its policy loss switches from behaviour cloning to Q (bc_warmup_updates)"
        return reason

    def loss(  # type: ignore[override]
        self, observation: dict[str, Tensor], actions: Tensor
    ) -> Tensor:
        """While cloning ``mean(alpha * log pi(a|s) - log pi(a_data|s))``, then SAC's."""
        if not self._cloning:
            return super().loss(observation)
        inputs = flatten_observation(observation, self.observation_keys)
        rows = inputs.shape[0]
        if actions.shape[0] != rows:
            raise ConfigurationError(
                f"{self.name}: the batch has {rows} observations and {actions.shape[0]} "
                "actions; cloning the stored actions needs one action per observation"
            )
        features = self.policy.features(inputs)
        _, log_probs = self.policy.head.sample(features)
        mean, log_std = self.policy.head.distribution(features)
        data_actions = actions.reshape(rows, -1).to(inputs.dtype)
        log_likelihood = squashed_log_likelihood(mean, log_std, data_actions)
        self.log_scalar(f"{self.name}/log_likelihood", log_likelihood.detach().mean())
        return (self.entropy_term(log_probs) - log_likelihood).mean()

    def backward(self, **state: Any) -> dict[str, Any]:
        """Picks the phase from ``bp_step`` (here, so a compiled loss sees no step numbers),
        then :class:`~emote_core.algorithms.sac.PolicyLoss`'s step."""
        step = state.get("bp_step")
        self._cloning = step is not None and step <= self.bc_warmup_updates
        return super().backward(**state)


class DiscreteCqlQLoss(dqn.QLoss):
    """DQN's Q regression plus CQL's penalty over every allowed action.

    The loss is ``mean(w * (huber(Q(s)[a] - q_target) + conservative_weight * penalty))`` with
    ``penalty = logsumexp_b Q(s)[b] - Q(s)[a]`` over the actions ``s``'s mask allows (all
    without ``action_mask_key``) and ``w`` the batch's importance weights (1 without). Logs,
    besides :class:`~emote_core.algorithms.dqn.QLoss`'s, ``training/<name>_cql_penalty`` and
    ``training/<name>_sampled_q`` (the mean value of the allowed actions).

    Args:
        conservative_weight: The penalty's weight, at least 0.
        action_mask_key: The observation's discrete action mask (``(B, num_actions)``, nonzero
            where allowed; ``None``: every action is allowed).
        **kwargs: As :class:`~emote_core.algorithms.dqn.QLoss`.

    Raises:
        ConfigurationError: If ``conservative_weight`` is negative or not finite; in a batch,
            if the observation lacks ``action_mask_key``.
    """

    def __init__(
        self,
        *,
        conservative_weight: float = 1.0,
        action_mask_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conservative_weight = non_negative_number(
            self.name, "conservative_weight", conservative_weight
        )
        self.action_mask_key = action_mask_key

    def loss(
        self,
        observation: dict[str, Tensor],
        actions: Tensor,
        q_target: Tensor,
        importance_weights: Tensor | None = None,
    ) -> Tensor:
        """The Huber (or squared) error plus the weighted penalty, averaged over the batch."""
        count = q_target.shape[0]
        inputs = flatten_observation(observation, self.observation_keys)
        inputs, actions = window_starts(self.name, [inputs, actions], count)
        every_q = self.q_network(inputs)
        data_q = every_q.gather(-1, actions.reshape(-1, 1).long())
        allowed_q = every_q
        if self.action_mask_key is not None:
            if self.action_mask_key not in observation:
                raise ConfigurationError(
                    f"{self.name}: the batch's observation has no action mask "
                    f"'{self.action_mask_key}' (it has {sorted(observation)}); sample from a "
                    "table of the masked environment, or pass action_mask_key=None"
                )
            (mask,) = window_starts(self.name, [observation[self.action_mask_key]], count)
            allowed_q = every_q.masked_fill(mask == 0, -torch.inf)
        penalty = conservative_penalty(allowed_q.T.unsqueeze(-1), data_q)
        finite = torch.isfinite(allowed_q.detach())
        sampled_mean = allowed_q.detach().where(finite, 0.0).sum() / finite.sum().clamp(min=1)
        self.log_scalar(f"training/{self.name}_sampled_q", sampled_mean)
        self.log_scalar(f"training/{self.name}_cql_penalty", penalty.detach().mean())
        per_window = self.regression(data_q, q_target) + self.conservative_weight * penalty
        return importance_weighted_mean(self.name, per_window, importance_weights, count)


__all__ = [
    "CQL_ACTIONS_KEY",
    "CQL_LOG_DENSITIES_KEY",
    "CqlPolicyLoss",
    "CqlProposals",
    "CqlQLoss",
    "DiscreteCqlQLoss",
    "conservative_penalty",
]
