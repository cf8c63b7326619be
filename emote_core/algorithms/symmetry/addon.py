"""Action symmetry as a registered add-on: the recipe table ``[symmetry]`` with its mirror maps,
and its callbacks (the discriminator's loss and the confusion reward)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_addon,
)
from emote_core.algorithms.symmetry.losses import (
    ActionSymmetryAMPReward,
    ActionSymmetryDiscriminatorLoss,
)
from emote_core.algorithms.symmetry.mirror import MirrorMap
from emote_core.callback import Callback
from emote_core.errors import ConfigurationError
from emote_core.nn.discriminator import Discriminator
from emote_core.nn.inputs import observation_dim
from emote_core.spaces import DiscreteSpace, MDPSpace
from emote_core.utils.checks import non_negative_number


@dataclass
class SymmetryConfig:
    """Adversarial action symmetry (the recipe table ``[symmetry]``).

    ``mirror(x)[i] = signs[i] * x[permutation[i]]``; a missing permutation is the identity and
    missing signs are all +1. The observation map applies to the flattened observation (the
    ``observation_keys``, or every key in sorted order); without one the discriminator sees
    actions alone.
    """

    action_permutation: list[int] | None = None
    """The action's mirror permutation: index ``permutation[i]`` lands at ``i``."""
    action_signs: list[float] | None = None
    """The action's mirror signs (1 or -1 per dimension)."""
    observation_permutation: list[int] | None = None
    """The flattened observation's mirror permutation."""
    observation_signs: list[float] | None = None
    """The flattened observation's mirror signs."""
    observation_keys: list[str] | None = None
    """The observation keys mirrored and flattened (in this order); every key when unset."""
    confusion_reward_weight: float = 1.0
    """Weight of the confusion reward (0 where the discriminator cannot tell, down to -1)."""
    center_on_batch: bool = False
    """Subtract each batch's mean confusion reward: it then ranks pairs without making every
    step cost (or pay) on average."""
    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the discriminator."""
    learning_rate: float = 3e-4
    """Adam learning rate of the discriminator."""
    gradient_penalty_weight: float = 1.0
    """Weight of the penalty on the discriminator's input gradient at unmirrored pairs."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of the discriminator's loss."""


def _mirrors(
    config: SymmetryConfig, action_size: int | None, observation_size: int | None
) -> tuple[MirrorMap, MirrorMap | None]:
    action = MirrorMap.build(
        permutation=config.action_permutation, signs=config.action_signs, size=action_size,
        option="symmetry.action",
    )  # fmt: skip
    if config.observation_permutation is None and config.observation_signs is None:
        return action, None
    observation = MirrorMap.build(
        permutation=config.observation_permutation, signs=config.observation_signs,
        size=observation_size, option="symmetry.observation",
    )  # fmt: skip
    return action, observation


@register_addon
class ActionSymmetry(AddOn):
    """Rewards a continuous-action policy for acting on mirrored states as the mirror image of
    what it does on the states, judged by a discriminator."""

    name: ClassVar[str] = "symmetry"
    config_class: ClassVar[type] = SymmetryConfig
    summary: ClassVar[str] = "adversarial action symmetry: a reward for mirror-symmetric actions"

    def validate(self, config: SymmetryConfig, *, source: str) -> None:
        try:
            _mirrors(config, None, None)
        except ConfigurationError as error:
            raise ConfigurationError(f"{source}: {error}") from None
        for key in ("confusion_reward_weight", "gradient_penalty_weight"):
            non_negative_number(source, f"'symmetry.{key}'", getattr(config, key))
        if not config.max_grad_norm > 0.0:
            raise ConfigurationError(
                f"{source}: 'symmetry.max_grad_norm' must be above 0; got {config.max_grad_norm}"
            )
        if any(width < 1 for width in config.hidden_dims):
            raise ConfigurationError(f"{source}: 'symmetry.hidden_dims' must be positive widths; "
                                     f"got {config.hidden_dims}")  # fmt: skip
        if config.observation_keys is not None and not config.observation_keys:
            raise ConfigurationError(
                f"{source}: 'symmetry.observation_keys' is empty; leave it out to use every key"
            )

    def check(
        self, config: SymmetryConfig, algorithm: AlgorithmFamily, spaces: MDPSpace, *, env_id: str
    ) -> None:
        """Refuses discrete actions, and mirror maps whose lengths do not fit the environment."""
        action_space = spaces.actions
        if isinstance(action_space, DiscreteSpace):
            raise ConfigurationError(
                f"the symmetry add-on mirrors continuous actions, and '{env_id}' has discrete ones"
            )
        keys = config.observation_keys
        missing = sorted(set(keys or ()) - set(spaces.state.keys()))
        if missing:
            raise ConfigurationError(
                f"'symmetry.observation_keys' names {missing}, which '{env_id}' does not give "
                f"(its keys: {sorted(spaces.state.keys())})"
            )
        try:
            _mirrors(config, math.prod(action_space.shape), observation_dim(spaces, keys))
        except ConfigurationError as error:
            raise ConfigurationError(f"{error} in '{env_id}'") from None

    def callbacks(
        self,
        config: SymmetryConfig,
        networks: Networks,
        parts: TrainingParts,
        context: BuildContext,
    ) -> list[Callback]:
        keys = config.observation_keys
        action_size = math.prod(context.spaces.actions.shape)
        observation_size = observation_dim(context.spaces, keys)
        action_mirror, observation_mirror = _mirrors(config, action_size, observation_size)
        input_dim = action_size + (observation_size if observation_mirror is not None else 0)
        discriminator = Discriminator(input_dim=input_dim, hidden_dims=config.hidden_dims)
        discriminator = discriminator.to(context.device)
        optimizer = torch.optim.Adam(discriminator.parameters(), lr=config.learning_rate)
        mirrors = {"action_mirror": action_mirror, "observation_mirror": observation_mirror,
                   "observation_keys": keys}  # fmt: skip
        return [
            ActionSymmetryDiscriminatorLoss(
                discriminator=discriminator, optimizer=optimizer,
                policy_actions=networks.policy_actions, seed=context.seed,
                grad_loss_weight=config.gradient_penalty_weight,
                max_grad_norm=config.max_grad_norm, **mirrors,
            ),
            ActionSymmetryAMPReward(
                discriminator=discriminator,
                confusion_reward_weight=config.confusion_reward_weight,
                center_on_batch=config.center_on_batch, **mirrors,
            ),
        ]  # fmt: skip


__all__ = ["ActionSymmetry", "SymmetryConfig"]
