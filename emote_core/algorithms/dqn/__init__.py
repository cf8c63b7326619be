"""Deep Q-learning: the callbacks, and the ``dqn`` algorithm family that recipes name.

Two callbacks share an online network ``q(observation) -> (B, num_actions)`` and a target copy::

    callbacks = [
        QTarget(q=q, q_target_network=copy.deepcopy(q), target_update_interval=500),
        QLoss(q=q, optimizer=torch.optim.Adam(q.parameters(), lr=1e-4)),
    ]

Actions are stored as int64 of shape ``(B, 1)`` (what tables built for a
:class:`~emote_core.spaces.DiscreteSpace` hold).
:class:`~emote_core.algorithms.dqn.family.DoubleDQN` registers this set-up, with epsilon-greedy
exploration, as ``algorithm = "dqn"``.
"""

from __future__ import annotations

from emote_core.algorithms.dqn.callbacks import HLGaussQLoss, QLoss, QTarget
from emote_core.algorithms.dqn.family import DoubleDQN, DqnConfig, DqnNetworks

__all__ = ["DoubleDQN", "DqnConfig", "DqnNetworks", "HLGaussQLoss", "QLoss", "QTarget"]
