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

With the twin Q networks stacked in one module (:class:`~emote_core.nn.StackedActionValueMlp`,
``(2, B, 1)`` values), one :class:`StackedQLoss` trains both, and the target and policy loss take
``critics=`` (and ``critics_target=``) instead of ``q1``/``q2``; the learning is the same, in
half as many kernels::

    critics = StackedActionValueMlp(observation_dim=obs_dim, action_dim=action_dim)
    QTarget(policy=policy, ln_alpha=ln_alpha, critics=critics,
            critics_target=copy.deepcopy(critics))
    StackedQLoss(critics=critics, optimizer=torch.optim.Adam(critics.parameters(), lr=3e-4))
    PolicyLoss(policy=policy, ln_alpha=ln_alpha, critics=critics, optimizer=...)

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
