"""Image augmentation for contrastive learning: random cutout, optional noise.

:class:`ImageAugmentor` makes the two views of an image that :class:`~emote_core.nn.curl.CurlLoss`
pairs; it draws from a generator of its own, so augmentations repeat with their seed and resume
from checkpoints.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from emote_core.errors import ConfigurationError
from emote_core.utils.checks import finite_number


def seeded_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A torch generator on ``device``, seeded with ``seed`` (from the OS when ``None``)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


class ImageAugmentor:
    """Random cutout, and optional Gaussian noise, for a batch of channels-last images.

    Each image gets one rectangle, anywhere inside it, filled with ``fill_value``; its sides are
    random fractions of the image's (at least one pixel). Every draw comes from
    :attr:`generator` on ``device``, so a seed gives the same augmentations.

    Args:
        min_mask_relative_size: The smallest mask side, as a fraction of the image side.
        max_mask_relative_size: The largest mask side, as a fraction of the image side.
        per_image_mask_size: Draw a mask size per image; ``False`` draws one for the batch (the
            position is drawn per image either way).
        fill_value: What the masked pixels become.
        noise_std: Standard deviation of Gaussian noise added to every pixel before masking (in
            pixel units); 0 adds none. Integer images are rounded and clamped to their range.
        seed: Seeds :attr:`generator`; ``None`` draws from fresh entropy.
        device: Where the generator lives; images must be on this device.

    Raises:
        ConfigurationError: If the sizes are not ``0 < min <= max <= 1``, ``noise_std`` is
            negative or a number is not finite.
    """

    def __init__(
        self,
        *,
        min_mask_relative_size: float = 0.2,
        max_mask_relative_size: float = 0.4,
        per_image_mask_size: bool = True,
        fill_value: float = 0.0,
        noise_std: float = 0.0,
        seed: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        owner = "ImageAugmentor"
        self.min_mask_relative_size = finite_number(
            owner, "min_mask_relative_size", min_mask_relative_size, 0, 1, low_open=True
        )
        self.max_mask_relative_size = finite_number(
            owner, "max_mask_relative_size", max_mask_relative_size, 0, 1, low_open=True
        )
        if self.max_mask_relative_size < self.min_mask_relative_size:
            raise ConfigurationError(
                f"{owner}: max_mask_relative_size ({max_mask_relative_size}) is below "
                f"min_mask_relative_size ({min_mask_relative_size}); they need 0 < min <= max <= 1"
            )
        self.noise_std = finite_number(owner, "noise_std", noise_std, 0, math.inf)
        self.fill_value = finite_number(owner, "fill_value", fill_value)
        self.per_image_mask_size = bool(per_image_mask_size)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.generator = seeded_generator(device, seed)
        """The source of every random draw; checkpointed through :meth:`random_generators`."""

    @property
    def device(self) -> torch.device:
        """Where the generator lives, and so where images must be."""
        return self.generator.device

    def random_generators(self) -> dict[str, torch.Generator]:
        """Its generator, for checkpoints (``emote_core.utils.random_state``)."""
        return {"cutout": self.generator}

    def __call__(self, images: Tensor) -> Tensor:
        """Returns an augmented copy of ``images``; the input is left as it is.

        Args:
            images: ``(B, H, W, C)`` images, float or integer (``uint8`` frames), contiguous or a
                view.

        Returns:
            The augmented images, of the input's shape and dtype.

        Raises:
            ConfigurationError: If the images are not ``(B, H, W, C)`` numbers on the generator's
                device, or ``fill_value`` does not fit their integer dtype.
        """
        self._check(images)
        batch, height, width = images.shape[:3]
        generator, device = self.generator, images.device
        low, high = self.min_mask_relative_size, self.max_mask_relative_size
        extents = torch.tensor([height, width], device=device)
        draws = batch if self.per_image_mask_size else 1
        fractions = low + (high - low) * torch.rand(draws, 2, generator=generator, device=device)
        sizes = (fractions * extents).round().long().clamp(min=1).minimum(extents).expand(batch, 2)
        free = extents - sizes + 1  # how many top-left corners keep the mask inside the image
        corners = torch.rand(batch, 2, generator=generator, device=device) * free
        corners = corners.long().minimum(free - 1)
        top, left = corners[:, 0, None, None], corners[:, 1, None, None]
        bottom, right = top + sizes[:, 0, None, None], left + sizes[:, 1, None, None]
        rows = torch.arange(height, device=device)[None, :, None]
        columns = torch.arange(width, device=device)[None, None, :]
        masks = (rows >= top) & (rows < bottom) & (columns >= left) & (columns < right)
        augmented = self._add_noise(images) if self.noise_std > 0 else images
        return augmented.masked_fill(masks[..., None], self.fill_value)

    def _check(self, images: Tensor) -> None:
        owner = "ImageAugmentor"
        if not isinstance(images, Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ConfigurationError(
                f"{owner} takes channels-last image batches (B, H, W, C); got {shape}"
            )
        if images.dtype == torch.bool or images.is_complex():
            raise ConfigurationError(f"{owner} takes float or integer images; got {images.dtype}")
        if images.device != self.generator.device:
            raise ConfigurationError(
                f"{owner}: images are on {images.device} but its generator is on "
                f"{self.generator.device}; build it with device='{images.device}'"
            )
        if not images.is_floating_point():
            info = torch.iinfo(images.dtype)
            if self.fill_value != int(self.fill_value) or not (
                info.min <= self.fill_value <= info.max
            ):
                raise ConfigurationError(
                    f"{owner}: fill_value {self.fill_value} is not a {images.dtype} value "
                    f"(integers in [{info.min}, {info.max}]); pass one that is"
                )

    def _add_noise(self, images: Tensor) -> Tensor:
        floating = images.dtype if images.is_floating_point() else torch.float32
        noise = torch.randn(
            images.shape, generator=self.generator, device=images.device, dtype=floating
        )
        if images.is_floating_point():
            return images + noise * self.noise_std
        info = torch.iinfo(images.dtype)
        noisy = images.to(floating) + noise * self.noise_std
        return noisy.round_().clamp_(info.min, info.max).to(images.dtype)

    def __repr__(self) -> str:
        return (
            f"ImageAugmentor(min_mask_relative_size={self.min_mask_relative_size}, "
            f"max_mask_relative_size={self.max_mask_relative_size}, "
            f"per_image_mask_size={self.per_image_mask_size}, fill_value={self.fill_value}, "
            f"noise_std={self.noise_std}, device={self.device})"
        )


__all__ = ["ImageAugmentor"]
