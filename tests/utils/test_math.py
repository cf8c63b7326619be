"""The clamped linear ramp and the truncated-normal initialisation."""

from __future__ import annotations

import math

import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.utils.math import truncated_linear, truncated_normal_


@pytest.mark.parametrize(
    ("x", "expected"),
    [(-5.0, 1.0), (20.0, 1.0), (30.0, 2.75), (60.0, 8.0), (100.0, 15.0), (1e9, 15.0)],
)
def test_the_ramp_holds_its_ends_and_is_linear_between(x: float, expected: float) -> None:
    # MBPO's rollout schedule: length 1 up to epoch 20, 15 from epoch 100 (+14 / 80 per epoch)
    assert truncated_linear(20.0, 100.0, 1.0, 15.0, x) == pytest.approx(expected)


def test_a_falling_ramp_and_an_empty_one() -> None:
    assert truncated_linear(0.0, 10.0, 1.0, 0.0, 2.5) == pytest.approx(0.75)
    assert truncated_linear(5.0, 5.0, 1.0, 2.0, 5.0) == 1.0
    assert truncated_linear(5.0, 5.0, 1.0, 2.0, 5.1) == 2.0
    with pytest.raises(ConfigurationError, match="truncated_linear's x must be finite; got nan"):
        truncated_linear(0.0, 1.0, 0.0, 1.0, math.nan)


def test_truncated_normal_samples_lie_within_two_std_with_the_truncated_moments() -> None:
    tensor = torch.empty(200_000)
    out = truncated_normal_(tensor, mean=1.0, std=0.5, generator=torch.Generator().manual_seed(0))
    assert out is tensor
    assert tensor.min() >= 0.0 and tensor.max() <= 2.0
    # N(0, 1) truncated to [-2, 2]: mean 0, std sqrt(1 - 4 phi(2) / (Phi(2) - Phi(-2))) = 0.880
    assert tensor.mean().item() == pytest.approx(1.0, abs=0.01)
    assert tensor.std().item() == pytest.approx(0.5 * 0.8796, abs=0.005)
    # values near the bounds exist: they are redrawn, not clipped onto the bounds
    assert (tensor == 0.0).sum() == 0 and (tensor > 1.95).any()


def test_truncated_normal_is_reproducible_with_a_generator_and_checks_its_std() -> None:
    def draw(seed: int) -> torch.Tensor:
        return truncated_normal_(torch.empty(4, 3), generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))
    with pytest.raises(ConfigurationError, match=r"std must be positive; got 0\.0"):
        truncated_normal_(torch.empty(2), std=0.0)
