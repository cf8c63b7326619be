"""Soft Actor-Critic: the callbacks, and the ``sac`` algorithm family that recipes name.

A SAC run is five callbacks sharing one policy, two Q networks with target copies and one
``ln_alpha`` tensor::

    ln_alpha = torch.zeros(1, requires_grad=True)
    callbacks = [
        QTarget(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2,
                q1_target=copy.deepcopy(q1), q2_target=copy.deepcopy(q2)),
        QLoss(name="q1", q=q1, optimizer=torch.optim.Adam(q1.parameters(), lr=3e-4)),
        QLoss(name="q2", q=q2, optimizer=torch.optim.Adam(q2.parameters(), lr=3e-4)),
        PolicyLoss(policy=policy, ln_alpha=ln_alpha, q1=q1, q2=q2,
                   optimizer=torch.optim.Adam(policy.parameters(), lr=3e-4)),
        AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=action_dim,
                  optimizer=torch.optim.Adam([ln_alpha], lr=3e-4)),
    ]

:class:`QTarget` runs at ``Order.TARGET`` (before the losses) and puts ``q_target`` in the data
group; the losses run at ``Order.DEFAULT`` in the order given (Q losses, then the policy, then
the temperature, as above). In that order the temperature step reuses the log-probabilities the
policy loss computed on the same batch (``policy_log_probs`` in the data group) instead of
running the policy again.

:class:`~emote_core.algorithms.sac.family.SoftActorCritic` registers this set-up as
``algorithm = "sac"`` with its recipe table :class:`~emote_core.algorithms.sac.family.SacConfig`.
"""

from __future__ import annotations

from emote_core.algorithms._common import soft_update_from_to
from emote_core.algorithms.sac.family import SacConfig, SacNetworks, SoftActorCritic
from emote_core.algorithms.sac.losses import (
    POLICY_LOG_PROBS_KEY,
    POLICY_LOG_PROBS_STEP_KEY,
    AlphaLoss,
    PolicyLoss,
    QLoss,
)
from emote_core.algorithms.sac.targets import QTarget

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
    "soft_update_from_to",
]
