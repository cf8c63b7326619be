"""The running observation and return normalisers: statistics, clipping, freezing, state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.models.normalizer import Normalizer as ModelNormalizer
from emote_core.nn.normalization import (
    Normalizer,
    ObservationNormalizer,
    ReturnNormalizer,
    normalized_keys,
)
from emote_core.spaces import BoxSpace, DictSpace


def spaces() -> DictSpace:
    return DictSpace(
        {
            "obs": BoxSpace(dtype=np.dtype(np.float32), shape=(3,)),
            "grid": BoxSpace(dtype=np.dtype(np.float64), shape=(2, 2)),
            "frames": BoxSpace(dtype=np.dtype(np.uint8), shape=(4, 4)),
            "action_mask": BoxSpace(dtype=np.dtype(np.float32), shape=(5,)),
        }
    )


def test_models_share_the_one_running_statistics_implementation() -> None:
    assert ModelNormalizer is Normalizer


def test_float_boxes_are_normalised_and_images_and_masks_pass_unchanged() -> None:
    assert normalized_keys(spaces()) == ("obs", "grid")
    normalizer = ObservationNormalizer(spaces())
    rng = np.random.default_rng(0)
    normalizer.update({"obs": rng.normal(300, 50, (64, 3)), "grid": rng.normal(size=(64, 2, 2))})
    frames = torch.randint(0, 255, (2, 4, 4), dtype=torch.uint8)
    mask = torch.tensor([[1.0, 0, 1, 0, 1]] * 2)
    out = normalizer({"frames": frames, "action_mask": mask, "grid": torch.ones(2, 2, 2)})
    assert out["frames"] is frames and out["action_mask"] is mask
    assert out["grid"].shape == (2, 2, 2)


def test_statistics_equal_numpys_over_the_same_rows_however_they_are_batched() -> None:
    rng = np.random.default_rng(1)
    rows = rng.normal(loc=[400.0, -250.0, 3.0], scale=[80.0, 5.0, 0.01], size=(1000, 3))
    normalizer = ObservationNormalizer(spaces())
    for piece in np.array_split(rows, [1, 7, 300, 301, 999]):
        normalizer.update({"obs": piece})
    statistics = normalizer.statistics[0]
    assert float(statistics.count) == 1000
    np.testing.assert_allclose(statistics.mean.numpy(), rows.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(statistics.var.numpy(), rows.var(axis=0), rtol=1e-4)
    expected = (rows[:5] - rows.mean(axis=0)) / np.sqrt(rows.var(axis=0) + 1e-8)
    got = normalizer({"obs": torch.as_tensor(rows[:5], dtype=torch.float32)})["obs"]
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-3, atol=1e-3)


def test_values_are_clipped_and_constant_entries_stay_finite() -> None:
    normalizer = ObservationNormalizer(spaces(), clip=2.5)
    normalizer.update({"obs": np.array([[100.0, 5.0, 1.0], [102.0, 5.0, 3.0]])})
    out = normalizer({"obs": torch.tensor([[1e6, 5.0, -1e6]])})["obs"]
    assert out.tolist() == [[2.5, 0.0, -2.5]]  # the constant entry: zero variance, no NaN


def test_before_any_update_observations_pass_unchanged() -> None:
    normalizer = ObservationNormalizer(spaces())
    value = torch.tensor([[300.0, 1.0, -2.0]])
    assert torch.equal(normalizer({"obs": value})["obs"], value)


def test_a_frozen_normaliser_does_not_update() -> None:
    normalizer = ObservationNormalizer(spaces())
    normalizer.update({"obs": np.ones((4, 3))})
    before = {k: v.clone() for k, v in normalizer.state_dict().items()}
    normalizer.frozen = True
    normalizer.update({"obs": np.full((4, 3), 50.0)})
    after = normalizer.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_state_dict_round_trip_gives_the_same_normalisation() -> None:
    rng = np.random.default_rng(2)
    normalizer = ObservationNormalizer(spaces())
    normalizer.update({"obs": rng.normal(200, 30, (50, 3)), "grid": rng.normal(size=(50, 2, 2))})
    restored = ObservationNormalizer(spaces())
    restored.load_state_dict(normalizer.state_dict())
    value = {"obs": torch.randn(3, 3) * 30 + 200, "grid": torch.randn(3, 2, 2)}
    for key in value:
        assert torch.equal(normalizer(value)[key], restored(value)[key])


@pytest.mark.parametrize("clip", [0.0, -1.0, float("inf"), float("nan")])
def test_the_clip_must_be_finite_and_positive(clip: float) -> None:
    with pytest.raises(ConfigurationError, match="observation_clip must be a finite number"):
        ObservationNormalizer(spaces(), clip=clip)


def test_rewards_are_divided_by_the_std_of_the_discounted_return() -> None:
    returns = ReturnNormalizer(0.9)
    rewards = np.array([1.0, 2.0, -1.0, 4.0])
    discounted = returns.discounted_returns(rewards)
    np.testing.assert_allclose(discounted, [1.0, 2.9, 1.61, 5.449])
    assert torch.equal(returns.scale(torch.tensor([2.0])), torch.tensor([2.0]))  # no data yet
    returns.update(discounted)
    scaled = returns.scale(torch.tensor([[2.0], [-3.0]]))
    np.testing.assert_allclose(scaled.numpy()[:, 0], [2.0, -3.0] / np.std(discounted), rtol=1e-5)
    restored = ReturnNormalizer(0.9)
    restored.load_state_dict(returns.state_dict())
    assert torch.equal(restored.scale(torch.tensor([2.0])), returns.scale(torch.tensor([2.0])))


def test_a_snapshot_holds_the_constants_of_the_entries_with_data() -> None:
    normalizer = ObservationNormalizer(spaces())
    assert normalizer.snapshot() == {}
    normalizer.update({"grid": np.array([[[1.0, 2.0], [3.0, 4.0]], [[3.0, 2.0], [5.0, 4.0]]])})
    taken = normalizer.snapshot()
    assert list(taken) == ["grid"]
    mean, std = taken["grid"]
    assert mean.dtype == torch.float32 and mean.shape == (2, 2)
    np.testing.assert_allclose(mean, [[2.0, 2.0], [4.0, 4.0]])
    np.testing.assert_allclose(std, [[1.0, 1e-4], [1.0, 1e-4]], rtol=1e-3)
