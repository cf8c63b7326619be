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
        self._first_window = np.zeros(0, dtype=np.int64)

    def _refresh(self, sequence_length: int) -> None:
        """Caches cumulative window counts per slot until the table or the length changes."""
        key = (self.index.version, sequence_length)
        if key != self._cache_key:
            windows = self.windows_per_episode(sequence_length)
            self._cumulative = np.cumsum(windows)
            self._first_window = self._cumulative - windows
            self._cache_key = key

    def sample(self, count: int, sequence_length: int, rng: np.random.Generator) -> SampledWindows:
        self._refresh(sequence_length)
        total = int(self._cumulative[-1]) if len(self._cumulative) else 0
        if total == 0:
            raise self.no_windows_error(sequence_length)
        draws = rng.integers(0, total, size=count)
        slots = np.searchsorted(self._cumulative, draws, side="right")
        return SampledWindows(slots=slots, offsets=draws - self._first_window[slots])


__all__ = ["UniformSampleStrategy"]
