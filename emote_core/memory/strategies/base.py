"""The two strategy roles of a memory table: which windows to sample, which episodes to eject.

Strategies see the table's :class:`~emote_core.memory.storage.EpisodeIndex` (slot arrays of
identities, lengths and end states) and are told of every added and removed episode. Their state
is expressed in episode identities, never slots, so it can be saved and restored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from emote_core.errors import MemoryTableError, SamplingError
from emote_core.memory.storage import EpisodeIndex


@dataclass
class SampledWindows:
    """What a sample strategy chose.

    Attributes:
        slots: Episode slot per window.
        offsets: First transition of each window within its episode.
        weights: Importance-sampling weights per window (prioritized sampling), else ``None``.
    """

    slots: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None = None


class Strategy(ABC):  # noqa: B024 - shared base; the roles below declare the abstract methods
    """What both roles share: binding to a table's index, episode events, and state."""

    def __init__(self) -> None:
        self._index: EpisodeIndex | None = None

    @property
    def index(self) -> EpisodeIndex:
        if self._index is None:
            raise MemoryTableError(f"{type(self).__name__} is not attached to a memory table")
        return self._index

    def attach(self, index: EpisodeIndex) -> None:
        """Called once by the table that uses this strategy."""
        self._index = index

    def track(self, *, slot: int, identity: int) -> None:  # noqa: B027 - optional event
        """An episode was added in ``slot``.

        Keyword-only, and called so by the table: upstream emote's strategies take
        ``track(identity, sequence_length)``, so a strategy ported from there fails at its first
        episode instead of reading a slot as an identity.
        """

    def track_block(self, slots: np.ndarray, identities: np.ndarray) -> None:
        """Episodes were added in ``slots``, in order (a table filled in bulk): :meth:`track`
        for each, unless the strategy has a faster way."""
        for slot, identity in zip(slots.tolist(), identities.tolist(), strict=True):
            self.track(slot=slot, identity=identity)

    def forget(self, *, slot: int, identity: int) -> None:  # noqa: B027 - optional event
        """The episode in ``slot`` is about to be removed."""

    def clear(self) -> None:  # noqa: B027 - optional event
        """Every episode was removed."""

    def relocated(self, moves: list[tuple[int, int, int]]) -> None:  # noqa: B027 - optional event
        """The table moved episodes' rows: ``(old_start, new_start, rows)`` per moved episode.

        Called after a reallocation, once ``index.starts`` holds the new starts.
        """

    def state(self) -> dict[str, Any]:
        """JSON-compatible state (in identities) to save with the table."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - stateless by default
        """Restores :meth:`state` after the table's episodes were re-added."""


class SampleStrategy(Strategy):
    """Chooses the windows of a sample."""

    has_priorities: ClassVar[bool] = False
    """Whether :meth:`update_priorities` is meaningful (losses should feed TD errors back)."""

    @abstractmethod
    def sample(self, count: int, sequence_length: int, rng: np.random.Generator) -> SampledWindows:
        """Chooses ``count`` windows of ``sequence_length`` transitions.

        Raises:
            SamplingError: If no episode holds a window of that length.
        """

    def update_priorities(
        self, slots: np.ndarray, offsets: np.ndarray, priorities: np.ndarray
    ) -> None:
        """Sets new priorities for sampled windows (prioritized strategies only)."""
        raise MemoryTableError(
            f"{type(self).__name__} has no priorities to update; use a prioritized strategy"
        )

    def windows_per_episode(self, sequence_length: int) -> np.ndarray:
        """How many windows of ``sequence_length`` each slot holds (0 for free or short slots)."""
        index = self.index
        return np.where(index.live, np.maximum(index.lengths - sequence_length + 1, 0), 0)

    def no_windows_error(self, sequence_length: int) -> SamplingError:
        index = self.index
        if len(index) == 0:
            return SamplingError("cannot sample an empty memory table; add episodes first")
        longest = int(index.lengths.max(initial=0))
        return SamplingError(
            f"no episode holds a window of {sequence_length} transitions: the table has "
            f"{len(index)} episodes, the longest with {longest} transitions — sample shorter "
            "sequences or collect longer episodes"
        )


class EjectionStrategy(Strategy):
    """Chooses which episode to remove when the table needs room."""

    @abstractmethod
    def choose(self) -> int:
        """The slot of the next episode to eject.

        Raises:
            MemoryTableError: If the table holds no episode.
        """


__all__ = ["EjectionStrategy", "SampleStrategy", "SampledWindows", "Strategy"]
