"""Behaviour cloning as a registered, offline-only algorithm family: its recipe table
``[bc]``, the policy it fits, its loss and its acting network.

Box actions train SAC's tanh-squashed Gaussian policy (by likelihood, or by squared error on
its mean); discrete actions train a network of one logit per action by cross-entropy and act
greedily, exported as DQN's graph (the logits as ``q_values``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import torch
from torch import nn

from emote_core.algorithms.bc.losses import BCLoss, BcObjective
from emote_core.algorithms.dqn.family import epsilon_greedy_agent, greedy_policy_graph
from emote_core.algorithms.registry import (
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_algorithm,
)
from emote_core.algorithms.sac.family import gaussian_agent, gaussian_policy_graph
from emote_core.errors import ConfigurationError
from emote_core.nn import DiscreteActionValueMlp, GaussianMlpPolicy, LayerInit, observation_dim
from emote_core.onnx.graph import PolicyGraph
from emote_core.spaces import DiscreteSpace, MDPSpace
from emote_core.utils.checks import finite_number, positive_ints

BC_CALLBACK = "policy"
"""The name of the loss, whose network state in a checkpoint is the acting network."""
DETERMINISTIC_LOG_STD = (-20.0, -19.0)
"""The log standard deviation's clamp of a ``deterministic`` policy: noise given from outside
(a sampling agent, an ONNX ``epsilon``) moves its actions by at most ``e^-19`` of it."""


class BcPolicy(StrEnum):
    """The policy fitted to Box actions (``[bc] policy``)."""

    GAUSSIAN = "gaussian"
    """A tanh-squashed Gaussian, by the log-likelihood of the stored actions."""
    DETERMINISTIC = "deterministic"
    """``tanh(mean)``, by its squared error to the stored actions."""


@dataclass
class BcConfig:
    """Behaviour cloning hyperparameters (the recipe table ``[bc]``)."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the policy."""
    learning_rate: float = 1e-3
    """Adam learning rate."""
    max_grad_norm: float = 10.0
    """Gradient norm clip."""
    policy: BcPolicy = BcPolicy.GAUSSIAN
    """For Box actions: ``gaussian`` or ``deterministic``. Discrete actions are always fitted by
    cross-entropy."""
    initialization: LayerInit = LayerInit.TORCH
    """For Box actions, how the policy's layers start: ``torch`` (PyTorch's defaults, as
    d3rlpy's) or ``orthogonal`` (upstream emote's). The discrete network always starts with
    PyTorch's."""


@dataclass
class BcNetworks(Networks):
    """The policy: a Gaussian policy (Box actions) or a network of logits (discrete actions)."""

    policy: nn.Module

    @property
    def acting(self) -> nn.Module:
        """The policy."""
        return self.policy


@register_algorithm
class BehaviourCloning(AlgorithmFamily):
    """Behaviour cloning: the policy that imitates a store's actions, trained offline."""

    name: ClassVar[str] = "bc"
    config_class: ClassVar[type] = BcConfig
    summary: ClassVar[str] = "behaviour cloning, trained offline on a store's actions"
    acting_callback: ClassVar[str] = BC_CALLBACK
    offline_only: ClassVar[bool] = True

    def validate(self, config: BcConfig, *, source: str) -> None:
        positive_ints(source, "'bc.hidden_dims'", config.hidden_dims, allow_empty=False)
        finite_number(source, "'bc.learning_rate'", config.learning_rate, 0, low_open=True)
        finite_number(source, "'bc.max_grad_norm'", config.max_grad_norm, 0, low_open=True)

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        if isinstance(spaces.actions, DiscreteSpace) and len(spaces.feature_keys) != 1:
            raise ConfigurationError(
                f"bc with discrete actions reads one observation key; '{env_id}' gives "
                f"{list(spaces.state.keys())}"
            )

    def make_networks(self, config: BcConfig, context: BuildContext) -> BcNetworks:
        spaces = context.spaces
        if isinstance(spaces.actions, DiscreteSpace):
            policy: nn.Module = DiscreteActionValueMlp(
                observation_dim=observation_dim(spaces, spaces.feature_keys),
                num_actions=spaces.actions.n, hidden_dims=config.hidden_dims,
            )  # fmt: skip
        else:
            low, high = (-20.0, 2.0)
            if config.policy is BcPolicy.DETERMINISTIC:
                low, high = DETERMINISTIC_LOG_STD
            policy = GaussianMlpPolicy(
                observation_dim=observation_dim(spaces), action_dim=int(spaces.actions.shape[0]),
                hidden_dims=config.hidden_dims, log_std_min=low, log_std_max=high,
                initialization=config.initialization,
            )  # fmt: skip
        return BcNetworks(policy=policy.to(context.device))

    def training_parts(
        self, config: BcConfig, networks: BcNetworks, context: BuildContext
    ) -> TrainingParts:
        spaces = context.spaces
        keys = None
        objective = BcObjective(config.policy.value)
        if isinstance(spaces.actions, DiscreteSpace):
            keys, objective = spaces.feature_keys, BcObjective.CATEGORICAL
        optimizer = torch.optim.Adam(networks.policy.parameters(), lr=config.learning_rate)
        loss = BCLoss(
            policy=networks.policy, optimizer=optimizer, objective=objective,
            observation_keys=keys, max_grad_norm=config.max_grad_norm, name=BC_CALLBACK,
        )  # fmt: skip
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=[loss], agent=agent)

    def acting_agent(
        self, config: BcConfig, networks: BcNetworks, context: BuildContext, *,
        deterministic: bool,
    ) -> Any:  # fmt: skip
        if isinstance(context.spaces.actions, DiscreteSpace):
            return epsilon_greedy_agent(networks.acting, context)
        return gaussian_agent(networks.acting, context, deterministic=deterministic)

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        if isinstance(spaces.actions, DiscreteSpace):
            return greedy_policy_graph(acting, spaces, algorithm=self.name)
        return gaussian_policy_graph(acting, spaces, algorithm=self.name)


__all__ = ["BC_CALLBACK", "BcConfig", "BcNetworks", "BcPolicy", "BehaviourCloning"]
