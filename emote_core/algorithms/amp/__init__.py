"""Adversarial motion priors (AMP), an add-on: ``addons = ["amp"]`` and an ``[amp]`` table with
the store of reference transitions. The discriminator's loss and the style reward are in
:mod:`.losses`; :mod:`.addon` registers them."""

from __future__ import annotations

from emote_core.algorithms.amp.addon import AdversarialMotionPrior, AmpConfig
from emote_core.algorithms.amp.losses import (
    REFERENCE_GROUP,
    AMPReward,
    Discriminator,
    DiscriminatorLoss,
    gradient_loss_function,
    style_reward,
    transition_pairs,
)

__all__ = [
    "REFERENCE_GROUP",
    "AMPReward",
    "AdversarialMotionPrior",
    "AmpConfig",
    "Discriminator",
    "DiscriminatorLoss",
    "gradient_loss_function",
    "style_reward",
    "transition_pairs",
]
