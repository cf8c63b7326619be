"""The gamma matrix gives the same n-step returns as a plain loop over the rewards."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError
from emote_core.utils import discount, discount_all_steps, make_gamma_matrix


def loop_returns(rewards, values, masks, gamma):
    """Returns from every step of every window, one number at a time."""
    batch, length = len(rewards), len(rewards[0])
    result = []
    for b in range(batch):
        row = []
        for start in range(length):
            total, weight = 0.0, 1.0
            for i in range(start, length):
                total += weight * rewards[b][i]
                weight *= gamma
            row.append(total + weight * masks[b][0] * values[b][0])
        result.append(row)
    return result


@settings(max_examples=60, deadline=None)
@given(
    gamma=st.floats(0.0, 1.0),
    length=st.integers(1, 6),
    batch=st.integers(1, 5),
    seed=st.integers(0, 2**31),
)
def test_vectorised_returns_match_the_loop(
    gamma: float, length: int, batch: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    values = torch.randn(batch, 1, generator=generator, dtype=torch.float64) * 10
    masks = torch.randint(0, 2, (batch, 1), generator=generator).double()
    matrix = make_gamma_matrix(gamma, length, dtype=torch.float64)
    expected = torch.tensor(
        loop_returns(rewards.tolist(), values.tolist(), masks.tolist(), gamma), dtype=torch.float64
    )
    torch.testing.assert_close(
        discount_all_steps(rewards, values, masks=masks, gamma_matrix=matrix),
        expected.reshape(-1, 1),
    )
    torch.testing.assert_close(
        discount(rewards, values, masks=masks, gamma_matrix=matrix), expected[:, :1]
    )


def test_a_three_step_return_by_hand() -> None:
    matrix = make_gamma_matrix(0.5, 3)
    rewards = torch.tensor([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])
    values = torch.tensor([[8.0], [8.0]])
    masks = torch.tensor([[1.0], [0.0]])
    # 1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 8 = 4, and 3 without the bootstrap.
    assert discount(rewards, values, masks=masks, gamma_matrix=matrix).tolist() == [[4.0], [3.0]]
    # Every step's return, window after window in one column, as upstream's discount gave them.
    every_step = discount_all_steps(rewards, values, masks=masks, gamma_matrix=matrix)
    assert every_step.tolist() == [[4.0], [6.0], [8.0], [3.0], [4.0], [4.0]]


def test_mismatched_shapes_and_bad_settings_are_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"make_gamma_matrix\(gamma, 2\)"):
        discount(
            torch.zeros(4, 2),
            torch.zeros(4, 1),
            masks=torch.ones(4, 1),
            gamma_matrix=make_gamma_matrix(0.9, 3),
        )
    with pytest.raises(ConfigurationError, match="values"):
        discount(
            torch.zeros(4, 2),
            torch.zeros(3, 1),
            masks=torch.ones(4, 1),
            gamma_matrix=make_gamma_matrix(0.9, 2),
        )
    with pytest.raises(ConfigurationError, match="gamma"):
        make_gamma_matrix(1.5, 3)
    with pytest.raises(ConfigurationError, match="rollout_length"):
        make_gamma_matrix(0.9, 0)


def test_upstream_positional_discount_call_fails_instead_of_reading_the_matrix_as_masks() -> None:
    rewards, values = torch.ones(2, 3), torch.ones(2, 1)
    # Upstream emote's call: discount(rewards, values, gamma_matrix) with no masks.
    with pytest.raises(TypeError, match="positional"):
        discount(rewards, values, make_gamma_matrix(0.9, 3))  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        discount(rewards, values, torch.ones(2, 1), make_gamma_matrix(0.9, 3))  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        discount_all_steps(rewards, values, torch.ones(2, 1), make_gamma_matrix(0.9, 3))  # type: ignore[misc]


def test_split_rollouts_gives_each_window_its_own_index() -> None:
    from emote_core.utils import split_rollouts

    rows = torch.arange(12.0).reshape(6, 2)
    windows = split_rollouts(rows, 3)
    assert windows.shape == (2, 3, 2)
    assert windows[1, 0].tolist() == [6.0, 7.0]
    assert windows.data_ptr() == rows.data_ptr()  # a view, as upstream's
    with pytest.raises(ConfigurationError, match="whole windows of 4 rows"):
        split_rollouts(rows, 4)
    with pytest.raises(ConfigurationError, match="positive integer"):
        split_rollouts(rows, 0)
