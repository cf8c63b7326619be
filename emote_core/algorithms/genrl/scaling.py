"""The one latent scaling convention of GenRL: between the policy's actions and the VAE's latents.

SAC's policy acts in ``[-1, 1]`` (a tanh-squashed Gaussian); the VAE's latents are shaped by a
standard normal prior, so most demonstrated actions have latents within a few units of 0. The two
spaces are related by one positive number, ``latent_scale``:

* **policy space -> latent space** (decoding what the policy chose):
  ``latent = latent_scale * policy_action`` (:func:`policy_to_latent`);
* **latent space -> policy space** (labelling what an agent did, for the replay memory):
  ``policy_action = clamp(latent / latent_scale, -1, 1)`` (:func:`latent_to_policy`).

The clamp is the only loss in the round trip: the policy cannot output beyond ``[-1, 1]``, so a
latent beyond ``latent_scale`` is stored as the nearest latent the policy can reach. With the
prior ``N(0, I)``, ``latent_scale = 3`` reaches 99.7% of it per dimension.

:class:`~emote_core.algorithms.genrl.wrappers.PolicyWrapper` (acting),
:class:`~emote_core.algorithms.genrl.memory.MemoryProxyWithEncoder` (storing) and
:class:`~emote_core.algorithms.genrl.export.LatentPolicyActing` (exporting, through the policy
wrapper) all go through these two functions, each with the ``latent_scale`` it is given: give all
of them the same one.
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
