"""ImageAugmentor: cutout masks within their bounds, noise, seeds, dtypes and views, and bad
arguments."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from emote_core.errors import ConfigurationError
from emote_core.nn import ImageAugmentor


def masked_rectangles(original: Tensor, augmented: Tensor) -> list[tuple[int, int]]:
    """The (height, width) of each image's masked region, checking that it is one rectangle."""
    changed = (augmented != original).any(dim=-1)  # (B, H, W)
    shapes = []
    for mask in changed:
        rows, columns = mask.any(dim=1).nonzero().flatten(), mask.any(dim=0).nonzero().flatten()
        height = int(rows.max() - rows.min() + 1) if len(rows) else 0
        width = int(columns.max() - columns.min() + 1) if len(columns) else 0
        assert int(mask.sum()) == height * width, "the masked pixels do not form one rectangle"
        shapes.append((height, width))
    return shapes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
def test_augmentation_keeps_shape_and_dtype_and_leaves_the_input_alone(dtype) -> None:
    images = (torch.rand(8, 16, 16, 3) * 200 + 10).to(dtype)
    before = images.clone()
    augmented = ImageAugmentor(seed=0, noise_std=2.0)(images)
    assert augmented.shape == images.shape and augmented.dtype == dtype
    torch.testing.assert_close(images, before, rtol=0, atol=0)
    assert not torch.equal(augmented, images)


def test_per_image_mask_sizes_vary_within_the_relative_bounds() -> None:
    images = torch.ones(32, 16, 16, 3)
    augmented = ImageAugmentor(min_mask_relative_size=0.25, max_mask_relative_size=0.5, seed=1)(
        images
    )
    shapes = masked_rectangles(images, augmented)
    for height, width in shapes:  # 0.25 * 16 = 4 pixels to 0.5 * 16 = 8 pixels
        assert 4 <= height <= 8 and 4 <= width <= 8
    areas = [height * width for height, width in shapes]
    assert len(set(areas)) > 3
    assert (augmented[augmented != 1] == 0).all()  # masked pixels are zeroed


def test_one_mask_size_for_the_batch_when_asked() -> None:
    images = torch.ones(16, 16, 16, 3)
    augmented = ImageAugmentor(
        min_mask_relative_size=0.2, max_mask_relative_size=0.6, per_image_mask_size=False, seed=2
    )(images)
    shapes = masked_rectangles(images, augmented)
    assert len(set(shapes)) == 1
    changed = (augmented != images).any(dim=-1)
    assert len({tuple(mask.nonzero()[0].tolist()) for mask in changed}) > 1  # positions differ


def test_fill_value_and_whole_image_masks() -> None:
    images = torch.zeros(4, 9, 9, 2)
    augmented = ImageAugmentor(
        min_mask_relative_size=1.0, max_mask_relative_size=1.0, fill_value=0.5, seed=0
    )(images)
    assert (augmented == 0.5).all()


def test_same_seed_same_masks_other_seed_other_masks() -> None:
    images = torch.rand(8, 16, 16, 3)
    first = ImageAugmentor(seed=7)(images)
    torch.testing.assert_close(ImageAugmentor(seed=7)(images), first, rtol=0, atol=0)
    assert not torch.equal(ImageAugmentor(seed=8)(images), first)
    augmentor = ImageAugmentor(seed=7)
    augmentor(images)
    assert not torch.equal(augmentor(images), first)  # successive calls draw afresh


def test_noise_has_the_asked_standard_deviation() -> None:
    images = torch.full((8, 32, 32, 3), 0.5)
    augmented = ImageAugmentor(noise_std=0.1, seed=3)(images)
    noise = (augmented - images)[augmented != 0]  # masked pixels hold the fill, not noise
    assert noise.numel() > 15_000
    assert noise.std().item() == pytest.approx(0.1, rel=0.03)
    assert abs(noise.mean().item()) < 0.003


def test_noisy_uint8_images_are_clamped_not_wrapped() -> None:
    images = torch.full((8, 24, 24, 3), 250, dtype=torch.uint8)
    augmented = ImageAugmentor(noise_std=20.0, fill_value=250, seed=4)(images)
    assert augmented.dtype == torch.uint8
    assert int(augmented.min()) >= 250 - 6 * 20  # wrapping past 255 would give small values
    assert (augmented == 255).float().mean().item() > 0.3


def test_a_non_contiguous_channels_last_view_is_augmented_like_a_copy() -> None:
    stored = torch.randint(0, 256, (8, 9, 24, 24), dtype=torch.uint8)  # frames channels first
    view = stored.movedim(1, -1)
    assert not view.is_contiguous()
    augmented = ImageAugmentor(seed=5, noise_std=3.0)(view)
    expected = ImageAugmentor(seed=5, noise_std=3.0)(view.contiguous())
    torch.testing.assert_close(augmented, expected, rtol=0, atol=0)
    assert augmented.shape == (8, 24, 24, 9)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"min_mask_relative_size": 0.0}, r"min_mask_relative_size must be in \(0, 1\]; got 0"),
        ({"max_mask_relative_size": 1.5}, r"max_mask_relative_size must be in \(0, 1\]; got 1.5"),
        (
            {"min_mask_relative_size": 0.5, "max_mask_relative_size": 0.3},
            "is below min_mask_relative_size",
        ),
        ({"noise_std": -1.0}, r"noise_std must be in \[0, inf\]; got -1"),
        ({"noise_std": math.nan}, "noise_std must be a finite number"),
    ],
)
def test_bad_augmentor_arguments_are_one_line_errors(arguments, message) -> None:
    with pytest.raises(ConfigurationError, match=message) as error:
        ImageAugmentor(**arguments)
    assert "ImageAugmentor" in str(error.value) and "\n" not in str(error.value)


def test_bad_images_are_one_line_errors() -> None:
    augmentor = ImageAugmentor(seed=0, fill_value=300)
    with pytest.raises(ConfigurationError, match=r"\(B, H, W, C\); got \(16, 16, 3\)"):
        augmentor(torch.zeros(16, 16, 3))
    with pytest.raises(ConfigurationError, match=r"fill_value 300.0 is not a torch.uint8 value"):
        augmentor(torch.zeros(2, 16, 16, 3, dtype=torch.uint8))
    assert augmentor(torch.zeros(2, 16, 16, 3)).max() == 300  # fine for float images
