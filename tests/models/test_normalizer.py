"""The running normaliser against numpy's statistics, its inverse and its checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.models import Normalizer


def test_batches_merged_one_by_one_give_numpy_s_statistics_of_all_rows() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(loc=[3.0, -2.0, 0.0], scale=[0.5, 4.0, 0.05], size=(1000, 3))
    normalizer = Normalizer(3)
    for start, end in ((0, 1), (1, 7), (7, 400), (400, 400), (400, 1000)):
        normalizer.update(torch.as_tensor(rows[start:end], dtype=torch.float32))
    assert normalizer.count.item() == 1000
    np.testing.assert_allclose(normalizer.mean.numpy(), rows.mean(axis=0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(normalizer.var.numpy(), rows.var(axis=0), rtol=1e-4)
    normalised = normalizer.normalize(torch.as_tensor(rows, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(normalised.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(normalised.std(axis=0), 1.0, rtol=1e-3)


def test_denormalize_inverts_normalize_and_both_are_the_identity_before_any_update() -> None:
    normalizer = Normalizer(2)
    values = torch.tensor([[1.0, -5.0], [2.0, 7.0]])
    assert torch.equal(normalizer.normalize(values), values)
    assert torch.equal(normalizer.denormalize(values), values)
    normalizer.update(torch.tensor([[0.0, 10.0], [4.0, 30.0]]))  # mean [2, 20], var [4, 100]
    assert normalizer.normalize(values).flatten().tolist() == pytest.approx([-0.5, -2.5, 0.0, -1.3])
    torch.testing.assert_close(normalizer.denormalize(normalizer(values)), values)


def test_a_constant_column_stays_finite() -> None:
    normalizer = Normalizer(1, epsilon=1e-8)
    normalizer.update(torch.full((10, 1), 3.0))
    assert torch.isfinite(normalizer.normalize(torch.tensor([[3.0], [4.0]]))).all()


def test_the_statistics_round_trip_through_a_state_dict() -> None:
    trained = Normalizer(2)
    trained.update(torch.tensor([[1.0, 2.0], [3.0, 8.0]]))
    restored = Normalizer(2)
    restored.load_state_dict(trained.state_dict())
    values = torch.tensor([[0.5, 0.5]])
    assert torch.equal(restored.normalize(values), trained.normalize(values))
    assert restored.count.item() == 2


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Normalizer(0), "size must be a positive integer; got 0"),
        (lambda: Normalizer(2, epsilon=-1.0), "epsilon must be 0 or more; got -1.0"),
        (lambda: Normalizer(2).update(torch.zeros(3, 3)), "size 2 was given rows of width 3"),
        (lambda: Normalizer(1).update(torch.tensor([[float("nan")]])), "NaN or infinite"),
    ],
)
def test_bad_sizes_and_values_are_refused_in_one_line(build, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        build()
    assert "\n" not in str(raised.value)
