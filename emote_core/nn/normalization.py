"""Running statistics and the normalisers built on them.

:class:`Normalizer` keeps the running mean and variance of rows (a dynamics model's inputs and
targets, say); :class:`ObservationNormalizer` holds one per float observation entry and maps raw
observations to clipped standard scores; :class:`ReturnNormalizer` keeps the variance of the
discounted return, by which training rewards are divided.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.utils.checks import positive_int


class Normalizer(nn.Module):
    """Keeps the running mean and variance of the rows it is shown; ``normalize`` maps them to
    zero mean and unit variance, ``denormalize`` back.

    The statistics are buffers, so they are saved and restored with the module's ``state_dict``
    (and move with ``.to(device)``). Batches are merged exactly (Chan et al.'s parallel update):
    after any sequence of :meth:`update` calls the statistics equal those of all rows at once
    (population variance). Before the first update it is the identity.

    Args:
        size: The width of a row (the last dimension).
        epsilon: Added to the variance before its square root, so constant columns stay finite.

    Raises:
        ConfigurationError: If ``size`` is not positive or ``epsilon`` is negative.
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(self, size: int, *, epsilon: float = 1e-8) -> None:
        super().__init__()
        positive_int("Normalizer", "size", size)
        if not (math.isfinite(epsilon) and epsilon >= 0.0):
            raise ConfigurationError(f"Normalizer's epsilon must be 0 or more; got {epsilon}")
        self.size = size
        self.epsilon = float(epsilon)
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("var", torch.ones(size))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def update(self, rows: Tensor) -> None:
        """Merges ``rows`` (``(..., size)``) into the statistics.

        Raises:
            ConfigurationError: If the last dimension is not ``size`` or a value is not finite.
        """
        if rows.shape[-1] != self.size:
            raise ConfigurationError(
                f"Normalizer of size {self.size} was given rows of width {rows.shape[-1]}"
            )
        batch = (
            rows.detach().reshape(-1, self.size).to(device=self.mean.device, dtype=torch.float64)
        )
        if batch.shape[0] == 0:
            return
        if not torch.isfinite(batch).all():
            raise ConfigurationError("Normalizer was given rows with NaN or infinite values")
        n = float(batch.shape[0])
        seen = float(self.count)
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, unbiased=False)
        total = seen + n
        if seen == 0.0:
            mean, var = batch_mean, batch_var
        else:
            old_mean, old_var = self.mean.double(), self.var.double()
            delta = batch_mean - old_mean
            mean = old_mean + delta * (n / total)
            var = (old_var * seen + batch_var * n + delta.square() * seen * n / total) / total
        self.mean.copy_(mean.to(self.mean.dtype))
        self.var.copy_(var.to(self.var.dtype))
        self.count.fill_(total)

    @property
    def std(self) -> Tensor:
        """``sqrt(var + epsilon)``, ``(size,)``."""
        return (self.var + self.epsilon).sqrt()

    # Both choose by a tensor, not by reading the count back: on CUDA that read would wait for
    # the device at every model step.
    def normalize(self, values: Tensor) -> Tensor:
        """``(values - mean) / std``; the values unchanged before any update."""
        return torch.where(self.count > 0, (values - self.mean) / self.std, values)

    def denormalize(self, values: Tensor) -> Tensor:
        """``values * std + mean``, the inverse of :meth:`normalize`."""
        return torch.where(self.count > 0, values * self.std + self.mean, values)

    def forward(self, values: Tensor) -> Tensor:
        """:meth:`normalize`."""
        return self.normalize(values)

    def extra_repr(self) -> str:
        return f"size={self.size}, epsilon={self.epsilon}"


def normalized_keys(spaces: MDPSpace | DictSpace) -> tuple[str, ...]:
    """The observation entries a :class:`ObservationNormalizer` scales: float boxes, except
    entries named like masks (``action_mask``); integer entries (``uint8`` frames) pass as
    they are."""
    state = spaces.state if isinstance(spaces, MDPSpace) else spaces
    return tuple(
        key
        for key, space in state.spaces.items()
        if isinstance(space, BoxSpace)
        and np.issubdtype(np.dtype(space.dtype), np.floating)
        and "mask" not in key.lower()
    )


class ObservationNormalizer(nn.Module):
    """Maps raw observations to ``clip((x - mean) / sqrt(var + epsilon), -clip, clip)`` per
    float entry, with running statistics of the observations it is shown.

    One :class:`Normalizer` per entry of :func:`normalized_keys` (each value flattened to a
    row); other entries pass unchanged. While :attr:`frozen`, :meth:`update` does nothing.

    Args:
        spaces: The observation space (an MDP space's ``state`` is used).
        clip: The bound of the normalised values, finite and positive.
        epsilon: Added to the variance before its square root.

    Raises:
        ConfigurationError: If ``clip`` is not finite and positive.
    """

    def __init__(
        self, spaces: MDPSpace | DictSpace, *, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        super().__init__()
        if isinstance(clip, bool) or not math.isfinite(clip) or clip <= 0:
            raise ConfigurationError(
                f"observation_clip must be a finite number above 0; got {clip!r}"
            )
        state = spaces.state if isinstance(spaces, MDPSpace) else spaces
        self.keys = normalized_keys(state)
        self.shapes = {key: tuple(int(d) for d in state[key].shape) for key in self.keys}
        self.clip = float(clip)
        self.frozen = False
        self.statistics = nn.ModuleList(
            Normalizer(max(1, int(np.prod(self.shapes[key]))), epsilon=epsilon) for key in self.keys
        )

    def update(self, observation: Mapping[str, Any]) -> None:
        """Merges a batch ``{key: (B, ...)}`` (tensors or arrays) into the statistics; entries
        not normalised are ignored, and nothing changes while :attr:`frozen`.

        Raises:
            ConfigurationError: If an entry holds NaN or infinite values.
        """
        if self.frozen:
            return
        for key, statistics in zip(self.keys, self.statistics, strict=True):
            if key in observation:
                rows = torch.as_tensor(observation[key])
                statistics.update(rows.reshape(-1, statistics.size))

    def normalize_entry(self, key: str, value: Tensor) -> Tensor:
        """One entry, ``(B, ...)``, normalised and clipped as float32 (unchanged when the key
        is not normalised, as float32 before any update)."""
        if key not in self.keys:
            return value
        statistics = self.statistics[self.keys.index(key)]
        rows = value.reshape(value.shape[0], -1).to(torch.float32)
        scaled = ((rows - statistics.mean) / statistics.std).clamp(-self.clip, self.clip)
        # Chosen by a tensor, not by reading the count back (a device sync on CUDA).
        return torch.where(statistics.count > 0, scaled, rows).reshape(value.shape)

    def snapshot(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{key: (mean, std)}`` as CPU float32 tensors of one entry's shape, for the keys whose
        statistics have seen data (the others pass unchanged): constants for an export."""
        taken = {}
        for key, statistics in zip(self.keys, self.statistics, strict=True):
            if float(statistics.count) > 0:
                shape = self.shapes[key]
                mean = statistics.mean.detach().float().cpu().reshape(shape)
                taken[key] = (mean, statistics.std.detach().float().cpu().reshape(shape))
        return taken

    def forward(self, observation: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Every entry of ``observation`` (``{key: (B, ...)}``), normalised where it is a
        normalised key."""
        return {key: self.normalize_entry(key, value) for key, value in observation.items()}

    def extra_repr(self) -> str:
        return f"keys={list(self.keys)}, clip={self.clip}, frozen={self.frozen}"


class ReturnNormalizer(nn.Module):
    """The running variance of the discounted return ``g_t = gamma * g_{t-1} + r_t`` (reset at
    each episode's start), by which :meth:`scale` divides rewards.

    Args:
        gamma: The discount of the return, in ``[0, 1]``.
        epsilon: Added to the variance before its square root.

    Raises:
        ConfigurationError: If ``gamma`` is outside ``[0, 1]``.
    """

    def __init__(self, gamma: float, *, epsilon: float = 1e-8) -> None:
        super().__init__()
        if not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
            raise ConfigurationError(f"the return's discount must be within [0, 1]; got {gamma}")
        self.gamma = float(gamma)
        self.frozen = False
        self.statistics = Normalizer(1, epsilon=epsilon)

    def discounted_returns(self, rewards: np.ndarray, start: float = 0.0) -> np.ndarray:
        """``g_t`` for a run of one episode's rewards, ``start`` being the return before it."""
        returns = np.empty(len(rewards), dtype=np.float64)
        running = float(start)
        for t, reward in enumerate(np.asarray(rewards, dtype=np.float64).reshape(-1)):
            running = self.gamma * running + reward
            returns[t] = running
        return returns

    def update(self, returns: np.ndarray) -> None:
        """Merges discounted returns into the statistics (nothing while :attr:`frozen`)."""
        if not self.frozen and len(returns):
            self.statistics.update(torch.as_tensor(returns, dtype=torch.float64).reshape(-1, 1))

    def scale(self, rewards: Tensor) -> Tensor:
        """``rewards / sqrt(var + epsilon)``; unchanged before any update."""
        std = self.statistics.std.to(rewards.device)
        return torch.where(self.statistics.count.to(rewards.device) > 0, rewards / std, rewards)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, frozen={self.frozen}"


__all__ = ["Normalizer", "ObservationNormalizer", "ReturnNormalizer", "normalized_keys"]
