"""VisionAgentProxy: a policy reading one image observation."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.proxies.generic import ACTIONS_KEY, GenericAgentProxy
from emote_core.spaces import MDPSpace


class VisionAgentProxy(GenericAgentProxy):
    """Acts from image observations, handling their channel layout.

    Observations arrive as environments and frame wrappers produce them: ``(H, W)`` grayscale
    or ``(H, W, C)`` channels-last, often ``uint8``. The proxy adds the channel axis of a
    grayscale image, optionally moves channels first (for encoders that take ``(B, C, H, W)``),
    and converts to float32 times ``scale``.

    Args:
        policy: The network, ``policy(images)`` or ``policy(images, epsilon)``.
        device: Where the policy runs.
        input_key: The observation key of the image.
        deterministic: Act with zero noise.
        spaces: The MDP space to validate observations and cast actions with.
        channels_first: Give the policy ``(B, C, H, W)`` instead of ``(B, H, W, C)``.
        scale: Multiplies pixel values (``1 / 255`` maps ``uint8`` frames to ``[0, 1]``; leave at
            1 when the environment already scales, as ``ScaledFloatFrame`` does).
        seed: Seeds the noise generator.

    Raises:
        ConfigurationError: If ``scale`` is not a positive number.
    """

    def __init__(
        self,
        *,
        policy: nn.Module,
        device: torch.device | str,
        input_key: str = "obs",
        deterministic: bool = False,
        spaces: MDPSpace | None = None,
        channels_first: bool = False,
        scale: float = 1.0,
        seed: int | None = None,
    ) -> None:
        if not (isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 0):
            raise ConfigurationError(f"VisionAgentProxy's scale must be positive; got {scale!r}")
        super().__init__(
            policy=policy,
            device=device,
            input_keys=[input_key],
            output_keys=[ACTIONS_KEY],
            spaces=spaces,
            deterministic=deterministic,
            seed=seed,
        )
        self.channels_first = bool(channels_first)
        self.scale = float(scale)

    def _prepare(self, key: str, batch: np.ndarray) -> torch.Tensor:
        if batch.ndim == 3:  # (B, H, W) grayscale: add the channel axis
            batch = batch[..., None]
        if batch.ndim != 4:
            raise ConfigurationError(
                f"VisionAgentProxy: observation '{key}' has per-agent shape {batch.shape[1:]}; "
                "images must be (H, W) or (H, W, C)"
            )
        images = torch.as_tensor(batch, device=self.device).to(torch.float32)
        if self.scale != 1.0:
            images = images * self.scale
        if self.channels_first:
            images = images.permute(0, 3, 1, 2).contiguous()
        return images


__all__ = ["VisionAgentProxy"]
