"""Discounted n-step returns as one matrix product.

For a window of ``L`` rewards ``r_0 .. r_{L-1}`` followed by a bootstrap value ``v`` (the value of
the observation after the window, already multiplied by its mask), the return from step ``j`` is

    G_j = sum_{i=j}^{L-1} gamma^(i-j) r_i + gamma^(L-j) v

Stacking ``[r_0 .. r_{L-1}, v]`` as a row, every ``G_j`` is that row times column ``j`` of the
gamma matrix made by :func:`make_gamma_matrix`. :func:`discount` needs only ``G_0``, the n-step
target of the window's first transition; :func:`discount_all_steps` gives every ``G_j``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from emote_core.errors import ConfigurationError
from emote_core.utils.checks import positive_int


def make_gamma_matrix(
    gamma: float,
    rollout_length: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Tensor:
    """The ``(L + 1, L)`` matrix ``M`` with ``M[i, j] = gamma^(i - j)`` for ``i >= j``, else 0.

    Row ``i < L`` weighs reward ``r_i`` and row ``L`` the bootstrap value, so ``[r, v] @ M``
    gives the discounted return from each step of the window.

    Args:
        gamma: The discount factor, in ``[0, 1]``.
        rollout_length: The window length ``L``, at least 1.
        dtype: The matrix's dtype.
        device: The matrix's device.

    Raises:
        ConfigurationError: If ``gamma`` is outside ``[0, 1]`` or ``rollout_length`` < 1.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ConfigurationError(f"gamma must be in [0, 1]; got {gamma!r}")
    positive_int("make_gamma_matrix", "rollout_length", rollout_length)
    rows = torch.arange(rollout_length + 1, dtype=torch.float64).unsqueeze(1)
    columns = torch.arange(rollout_length, dtype=torch.float64).unsqueeze(0)
    exponents = rows - columns
    matrix = torch.where(
        exponents >= 0, torch.tensor(float(gamma), dtype=torch.float64) ** exponents.clamp(min=0), 0
    )
    return matrix.to(dtype=dtype, device=device)


def _stacked(rewards: Tensor, values: Tensor, masks: Tensor, gamma_matrix: Tensor) -> Tensor:
    if rewards.dim() != 2:
        raise ConfigurationError(f"rewards must be (B, L); got shape {tuple(rewards.shape)}")
    batch, length = rewards.shape
    if gamma_matrix.shape != (length + 1, length):
        raise ConfigurationError(
            f"the gamma matrix has shape {tuple(gamma_matrix.shape)} but the rewards are windows "
            f"of {length}; make it with make_gamma_matrix(gamma, {length})"
        )
    for name, tensor in (("values", values), ("masks", masks)):
        if tensor.shape != (batch, 1):
            raise ConfigurationError(
                f"{name} must be ({batch}, 1) for rewards of shape {tuple(rewards.shape)}; got "
                f"{tuple(tensor.shape)}"
            )
    return torch.cat([rewards, masks * values], dim=1)


def discount(rewards: Tensor, values: Tensor, *, masks: Tensor, gamma_matrix: Tensor) -> Tensor:
    """The n-step return of each window's first transition.

    ``masks`` and ``gamma_matrix`` are keyword-only: upstream emote's ``discount(rewards, values,
    gamma_matrix)`` takes no masks and returns every step's return, flattened; a call written for
    it fails here instead of reading the gamma matrix as masks. Its counterpart is
    :func:`discount_all_steps`, which returns upstream's shape.

    Args:
        rewards: ``(B, L)`` rewards of each window.
        values: ``(B, 1)`` value of the observation after each window.
        masks: ``(B, 1)``; 0 where the window ends an episode that must not be bootstrapped.
        gamma_matrix: From ``make_gamma_matrix(gamma, L)``.

    Returns:
        ``(B, 1)``: ``sum_i gamma^i r_i + gamma^L * masks * values``.

    Raises:
        ConfigurationError: If the shapes disagree.
    """
    return _stacked(rewards, values, masks, gamma_matrix) @ gamma_matrix[:, :1]


def discount_all_steps(
    rewards: Tensor, values: Tensor, *, masks: Tensor, gamma_matrix: Tensor
) -> Tensor:
    """The return from every step of each window, all bootstrapped from the window's end, in
    upstream emote's flattened shape.

    Args:
        rewards: ``(B, L)`` rewards of each window.
        values: ``(B, 1)`` value of the observation after each window.
        masks: ``(B, 1)``; 0 where the window ends an episode that must not be bootstrapped.
        gamma_matrix: From ``make_gamma_matrix(gamma, L)``.

    Returns:
        ``(B * L, 1)``, window after window: row ``b * L + j`` is
        ``sum_{i>=j} gamma^(i-j) r_i + gamma^(L-j) * masks * values`` of window ``b``
        (``.view(B, L)`` gives one row per window).

    Raises:
        ConfigurationError: If the shapes disagree.
    """
    return (_stacked(rewards, values, masks, gamma_matrix) @ gamma_matrix).reshape(-1, 1)


def split_rollouts(data: Tensor, rollout_length: int) -> Tensor:
    """Reshapes a batch of flattened windows ``(B * L, ...)`` to ``(B, L, ...)``.

    The memory loader delivers the ``L`` steps of each sampled window as consecutive rows; this
    gives each window its own leading index (a view, no copy), as upstream emote's function of the
    same name does.

    Args:
        data: Rows of whole windows, window after window.
        rollout_length: The window length ``L``, at least 1.

    Raises:
        ConfigurationError: If ``rollout_length`` is not a positive integer or the row count is not
            a multiple of it (upstream's ``view`` would fail less clearly, or not at all for a
            0-d input).
    """
    positive_int("split_rollouts", "rollout_length", rollout_length)
    if data.dim() == 0 or data.shape[0] % rollout_length:
        raise ConfigurationError(
            f"split_rollouts needs whole windows of {rollout_length} rows; got a tensor of shape "
            f"{tuple(data.shape)}"
        )
    return data.view(data.shape[0] // rollout_length, rollout_length, *data.shape[1:])


__all__ = ["discount", "discount_all_steps", "make_gamma_matrix", "split_rollouts"]
