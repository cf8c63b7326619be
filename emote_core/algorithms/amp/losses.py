"""Adversarial motion priors (Peng et al. 2021): the discriminator's loss and the style reward.

A discriminator ``D(s, s')`` scores transitions. It is trained by least squares to output +1 on
transitions of a reference (demonstrations) and -1 on the policy's own, with a penalty on its
input gradient at the reference transitions; the policy is then rewarded for transitions that
look like the reference's, with the style reward ``max(0, 1 - 0.25 (D(s, s') - 1)^2)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.discriminator import Discriminator
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import non_negative_number

StateMap = Callable[[Tensor], Tensor]
"""Maps flattened observations ``(B, D)`` to the discriminator's features of one state."""

REFERENCE_GROUP = "amp_reference"
"""The data group that carries the reference transitions."""


def _identity(features: Tensor) -> Tensor:
    return features


def gradient_loss_function(model_output: Tensor, model_input: Tensor) -> Tensor:
    """The mean over the batch of the squared norm of each output's gradient to its input row.

    ``mean_b sum_j (d output_b / d input_bj)^2``, with a graph kept so the result can be
    back-propagated (the gradient penalty). Each output row must depend on its own input row
    only (no batch normalisation), as it does for a per-transition discriminator.

    Args:
        model_output: ``(B, 1)`` (or ``(B,)``) outputs of a network.
        model_input: The ``(B, F)`` input it was computed from, with ``requires_grad``.

    Returns:
        A scalar tensor.
    """
    (gradient,) = torch.autograd.grad(
        model_output.sum(), model_input, create_graph=True, retain_graph=True
    )
    return gradient.pow(2).flatten(1).sum(dim=1).mean()


def style_reward(prediction: Tensor) -> Tensor:
    """``max(0, 1 - 0.25 (D - 1)^2)``: 1 where the discriminator says "reference" (+1), 0 at
    "policy" (-1) and beyond.

    The clamp is the paper's (upstream emote leaves it out). The least-squares discriminator is
    not bounded, so without it an output far from +1 gives a large negative reward that swamps
    the task reward and the Q targets; with it the style reward stays in ``[0, 1]``.
    """
    return torch.clamp(1.0 - 0.25 * (prediction - 1.0).pow(2), min=0.0)


def transition_pairs(
    observation: Tensor, next_observation: Tensor, rollout_length: int, *, owner: str
) -> tuple[Tensor, Tensor]:
    """``(s, s')`` per transition of a batch of windows.

    Args:
        observation: ``(count * L, D)`` flattened observations.
        next_observation: ``(count * L, D)``, or ``(count, D)`` from an n-step table that keeps
            only each window's last next observation; the others are the window's next rows.
        rollout_length: ``L``, transitions per window.
        owner: Names the callback in errors.

    Raises:
        ConfigurationError: If the row counts do not fit ``L``.
    """
    rows, following = observation.shape[0], next_observation.shape[0]
    if following == rows:
        return observation, next_observation
    if following * rollout_length != rows:
        raise ConfigurationError(
            f"{owner}: the batch has {rows} observations and {following} next observations; "
            f"with windows of {rollout_length} there should be {rows} or {rows // rollout_length}"
        )
    windows = observation.reshape(following, rollout_length, -1)
    shifted = torch.cat([windows[:, 1:], next_observation.reshape(following, 1, -1)], dim=1)
    return observation, shifted.reshape(rows, -1)


class _TransitionFeatures:
    """Reads ``D``'s inputs ``[map(s), map(s')]`` from a data group."""

    def __init__(self, owner: str, keys: Sequence[str] | None, rollout_length: int) -> None:
        self.owner = owner
        self.keys = list(keys) if keys is not None else None
        self.rollout_length = rollout_length

    def __call__(self, group: Mapping[str, Any], state_map: StateMap, *, where: str) -> Tensor:
        for key in ("observation", "next_observation"):
            if key not in group:
                raise ConfigurationError(
                    f"{self.owner}: the data group '{where}' has no '{key}'; it holds "
                    f"{sorted(group)}"
                )
        now, after = transition_pairs(
            flatten_observation(group["observation"], self.keys),
            flatten_observation(group["next_observation"], self.keys),
            self.rollout_length, owner=self.owner,
        )  # fmt: skip
        return torch.cat([state_map(now), state_map(after)], dim=-1)


class DiscriminatorLoss(LossCallback):
    """Trains the discriminator: least squares to +1 on reference transitions, to -1 on the
    policy's, plus ``grad_loss_weight`` times the gradient penalty on the reference inputs::

        loss = mean((D(ref) - 1)^2) + mean((D(policy) + 1)^2)
               + grad_loss_weight * mean_b |dD(ref_b)/d ref_b|^2

    Args:
        discriminator: ``(B, 2F) -> (B, 1)``.
        optimizer: Over the discriminator's parameters.
        imitation_state_map_fn: Features of a reference state (identity by default).
        policy_state_map_fn: Features of a policy state (identity by default).
        grad_loss_weight: Weight of the gradient penalty (the paper's ``w_gp``).
        policy_data_group: The data group of the policy's transitions.
        imitation_data_group: The data group of the reference transitions.
        observation_keys: The observation keys the features are made of (``None``: all).
        rollout_length: Transitions per window in the policy's group.
        max_grad_norm: Gradient norm clip.
        lr_schedule: A learning-rate scheduler.
        name: Unique name (keys logs and checkpoints).

    Raises:
        ConfigurationError: If ``grad_loss_weight`` is negative or not finite.
    """

    compiled_methods: ClassVar[tuple[str, ...]] = ()
    """Not compiled: the gradient penalty differentiates the score's gradient, and the backward
    pass of a ``torch.compile``'d function cannot be differentiated again (training failed at
    its first update with ``training.compile = "compile"``)."""

    def __init__(
        self,
        *,
        discriminator: nn.Module,
        optimizer: torch.optim.Optimizer,
        imitation_state_map_fn: StateMap = _identity,
        policy_state_map_fn: StateMap = _identity,
        grad_loss_weight: float = 10.0,
        policy_data_group: str = "default",
        imitation_data_group: str = REFERENCE_GROUP,
        observation_keys: Sequence[str] | None = None,
        rollout_length: int = 1,
        max_grad_norm: float | None = 10.0,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        name: str = "discriminator",
    ) -> None:
        super().__init__(
            name=name, network=discriminator, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=None,
        )  # fmt: skip
        non_negative_number(name, "grad_loss_weight", grad_loss_weight)
        self.discriminator = discriminator
        self.imitation_state_map_fn = imitation_state_map_fn
        self.policy_state_map_fn = policy_state_map_fn
        self.grad_loss_weight = grad_loss_weight
        self.policy_data_group = policy_data_group
        self.imitation_data_group = imitation_data_group
        self._policy_features = _TransitionFeatures(name, observation_keys, rollout_length)
        self._reference_features = _TransitionFeatures(name, observation_keys, 1)

    def loss(self, **state: Any) -> Tensor:
        """The loss of this batch, from the two data groups."""
        groups = {}
        for group in (self.policy_data_group, self.imitation_data_group):
            if not isinstance(state.get(group), Mapping):
                raise ConfigurationError(
                    f"{self.name}: the batch has no data group '{group}'; groups: "
                    f"{sorted(k for k, v in state.items() if isinstance(v, Mapping))}"
                )
            groups[group] = state[group]
        reference = self._reference_features(
            groups[self.imitation_data_group], self.imitation_state_map_fn,
            where=self.imitation_data_group,
        ).detach().requires_grad_(True)  # fmt: skip
        policy = self._policy_features(
            groups[self.policy_data_group], self.policy_state_map_fn,
            where=self.policy_data_group,
        ).detach()  # fmt: skip
        reference_score = self.discriminator(reference)
        policy_score = self.discriminator(policy)
        reference_loss = (reference_score - 1.0).pow(2).mean()
        policy_loss = (policy_score + 1.0).pow(2).mean()
        penalty = gradient_loss_function(reference_score, reference)
        loss = reference_loss + policy_loss + self.grad_loss_weight * penalty
        self.log_scalar("amp/loss/reference", reference_loss.detach())
        self.log_scalar("amp/loss/policy", policy_loss.detach())
        self.log_scalar("amp/loss/gradient_penalty", penalty.detach())
        self.log_scalar("amp/score/reference_mean", reference_score.detach().mean())
        self.log_scalar("amp/score/policy_mean", policy_score.detach().mean())
        return loss


class AMPReward(LoggingMixin, Callback):
    """Adds the style reward to the batch's task reward before the Q targets read it.

    ``rewards <- task_reward_weight * rewards + style_reward_weight * style_reward(D(s, s'))``,
    per transition, computed without gradients in ``begin_batch`` (:attr:`Order.REWARD`, before
    :attr:`Order.TARGET`). The batch's rewards change, not the table's: stored episodes keep
    their task rewards. Logs ``amp/task_reward``, ``amp/style_reward`` (unweighted, in [0, 1])
    and ``amp/total_reward``, batch means.

    Args:
        discriminator: The network :class:`DiscriminatorLoss` trains.
        style_reward_weight: Weight of the style reward.
        task_reward_weight: Weight of the environment's reward (0: style reward only).
        state_map_fn: Features of a policy state (identity by default).
        observation_keys: The observation keys the features are made of (``None``: all).
        rollout_length: Transitions per window in the batch.
        data_group: The data group whose ``rewards`` are rewritten; ``None``: the top-level
            ``rewards``.
        name: Unique name.

    Raises:
        ConfigurationError: If a weight is negative or not finite.
    """

    order: ClassVar[int] = Order.REWARD

    def __init__(
        self,
        *,
        discriminator: nn.Module,
        style_reward_weight: float = 1.0,
        task_reward_weight: float = 1.0,
        state_map_fn: StateMap = _identity,
        observation_keys: Sequence[str] | None = None,
        rollout_length: int = 1,
        data_group: str | None = "default",
        name: str = "amp_reward",
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        non_negative_number(name, "style_reward_weight", style_reward_weight)
        non_negative_number(name, "task_reward_weight", task_reward_weight)
        self.discriminator = discriminator
        self.style_reward_weight = style_reward_weight
        self.task_reward_weight = task_reward_weight
        self.state_map_fn = state_map_fn
        self._features = _TransitionFeatures(name, observation_keys, rollout_length)

    def begin_batch(
        self, observation: dict[str, Tensor], next_observation: dict[str, Tensor], rewards: Tensor
    ) -> dict[str, Any]:
        """Returns ``{data_group: {"rewards": task and style reward}}`` (without a data group,
        ``{"rewards": ...}``)."""
        group = {"observation": observation, "next_observation": next_observation}
        with torch.no_grad():
            inputs = self._features(group, self.state_map_fn, where=str(self.data_group))
            style = style_reward(self.discriminator(inputs)).reshape(rewards.shape)
            total = self.task_reward_weight * rewards + self.style_reward_weight * style
        self.log_scalar("amp/task_reward", rewards.mean())
        self.log_scalar("amp/style_reward", style.mean())
        self.log_scalar("amp/total_reward", total.mean())
        if self.data_group is None:
            return {"rewards": total}
        return {self.data_group: {"rewards": total}}


__all__ = [
    "REFERENCE_GROUP",
    "AMPReward",
    "Discriminator",
    "DiscriminatorLoss",
    "StateMap",
    "gradient_loss_function",
    "style_reward",
    "transition_pairs",
]
