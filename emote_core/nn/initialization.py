"""Weight initialisers for linear and convolutional layers, for use with ``module.apply``.

Each initialiser takes one module, re-initialises it if it is a :class:`torch.nn.Linear` or a
convolution (``Conv1d``/``Conv2d``/``Conv3d`` and their transposes) and leaves every other module
alone, so ``network.apply(orthogonal_init_)`` initialises a whole network. Biases are set to zero.
Pass other gains or scales with :func:`functools.partial`::

    policy.head.apply(functools.partial(orthogonal_init_, gain=0.01))
"""

from __future__ import annotations

import math
from enum import StrEnum
from functools import partial

from torch import nn

from emote_core.errors import ConfigurationError

_LAYERS = (nn.Linear, nn.modules.conv._ConvNd)


class LayerInit(StrEnum):
    """How a network's linear layers start (a family's ``initialization`` recipe key)."""

    ORTHOGONAL = "orthogonal"
    """Upstream emote's: orthogonal weights (gain ``sqrt 2`` on hidden layers; each network
    says its output layer's), zero biases."""
    TORCH = "torch"
    """PyTorch's own defaults for each layer (Kaiming-uniform weights and uniform biases), as
    d3rlpy's and CORL's networks start."""


def layer_init(owner: str, value: LayerInit | str) -> LayerInit:
    """``value`` as a :class:`LayerInit`.

    Raises:
        ConfigurationError: If it names none, saying which ``owner`` was given it.
    """
    try:
        return LayerInit(value)
    except ValueError:
        choices = ", ".join(repr(str(choice)) for choice in LayerInit)
        raise ConfigurationError(
            f"{owner}: initialization must be one of {choices}; got {value!r}"
        ) from None


def init_value_mlp_(hidden: nn.Module, output: nn.Module, initialization: LayerInit) -> None:
    """Starts a value network's ``hidden`` layers and ``output`` layer as ``initialization``
    says: for :attr:`LayerInit.ORTHOGONAL` orthogonal hidden layers of gain ``sqrt 2``, an
    orthogonal output layer of gain 1 and zero biases; for :attr:`LayerInit.TORCH` as PyTorch
    built them (unchanged)."""
    if initialization is LayerInit.ORTHOGONAL:
        hidden.apply(orthogonal_init_)
        output.apply(partial(orthogonal_init_, gain=1.0))


def _is_layer(module: nn.Module) -> bool:
    return isinstance(module, _LAYERS)


def _zero_bias(module: nn.Module) -> None:
    bias = getattr(module, "bias", None)
    if bias is not None:
        nn.init.zeros_(bias)


def orthogonal_init_(module: nn.Module, *, gain: float = math.sqrt(2.0)) -> None:
    """Orthogonal weights scaled by ``gain`` (``sqrt(2)`` suits ReLU layers) and zero biases.

    Args:
        module: Any module; only linear and convolutional layers change.
        gain: The scale of the orthogonal matrix.
    """
    if _is_layer(module):
        nn.init.orthogonal_(module.weight, gain=gain)
        _zero_bias(module)


def xavier_uniform_init_(module: nn.Module, *, gain: float = 1.0) -> None:
    """Glorot/Xavier uniform weights and zero biases.

    Args:
        module: Any module; only linear and convolutional layers change.
        gain: The scale applied to the uniform bound.
    """
    if _is_layer(module):
        nn.init.xavier_uniform_(module.weight, gain=gain)
        _zero_bias(module)


def normal_init_(module: nn.Module, *, std: float | None = None, mean: float = 0.0) -> None:
    """Normally distributed weights and zero biases (small ``std`` for output layers).

    With no ``std``, the scales are upstream emote's, by layer type: ``Linear`` 1e-3, ``Conv1d``
    0.01, and ``BatchNorm1d`` reset to weight 1 and bias 0; other layers are left alone. So
    ``net.apply(normal_init_)`` ported from upstream initialises the same way. A given ``std``
    applies to every linear and convolutional layer.

    Args:
        module: Any module; only the layers named above change.
        std: The standard deviation of the weights, or ``None`` for upstream's per-type scales.
        mean: The mean of the weights.
    """
    if std is not None:
        if _is_layer(module):
            nn.init.normal_(module.weight, mean=mean, std=std)
            _zero_bias(module)
        return
    if isinstance(module, nn.BatchNorm1d):
        if module.affine:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        return
    default = {nn.Linear: 1e-3, nn.Conv1d: 0.01}.get(type(module))
    if default is None:
        for kind, scale in ((nn.Linear, 1e-3), (nn.Conv1d, 0.01)):
            if isinstance(module, kind):
                default = scale
    if default is not None:
        nn.init.normal_(module.weight, mean=mean, std=default)
        _zero_bias(module)


__all__ = [
    "LayerInit",
    "init_value_mlp_",
    "layer_init",
    "normal_init_",
    "orthogonal_init_",
    "xavier_uniform_init_",
]
