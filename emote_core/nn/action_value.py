"""Q networks: values of actions in states.

Continuous-action networks take ``observation=`` and ``actions=`` by keyword and return
``(B, 1)``; the discrete one takes the observation and returns one value per action,
``(B, num_actions)``.

Why by keyword: upstream emote's Q networks take ``(action, obs)``, ours were
``(observation, actions)``, and both concatenate their inputs into one layer of the same width,
so code ported with the other order would train on swapped inputs without an error. Keywords
make that mistake fail at the call (``docs/porting.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import Activation, MlpEncoder
from emote_core.nn.initialization import orthogonal_init_


def _check_positive(owner: str, what: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{owner}'s {what} must be a positive integer; got {value!r}")


class ActionValueMlp(nn.Module):
    """``Q(s, a)`` for continuous actions: an MLP over the concatenated observation and action.

    Its layers start orthogonal (gain sqrt 2, the output layer gain 1) with zero biases, as
    upstream emote's.

    Args:
        observation_dim: The width of the flattened observation.
        action_dim: The number of action dimensions.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
    ) -> None:
        super().__init__()
        _check_positive("ActionValueMlp", "observation_dim", observation_dim)
        _check_positive("ActionValueMlp", "action_dim", action_dim)
        self.encoder = MlpEncoder(
            input_dim=observation_dim + action_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.final_layer = nn.Linear(self.encoder.output_dim, 1)
        # Upstream emote's initialisation: orthogonal hidden layers (gain sqrt 2), an orthogonal
        # output layer of gain 1, zero biases.
        self.encoder.apply(orthogonal_init_)
        self.final_layer.apply(partial(orthogonal_init_, gain=1.0))
        self.observation_dim = observation_dim
        self.action_dim = action_dim

    def forward(self, *, observation: Tensor, actions: Tensor) -> Tensor:
        """The value of ``actions`` (``(B, action_dim)``) in ``observation`` (``(B, D)``):
        ``(B, 1)``. Both by keyword (see the module docstring)."""
        return self.final_layer(self.encoder(torch.cat([observation, actions], dim=-1)))


class DiscreteActionValueMlp(nn.Module):
    """``Q(s, .)`` for a discrete choice: an MLP giving one value per action.

    Args:
        observation_dim: The width of the flattened observation.
        num_actions: The number of actions.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        num_actions: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
    ) -> None:
        super().__init__()
        _check_positive("DiscreteActionValueMlp", "observation_dim", observation_dim)
        _check_positive("DiscreteActionValueMlp", "num_actions", num_actions)
        self.encoder = MlpEncoder(
            input_dim=observation_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.final_layer = nn.Linear(self.encoder.output_dim, num_actions)
        self.observation_dim = observation_dim
        self.num_actions = num_actions

    def forward(self, observation: Tensor) -> Tensor:
        """The value of every action in ``observation`` (``(B, D)``): ``(B, num_actions)``."""
        return self.final_layer(self.encoder(observation))


class SharedEncoderActionValueNet(nn.Module):
    """``Q(s, a)`` on top of an encoder that other networks (the policy) may share.

    The encoder turns the observation tensor (an image, say) into features; an MLP over the
    features and the action gives the value.

    Args:
        encoder: Turns the observation into ``(B, encoder_output_dim)`` features.
        encoder_output_dim: The width of the encoder's features.
        action_dim: The number of action dimensions.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(
        self,
        *,
        encoder: nn.Module,
        encoder_output_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
    ) -> None:
        super().__init__()
        _check_positive("SharedEncoderActionValueNet", "encoder_output_dim", encoder_output_dim)
        _check_positive("SharedEncoderActionValueNet", "action_dim", action_dim)
        self.obs_encoder = encoder
        self.encoder = MlpEncoder(
            input_dim=encoder_output_dim + action_dim, hidden_dims=hidden_dims,
            activation=activation,
        )  # fmt: skip
        self.final_layer = nn.Linear(self.encoder.output_dim, 1)
        self.action_dim = action_dim

    def forward(self, *, observation: Tensor, actions: Tensor) -> Tensor:
        """The value of ``actions`` in ``observation``: ``(B, 1)``. Both by keyword."""
        features = self.obs_encoder(observation)
        return self.final_layer(self.encoder(torch.cat([features, actions], dim=-1)))


__all__ = ["ActionValueMlp", "DiscreteActionValueMlp", "SharedEncoderActionValueNet"]
