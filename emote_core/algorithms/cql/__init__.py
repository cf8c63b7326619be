"""Conservative Q-Learning (``cql``), trained offline from a store: SAC with CQL's penalty on
sampled actions for Box actions, double DQN with the penalty over every action for discrete
ones.

A Box-action run is SAC's :class:`~emote_core.algorithms.sac.QTarget` and
:class:`~emote_core.algorithms.cql.losses.CqlProposals` (both at ``Order.TARGET``), a
:class:`~emote_core.algorithms.cql.losses.CqlQLoss` per Q network, then a
:class:`~emote_core.algorithms.cql.losses.CqlPolicyLoss` (SAC's, after an optional warm-up of
behaviour cloning) and SAC's ``AlphaLoss``; a discrete run is DQN's ``QTarget`` and a
:class:`~emote_core.algorithms.cql.losses.DiscreteCqlQLoss`.
"""

from __future__ import annotations

from emote_core.algorithms.cql.family import (
    CQL_ACTING_CALLBACK,
    CQL_DISCRETE_ACTING_CALLBACK,
    ConservativeQLearning,
    CqlConfig,
)
from emote_core.algorithms.cql.losses import (
    CqlPolicyLoss,
    CqlProposals,
    CqlQLoss,
    DiscreteCqlQLoss,
    conservative_penalty,
)

__all__ = [
    "CQL_ACTING_CALLBACK",
    "CQL_DISCRETE_ACTING_CALLBACK",
    "ConservativeQLearning",
    "CqlConfig",
    "CqlPolicyLoss",
    "CqlProposals",
    "CqlQLoss",
    "DiscreteCqlQLoss",
    "conservative_penalty",
]
