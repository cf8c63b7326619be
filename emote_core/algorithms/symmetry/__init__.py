"""Adversarial action symmetry, an add-on: ``addons = ["symmetry"]`` and a ``[symmetry]`` table
with the mirror maps of the actions (and, usually, the observations). :mod:`.mirror` holds the
maps and the policy's symmetry error, :mod:`.losses` the discriminator's loss and the confusion
reward; :mod:`.addon` registers them."""

from __future__ import annotations

from emote_core.algorithms.symmetry.addon import ActionSymmetry, SymmetryConfig
from emote_core.algorithms.symmetry.losses import (
    ActionSymmetryAMPReward,
    ActionSymmetryDiscriminatorLoss,
    MirroredPairs,
    confusion_reward,
)
from emote_core.algorithms.symmetry.mirror import MirrorMap, symmetry_error

__all__ = [
    "ActionSymmetry",
    "ActionSymmetryAMPReward",
    "ActionSymmetryDiscriminatorLoss",
    "MirrorMap",
    "MirroredPairs",
    "SymmetryConfig",
    "confusion_reward",
    "symmetry_error",
]
