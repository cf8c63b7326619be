"""The ``curl`` add-on: its recipe table ``[curl]`` and the :class:`CurlLoss` it adds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_addon,
)
from emote_core.callback import Callback
from emote_core.errors import ConfigurationError
from emote_core.nn.augmentation import ImageAugmentor
from emote_core.nn.curl import CurlLoss
from emote_core.spaces import MDPSpace
from emote_core.utils.checks import finite_number, positive_int


@dataclass
class CurlConfig:
    """Contrastive representation learning of the image encoder (the recipe table ``[curl]``).

    Anchors and positives are two random cutouts of each batch image; the defaults are CURL's
    (the encoder's learning rate and momentum, the bilinear similarity on the features).
    """

    learning_rate: float = 1e-3
    """Adam learning rate of the encoder, the projection and the bilinear matrix."""
    tau: float = 0.05
    """The fraction the momentum target encoder moves toward the encoder per update."""
    temperature: float = 1.0
    """Divides the similarity logits."""
    projection_dim: int | None = None
    """A linear projection of the features to codes of this width; the features themselves
    when unset."""
    min_mask_relative_size: float = 0.2
    """The smallest cutout side, as a fraction of the image side."""
    max_mask_relative_size: float = 0.4
    """The largest cutout side, as a fraction of the image side."""
    per_image_mask_size: bool = True
    """Draw a cutout size per image (else one per batch)."""
    noise_std: float = 0.0
    """Gaussian pixel noise added before the cutout, in pixel units."""
    max_grad_norm: float = 10.0
    """Gradient norm clip of the contrastive loss."""
    log_images: bool = False
    """Log an anchor and its positive to TensorBoard every ``image_log_interval`` updates."""
    image_log_interval: int = 1000
    """Updates between logged images."""


@register_addon
class CurlAddOn(AddOn):
    """Trains the networks' image encoder with CURL's InfoNCE loss beside the RL losses."""

    name: ClassVar[str] = "curl"
    config_class: ClassVar[type] = CurlConfig
    summary: ClassVar[str] = "CURL: a contrastive loss that trains the image encoder"

    def validate(self, config: CurlConfig, *, source: str) -> None:
        for key, high in (("learning_rate", math.inf), ("tau", 1.0), ("temperature", math.inf),
                          ("max_grad_norm", math.inf)):  # fmt: skip
            value = finite_number(source, f"'curl.{key}'", getattr(config, key), 0.0, high)
            if value == 0.0:
                raise ConfigurationError(f"{source}: 'curl.{key}' must be above 0; got {value}")
        for key in ("projection_dim", "image_log_interval"):
            value = getattr(config, key)
            if value is not None:
                positive_int(source, f"'curl.{key}'", value)
        try:
            self._augmentor(config, seed=0, device="cpu")
        except ConfigurationError as error:
            raise ConfigurationError(f"{source}: [curl] {error}") from None

    def check(
        self, config: CurlConfig, algorithm: AlgorithmFamily, spaces: MDPSpace, *, env_id: str
    ) -> None:
        """Refuses environments without an image observation."""
        if not any(len(space.shape) == 3 for space in spaces.state.spaces.values()):
            shapes = {key: space.shape for key, space in spaces.state.spaces.items()}
            raise ConfigurationError(
                f"the curl add-on learns from (height, width, channels) images, and '{env_id}' "
                f"observations are {shapes}"
            )

    def callbacks(
        self, config: CurlConfig, networks: Networks, parts: TrainingParts, context: BuildContext
    ) -> list[Callback]:
        found = networks.image_encoder
        if found is None:
            raise ConfigurationError(
                f"the curl add-on trains the networks' image encoder, and these "
                f"{type(networks).__name__} read no images through one; set the algorithm's "
                'encoder = "conv" (sac.encoder = "conv")'
            )
        key, encoder = found
        return [
            CurlLoss(
                encoder=encoder, observation_key=key, feature_dim=int(encoder.output_dim),
                projection_dim=config.projection_dim, temperature=config.temperature,
                tau=config.tau, learning_rate=config.learning_rate,
                max_grad_norm=config.max_grad_norm, log_images=config.log_images,
                image_log_interval=config.image_log_interval, seed=context.seed,
                augmentor=self._augmentor(config, seed=context.seed, device=context.device),
            )
        ]  # fmt: skip

    @staticmethod
    def _augmentor(config: CurlConfig, *, seed: int, device: object) -> ImageAugmentor:
        return ImageAugmentor(
            min_mask_relative_size=config.min_mask_relative_size,
            max_mask_relative_size=config.max_mask_relative_size,
            per_image_mask_size=config.per_image_mask_size, noise_std=config.noise_std,
            seed=seed, device=device,
        )  # fmt: skip


__all__ = ["CurlAddOn", "CurlConfig"]
