"""Uniform strategies: every window equally likely to be sampled; episodes ejected at random."""

from __future__ import annotations

from typing import Any

import numpy as np

from emote_core.errors import MemoryTableError
from emote_core.memory.strategies.base import EjectionStrategy, SampledWindows, SampleStrategy


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


class UniformEjectionStrategy(EjectionStrategy):
    """Ejects random episodes, each with probability proportional to its length (upstream
    emote's ``UniformEjectionStrategy``): every held transition is equally likely to go.

    The table asks for one episode at a time until the new one fits, so no episode is chosen
    twice. Draws come from the strategy's own generator, which checkpoints keep (through the
    table's ``random_generators``) and :meth:`state` records.

    Args:
        seed: Seed of the strategy's random generator (upstream drew from numpy's global one).
    """

    def __init__(self, *, seed: int | None = None) -> None:
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def random_generators(self) -> dict[str, np.random.Generator]:
        """The generator ejections draw from, for checkpoints."""
        return {"ejection": self.rng}

    def episode_weights(self) -> np.ndarray:
        """Each slot's unnormalised chance to be ejected next (0 for free slots)."""
        index = self.index
        return np.where(index.live, index.lengths, 0).astype(np.float64)

    def choose(self) -> int:
        weights = self.episode_weights()
        cumulative = np.cumsum(weights)
        if len(cumulative) == 0 or cumulative[-1] <= 0.0:
            raise MemoryTableError("no episode to eject: the memory table is empty")
        slot = int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right"))
        # A draw rounded up to the total belongs to the last slot with a chance.
        return min(slot, int(np.flatnonzero(weights)[-1]))

    def state(self) -> dict[str, Any]:
        """The generator's state (JSON-compatible)."""
        return {"rng": self.rng.bit_generator.state}

    def load_state(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]


__all__ = ["UniformEjectionStrategy", "UniformSampleStrategy"]
