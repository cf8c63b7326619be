"""Behaviour cloning (``bc``): a policy fitted offline to the actions a store holds."""

from __future__ import annotations

from emote_core.algorithms.bc.family import (
    BcConfig,
    BcNetworks,
    BcPolicy,
    BehaviourCloning,
)
from emote_core.algorithms.bc.losses import BCLoss

__all__ = ["BCLoss", "BcConfig", "BcNetworks", "BcPolicy", "BehaviourCloning"]
