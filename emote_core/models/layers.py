"""The building blocks of the dynamics networks: a linear layer holding every ensemble member,
MBPO's truncated-normal initialisation and the activations accepted by name."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.utils.checks import one_of, positive_int
from emote_core.utils.math import truncated_normal_

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "elu": nn.ELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
}
"""The activations the networks accept by name."""


def activation_class(owner: str, name: str) -> type[nn.Module]:
    """The activation class of ``name``, a key of :data:`ACTIVATIONS`.

    Raises:
        ConfigurationError: If ``name`` is not one of them.
    """
    return ACTIVATIONS[one_of(owner, "activation", name, ACTIVATIONS)]


class EnsembleLinearLayer(nn.Module):
    """``ensemble_size`` independent linear layers applied in one batched matmul.

    Args:
        in_size: The width of a member's input.
        out_size: The width of a member's output.
        ensemble_size: The number of members.
        bias: Whether each member adds a bias.
        generator: Draws the truncated-normal initial weights (see :func:`truncated_normal_init`).

    Raises:
        ConfigurationError: If a size is not a positive integer.
    """

    bias: nn.Parameter | None

    def __init__(
        self,
        in_size: int,
        out_size: int,
        ensemble_size: int,
        *,
        bias: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.in_size = positive_int("EnsembleLinearLayer", "in_size", in_size)
        self.out_size = positive_int("EnsembleLinearLayer", "out_size", out_size)
        self.ensemble_size = positive_int("EnsembleLinearLayer", "ensemble_size", ensemble_size)
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_size, out_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(ensemble_size, 1, out_size))
        else:
            self.register_parameter("bias", None)
        truncated_normal_init(self, generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        """Member ``e``'s output is ``x[e] @ weight[e] + bias[e]``.

        Args:
            x: ``(ensemble_size, B, in_size)``, one batch per member, or ``(B, in_size)``, the
                same rows for every member.

        Returns:
            ``(ensemble_size, B, out_size)``.

        Raises:
            ConfigurationError: If ``x`` has another shape.
        """
        size, width = self.ensemble_size, self.in_size
        if x.dim() == 2 and x.shape[1] == width:
            x = x.unsqueeze(0).expand(size, -1, -1)
        elif not (x.dim() == 3 and x.shape[0] == size and x.shape[2] == width):
            raise ConfigurationError(
                f"EnsembleLinearLayer takes inputs of shape (B, {width}) or ({size}, B, {width}); "
                f"got {tuple(x.shape)}"
            )
        if self.bias is None:
            return torch.bmm(x, self.weight)
        return torch.baddbmm(self.bias, x, self.weight)

    def extra_repr(self) -> str:
        return (
            f"in_size={self.in_size}, out_size={self.out_size}, "
            f"ensemble_size={self.ensemble_size}, bias={self.bias is not None}"
        )


def truncated_normal_init(module: nn.Module, *, generator: torch.Generator | None = None) -> None:
    """Re-initialises every :class:`torch.nn.Linear` and :class:`EnsembleLinearLayer` in
    ``module`` (``module`` included): weights from a normal of std ``1 / (2 sqrt(fan_in))``
    truncated at 2 std, biases zero. Other modules are left alone.

    MBPO's initialisation of its model networks. Unlike ``module.apply`` it takes a
    ``generator``, which draws every layer's weights in ``module.modules()`` order, so a seeded
    generator gives the same network each time.

    Args:
        module: Any module.
        generator: The CPU generator the weights are drawn with; ``None`` uses torch's global one.
    """
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            fan_in = layer.in_features
        elif isinstance(layer, EnsembleLinearLayer):
            fan_in = layer.in_size
        else:
            continue
        truncated_normal_(layer.weight, std=1.0 / (2.0 * math.sqrt(fan_in)), generator=generator)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


__all__ = ["ACTIVATIONS", "EnsembleLinearLayer", "truncated_normal_init"]
