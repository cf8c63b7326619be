"""The one latent scaling convention of GenRL: between the policy's actions and the VAE's latents.

``latent = latent_scale * policy_action`` (:func:`policy_to_latent`) and
``policy_action = clamp(latent / latent_scale, -1, 1)`` (:func:`latent_to_policy`); the clamp
is the only loss in the round trip. Acting, storing and exporting all go through these two
functions: give them the same ``latent_scale``.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from emote_core.errors import ConfigurationError

DEFAULT_LATENT_SCALE = 3.0
"""A ``latent_scale`` that lets the policy reach three prior standard deviations."""


def check_latent_scale(owner: str, latent_scale: Any) -> float:
    """``latent_scale`` as a float if it is finite and positive.

    Raises:
        ConfigurationError: Naming ``owner`` and the value.
    """
    if (
        isinstance(latent_scale, bool)
        or not isinstance(latent_scale, int | float)
        or not (math.isfinite(latent_scale) and latent_scale > 0)
    ):
        raise ConfigurationError(
            f"{owner}: latent_scale must be finite and > 0 (latent = latent_scale * policy "
            f"action); got {latent_scale!r}"
        )
    return float(latent_scale)


def policy_to_latent(policy_actions: Tensor, latent_scale: float) -> Tensor:
    """The latents the decoder reads for the policy's ``[-1, 1]`` actions:
    ``latent_scale * policy_actions``."""
    return policy_actions * latent_scale


def latent_to_policy(latents: Tensor, latent_scale: float) -> Tensor:
    """The policy actions that stand for ``latents``: ``clamp(latents / latent_scale, -1, 1)``."""
    return (latents / latent_scale).clamp(-1.0, 1.0)


__all__ = [
    "DEFAULT_LATENT_SCALE",
    "check_latent_scale",
    "latent_to_policy",
    "policy_to_latent",
]
