"""Numeric helpers of model-based RL: a clamped linear ramp (rollout lengths that grow with
training) and the truncated-normal initialisation of ensemble layers."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from emote_core.errors import ConfigurationError


def truncated_linear(min_x: float, max_x: float, min_y: float, max_y: float, x: float) -> float:
    """``min_y`` up to ``x = min_x``, ``max_y`` from ``x = max_x``, linear between.

    ``max_y`` may be below ``min_y`` (a falling ramp). An empty ramp (``max_x <= min_x``) is a step
    at ``min_x``: ``min_y`` up to it, ``max_y`` after.

    Raises:
        ConfigurationError: If an argument is not finite.
    """
    for name, value in (("min_x", min_x), ("max_x", max_x), ("min_y", min_y),
                        ("max_y", max_y), ("x", x)):  # fmt: skip
        if not math.isfinite(value):
            raise ConfigurationError(f"truncated_linear's {name} must be finite; got {value}")
    if x <= min_x:
        return float(min_y)
    if x >= max_x:
        return float(max_y)
    return float(min_y + (x - min_x) / (max_x - min_x) * (max_y - min_y))


def truncated_normal_(
    tensor: Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Fills ``tensor`` in place from ``N(mean, std^2)`` truncated to ``mean +- 2 std`` (values
    outside are redrawn, not clipped) and returns it.

    The initialisation of model-based RL's ensemble layers (weights with ``std = 1 / (2
    sqrt(fan_in))``, as in MBPO's and mbrl-lib's). ``generator`` makes it reproducible.

    Raises:
        ConfigurationError: If ``std`` is not positive or ``mean`` is not finite.
    """
    if not math.isfinite(mean):
        raise ConfigurationError(f"truncated_normal_'s mean must be finite; got {mean}")
    if not (math.isfinite(std) and std > 0.0):
        raise ConfigurationError(f"truncated_normal_'s std must be positive; got {std}")
    with torch.no_grad():
        return torch.nn.init.trunc_normal_(
            tensor, mean=mean, std=std, a=mean - 2.0 * std, b=mean + 2.0 * std, generator=generator
        )


__all__ = ["truncated_linear", "truncated_normal_"]
