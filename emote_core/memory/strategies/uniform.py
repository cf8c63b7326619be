"""Uniform sampling: every window of the requested length is equally likely."""

from __future__ import annotations

import numpy as np

from emote_core.memory.strategies.base import SampledWindows, SampleStrategy


class UniformSampleStrategy(SampleStrategy):
    """Samples windows uniformly over all windows the table holds.

    An episode is chosen with probability proportional to the number of windows it holds (its
    length for single steps), then a window start uniformly within it; episodes shorter than the
    window are never chosen. The cumulative window counts are cached until the table changes.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cache_key: tuple[int, int] | None = None
        self._cumulative = np.zeros(0, dtype=np.int64)

    def _cumulative_windows(self, sequence_length: int) -> np.ndarray:
        key = (self.index.version, sequence_length)
        if key != self._cache_key:
            self._cumulative = np.cumsum(self.windows_per_episode(sequence_length))
            self._cache_key = key
        return self._cumulative

    def sample(self, count: int, sequence_length: int, rng: np.random.Generator) -> SampledWindows:
        cumulative = self._cumulative_windows(sequence_length)
        total = int(cumulative[-1]) if len(cumulative) else 0
        if total == 0:
            raise self.no_windows_error(sequence_length)
        draws = rng.integers(0, total, size=count)
        slots = np.searchsorted(cumulative, draws, side="right")
        first_window = cumulative[slots] - self.windows_per_slot(slots, sequence_length)
        return SampledWindows(slots=slots, offsets=draws - first_window)

    def windows_per_slot(self, slots: np.ndarray, sequence_length: int) -> np.ndarray:
        return np.maximum(self.index.lengths[slots] - sequence_length + 1, 0)


__all__ = ["UniformSampleStrategy"]
