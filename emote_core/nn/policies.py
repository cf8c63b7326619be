"""Tanh-squashed Gaussian policies for continuous actions (as SAC trains them).

Actions lie in ``[-1, 1]``. :meth:`GaussianPolicy.sample` (``forward`` in train mode) draws a
reparameterised action and its tanh-corrected log-probability, for losses;
:meth:`GaussianPolicy.act` (``forward(obs, epsilon)`` in eval mode, what ONNX export traces)
gives ``tanh(mean + std * epsilon)`` for noise given from outside. Both work in either mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import Activation, MlpEncoder
from emote_core.nn.initialization import (
    LayerInit,
    layer_init,
    orthogonal_init_,
    xavier_uniform_init_,
)
from emote_core.utils.checks import positive_int

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
_LOG_TWO = math.log(2.0)

MEAN_LIMIT = 5.0
"""The pre-squash mean is clamped to ``[-MEAN_LIMIT, MEAN_LIMIT]`` (``tanh(5)`` = 0.99991), as
upstream emote's head does: it keeps the mean from drifting where tanh has no gradient."""


class GaussianPolicyHead(nn.Module):
    """Maps features to a tanh-squashed diagonal Gaussian over actions.

    One linear layer gives the mean and the log standard deviation of the pre-squash Gaussian;
    the mean is clamped to ``[-5, 5]`` (:data:`MEAN_LIMIT`, as upstream emote) and the log standard
    deviation to ``[log_std_min, log_std_max]``.

    Args:
        hidden_dim: The width of the input features.
        action_dim: The number of action dimensions.
        log_std_min: The smallest log standard deviation.
        log_std_max: The largest log standard deviation.

    Raises:
        ConfigurationError: If a width is not positive or the clamp range is empty.
    """

    def __init__(
        self,
        *,
        hidden_dim: int,
        action_dim: int,
        log_std_min: float = -20.0,
        log_std_max: float = 2.0,
    ) -> None:
        super().__init__()
        positive_int("GaussianPolicyHead", "hidden_dim", hidden_dim)
        positive_int("GaussianPolicyHead", "action_dim", action_dim)
        if not log_std_min < log_std_max:
            raise ConfigurationError(
                f"GaussianPolicyHead needs log_std_min < log_std_max; got {log_std_min} and "
                f"{log_std_max}"
            )
        self.action_dim = action_dim
        self.log_std_min = float(log_std_min)
        self.log_std_max = float(log_std_max)
        self.linear = nn.Linear(hidden_dim, 2 * action_dim)

    def distribution(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """The pre-squash Gaussian's clamped mean and log standard deviation, each ``(B, A)``."""
        mean, log_std = self.linear(features).chunk(2, dim=-1)
        return (
            mean.clamp(-MEAN_LIMIT, MEAN_LIMIT),
            log_std.clamp(self.log_std_min, self.log_std_max),
        )

    def sample(self, features: Tensor, epsilon: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A reparameterised action sample and its log-probability.

        Args:
            features: ``(B, hidden_dim)`` features.
            epsilon: ``(B, action_dim)`` standard normal noise; drawn when omitted.

        Returns:
            ``actions`` of shape ``(B, action_dim)`` in ``[-1, 1]`` and ``log_probs`` of shape
            ``(B, 1)``: the log-density of the squashed action, ``log N(u; mean, std) -
            sum log(1 - tanh(u)^2)`` with ``u = mean + std * epsilon``.
        """
        mean, log_std = self.distribution(features)
        if epsilon is None:
            epsilon = torch.randn_like(mean)
        pre_squash = mean + log_std.exp() * epsilon
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|.
        squash_correction = 2.0 * (_LOG_TWO - pre_squash - F.softplus(-2.0 * pre_squash))
        log_density = -0.5 * epsilon.square() - log_std - _HALF_LOG_TWO_PI
        log_probs = (log_density - squash_correction).sum(dim=-1, keepdim=True)
        return torch.tanh(pre_squash), log_probs

    def act(self, features: Tensor, epsilon: Tensor | None = None) -> Tensor:
        """``tanh(mean + std * epsilon)``; the deterministic ``tanh(mean)`` when ``epsilon`` is
        omitted."""
        mean, log_std = self.distribution(features)
        if epsilon is None:
            return torch.tanh(mean)
        return torch.tanh(mean + log_std.exp() * epsilon)

    def forward(
        self, features: Tensor, epsilon: Tensor | None = None
    ) -> tuple[Tensor, Tensor] | Tensor:
        """:meth:`sample` in train mode, :meth:`act` in eval mode."""
        if self.training:
            return self.sample(features, epsilon)
        return self.act(features, epsilon)


class BasePolicy(nn.Module):
    """The base of policies (upstream emote's ``BasePolicy``): sampling and post-processing.

    A policy's ``forward`` in train mode returns the sampled actions first (then, say, their
    log-probabilities). Those samples are *pre-actions*; :meth:`post_process` turns them into the
    decisions an environment acts on, the identity unless a subclass (a discrete reparameterised
    policy, say) says otherwise.
    """

    def post_process(self, actions: Tensor) -> Tensor:
        """The decisions for sampled pre-actions; the identity here."""
        return actions

    def infer(self, observation: Tensor) -> tuple[Tensor, Tensor]:
        """Samples pre-actions for ``observation`` and returns ``(pre_actions, post_actions)``.

        For inference only (it is not meant for gradients). This default calls the policy and
        takes its first output.
        """
        outputs = self(observation)
        sampled = outputs[0] if isinstance(outputs, tuple | list) else outputs
        return sampled, self.post_process(sampled)


class GaussianPolicy(BasePolicy):
    """An encoder, optional hidden layers and a :class:`GaussianPolicyHead`.

    Args:
        encoder: Turns the observation tensor into ``(B, encoder_output_dim)`` features (a
            convolutional encoder, possibly shared with the Q networks).
        encoder_output_dim: The width of the encoder's features.
        action_dim: The number of action dimensions.
        hidden_dims: Widths of linear layers between the encoder and the head.
        activation: Builds the activation after each hidden layer.
        detach_encoder: Stop the policy's gradients at the encoder's output (for an encoder that
            the Q losses train).
        log_std_min: The smallest log standard deviation.
        log_std_max: The largest log standard deviation.
        initialization: How the hidden layers and the head start
            (:class:`~emote_core.nn.LayerInit`): upstream emote's orthogonal hidden layers and
            near-zero head, or PyTorch's defaults. The given encoder keeps its own.

    Raises:
        ConfigurationError: If ``initialization`` names no :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        encoder: nn.Module,
        encoder_output_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (),
        activation: Activation = nn.ReLU,
        detach_encoder: bool = False,
        log_std_min: float = -20.0,
        log_std_max: float = 2.0,
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__()
        initialization = layer_init("GaussianPolicy", initialization)
        self.encoder = encoder
        self.hidden = MlpEncoder(
            input_dim=encoder_output_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.head = GaussianPolicyHead(
            hidden_dim=self.hidden.output_dim, action_dim=action_dim,
            log_std_min=log_std_min, log_std_max=log_std_max,
        )  # fmt: skip
        if initialization is LayerInit.ORTHOGONAL:
            # Upstream emote's: orthogonal hidden layers (gain sqrt 2) and a head with
            # Xavier-uniform weights of gain 0.01, so the first actions are near tanh(0) with a
            # standard deviation near 1.
            self.hidden.apply(orthogonal_init_)
            self.head.apply(partial(xavier_uniform_init_, gain=0.01))
        self.action_dim = action_dim
        self.detach_encoder = detach_encoder

    def features(self, observation: Tensor) -> Tensor:
        """The features the head reads."""
        encoded = self.encoder(observation)
        if self.detach_encoder:
            encoded = encoded.detach()
        return self.hidden(encoded)

    def sample(self, observation: Tensor, epsilon: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A reparameterised sample ``(actions (B, A), log_probs (B, 1))``; see
        :meth:`GaussianPolicyHead.sample`."""
        return self.head.sample(self.features(observation), epsilon)

    def act(self, observation: Tensor, epsilon: Tensor | None = None) -> Tensor:
        """``tanh(mean + std * epsilon)`` (``tanh(mean)`` without ``epsilon``), ``(B, A)``."""
        return self.head.act(self.features(observation), epsilon)

    def infer(self, observation: Tensor) -> tuple[Tensor, Tensor]:
        """A sampled action and its post-processed decision (the same tensor here), in either
        mode; see :meth:`BasePolicy.infer`."""
        actions, _ = self.sample(observation)
        return actions, self.post_process(actions)

    def forward(
        self, observation: Tensor, epsilon: Tensor | None = None
    ) -> tuple[Tensor, Tensor] | Tensor:
        """Train mode: ``(actions, log_probs)`` as :meth:`sample`. Eval mode: the action
        ``tanh(mean + std * epsilon)`` only, as :meth:`act` (``epsilon = 0`` is deterministic)."""
        if self.training:
            return self.sample(observation, epsilon)
        return self.act(observation, epsilon)


class GaussianMlpPolicy(GaussianPolicy):
    """A Gaussian policy on a flat observation: an MLP and a :class:`GaussianPolicyHead`.

    Args:
        observation_dim: The width of the flattened observation
            (see :func:`emote_core.nn.inputs.flatten_observation`).
        action_dim: The number of action dimensions.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.
        log_std_min: The smallest log standard deviation.
        log_std_max: The largest log standard deviation.
        initialization: How the layers start (:class:`~emote_core.nn.LayerInit`).

    Raises:
        ConfigurationError: If ``initialization`` names no :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
        log_std_min: float = -20.0,
        log_std_max: float = 2.0,
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__(
            encoder=nn.Identity(), encoder_output_dim=observation_dim, action_dim=action_dim,
            hidden_dims=hidden_dims, activation=activation, log_std_min=log_std_min,
            log_std_max=log_std_max, initialization=initialization,
        )  # fmt: skip
        self.observation_dim = observation_dim


__all__ = ["BasePolicy", "GaussianMlpPolicy", "GaussianPolicy", "GaussianPolicyHead"]
