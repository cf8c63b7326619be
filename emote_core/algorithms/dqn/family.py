"""Double DQN as a registered algorithm family: its recipe table, networks, callbacks and acting
network."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms.base import priority_feedback
from emote_core.algorithms.dqn.callbacks import HLGaussQLoss, QLoss, QTarget
from emote_core.algorithms.hlgauss import HL_GAUSS_CRITIC, HLGaussConfig, QNet
from emote_core.algorithms.registry import (
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_algorithm,
)
from emote_core.callbacks.generic import ScheduleStepper
from emote_core.errors import ConfigurationError
from emote_core.nn import DiscreteActionLogitMlp, DiscreteActionValueMlp, observation_dim
from emote_core.onnx.format import ACTION_MASKS_INPUT, ACTIONS_OUTPUT, Q_VALUES_OUTPUT
from emote_core.onnx.graph import KeyedInputs, PolicyGraph, masked_argmax, policy_graph
from emote_core.proxies import EpsilonGreedyAgentProxy
from emote_core.schedules import LinearSchedule
from emote_core.spaces import ACTION_MASK_KEY, DiscreteSpace, MDPSpace


class DqnCritic(StrEnum):
    """How DQN's Q network learns (``[dqn] critic``)."""

    HUBER = "huber"
    """Regression with the Huber (smooth L1) error."""
    MSE = "mse"
    """Regression with the squared error."""
    HL_GAUSS = HL_GAUSS_CRITIC
    """Classification: an HL-Gauss histogram per action and cross-entropy (``[dqn.hl_gauss]``)."""


@dataclass
class DqnConfig:
    """Double DQN hyperparameters (the recipe table ``[dqn]``)."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the Q network."""
    learning_rate: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    target_update_interval: int = 500
    """Updates between copies of the Q network into its target."""
    epsilon_start: float = 1.0
    """Exploration rate at the first step."""
    epsilon_end: float = 0.05
    """Exploration rate after the decay."""
    epsilon_decay_steps: int = 10_000
    """Updates over which exploration decays linearly."""
    max_grad_norm: float = 10.0
    """Gradient norm clip."""
    critic: DqnCritic = DqnCritic.HUBER
    """How the Q network learns: ``huber`` or ``mse`` (regression), or ``hl_gauss``
    (classification: one histogram per action over the ``hl_gauss`` table's bins)."""
    hl_gauss: HLGaussConfig = field(default_factory=HLGaussConfig)
    """The HL-Gauss critic's bins, value range and smoothing (``critic = "hl_gauss"`` only)."""


@dataclass
class DqnNetworks(Networks):
    """The Q network and its target copy."""

    q: nn.Module
    targets: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def acting(self) -> nn.Module:
        """The Q network (agents act greedily on it)."""
        return self.q


class GreedyActing(KeyedInputs):
    """``(*observations[, action_masks]) -> (actions, q_values)``: the greedy action of a Q
    network, as exported; with ``masked``, among the actions the last input allows (see
    :func:`~emote_core.onnx.graph.masked_argmax`). ``q_values`` are the network's, unmasked."""

    def __init__(
        self, q_network: nn.Module, keys: tuple[str, ...], *, masked: bool = False
    ) -> None:
        super().__init__(keys)
        self.q_network = q_network
        self.masked = masked

    def forward(self, *inputs: Tensor) -> tuple[Tensor, Tensor]:
        if not self.masked:
            values = self.q_network(self.features(inputs))
            return values.argmax(dim=1, keepdim=True), values
        values = self.q_network(self.features(inputs[:-1]))
        return masked_argmax(values, inputs[-1]), values


@register_algorithm
class DoubleDQN(AlgorithmFamily):
    """Deep Q-learning with double Q targets and linearly decaying epsilon-greedy exploration."""

    name: ClassVar[str] = "dqn"
    config_class: ClassVar[type] = DqnConfig
    summary: ClassVar[str] = "deep Q-learning (double DQN), for discrete actions"
    acting_callback: ClassVar[str] = "q"

    def validate(self, config: DqnConfig, *, source: str) -> None:
        if not 0.0 <= config.gamma <= 1.0:
            raise ConfigurationError(
                f"{source}: 'dqn.gamma' must be within [0, 1]; got {config.gamma}"
            )
        config.hl_gauss.check(config.critic, source=source, where=self.name)

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        if not isinstance(spaces.actions, DiscreteSpace):
            raise ConfigurationError(
                f"DQN needs discrete actions; '{env_id}' has continuous actions — use "
                'algorithm = "sac"'
            )
        if len(spaces.feature_keys) != 1:
            raise ConfigurationError(
                f"DQN recipes take one observation key (besides an '{ACTION_MASK_KEY}'); "
                f"'{env_id}' gives {list(spaces.state.keys())}"
            )
        mask_key = spaces.action_mask_key
        if mask_key is not None and spaces.state[mask_key].shape != (spaces.actions.n,):
            raise ConfigurationError(
                f"'{env_id}' gives an '{mask_key}' of shape {spaces.state[mask_key].shape} for "
                f"{spaces.actions.n} discrete actions; a mask has one entry per action, shape "
                f"({spaces.actions.n},)"
            )

    def make_networks(self, config: DqnConfig, context: BuildContext) -> DqnNetworks:
        actions = context.spaces.actions
        assert isinstance(actions, DiscreteSpace)  # check_spaces ran first
        obs_dim = observation_dim(context.spaces, context.spaces.feature_keys)
        q: nn.Module
        if config.critic is DqnCritic.HL_GAUSS:
            table = config.hl_gauss
            logit_net = DiscreteActionLogitMlp(
                observation_dim=obs_dim, num_actions=actions.n, num_bins=table.num_bins,
                hidden_dims=config.hidden_dims,
            )  # fmt: skip
            q = QNet(logit_net, table.min_value, table.max_value)
        else:
            q = DiscreteActionValueMlp(
                observation_dim=obs_dim, num_actions=actions.n, hidden_dims=config.hidden_dims
            )
        q = q.to(context.device)
        return DqnNetworks(q=q, targets={"q": copy.deepcopy(q)})

    def training_parts(
        self, config: DqnConfig, networks: DqnNetworks, context: BuildContext
    ) -> TrainingParts:
        epsilon = LinearSchedule(
            config.epsilon_start, config.epsilon_end, config.epsilon_decay_steps
        )
        spaces = context.spaces
        callbacks = [
            QTarget(q=networks.q, q_target_network=networks.targets["q"], gamma=config.gamma,
                    target_update_interval=config.target_update_interval,
                    rollout_length=context.rollout_length, observation_keys=spaces.feature_keys,
                    action_mask_key=spaces.action_mask_key),
            self._q_loss(config, networks.q, spaces.feature_keys),
            ScheduleStepper(schedules={"epsilon": epsilon}),
            *priority_feedback(context.table, losses=["q"]),
        ]  # fmt: skip
        agent = epsilon_greedy_agent(networks.acting, context, epsilon=epsilon)
        return TrainingParts(callbacks=callbacks, agent=agent)

    @staticmethod
    def _q_loss(config: DqnConfig, q: nn.Module, keys: list[str]) -> Any:
        optimizer = torch.optim.Adam(q.parameters(), lr=config.learning_rate, fused=True)
        clip = config.max_grad_norm
        if config.critic is DqnCritic.HL_GAUSS:
            return HLGaussQLoss(
                q=q, optimizer=optimizer, max_grad_norm=clip,
                smoothing_ratio=config.hl_gauss.smoothing_ratio, observation_keys=keys,
            )  # fmt: skip
        huber = config.critic is DqnCritic.HUBER
        return QLoss(q=q, optimizer=optimizer, max_grad_norm=clip, huber=huber,
                     observation_keys=keys)  # fmt: skip

    def acting_agent(
        self, config: DqnConfig, networks: DqnNetworks, context: BuildContext, *,
        deterministic: bool,
    ) -> Any:  # fmt: skip
        # Outside training a stochastic agent explores as much as training ended with.
        epsilon = 0.0 if deterministic else config.epsilon_end
        return epsilon_greedy_agent(networks.acting, context, epsilon=epsilon)

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        return greedy_policy_graph(acting, spaces, algorithm=self.name)


def epsilon_greedy_agent(q_network: nn.Module, context: BuildContext, *, epsilon: Any = 0.0) -> Any:
    """The agent acting on a network of one value (or logit) per discrete action: the best
    action its observation's mask allows, or with probability ``epsilon`` (a number or a
    schedule) a random allowed one; ``0`` is greedy. Reads the one observation key of
    ``context.spaces`` (see :meth:`DoubleDQN.check_spaces`)."""
    actions = context.spaces.actions
    assert isinstance(actions, DiscreteSpace)  # check_spaces ran first
    (key,) = context.spaces.feature_keys
    return EpsilonGreedyAgentProxy(
        q_network=q_network, device=context.device, num_actions=actions.n, epsilon=epsilon,
        input_key=key, seed=context.seed, action_mask_key=context.spaces.action_mask_key,
        flatten=True,
    )  # fmt: skip


def greedy_policy_graph(acting: nn.Module, spaces: MDPSpace, *, algorithm: str) -> PolicyGraph:
    """The ONNX graph of :class:`GreedyActing` over ``acting`` (one value or logit per discrete
    action): the observation key, then ``action_masks`` when ``spaces`` has an action mask;
    ``actions`` and ``q_values`` out."""
    keys = tuple(spaces.feature_keys)
    mask_key = spaces.action_mask_key
    masked = mask_key is not None
    extra = {ACTION_MASKS_INPUT: spaces.state[mask_key].shape} if masked else None
    return policy_graph(
        GreedyActing(acting, keys, masked=masked), algorithm=algorithm, spaces=spaces,
        output_names=(ACTIONS_OUTPUT, Q_VALUES_OUTPUT), observation_keys=keys,
        extra_inputs=extra,
    )  # fmt: skip


__all__ = [
    "DoubleDQN",
    "DqnConfig",
    "DqnCritic",
    "DqnNetworks",
    "GreedyActing",
    "epsilon_greedy_agent",
    "greedy_policy_graph",
]
