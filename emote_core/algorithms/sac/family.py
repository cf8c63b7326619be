"""SAC as a registered algorithm family: its recipe table, networks, callbacks and acting
network."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from emote_core.algorithms import hlgauss
from emote_core.algorithms.base import priority_feedback
from emote_core.algorithms.hlgauss import HL_GAUSS_CRITIC, HLGaussConfig, QNet
from emote_core.algorithms.pixels import ConvEncoderConfig, ObservationEncoder, build_image_encoder
from emote_core.algorithms.registry import (
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_algorithm,
)
from emote_core.algorithms.sac.losses import AlphaLoss, PolicyLoss, QLoss, StackedQLoss
from emote_core.algorithms.sac.targets import QTarget
from emote_core.errors import ConfigurationError, ExportError
from emote_core.nn import (
    ActionLogitMlp,
    ActionValueMlp,
    GaussianMlpPolicy,
    GaussianPolicy,
    LayerInit,
    SharedEncoderActionValueNet,
    StackedActionValueMlp,
    observation_dim,
)
from emote_core.nn.inputs import flatten_observation
from emote_core.onnx.format import ACTIONS_OUTPUT, EPSILON_INPUT
from emote_core.onnx.graph import KeyedInputs, PolicyGraph, policy_graph
from emote_core.proxies import MultiKeyAgentProxy
from emote_core.spaces import DiscreteSpace, MDPSpace


class SacCritic(StrEnum):
    """How SAC's Q networks learn (``[sac] critic``)."""

    MSE = "mse"
    """Regression: the squared error between the value and its target."""
    HL_GAUSS = HL_GAUSS_CRITIC
    """Classification: HL-Gauss histograms and cross-entropy (the ``[sac.hl_gauss]`` table)."""


@dataclass
class SacConfig:
    """Soft actor-critic hyperparameters (the recipe table ``[sac]``)."""

    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the policy and both Q networks."""
    learning_rate: float = 3e-4
    """Adam learning rate of the policy, the Q networks and the temperature."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor of the target Q networks."""
    reward_scale: float = 1.0
    """Multiplies rewards in the Q targets."""
    target_entropy: float | None = None
    """Entropy the temperature aims for; ``-action_dim`` when unset."""
    max_alpha: float = 10.0
    """Upper bound of the temperature."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of every loss."""
    critic: SacCritic = SacCritic.MSE
    """How the Q networks learn: ``mse`` (regression) or ``hl_gauss`` (classification over the
    ``hl_gauss`` table's bins)."""
    hl_gauss: HLGaussConfig = field(default_factory=HLGaussConfig)
    """The HL-Gauss critics' bins, value range and smoothing (``critic = "hl_gauss"`` only)."""
    encoder: ObservationEncoder = ObservationEncoder.MLP
    """How the networks read observations: ``mlp`` (every entry flattened) or ``conv`` (one
    image entry through a convolutional encoder that both Q networks train and the policy reads
    without gradients, as in CURL and SAC-AE; the ``conv`` table)."""
    conv: ConvEncoderConfig = field(default_factory=ConvEncoderConfig)
    """The image encoder (``encoder = "conv"`` only)."""
    stacked_q: bool = False
    """Both Q networks in one module of stacked weights, trained by one loss (``q``) with one
    optimizer: the same learning, in half as many (twice as large) kernels, for GPUs. MLP
    regression critics only (``critic = "mse"``, ``encoder = "mlp"``)."""
    initialization: LayerInit = LayerInit.ORTHOGONAL
    """How the policy's and the Q networks' layers start: ``orthogonal`` (upstream emote's) or
    ``torch`` (PyTorch's defaults, as d3rlpy's). A ``conv`` image encoder keeps its own."""


@dataclass
class SacNetworks(Networks):
    """A Gaussian policy, two Q networks with target copies and the log-temperature.

    The Q networks are ``q1`` and ``q2``, or, with ``stacked_q``, ``critics`` (both in one
    stacked module; ``q1`` and ``q2`` are then ``None``).
    """

    policy: nn.Module
    q1: nn.Module | None
    q2: nn.Module | None
    ln_alpha: Tensor
    targets: dict[str, nn.Module] = field(default_factory=dict)
    image_encoder: tuple[str, nn.Module] | None = None
    """The image entry and the encoder the Q networks share (``encoder = "conv"``)."""
    critics: nn.Module | None = None
    """Both Q networks stacked (``stacked_q``), ``(2, B, 1)`` values."""

    @property
    def acting(self) -> nn.Module:
        """The policy."""
        return self.policy

    def policy_actions(
        self, observation: Mapping[str, Tensor], *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Reparameterised samples ``tanh(mean + std * epsilon)``, ``(B, A)``."""
        inputs = flatten_observation(observation)
        shape = (inputs.shape[0], int(self.policy.action_dim))
        epsilon = torch.randn(shape, generator=generator).to(inputs.device)
        with torch.no_grad():
            actions, _ = self.policy.sample(inputs, epsilon)
        return actions


class GaussianActing(KeyedInputs):
    """``(*observations, epsilon) -> actions``: the policy's eval-mode forward, as exported."""

    def __init__(self, policy: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__(keys)
        self.policy = policy

    def forward(self, *inputs: Tensor) -> Tensor:
        *observations, epsilon = inputs
        return self.policy(self.features(observations), epsilon)


@register_algorithm
class SoftActorCritic(AlgorithmFamily):
    """Soft actor-critic with twin Q networks and a learned temperature, for Box actions."""

    name: ClassVar[str] = "sac"
    config_class: ClassVar[type] = SacConfig
    summary: ClassVar[str] = "soft actor-critic, for continuous (Box) actions"
    acting_callback: ClassVar[str] = "policy"

    def validate(self, config: SacConfig, *, source: str) -> None:
        if not 0.0 <= config.gamma <= 1.0:
            raise ConfigurationError(
                f"{source}: 'sac.gamma' must be within [0, 1]; got {config.gamma}"
            )
        config.hl_gauss.check(config.critic, source=source, where=self.name)
        config.conv.check(config.encoder, source=source, where=self.name)
        if config.stacked_q and (
            config.critic is not SacCritic.MSE or config.encoder is not ObservationEncoder.MLP
        ):
            raise ConfigurationError(
                f"{source}: 'sac.stacked_q = true' stacks MLP regression critics; got critic = "
                f'"{config.critic}" and encoder = "{config.encoder}" — set sac.critic = "mse" '
                'and sac.encoder = "mlp", or sac.stacked_q = false'
            )
        if config.encoder is ObservationEncoder.CONV and config.critic is SacCritic.HL_GAUSS:
            raise ConfigurationError(
                f"{source}: 'sac.encoder = \"conv\"' trains regression critics; an HL-Gauss "
                'critic on images is not built — set sac.critic = "mse"'
            )

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        if isinstance(spaces.actions, DiscreteSpace):
            raise ConfigurationError(
                f"SAC needs continuous (Box) actions; '{env_id}' has discrete actions — "
                'use algorithm = "dqn"'
            )

    def make_networks(self, config: SacConfig, context: BuildContext) -> SacNetworks:
        action_dim = int(context.spaces.actions.shape[0])
        hidden = config.hidden_dims
        image_encoder = None
        if config.encoder is ObservationEncoder.CONV:
            # One encoder that both Q losses train; the policy reads its features detached.
            image_encoder = build_image_encoder(
                config.conv, context.spaces, where=self.name, env_id=context.env_id
            )
            encoder = image_encoder[1]
            features = encoder.output_dim
            policy: nn.Module = GaussianPolicy(
                encoder=encoder, encoder_output_dim=features, action_dim=action_dim,
                hidden_dims=hidden, detach_encoder=True, initialization=config.initialization,
            )  # fmt: skip
            q1, q2 = (
                SharedEncoderActionValueNet(
                    encoder=encoder,
                    encoder_output_dim=features,
                    action_dim=action_dim,
                    hidden_dims=hidden,
                    initialization=config.initialization,
                )
                for _ in range(2)
            )
        else:
            obs_dim = observation_dim(context.spaces)
            policy = GaussianMlpPolicy(
                observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden,
                initialization=config.initialization,
            )  # fmt: skip
            if config.stacked_q:  # the same initial weights as q1 and q2 built one by one
                critics = StackedActionValueMlp(
                    observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden,
                    initialization=config.initialization,
                ).to(context.device)  # fmt: skip
                return SacNetworks(
                    policy=policy.to(context.device), q1=None, q2=None,
                    ln_alpha=torch.zeros(1, device=context.device, requires_grad=True),
                    critics=critics, targets={"critics": copy.deepcopy(critics)},
                )  # fmt: skip
            q1, q2 = (self._q_network(config, obs_dim, action_dim) for _ in range(2))
        device = context.device
        networks = SacNetworks(
            policy=policy.to(device),
            q1=q1.to(device),
            q2=q2.to(device),
            ln_alpha=torch.zeros(1, device=device, requires_grad=True),
            image_encoder=image_encoder,
        )
        networks.targets = {"q1": copy.deepcopy(networks.q1), "q2": copy.deepcopy(networks.q2)}
        return networks

    @staticmethod
    def _q_network(config: SacConfig, obs_dim: int, action_dim: int) -> nn.Module:
        hidden = config.hidden_dims
        if config.critic is SacCritic.HL_GAUSS:
            table = config.hl_gauss
            logit_net = ActionLogitMlp(
                observation_dim=obs_dim, action_dim=action_dim, num_bins=table.num_bins,
                hidden_dims=hidden, initialization=config.initialization,
            )  # fmt: skip
            return QNet(logit_net, table.min_value, table.max_value)
        return ActionValueMlp(
            observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden,
            initialization=config.initialization,
        )  # fmt: skip

    def training_parts(
        self, config: SacConfig, networks: SacNetworks, context: BuildContext
    ) -> TrainingParts:
        # Fused Adam (one kernel for all parameters): more updates/s (benchmarks/RESULTS.md).
        adam = functools.partial(torch.optim.Adam, fused=True, lr=config.learning_rate)
        action_dim = int(context.spaces.actions.shape[0])
        clip = config.max_grad_norm
        if networks.critics is not None:  # stacked_q
            critics: dict[str, Any] = {"critics": networks.critics}
            targets = {"critics_target": networks.targets["critics"]}
            q_losses = [StackedQLoss(critics=networks.critics, max_grad_norm=clip,
                                     optimizer=adam(networks.critics.parameters()))]  # fmt: skip
        else:
            critics = {"q1": networks.q1, "q2": networks.q2}
            targets = {"q1_target": networks.targets["q1"], "q2_target": networks.targets["q2"]}
            q_losses = [self._q_loss(config, name, q, adam(q.parameters()))
                        for name, q in critics.items()]  # fmt: skip
        callbacks = [
            QTarget(
                policy=networks.policy, ln_alpha=networks.ln_alpha, **critics, **targets,
                gamma=config.gamma, reward_scale=config.reward_scale, target_q_tau=config.tau,
                rollout_length=context.rollout_length,
            ),
            *q_losses,
            PolicyLoss(policy=networks.policy, ln_alpha=networks.ln_alpha, **critics,
                       max_grad_norm=clip, optimizer=adam(networks.policy.parameters())),
            AlphaLoss(policy=networks.policy, ln_alpha=networks.ln_alpha, action_dim=action_dim,
                      target_entropy=config.target_entropy, max_alpha=config.max_alpha,
                      optimizer=adam([networks.ln_alpha])),
        ]  # fmt: skip
        callbacks += priority_feedback(context.table, losses=["q1", "q2"])
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=callbacks, agent=agent)

    @staticmethod
    def _q_loss(config: SacConfig, name: str, q: nn.Module, optimizer: Any) -> Any:
        if config.critic is SacCritic.HL_GAUSS:
            return hlgauss.QLoss(
                name=name, q=q, optimizer=optimizer, max_grad_norm=config.max_grad_norm,
                smoothing_ratio=config.hl_gauss.smoothing_ratio,
            )  # fmt: skip
        return QLoss(name=name, q=q, max_grad_norm=config.max_grad_norm, optimizer=optimizer)

    def acting_agent(
        self, config: SacConfig, networks: SacNetworks, context: BuildContext, *,
        deterministic: bool,
    ) -> Any:  # fmt: skip
        return gaussian_agent(networks.acting, context, deterministic=deterministic)

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        return gaussian_policy_graph(acting, spaces, algorithm=self.name)


def gaussian_agent(policy: nn.Module, context: BuildContext, *, deterministic: bool) -> Any:
    """The agent acting on a Gaussian policy over every observation key of ``context.spaces``:
    with zero noise when ``deterministic``, else sampling with ``context.seed``."""
    return MultiKeyAgentProxy(
        policy=policy, device=context.device, input_keys=context.spaces.state.keys(),
        spaces=context.spaces, deterministic=deterministic, seed=context.seed,
    )  # fmt: skip


def gaussian_policy_graph(acting: nn.Module, spaces: MDPSpace, *, algorithm: str) -> PolicyGraph:
    """The ONNX graph of a Gaussian policy over Box actions: :func:`noise_input_graph` with
    ``epsilon`` of the actions' shape."""
    noise_shape = tuple(spaces.actions.shape)
    return noise_input_graph(acting, spaces, algorithm=algorithm, noise_shape=noise_shape)


def noise_input_graph(
    acting: nn.Module, spaces: MDPSpace, *, algorithm: str, noise_shape: tuple[int, ...]
) -> PolicyGraph:
    """The ONNX graph of a network called ``acting(flat_observation, epsilon)``: one input per
    observation key, then ``epsilon`` of ``noise_shape`` per row; ``actions`` out.

    Raises:
        ExportError: If an observation key is named ``epsilon``.
    """
    keys = tuple(spaces.state.keys())
    if EPSILON_INPUT in keys:
        raise ExportError(
            f"an observation key is named '{EPSILON_INPUT}', which exports reserve for the "
            "noise input; rename the observation key"
        )
    return policy_graph(
        GaussianActing(acting, keys), algorithm=algorithm, spaces=spaces,
        extra_inputs={EPSILON_INPUT: noise_shape}, output_names=(ACTIONS_OUTPUT,),
    )  # fmt: skip


__all__ = [
    "GaussianActing",
    "SacConfig",
    "SacCritic",
    "SacNetworks",
    "SoftActorCritic",
    "gaussian_agent",
    "gaussian_policy_graph",
    "noise_input_graph",
]
