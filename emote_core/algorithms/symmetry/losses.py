"""Adversarial action symmetry: a discriminator learns to tell what the policy does in a state
from the mirror image of what it does in the mirrored state, and the policy is rewarded where it
cannot.

The discriminator compares, at the same states ``s`` of the batch, the pairs ``[s, pi(s)]``
(trained towards +1) with ``[s, m pi(m s)]`` (towards -1), both sampled from the policy as it is
now. Both sides hold the same states, so it can only tell them apart by the actions; a policy
that mirrors exactly (``pi(m s) = m pi(s)``) makes the two the same and the discriminator's best
answer 0 on both. Without an observation map it sees actions alone, the policy's beside their
mirror images (upstream emote's form: the actions' spread must be mirror-symmetric).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms.amp.losses import gradient_loss_function
from emote_core.algorithms.symmetry.mirror import MirrorMap
from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation
from emote_core.utils.checks import non_negative_number


def confusion_reward(unmirrored: Tensor, mirrored: Tensor) -> Tensor:
    """``-(D(x)^2 + D(m x)^2) / 2``, scores clamped to ``[-1, 1]``: 0 where the discriminator
    cannot tell (``D = 0`` on both), -1 where it tells perfectly (``D(x) = 1``, ``D(m x) = -1``).

    The best the policy can do is the confusion point itself. Upstream emote's reward,
    ``(1 - 0.25 (D(m x) - 1)^2) + (1 - 0.25 (D(x) + 1)^2)``, is highest where the scores are
    reversed (``D(x) = -1``, ``D(m x) = 1``): for pairs that look like the *mirror images* of
    the policy's own. The "reference" of this discriminator is the policy's mirror, which moves
    with it, so that reward sends the policy after its mirror image and past the symmetric
    point, swinging from one asymmetry to the opposite one (it raised the symmetry error on
    HitTheMiddle: benchmarks/RESULTS.md). Upstream's is also always positive, paying for every
    step lived.

    Args:
        unmirrored: ``D(x)`` of the batch's pairs (trained towards +1).
        mirrored: ``D(m x)`` of their mirror images (trained towards -1).
    """
    unmirrored = unmirrored.clamp(-1.0, 1.0)
    mirrored = mirrored.clamp(-1.0, 1.0)
    return -0.5 * (unmirrored.pow(2) + mirrored.pow(2))


class MirroredPairs:
    """The discriminator's inputs, with the observation and action maps.

    A stored transition ``(s, a)`` gives ``[s, a]`` and its mirror image ``[m s, m a]``; the
    policy at states ``s`` gives ``[s, pi(s)]`` and ``[s, m pi(m s)]``. Observation keys left
    out of ``observation_keys`` are taken to be unchanged by the mirror.

    Args:
        action_mirror: The action's reflection.
        observation_mirror: The flattened observation's reflection; ``None``: actions alone.
        observation_keys: The keys flattened (sorted order when ``None``).
        owner: Names the callback in errors.
    """

    def __init__(
        self,
        *,
        action_mirror: MirrorMap,
        observation_mirror: MirrorMap | None,
        observation_keys: Sequence[str] | None,
        owner: str,
    ) -> None:
        self.action_mirror = action_mirror
        self.observation_mirror = observation_mirror
        self.keys = list(observation_keys) if observation_keys is not None else None
        self.owner = owner

    def __call__(
        self, observation: Mapping[str, Tensor] | None, actions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``[s, a]`` and ``[m s, m a]`` rows (``a`` and ``m a`` without an observation map)."""
        flat_actions = self._actions(actions)
        mirrored_actions = self.action_mirror(flat_actions)
        if self.observation_mirror is None:
            return flat_actions, mirrored_actions
        states = self._states(observation)
        return (
            torch.cat([states, flat_actions], dim=-1),
            torch.cat([self.observation_mirror(states), mirrored_actions], dim=-1),
        )

    def policy_pairs(
        self, observation: Mapping[str, Tensor], policy: Callable[[Mapping[str, Tensor]], Tensor]
    ) -> tuple[Tensor, Tensor]:
        """``[s, pi(s)]`` and ``[s, m pi(m s)]`` rows for the batch's states (``pi(s)`` and
        ``m pi(s)`` without an observation map), from one call of ``policy`` on both."""
        if self.observation_mirror is None:
            acted = self._actions(policy(observation))
            return acted, self.action_mirror(acted)
        states = self._states(observation)
        mirrored = self._unflatten(observation, self.observation_mirror(states))
        both = {key: torch.cat([value, mirrored[key]], dim=0) for key, value in observation.items()}
        acted, acted_mirrored = self._actions(policy(both)).chunk(2, dim=0)
        return (
            torch.cat([states, acted], dim=-1),
            torch.cat([states, self.action_mirror(acted_mirrored)], dim=-1),
        )

    def mirror_observation(self, observation: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The observation with the mirrored keys reflected (the others as they are)."""
        assert self.observation_mirror is not None
        return self._unflatten(observation, self.observation_mirror(self._states(observation)))

    def _unflatten(self, observation: Mapping[str, Tensor], flat: Tensor) -> dict[str, Tensor]:
        """``observation`` with its mirrored keys replaced by their slices of ``flat``."""
        keys = self.keys if self.keys is not None else sorted(observation)
        mirrored = dict(observation)
        start = 0
        for key in keys:
            value = observation[key]
            width = math.prod(value.shape[1:])
            mirrored[key] = flat[:, start : start + width].reshape(value.shape).to(value.dtype)
            start += width
        return mirrored

    def _actions(self, actions: Tensor) -> Tensor:
        flat = actions.reshape(actions.shape[0], -1)
        self._fits("actions", flat, self.action_mirror)
        return flat

    def _states(self, observation: Mapping[str, Tensor] | None) -> Tensor:
        if observation is None:
            raise ConfigurationError(f"{self.owner}: the batch has no observation to mirror")
        assert self.observation_mirror is not None
        states = flatten_observation(observation, self.keys)
        self._fits("observations", states, self.observation_mirror)
        return states

    def _fits(self, what: str, values: Tensor, mirror: MirrorMap) -> None:
        if values.shape[-1] != len(mirror):
            raise ConfigurationError(
                f"{self.owner}: the batch's {what} have {values.shape[-1]} dimensions and the "
                f"mirror map {len(mirror)}"
            )


class ActionSymmetryDiscriminatorLoss(LossCallback):
    """Trains the discriminator on the policy as it is now: least squares to +1 on
    ``x = [s, pi(s)]``, to -1 on ``x' = [s, m pi(m s)]``, plus ``grad_loss_weight`` times the
    gradient penalty on the first::

        loss = mean((D(x) - 1)^2) + mean((D(x') + 1)^2) + grad_loss_weight * mean |dD(x)/dx|^2

    ``s`` are the batch's states; the actions are sampled from the current policy, not read
    from the batch, whose actions come from every past policy. Without an observation map,
    ``x = pi(s)`` and ``x' = m pi(s)``.

    Args:
        discriminator: ``(B, F) -> (B, 1)``, ``F`` the width of a pair.
        optimizer: Over the discriminator's parameters.
        policy_actions: Samples the policy's actions, ``(observation, *, generator) -> (B, A)``
            (``Networks.policy_actions`` of the algorithm's networks).
        action_mirror: The action's reflection.
        observation_mirror: The observation's; ``None``: the discriminator sees actions alone.
        observation_keys: The observation keys mirrored (all, in sorted order, when ``None``).
        grad_loss_weight: Weight of the gradient penalty.
        max_grad_norm: Gradient norm clip.
        lr_schedule: A learning-rate scheduler.
        seed: Seeds the sampling noise's generator.
        data_group: The data group of the policy's transitions.
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
        policy_actions: Callable[..., Tensor],
        action_mirror: MirrorMap,
        observation_mirror: MirrorMap | None = None,
        observation_keys: Sequence[str] | None = None,
        grad_loss_weight: float = 10.0,
        max_grad_norm: float | None = 10.0,
        lr_schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
        seed: int = 0,
        data_group: str = "default",
        name: str = "symmetry_discriminator",
    ) -> None:
        super().__init__(
            name=name, network=discriminator, optimizer=optimizer, lr_schedule=lr_schedule,
            max_grad_norm=max_grad_norm, data_group=data_group,
        )  # fmt: skip
        non_negative_number(name, "grad_loss_weight", grad_loss_weight)
        self.discriminator = discriminator
        self.policy_actions = policy_actions
        self.grad_loss_weight = grad_loss_weight
        self.generator = torch.Generator().manual_seed(int(seed))
        self._pairs = MirroredPairs(
            action_mirror=action_mirror, observation_mirror=observation_mirror,
            observation_keys=observation_keys, owner=name,
        )  # fmt: skip

    def _sample(self, observation: Mapping[str, Tensor]) -> Tensor:
        return self.policy_actions(observation, generator=self.generator)

    def loss(self, observation: Mapping[str, Tensor]) -> Tensor:
        """The loss at this batch's states."""
        with torch.no_grad():
            unmirrored, mirrored = self._pairs.policy_pairs(observation, self._sample)
        unmirrored.requires_grad_(True)  # made without gradients: a leaf, for the penalty
        unmirrored_score = self.discriminator(unmirrored)
        mirrored_score = self.discriminator(mirrored)
        unmirrored_loss = (unmirrored_score - 1.0).pow(2).mean()
        mirrored_loss = (mirrored_score + 1.0).pow(2).mean()
        penalty = gradient_loss_function(unmirrored_score, unmirrored)
        self.log_scalar("symmetry/loss/unmirrored", unmirrored_loss.detach())
        self.log_scalar("symmetry/loss/mirrored", mirrored_loss.detach())
        self.log_scalar("symmetry/loss/gradient_penalty", penalty.detach())
        self.log_scalar("symmetry/score/unmirrored_mean", unmirrored_score.detach().mean())
        self.log_scalar("symmetry/score/mirrored_mean", mirrored_score.detach().mean())
        return unmirrored_loss + mirrored_loss + self.grad_loss_weight * penalty

    def state_dict(self) -> dict[str, Any]:
        """The loss's state and the sampling generator's."""
        state = super().state_dict()
        state["generator_state"] = self.generator.get_state()
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores :meth:`state_dict`'s, the generator with the network."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        if load_network and "generator_state" in state_dict:
            self.generator.set_state(state_dict["generator_state"])


class ActionSymmetryAMPReward(LoggingMixin, Callback):
    """Adds the weighted :func:`confusion_reward` to the batch's rewards before the Q targets
    read them (``begin_batch`` at :attr:`Order.REWARD`, without gradients).

    The batch's rewards change, not the table's. Logs ``symmetry/task_reward``,
    ``symmetry/confusion_reward`` (unweighted) and ``symmetry/total_reward``, batch means.

    Args:
        discriminator: The network :class:`ActionSymmetryDiscriminatorLoss` trains.
        action_mirror: The action's reflection.
        observation_mirror: The observation's; ``None``: actions alone.
        observation_keys: The observation keys mirrored (all when ``None``).
        confusion_reward_weight: Weight of the confusion reward.
        center_on_batch: Subtract the batch's mean confusion reward, so that it only ranks the
            batch's pairs against each other and adds nothing on average: a discriminator that
            tells the policy's pairs apart everywhere then no longer makes every step cost
            (which, where episodes end on failure, pays for ending them early).
        data_group: The data group whose ``rewards`` are rewritten.
        name: Unique name.

    Raises:
        ConfigurationError: If the weight is negative or not finite.
    """

    order: ClassVar[int] = Order.REWARD

    def __init__(
        self,
        *,
        discriminator: nn.Module,
        action_mirror: MirrorMap,
        observation_mirror: MirrorMap | None = None,
        observation_keys: Sequence[str] | None = None,
        confusion_reward_weight: float = 1.0,
        center_on_batch: bool = False,
        data_group: str = "default",
        name: str = "symmetry_reward",
    ) -> None:
        super().__init__(name=name, data_group=data_group)
        non_negative_number(name, "confusion_reward_weight", confusion_reward_weight)
        self.discriminator = discriminator
        self.confusion_reward_weight = confusion_reward_weight
        self.center_on_batch = center_on_batch
        self._pairs = MirroredPairs(
            action_mirror=action_mirror, observation_mirror=observation_mirror,
            observation_keys=observation_keys, owner=name,
        )  # fmt: skip

    def begin_batch(
        self, actions: Tensor, rewards: Tensor, observation: Mapping[str, Tensor] | None = None
    ) -> dict[str, Any]:
        """Returns ``{data_group: {"rewards": task reward + weighted confusion reward}}``
        (``symmetry/confusion_reward`` logs the uncentred batch mean)."""
        with torch.no_grad():
            unmirrored, mirrored = self._pairs(observation, actions)
            scores = self.discriminator(torch.cat([unmirrored, mirrored], dim=0))
            count = unmirrored.shape[0]
            confusion = confusion_reward(scores[:count], scores[count:]).reshape(rewards.shape)
            added = confusion - confusion.mean() if self.center_on_batch else confusion
            total = rewards + self.confusion_reward_weight * added
        self.log_scalar("symmetry/task_reward", rewards.mean())
        self.log_scalar("symmetry/confusion_reward", confusion.mean())
        self.log_scalar("symmetry/total_reward", total.mean())
        return {self.data_group: {"rewards": total}}


__all__ = [
    "ActionSymmetryAMPReward",
    "ActionSymmetryDiscriminatorLoss",
    "MirroredPairs",
    "confusion_reward",
]
