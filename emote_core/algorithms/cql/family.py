"""Conservative Q-Learning as a registered, offline-only algorithm family: its recipe table
``[cql]``, networks, callbacks and acting network.

Box actions train SAC (its networks, soft Q target, policy and temperature losses) with CQL's
penalty in the Q losses; discrete actions train double DQN (its Q network and target) with
the penalty in its Q loss, and act greedily. The acting network in checkpoints is SAC's
policy (callback ``policy``) or the Q network whose greedy choice is the discrete policy
(callback ``q``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from emote_core.algorithms.base import priority_feedback
from emote_core.algorithms.cql.losses import (
    CqlPolicyLoss,
    CqlProposals,
    CqlQLoss,
    DiscreteCqlQLoss,
)
from emote_core.algorithms.dqn import DoubleDQN, DqnConfig, DqnNetworks
from emote_core.algorithms.dqn import QTarget as DqnQTarget
from emote_core.algorithms.dqn.family import epsilon_greedy_agent, greedy_policy_graph
from emote_core.algorithms.registry import (
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_algorithm,
)
from emote_core.algorithms.sac import AlphaLoss, SacConfig, SacNetworks
from emote_core.algorithms.sac import QTarget as SacQTarget
from emote_core.algorithms.sac.family import SoftActorCritic, gaussian_agent, gaussian_policy_graph
from emote_core.nn import LayerInit
from emote_core.onnx.graph import PolicyGraph
from emote_core.spaces import DiscreteSpace, MDPSpace
from emote_core.utils.checks import (
    finite_number,
    non_negative_int,
    non_negative_number,
    positive_int,
    positive_ints,
)

CQL_ACTING_CALLBACK = "policy"
"""The callback whose network state in a checkpoint is the acting network for Box actions:
SAC's policy loss."""
CQL_DISCRETE_ACTING_CALLBACK = "q"
"""The same for discrete actions: the Q loss, whose network's greedy choice is the policy."""


@dataclass
class CqlConfig:
    """Conservative Q-Learning hyperparameters (the recipe table ``[cql]``)."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of every network."""
    learning_rate: float = 3e-4
    """Adam learning rate of the Q networks."""
    policy_learning_rate: float = 1e-4
    """Adam learning rate of the policy and the temperature (Box actions only)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor of the target Q networks (Box actions only)."""
    conservative_weight: float = 5.0
    """The weight of the penalty ``logsumexp_a Q(s, a) - Q(s, a_data)`` in the Q losses."""
    sampled_actions: int = 10
    """Box actions: actions drawn per observation from each of the penalty's three proposals
    (uniform, the policy at ``s``, the policy at ``s'``)."""
    target_entropy: float | None = None
    """Entropy the temperature aims for; ``-action_dim`` when unset (Box actions only)."""
    max_alpha: float = 10.0
    """Upper bound of the temperature (Box actions only)."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of every loss."""
    bc_warmup_updates: int = 0
    """Box actions: the first updates train the policy to clone the stored actions (with SAC's
    entropy term) instead of following Q, as CQL's authors' own code does for D4RL's locomotion
    tasks (40,000 of 1,000,000 updates there); ``0`` follows Q from the start, as d3rlpy's CQL.
    The Q networks train from the first update either way."""
    target_update_interval: int = 500
    """Discrete actions: updates between copies of the Q network into its target."""
    initialization: LayerInit = LayerInit.TORCH
    """Box actions: how the policy's and Q networks' layers start, ``torch`` (PyTorch's
    defaults, as d3rlpy's CQL) or ``orthogonal`` (SAC's, upstream emote's). The discrete Q
    network always starts with PyTorch's, as DQN's."""


@register_algorithm
class ConservativeQLearning(AlgorithmFamily):
    """CQL: Q-learning that keeps the values of actions outside the data low, trained offline;
    on SAC for Box actions and on double DQN for discrete actions."""

    name: ClassVar[str] = "cql"
    config_class: ClassVar[type] = CqlConfig
    summary: ClassVar[str] = "conservative Q-learning, trained offline (SAC for Box, DQN discrete)"
    acting_callback: ClassVar[str] = CQL_ACTING_CALLBACK
    offline_only: ClassVar[bool] = True

    def validate(self, config: CqlConfig, *, source: str) -> None:
        positive_ints(source, "'cql.hidden_dims'", config.hidden_dims, allow_empty=False)
        for key in ("learning_rate", "policy_learning_rate", "max_alpha", "max_grad_norm"):
            finite_number(source, f"'cql.{key}'", getattr(config, key), 0, low_open=True)
        finite_number(source, "'cql.gamma'", config.gamma, 0, 1)
        finite_number(source, "'cql.tau'", config.tau, 0, 1, low_open=True)
        non_negative_number(source, "'cql.conservative_weight'", config.conservative_weight)
        positive_int(source, "'cql.sampled_actions'", config.sampled_actions)
        positive_int(source, "'cql.target_update_interval'", config.target_update_interval)
        non_negative_int(source, "'cql.bc_warmup_updates'", config.bc_warmup_updates)
        if config.target_entropy is not None:
            finite_number(source, "'cql.target_entropy'", config.target_entropy)

    def acting_callback_for(self, spaces: MDPSpace) -> str:
        if isinstance(spaces.actions, DiscreteSpace):
            return CQL_DISCRETE_ACTING_CALLBACK
        return CQL_ACTING_CALLBACK

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        if isinstance(spaces.actions, DiscreteSpace):
            DoubleDQN().check_spaces(spaces, env_id=env_id)

    def make_networks(self, config: CqlConfig, context: BuildContext) -> Networks:
        if isinstance(context.spaces.actions, DiscreteSpace):
            return DoubleDQN().make_networks(self._dqn_config(config), context)
        sac = SacConfig(hidden_dims=config.hidden_dims, initialization=config.initialization)
        return SoftActorCritic().make_networks(sac, context)

    @staticmethod
    def _dqn_config(config: CqlConfig) -> DqnConfig:
        return DqnConfig(
            hidden_dims=config.hidden_dims, learning_rate=config.learning_rate,
            gamma=config.gamma, target_update_interval=config.target_update_interval,
            max_grad_norm=config.max_grad_norm,
        )  # fmt: skip

    def training_parts(self, config: CqlConfig, networks: Any, context: BuildContext) -> Any:
        if isinstance(networks, DqnNetworks):
            return self._discrete_parts(config, networks, context)
        return self._continuous_parts(config, networks, context)

    def _continuous_parts(
        self, config: CqlConfig, networks: SacNetworks, context: BuildContext
    ) -> TrainingParts:
        # Fused Adam (one kernel for all parameters), as SAC's.
        adam = functools.partial(torch.optim.Adam, fused=True)
        action_dim = int(context.spaces.actions.shape[0])
        clip = config.max_grad_norm
        critics = {"q1": networks.q1, "q2": networks.q2}
        policy, ln_alpha = networks.policy, networks.ln_alpha
        callbacks = [
            SacQTarget(policy=policy, ln_alpha=ln_alpha, **critics, gamma=config.gamma,
                       q1_target=networks.targets["q1"], q2_target=networks.targets["q2"],
                       target_q_tau=config.tau, rollout_length=context.rollout_length),
            CqlProposals(policy=policy, action_dim=action_dim,
                         sampled_actions=config.sampled_actions,
                         rollout_length=context.rollout_length),
            *(CqlQLoss(name=name, q=q, optimizer=adam(q.parameters(), lr=config.learning_rate),
                       max_grad_norm=clip, conservative_weight=config.conservative_weight)
              for name, q in critics.items()),
            CqlPolicyLoss(policy=policy, ln_alpha=ln_alpha, **critics, max_grad_norm=clip,
                          optimizer=adam(policy.parameters(), lr=config.policy_learning_rate),
                          bc_warmup_updates=config.bc_warmup_updates, name=CQL_ACTING_CALLBACK),
            AlphaLoss(policy=policy, ln_alpha=ln_alpha, action_dim=action_dim,
                      target_entropy=config.target_entropy, max_alpha=config.max_alpha,
                      optimizer=adam([ln_alpha], lr=config.policy_learning_rate)),
        ]  # fmt: skip
        callbacks += priority_feedback(context.table, losses=list(critics))
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=callbacks, agent=agent)

    def _discrete_parts(
        self, config: CqlConfig, networks: DqnNetworks, context: BuildContext
    ) -> TrainingParts:
        spaces = context.spaces
        keys = spaces.feature_keys
        optimizer = torch.optim.Adam(networks.q.parameters(), lr=config.learning_rate, fused=True)
        callbacks = [
            DqnQTarget(q=networks.q, q_target_network=networks.targets["q"], gamma=config.gamma,
                       target_update_interval=config.target_update_interval,
                       rollout_length=context.rollout_length, observation_keys=keys,
                       action_mask_key=spaces.action_mask_key),
            DiscreteCqlQLoss(q=networks.q, optimizer=optimizer, max_grad_norm=config.max_grad_norm,
                             observation_keys=keys, action_mask_key=spaces.action_mask_key,
                             conservative_weight=config.conservative_weight,
                             name=CQL_DISCRETE_ACTING_CALLBACK),
            *priority_feedback(context.table, losses=[CQL_DISCRETE_ACTING_CALLBACK]),
        ]  # fmt: skip
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=callbacks, agent=agent)

    def acting_agent(
        self, config: CqlConfig, networks: Any, context: BuildContext, *, deterministic: bool
    ) -> Any:
        if isinstance(context.spaces.actions, DiscreteSpace):  # greedy, also when asked to sample
            return epsilon_greedy_agent(networks.acting, context)
        return gaussian_agent(networks.acting, context, deterministic=deterministic)

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        if isinstance(spaces.actions, DiscreteSpace):
            return greedy_policy_graph(acting, spaces, algorithm=self.name)
        return gaussian_policy_graph(acting, spaces, algorithm=self.name)


__all__ = [
    "CQL_ACTING_CALLBACK",
    "CQL_DISCRETE_ACTING_CALLBACK",
    "ConservativeQLearning",
    "CqlConfig",
]
