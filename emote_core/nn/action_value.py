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

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import Activation, MlpEncoder
from emote_core.nn.initialization import LayerInit, init_value_mlp_, layer_init
from emote_core.utils.checks import positive_int


class ActionValueMlp(nn.Module):
    """``Q(s, a)`` for continuous actions: an MLP over the concatenated observation and action.

    Its layers start orthogonal (gain sqrt 2, the output layer gain 1) with zero biases, as
    upstream emote's, unless ``initialization`` is ``"torch"``.

    Args:
        observation_dim: The width of the flattened observation.
        action_dim: The number of action dimensions.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.
        initialization: How the layers start (:class:`~emote_core.nn.LayerInit`).

    Raises:
        ConfigurationError: If a width is not a positive integer, or ``initialization`` names
            no :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__()
        positive_int("ActionValueMlp", "observation_dim", observation_dim)
        positive_int("ActionValueMlp", "action_dim", action_dim)
        initialization = layer_init("ActionValueMlp", initialization)
        self.encoder = MlpEncoder(
            input_dim=observation_dim + action_dim, hidden_dims=hidden_dims, activation=activation
        )
        self.final_layer = nn.Linear(self.encoder.output_dim, 1)
        init_value_mlp_(self.encoder, self.final_layer, initialization)
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
        positive_int("DiscreteActionValueMlp", "observation_dim", observation_dim)
        positive_int("DiscreteActionValueMlp", "num_actions", num_actions)
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
    features and the action gives the value. The MLP starts as :class:`ActionValueMlp`'s does
    (``initialization``); the encoder keeps its own start.

    Args:
        encoder: Turns the observation into ``(B, encoder_output_dim)`` features.
        encoder_output_dim: The width of the encoder's features.
        action_dim: The number of action dimensions.
        hidden_dims: The MLP's layer widths.
        activation: Builds the activation after each layer.
        initialization: How the MLP's layers start (:class:`~emote_core.nn.LayerInit`).

    Raises:
        ConfigurationError: If a width is not a positive integer, or ``initialization`` names
            no :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        encoder: nn.Module,
        encoder_output_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        activation: Activation = nn.ReLU,
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__()
        positive_int("SharedEncoderActionValueNet", "encoder_output_dim", encoder_output_dim)
        positive_int("SharedEncoderActionValueNet", "action_dim", action_dim)
        initialization = layer_init("SharedEncoderActionValueNet", initialization)
        self.obs_encoder = encoder
        self.encoder = MlpEncoder(
            input_dim=encoder_output_dim + action_dim, hidden_dims=hidden_dims,
            activation=activation,
        )  # fmt: skip
        self.final_layer = nn.Linear(self.encoder.output_dim, 1)
        init_value_mlp_(self.encoder, self.final_layer, initialization)
        self.action_dim = action_dim

    def forward(self, *, observation: Tensor, actions: Tensor) -> Tensor:
        """The value of ``actions`` in ``observation``: ``(B, 1)``. Both by keyword."""
        features = self.obs_encoder(observation)
        return self.final_layer(self.encoder(torch.cat([features, actions], dim=-1)))


class StackedActionValueMlp(nn.Module):
    """Several :class:`ActionValueMlp` of the same shape evaluated together: ``(M, B, 1)``.

    Each layer keeps the members' weights stacked, ``(M, in, out)``, and biases, ``(M, 1, out)``,
    so one batched matrix product runs a layer for every member: SAC's twin Q networks become
    half as many, twice as large kernels, which is what a GPU wants of small networks (LeanRL's
    stacked critics). The members stay independent: member ``m`` computes exactly what an
    :class:`ActionValueMlp` with its weights computes, and gets the gradients that network would.
    Members start as freshly built :class:`ActionValueMlp` of the same ``initialization`` do.

    Args:
        observation_dim: The width of the flattened observation.
        action_dim: The number of action dimensions.
        hidden_dims: The MLP's layer widths.
        members: How many Q networks.
        activation: Builds the activation after each layer (one module, shared by the members:
            it must have no parameters).
        initialization: How the members' layers start (:class:`~emote_core.nn.LayerInit`).

    Raises:
        ConfigurationError: If a width or ``members`` is not a positive integer, the
            activation has parameters, or ``initialization`` names no
            :class:`~emote_core.nn.LayerInit`.
    """

    def __init__(
        self,
        *,
        observation_dim: int,
        action_dim: int,
        hidden_dims: Sequence[int] = (256, 256),
        members: int = 2,
        activation: Activation = nn.ReLU,
        initialization: LayerInit | str = LayerInit.ORTHOGONAL,
    ) -> None:
        super().__init__()
        positive_int("StackedActionValueMlp", "members", members)
        shape = {"observation_dim": observation_dim, "action_dim": action_dim,
                 "hidden_dims": hidden_dims, "activation": activation,
                 "initialization": layer_init("StackedActionValueMlp", initialization)}  # fmt: skip
        networks = [ActionValueMlp(**shape) for _ in range(members)]
        self.activation = activation()
        if any(True for _ in self.activation.parameters()):
            raise ConfigurationError(
                "StackedActionValueMlp's activation must have no parameters (the members share "
                f"one); got {type(self.activation).__name__}"
            )
        self.observation_dim = observation_dim
        self.action_dim = action_dim
        self.hidden_dims = [int(width) for width in hidden_dims]
        self.members = members
        layers = [_linear_layers(network) for network in networks]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([member[k].weight.detach().T for member in layers]))
            for k in range(len(layers[0]))
        )
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([member[k].bias.detach()[None] for member in layers]))
            for k in range(len(layers[0]))
        )

    @classmethod
    def from_networks(cls, networks: Sequence[ActionValueMlp]) -> StackedActionValueMlp:
        """The members ``networks`` (of one shape), their weights copied.

        Raises:
            ConfigurationError: If the networks differ in shape or are not ActionValueMlp.
        """
        first = networks[0] if networks else None
        if not isinstance(first, ActionValueMlp) or not all(
            isinstance(n, ActionValueMlp) and _shape_of(n) == _shape_of(first) for n in networks
        ):
            raise ConfigurationError(
                "StackedActionValueMlp.from_networks takes ActionValueMlp networks of one shape"
            )
        hidden = [layer.out_features for layer in _linear_layers(first)[:-1]]
        # Its initial draws are overwritten below: the caller's random stream stays as it was.
        with torch.random.fork_rng(devices=[]):
            stacked = cls(
                observation_dim=first.observation_dim, action_dim=first.action_dim,
                hidden_dims=hidden, members=len(networks),
            )  # fmt: skip
        with torch.no_grad():
            for member, network in enumerate(networks):
                stacked.load_member(member, network)
        device = next(first.parameters()).device
        return stacked.to(device)

    def load_member(self, member: int, network: ActionValueMlp) -> None:
        """Copies ``network``'s weights into member ``member``."""
        with torch.no_grad():
            for k, layer in enumerate(_linear_layers(network)):
                self.weights[k][member].copy_(layer.weight.T)
                self.biases[k][member, 0].copy_(layer.bias)

    def member(self, member: int) -> ActionValueMlp:
        """A new :class:`ActionValueMlp` holding a copy of member ``member``'s weights."""
        with torch.random.fork_rng(devices=[]):  # its initial draws are overwritten
            network = ActionValueMlp(
                observation_dim=self.observation_dim, action_dim=self.action_dim,
                hidden_dims=self.hidden_dims, activation=type(self.activation),
            )  # fmt: skip
        network = network.to(self.weights[0].device)
        with torch.no_grad():
            for k, layer in enumerate(_linear_layers(network)):
                layer.weight.copy_(self.weights[k][member].T)
                layer.bias.copy_(self.biases[k][member, 0])
        return network

    def forward(self, *, observation: Tensor, actions: Tensor) -> Tensor:
        """Every member's value of ``actions`` (``(B, action_dim)``) in ``observation``
        (``(B, D)``): ``(M, B, 1)``. Both by keyword."""
        x = torch.cat([observation, actions], dim=-1)
        x = x.unsqueeze(0).expand(self.members, *x.shape)
        last = len(self.weights) - 1
        for k, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(bias, x, weight)
            if k < last:
                x = self.activation(x)
        return x

    def extra_repr(self) -> str:
        return (
            f"members={self.members}, observation_dim={self.observation_dim}, "
            f"action_dim={self.action_dim}, hidden_dims={self.hidden_dims}"
        )


def _linear_layers(network: ActionValueMlp) -> list[nn.Linear]:
    return [m for m in network.encoder.layers if isinstance(m, nn.Linear)] + [network.final_layer]


def _shape_of(network: ActionValueMlp) -> list[tuple[int, int]]:
    return [(layer.in_features, layer.out_features) for layer in _linear_layers(network)]


__all__ = [
    "ActionValueMlp",
    "DiscreteActionValueMlp",
    "SharedEncoderActionValueNet",
    "StackedActionValueMlp",
]
