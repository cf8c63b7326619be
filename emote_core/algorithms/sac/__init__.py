"""Soft Actor-Critic: the callbacks, and the ``sac`` algorithm family that recipes name.

A SAC run is :class:`QTarget` (at ``Order.TARGET``, putting ``q_target`` in the data group)
then, in this order, a :class:`QLoss` per Q network, :class:`PolicyLoss` and
:class:`AlphaLoss`, which reuses the policy loss's log-probabilities of the same batch.
:class:`~emote_core.algorithms.sac.family.SoftActorCritic` registers this set-up as
``algorithm = "sac"``.
"""

from __future__ import annotations

from emote_core.algorithms.base import soft_update_from_to
from emote_core.algorithms.sac.family import SacConfig, SacNetworks, SoftActorCritic
from emote_core.algorithms.sac.losses import (
    POLICY_LOG_PROBS_KEY,
    POLICY_LOG_PROBS_STEP_KEY,
    AlphaLoss,
    PolicyLoss,
    QLoss,
    StackedQLoss,
)
from emote_core.algorithms.sac.targets import QTarget, TwinQ

__all__ = [
    "POLICY_LOG_PROBS_KEY",
    "POLICY_LOG_PROBS_STEP_KEY",
    "AlphaLoss",
    "PolicyLoss",
    "QLoss",
    "QTarget",
    "SacConfig",
    "SacNetworks",
    "SoftActorCritic",
    "StackedQLoss",
    "TwinQ",
    "soft_update_from_to",
]
