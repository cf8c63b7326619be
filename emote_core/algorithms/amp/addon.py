"""AMP as a registered add-on: the recipe table ``[amp]``, its reference data group and its
callbacks (the discriminator's loss and the style reward)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from emote_core.algorithms.amp.losses import REFERENCE_GROUP, AMPReward, DiscriminatorLoss
from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    BuildContext,
    DataSource,
    Networks,
    TrainingParts,
    register_addon,
)
from emote_core.callback import Callback
from emote_core.errors import ConfigurationError
from emote_core.nn.discriminator import Discriminator
from emote_core.nn.inputs import observation_dim
from emote_core.spaces import MDPSpace
from emote_core.utils.checks import non_negative_number


@dataclass
class AmpConfig:
    """Adversarial motion priors (the recipe table ``[amp]``)."""

    reference: str = ""
    """The emote-memory store of reference transitions (demonstrations), made with ``emote
    collect RECIPE --policy RUN --out expert.zarr``; relative to the working directory."""
    style_reward_weight: float = 1.0
    """Weight of the style reward ``max(0, 1 - 0.25 (D(s, s') - 1)^2)``."""
    task_reward_weight: float = 1.0
    """Weight of the environment's reward; 0 trains on the style reward alone."""
    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the discriminator."""
    learning_rate: float = 1e-4
    """Adam learning rate of the discriminator."""
    gradient_penalty_weight: float = 10.0
    """Weight of the penalty on the discriminator's input gradient at reference transitions."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of the discriminator's loss."""
    batch_size: int | None = None
    """Reference transitions per batch; ``memory.batch_size`` when unset."""
    observation_keys: list[str] | None = None
    """The observation keys the discriminator sees; every key when unset."""


@register_addon
class AdversarialMotionPrior(AddOn):
    """Rewards the policy for transitions a discriminator cannot tell from a reference store's."""

    name: ClassVar[str] = "amp"
    config_class: ClassVar[type] = AmpConfig
    summary: ClassVar[str] = "adversarial motion priors: a style reward from reference transitions"

    def validate(self, config: AmpConfig, *, source: str) -> None:
        if not config.reference.strip():
            raise ConfigurationError(
                f"{source}: 'amp.reference' must name the store of reference transitions; make "
                "one with: emote collect RECIPE --policy RUN --out expert.zarr"
            )
        for key in ("style_reward_weight", "task_reward_weight", "gradient_penalty_weight"):
            non_negative_number(source, f"'amp.{key}'", getattr(config, key))
        if config.style_reward_weight == 0.0 and config.task_reward_weight == 0.0:
            raise ConfigurationError(
                f"{source}: 'amp.style_reward_weight' and 'amp.task_reward_weight' are both 0, "
                "which leaves no reward; set one above 0"
            )
        if not config.max_grad_norm > 0.0:
            raise ConfigurationError(
                f"{source}: 'amp.max_grad_norm' must be above 0; got {config.max_grad_norm}"
            )
        if config.batch_size is not None and config.batch_size < 1:
            raise ConfigurationError(
                f"{source}: 'amp.batch_size' must be at least 1; got {config.batch_size}"
            )
        if any(width < 1 for width in config.hidden_dims):
            raise ConfigurationError(
                f"{source}: 'amp.hidden_dims' must be positive widths; got {config.hidden_dims}"
            )
        if config.observation_keys is not None and not config.observation_keys:
            raise ConfigurationError(
                f"{source}: 'amp.observation_keys' is empty; leave it out to use every key"
            )

    def check(
        self, config: AmpConfig, algorithm: AlgorithmFamily, spaces: MDPSpace, *, env_id: str
    ) -> None:
        """Nothing to refuse: the discriminator reads observations only (discrete or continuous
        actions alike), and the style reward is in the batch's ``rewards`` before any callback at
        :attr:`~emote_core.callback.Order.TARGET` (SAC's and DQN's Q targets) reads them."""

    def data_sources(self, config: AmpConfig) -> list[DataSource]:
        return [DataSource(data_group=REFERENCE_GROUP, store=config.reference,
                           option="amp.reference", batch_size=config.batch_size)]  # fmt: skip

    def callbacks(
        self, config: AmpConfig, networks: Networks, parts: TrainingParts, context: BuildContext
    ) -> list[Callback]:
        keys = config.observation_keys
        missing = sorted(set(keys or ()) - set(context.spaces.state.keys()))
        if missing:
            raise ConfigurationError(
                f"'amp.observation_keys' names {missing}, which '{context.env_id}' does not give "
                f"(its keys: {sorted(context.spaces.state.keys())})"
            )
        feature_dim = observation_dim(context.spaces, keys)
        discriminator = Discriminator(input_dim=2 * feature_dim, hidden_dims=config.hidden_dims)
        discriminator = discriminator.to(context.device)
        optimizer = torch.optim.Adam(discriminator.parameters(), lr=config.learning_rate)
        return [
            DiscriminatorLoss(
                discriminator=discriminator, optimizer=optimizer,
                grad_loss_weight=config.gradient_penalty_weight, observation_keys=keys,
                rollout_length=context.rollout_length, max_grad_norm=config.max_grad_norm,
            ),
            AMPReward(
                discriminator=discriminator, style_reward_weight=config.style_reward_weight,
                task_reward_weight=config.task_reward_weight, observation_keys=keys,
                rollout_length=context.rollout_length,
            ),
        ]  # fmt: skip


__all__ = ["AdversarialMotionPrior", "AmpConfig"]
