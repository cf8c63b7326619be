"""Implicit Q-Learning as a registered, offline-only algorithm family: its recipe table
``[iql]``, networks, callbacks and acting network.

IQL never queries its Q networks at actions the store does not hold: ``V(s)`` is an upper
expectile of ``min(Q1', Q2')(s, a)`` over the stored actions, the Q networks regress onto
``r + gamma * mask * V(s')``, and the policy is fitted to the stored actions weighted by
``exp(temperature * (Q - V))``. It acts, is evaluated and exports as ``bc``'s Box-action policy.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms.base import priority_feedback
from emote_core.algorithms.bc.family import DETERMINISTIC_LOG_STD
from emote_core.algorithms.iql.losses import (
    AdvantageWeightedPolicyLoss,
    ExpectileValueLoss,
    IqlPolicy,
    IqlTarget,
    check_expectile,
)
from emote_core.algorithms.registry import (
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_algorithm,
)
from emote_core.algorithms.sac.family import gaussian_agent, gaussian_policy_graph
from emote_core.algorithms.sac.losses import StackedQLoss
from emote_core.errors import ConfigurationError
from emote_core.nn import GaussianMlpPolicy, MlpEncoder, StackedActionValueMlp, observation_dim
from emote_core.nn.initialization import LayerInit, init_value_mlp_, layer_init
from emote_core.onnx.graph import PolicyGraph
from emote_core.spaces import DiscreteSpace, MDPSpace
from emote_core.utils.checks import finite_number, positive_ints

IQL_POLICY_CALLBACK = "policy"
"""The name of the policy loss, whose network state in a checkpoint is the acting network."""


@dataclass
class IqlConfig:
    """Implicit Q-Learning hyperparameters (the recipe table ``[iql]``)."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the policy, both Q networks and the value network."""
    learning_rate: float = 3e-4
    """Adam learning rate of the policy, the Q networks and the value network."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor of the target Q networks."""
    expectile: float = 0.7
    """The expectile of the stored actions' Q values that V fits, in (0, 1); 0.5 is their
    mean, nearer 1 their best."""
    temperature: float = 3.0
    """The inverse temperature of the policy's weights ``exp(temperature * advantage)``;
    0 is behaviour cloning."""
    max_weight: float = 100.0
    """The largest weight a stored action gets in the policy's loss."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of every loss."""
    policy: IqlPolicy = IqlPolicy.GAUSSIAN
    """``gaussian`` (weighted log-likelihood) or ``deterministic`` (weighted squared error of
    ``tanh(mean)``)."""
    initialization: LayerInit = LayerInit.ORTHOGONAL
    """How every network's layers start: ``orthogonal`` (upstream emote's, SAC's default) or
    ``torch`` (PyTorch's defaults, as d3rlpy's). Unlike bc and cql, iql learned more from the
    orthogonal start on the Pendulum and Hopper datasets (benchmarks/RESULTS.md)."""


class StateValueMlp(nn.Module):
    """``V(s)``: an MLP over the flattened observation with one output, ``(B, 1)``.

    Initialised as :class:`~emote_core.nn.ActionValueMlp` is: by default orthogonal hidden
    layers (gain sqrt 2), an orthogonal output layer of gain 1, zero biases.

    Args:
        observation_dim: The width of the flattened observation.
        hidden_dims: The MLP's layer widths.
        initialization: How the layers start (:class:`~emote_core.nn.LayerInit`).

    Raises:
        ConfigurationError: If a width is not a positive integer, or ``initialization`` names
            no :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__()
        initialization = layer_init("StateValueMlp", initialization)
        self.encoder = MlpEncoder(input_dim=observation_dim, hidden_dims=hidden_dims)
        self.final_layer = nn.Linear(self.encoder.output_dim, 1)
        init_value_mlp_(self.encoder, self.final_layer, initialization)

    def forward(self, observation: Tensor) -> Tensor:
        """The value of ``observation`` (``(B, D)``): ``(B, 1)``."""
        return self.final_layer(self.encoder(observation))


@dataclass
class IqlNetworks(Networks):
    """A Gaussian policy, the twin Q networks stacked in one module (``(2, B, 1)`` values) with
    their target copy, and the value network."""

    policy: nn.Module
    critics: nn.Module
    value: nn.Module
    targets: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def acting(self) -> nn.Module:
        """The policy."""
        return self.policy


@register_algorithm
class ImplicitQLearning(AlgorithmFamily):
    """Implicit Q-Learning for Box actions: expectile value, twin Q networks and an
    advantage-weighted policy, trained offline."""

    name: ClassVar[str] = "iql"
    config_class: ClassVar[type] = IqlConfig
    summary: ClassVar[str] = "implicit Q-learning, trained offline on a store, for Box actions"
    acting_callback: ClassVar[str] = IQL_POLICY_CALLBACK
    offline_only: ClassVar[bool] = True

    def validate(self, config: IqlConfig, *, source: str) -> None:
        positive_ints(source, "'iql.hidden_dims'", config.hidden_dims, allow_empty=False)
        for key, low in (("learning_rate", 0), ("max_weight", 0), ("max_grad_norm", 0)):
            finite_number(source, f"'iql.{key}'", getattr(config, key), low, low_open=True)
        finite_number(source, "'iql.gamma'", config.gamma, 0, 1)
        finite_number(source, "'iql.tau'", config.tau, 0, 1, low_open=True)
        finite_number(source, "'iql.temperature'", config.temperature, 0)
        check_expectile(source, "'iql.expectile'", config.expectile)

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        if isinstance(spaces.actions, DiscreteSpace):
            raise ConfigurationError(
                f"iql needs continuous (Box) actions; '{env_id}' has discrete actions — use "
                'algorithm = "cql" or "bc", which take them'
            )

    def make_networks(self, config: IqlConfig, context: BuildContext) -> IqlNetworks:
        spaces, device, hidden = context.spaces, context.device, config.hidden_dims
        obs_dim, action_dim = observation_dim(spaces), int(spaces.actions.shape[0])
        low, high = (-20.0, 2.0)
        if config.policy is IqlPolicy.DETERMINISTIC:
            low, high = DETERMINISTIC_LOG_STD
        start = config.initialization
        policy = GaussianMlpPolicy(
            observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden,
            log_std_min=low, log_std_max=high, initialization=start,
        )  # fmt: skip
        # Stacked: one batched product per layer for both, one optimizer step (more updates/s).
        critics = StackedActionValueMlp(
            observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden,
            initialization=start,
        ).to(device)  # fmt: skip
        value = StateValueMlp(observation_dim=obs_dim, hidden_dims=hidden, initialization=start)
        return IqlNetworks(
            policy=policy.to(device), critics=critics, value=value.to(device),
            targets={"critics": copy.deepcopy(critics)},
        )  # fmt: skip

    def training_parts(
        self, config: IqlConfig, networks: IqlNetworks, context: BuildContext
    ) -> TrainingParts:
        adam = functools.partial(torch.optim.Adam, fused=True, lr=config.learning_rate)
        clip = config.max_grad_norm
        callbacks: list[Any] = [
            IqlTarget(
                critics=networks.critics, critics_target=networks.targets["critics"],
                value=networks.value, gamma=config.gamma, target_q_tau=config.tau,
                rollout_length=context.rollout_length,
            ),
            ExpectileValueLoss(value=networks.value, optimizer=adam(networks.value.parameters()),
                               expectile=config.expectile, max_grad_norm=clip),
            StackedQLoss(critics=networks.critics, optimizer=adam(networks.critics.parameters()),
                         max_grad_norm=clip),
            AdvantageWeightedPolicyLoss(
                policy=networks.policy, optimizer=adam(networks.policy.parameters()),
                objective=config.policy,
                temperature=config.temperature, max_weight=config.max_weight,
                max_grad_norm=clip, name=IQL_POLICY_CALLBACK,
            ),
        ]  # fmt: skip
        callbacks += priority_feedback(context.table, losses=["q1", "q2"])
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=callbacks, agent=agent)

    def acting_agent(
        self, config: IqlConfig, networks: IqlNetworks, context: BuildContext, *,
        deterministic: bool,
    ) -> Any:  # fmt: skip
        return gaussian_agent(networks.acting, context, deterministic=deterministic)

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        return gaussian_policy_graph(acting, spaces, algorithm=self.name)


__all__ = [
    "IQL_POLICY_CALLBACK",
    "ImplicitQLearning",
    "IqlConfig",
    "IqlNetworks",
    "StateValueMlp",
]
