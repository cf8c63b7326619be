"""Implicit Q-Learning (``iql``): an expectile value, twin Q networks and an
advantage-weighted policy, trained offline from a store."""

from __future__ import annotations

from emote_core.algorithms.iql.family import (
    ImplicitQLearning,
    IqlConfig,
    IqlNetworks,
    StateValueMlp,
)
from emote_core.algorithms.iql.losses import (
    AdvantageWeightedPolicyLoss,
    ExpectileValueLoss,
    IqlPolicy,
    IqlTarget,
    advantage_weights,
    expectile_loss,
)

__all__ = [
    "AdvantageWeightedPolicyLoss",
    "ExpectileValueLoss",
    "ImplicitQLearning",
    "IqlConfig",
    "IqlNetworks",
    "IqlPolicy",
    "IqlTarget",
    "StateValueMlp",
    "advantage_weights",
    "expectile_loss",
]
