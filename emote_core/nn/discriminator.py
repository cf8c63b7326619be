"""The score network of adversarial losses (AMP's transitions, action symmetry's actions)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from emote_core.nn.encoders import MlpEncoder


class Discriminator(nn.Module):
    """An MLP from one input row to one unbounded score (trained by least squares to +-1).

    Each output row depends on its own input row only (no normalisation across the batch), as
    the gradient penalty of :func:`emote_core.algorithms.amp.gradient_loss_function` needs.

    Args:
        input_dim: The width of an input row.
        hidden_dims: Hidden layer widths.

    Raises:
        ConfigurationError: If a width is not a positive integer.
    """

    def __init__(self, *, input_dim: int, hidden_dims: Sequence[int]) -> None:
        super().__init__()
        self.encoder = MlpEncoder(input_dim=input_dim, hidden_dims=hidden_dims)
        self.head = nn.Linear(self.encoder.output_dim, 1)
        self.input_dim = input_dim

    def forward(self, inputs: Tensor) -> Tensor:
        """``(B, input_dim)`` -> ``(B, 1)`` scores."""
        return self.head(self.encoder(inputs))


__all__ = ["Discriminator"]
