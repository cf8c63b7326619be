"""Image observations for algorithm families: the ``[<algorithm>.conv]`` table and the encoder it
builds.

A family that offers ``encoder = "conv"`` reads images through one :class:`ImageEncoder` that its
networks share (SAC: both Q networks train it, the policy reads its features without gradients),
and exposes it as :attr:`~emote_core.algorithms.registry.Networks.image_encoder` so that
representation add-ons (``curl``) train the same encoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from emote_core.errors import ConfigurationError
from emote_core.nn.encoders import ImageEncoder
from emote_core.spaces import BoxSpace, MDPSpace


class ObservationEncoder(StrEnum):
    """How a family's networks read observations (``[<algorithm>] encoder``)."""

    MLP = "mlp"
    """Every observation entry flattened into one vector for MLPs."""
    CONV = "conv"
    """One image entry through a convolutional encoder (the ``conv`` table)."""


@dataclass
class ConvEncoderConfig:
    """The convolutional image encoder (a recipe's ``[<algorithm>.conv]``, with ``encoder =
    "conv"``): convolutions, then a linear layer to ``feature_dim``, layer norm and tanh. The
    defaults are CURL's encoder for 84x84 images."""

    channels: list[int] = field(default_factory=lambda: [32, 32, 32, 32])
    """Output channels of each convolution."""
    kernels: list[int] = field(default_factory=lambda: [3, 3, 3, 3])
    """Kernel size of each convolution."""
    strides: list[int] = field(default_factory=lambda: [2, 1, 1, 1])
    """Stride of each convolution."""
    feature_dim: int = 50
    """The width of the encoded features."""
    observation_key: str | None = None
    """The image entry of the observation; the only entry when unset."""

    def check(self, encoder: ObservationEncoder, *, source: str, where: str) -> None:
        """Checks the layer lists, and that an MLP family leaves the table at its defaults.

        Raises:
            ConfigurationError: Naming the key, its value and the fix.
        """
        if encoder is not ObservationEncoder.CONV:
            if self != ConvEncoderConfig():
                raise ConfigurationError(
                    f"{source}: '{where}.conv' configures an image encoder but '{where}.encoder' "
                    f"is '{encoder}'; set {where}.encoder = \"conv\" or remove {where}.conv"
                )
            return
        for key in ("channels", "kernels", "strides"):
            values = getattr(self, key)
            if not values or any(value < 1 for value in values):
                raise ConfigurationError(
                    f"{source}: '{where}.conv.{key}' must be a non-empty list of positive "
                    f"integers; got {values}"
                )
        if not len(self.channels) == len(self.kernels) == len(self.strides):
            raise ConfigurationError(
                f"{source}: '{where}.conv' needs one kernel and one stride per channel count; got "
                f"{len(self.channels)} channels, {len(self.kernels)} kernels and "
                f"{len(self.strides)} strides"
            )
        if self.feature_dim < 1:
            raise ConfigurationError(
                f"{source}: '{where}.conv.feature_dim' must be a positive integer; got "
                f"{self.feature_dim}"
            )


def image_key(config: ConvEncoderConfig, spaces: MDPSpace, *, where: str, env_id: str) -> str:
    """The observation entry the encoder reads, checked to be the only one and an image.

    Raises:
        ConfigurationError: If the observation has other entries (the networks would not read
            them), the named entry is missing, or it is not ``(height, width, channels)``.
    """
    keys = list(spaces.state.keys())
    if len(keys) > 1:
        raise ConfigurationError(
            f"'{where}.encoder = \"conv\"' reads one image entry, and '{env_id}' observations "
            f"have {len(keys)} entries {keys}; wrap the env to give the image alone"
        )
    key = config.observation_key or keys[0]
    if key not in keys:
        raise ConfigurationError(
            f"'{where}.conv.observation_key' names '{key}', which '{env_id}' observations do not "
            f"have (they have {keys}); name the image entry or leave it unset"
        )
    space = spaces.state[key]
    if not isinstance(space, BoxSpace) or len(space.shape) != 3:
        shape = getattr(space, "shape", None)
        raise ConfigurationError(
            f"'{where}.encoder = \"conv\"' needs (height, width, channels) images, and "
            f"'{env_id}' observation '{key}' has shape {shape}; use encoder = \"mlp\""
        )
    return key


def build_image_encoder(
    config: ConvEncoderConfig, spaces: MDPSpace, *, where: str, env_id: str
) -> tuple[str, ImageEncoder]:
    """The image entry and a fresh encoder for it (on the CPU).

    Raises:
        ConfigurationError: See :func:`image_key`; also if the images are too small for the
            convolutions.
    """
    key = image_key(config, spaces, where=where, env_id=env_id)
    try:
        encoder = ImageEncoder(
            image_shape=spaces.state[key].shape, channels=config.channels,
            kernels=config.kernels, strides=config.strides, feature_dim=config.feature_dim,
        )  # fmt: skip
    except ConfigurationError as error:
        raise ConfigurationError(f"'{where}.conv' for '{env_id}': {error}") from None
    return key, encoder


__all__ = ["ConvEncoderConfig", "ObservationEncoder", "build_image_encoder", "image_key"]
