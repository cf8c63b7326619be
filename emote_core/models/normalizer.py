"""Running mean and variance of a model's inputs or targets, to normalise and denormalise them."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from emote_core.errors import ConfigurationError


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
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(f"Normalizer's size must be a positive integer; got {size!r}")
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


__all__ = ["Normalizer"]
