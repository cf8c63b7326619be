"""Coverage-based strategies: sampling favours episodes drawn less than their share; ejection
(upstream emote's weighting) favours removing episodes that were drawn little."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError
from emote_core.memory.strategies.base import SampledWindows, SampleStrategy
from emote_core.memory.strategies.uniform import UniformEjectionStrategy


def _alpha(alpha: Any) -> float:
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, int | float)
        or not math.isfinite(alpha)
        or alpha < 0
    ):
        raise ConfigurationError(
            f"alpha must be a finite number >= 0 (0 weighs every transition alike); got {alpha!r}"
        )
    return float(alpha)


class CoverageBasedSampleStrategy(SampleStrategy):
    """Samples episodes by their window count, discounted by how often they were already drawn.

    Upstream emote's weighting: episode ``e`` with ``n_e`` windows of the requested length,
    drawn ``d_e`` times so far, is chosen with probability proportional to
    ``n_e * (d_e + 1) ** -alpha``; the window start is uniform within it. With ``alpha = 0`` this
    is exactly uniform sampling over windows; larger ``alpha`` favours fresh episodes more. Draw
    counts are updated after every sample (upstream recomputed its weights only when an episode
    was added or removed) and reset when an episode leaves.

    Args:
        alpha: Strength of the preference for episodes with low coverage (0 = uniform).

    Raises:
        ConfigurationError: If ``alpha`` is negative or not a finite number.
    """

    def __init__(self, *, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = _alpha(alpha)
        self._drawn = np.zeros(0, dtype=np.int64)

    def _counts(self) -> np.ndarray:
        """Draws per slot, sized to the index's slot capacity."""
        capacity = self.index.capacity
        if len(self._drawn) < capacity:
            grown = np.zeros(capacity, dtype=np.int64)
            grown[: len(self._drawn)] = self._drawn
            self._drawn = grown
        return self._drawn

    def draw_counts(self) -> np.ndarray:
        """Draws so far per slot (0 for free slots), sized to the index's slot capacity."""
        return self._counts().copy()

    def draws_by_episode(self) -> dict[int, int]:
        """Draws so far per held episode, keyed by episode id (upstream's ``_sample_count``)."""
        slots = self.index.live_slots()
        counts = self._counts()
        return {int(self.index.ids[s]): int(counts[s]) for s in slots}

    def drawn(self, slot: int) -> int:
        """How many windows were drawn from the episode in ``slot`` so far."""
        return int(self._counts()[slot])

    def track(self, *, slot: int, identity: int) -> None:
        self._counts()[slot] = 0

    def forget(self, *, slot: int, identity: int) -> None:
        self._counts()[slot] = 0

    def clear(self) -> None:
        self._drawn = np.zeros(0, dtype=np.int64)

    def episode_weights(self, sequence_length: int) -> np.ndarray:
        """Each slot's unnormalised probability of being chosen (0 for free or short slots)."""
        windows = self.windows_per_episode(sequence_length)
        if self.alpha == 0.0:
            return windows.astype(np.float64)
        return windows * (self._counts() + 1.0) ** -self.alpha

    def sample(self, count: int, sequence_length: int, rng: np.random.Generator) -> SampledWindows:
        weights = self.episode_weights(sequence_length)
        cumulative = np.cumsum(weights)
        total = cumulative[-1] if len(cumulative) else 0.0
        if total <= 0.0:
            raise self.no_windows_error(sequence_length)
        slots = np.searchsorted(cumulative, rng.random(count) * total, side="right")
        # A draw rounded up to the total belongs to the last episode that holds windows.
        np.minimum(slots, int(np.flatnonzero(weights)[-1]), out=slots)
        windows = np.maximum(self.index.lengths[slots] - sequence_length + 1, 1)
        offsets = rng.integers(0, windows)
        counts = self._counts()
        counts += np.bincount(slots, minlength=len(counts))
        return SampledWindows(slots=slots, offsets=offsets)

    def state(self) -> dict[str, Any]:
        """Draw counts per episode identity (JSON-compatible)."""
        counts = self._counts()
        index = self.index
        return {
            "drawn": {str(int(index.ids[slot])): int(counts[slot]) for slot in index.live_slots()}
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores draw counts of held episodes; others keep theirs."""
        counts = self._counts()
        slot_of = self.index.slot_of
        for key, value in state.get("drawn", {}).items():
            slot = slot_of.get(int(key))
            if slot is not None:
                counts[slot] = int(value)


class CoverageBasedEjectionStrategy(UniformEjectionStrategy):
    """Ejects random episodes weighted by length and by how little they were sampled.

    Upstream emote's weighting: episode ``e`` of ``N_e`` transitions, drawn ``d_e`` times by
    sampling, is chosen with probability proportional to ``N_e * (d_e + 1) ** -alpha``, so
    episodes that training has drawn often tend to stay. The draw counts are those of
    ``sampler``, a :class:`CoverageBasedSampleStrategy` of the same table. Without one every
    count is 0 and ejection is :class:`UniformEjectionStrategy`'s (what upstream's ejector does,
    since only its own, never called, sampling raised its counts).

    Args:
        alpha: How strongly draws protect an episode (0 ejects as the uniform strategy).
        sampler: The table's coverage-based sampler whose draw counts to use.
        seed: Seed of the strategy's random generator.

    Raises:
        ConfigurationError: If ``alpha`` is negative or not a finite number, or ``sampler`` is
            not a :class:`CoverageBasedSampleStrategy`.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.5,
        sampler: CoverageBasedSampleStrategy | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(seed=seed)
        self.alpha = _alpha(alpha)
        if sampler is not None and not isinstance(sampler, CoverageBasedSampleStrategy):
            raise ConfigurationError(
                f"CoverageBasedEjectionStrategy's sampler must be the table's "
                f"CoverageBasedSampleStrategy (its draw counts); got {type(sampler).__name__}"
            )
        self.sampler = sampler

    def episode_weights(self) -> np.ndarray:
        weights = super().episode_weights()
        if self.sampler is None or self.alpha == 0.0:
            return weights
        if self.sampler.index is not self.index:
            raise ConfigurationError(
                "CoverageBasedEjectionStrategy's sampler belongs to another table; pass the "
                "sampler of the table this ejector serves"
            )
        drawn = self.sampler.draw_counts()[: len(weights)]
        return weights * (drawn + 1.0) ** -self.alpha


__all__ = ["CoverageBasedEjectionStrategy", "CoverageBasedSampleStrategy"]
