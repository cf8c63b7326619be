"""Networks of value histograms: logits over ``num_bins`` bins, for classification critics
(:mod:`emote_core.algorithms.hlgauss` turns them into values).

Like the Q networks of :mod:`emote_core.nn.action_value`, the continuous-action one takes
``observation=`` and ``actions=`` by keyword.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from emote_core.nn.encoders import Activation, MlpEncoder
from emote_core.nn.initialization import LayerInit, init_value_mlp_, layer_init
from emote_core.utils.checks import int_at_least


class ActionLogitMlp(nn.Module):
    """Logits of ``Q(s, a)``'s histogram for continuous actions: ``(B, num_bins)``.

    An MLP over the concatenated observation and action, initialised as
    :class:`~emote_core.nn.ActionValueMlp` is (orthogonal, output gain 1, zero biases, unless
    ``initialization`` is ``"torch"``).

    Args:
        observation_dim: The width of the flattened observation.
        action_dim: The number of action dimensions.
        num_bins: The number of bins (at least 2).
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.
        initialization: How the layers start (:class:`~emote_core.nn.LayerInit`).

    Raises:
        ConfigurationError: If a width is not a positive integer, there are fewer than 2 bins,
            or ``initialization`` names no :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        action_dim: int,
        num_bins: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__()
        int_at_least("ActionLogitMlp", "observation_dim", observation_dim, 1)
        int_at_least("ActionLogitMlp", "action_dim", action_dim, 1)
        int_at_least("ActionLogitMlp", "num_bins", num_bins, 2)
        initialization = layer_init("ActionLogitMlp", initialization)
        self.encoder = MlpEncoder(
            input_dim=observation_dim + action_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.final_layer = nn.Linear(self.encoder.output_dim, num_bins)
        init_value_mlp_(self.encoder, self.final_layer, initialization)
        self.observation_dim = observation_dim
        self.action_dim = action_dim
        self.num_bins = num_bins

    def forward(self, *, observation: Tensor, actions: Tensor) -> Tensor:
        """``(B, num_bins)`` logits for ``actions`` ``(B, action_dim)`` in ``observation``
        ``(B, D)``, both by keyword."""
        return self.final_layer(self.encoder(torch.cat([observation, actions], dim=-1)))


class DiscreteActionLogitMlp(nn.Module):
    """Logits of every action's value histogram: ``(B, num_actions, num_bins)``, one categorical
    head per action.

    Args:
        observation_dim: The width of the flattened observation.
        num_actions: The number of actions.
        num_bins: The number of bins (at least 2).
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.

    Raises:
        ConfigurationError: If a width is not a positive integer or there are fewer than 2 bins.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        num_actions: int,
        num_bins: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
    ) -> None:
        super().__init__()
        int_at_least("DiscreteActionLogitMlp", "observation_dim", observation_dim, 1)
        int_at_least("DiscreteActionLogitMlp", "num_actions", num_actions, 1)
        int_at_least("DiscreteActionLogitMlp", "num_bins", num_bins, 2)
        self.encoder = MlpEncoder(
            input_dim=observation_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.final_layer = nn.Linear(self.encoder.output_dim, num_actions * num_bins)
        self.observation_dim = observation_dim
        self.num_actions = num_actions
        self.num_bins = num_bins

    def forward(self, observation: Tensor) -> Tensor:
        """``(B, num_actions, num_bins)`` logits for ``observation`` ``(B, D)``."""
        logits = self.final_layer(self.encoder(observation))
        return logits.reshape(-1, self.num_actions, self.num_bins)


__all__ = ["ActionLogitMlp", "DiscreteActionLogitMlp"]
