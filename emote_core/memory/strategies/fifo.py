"""First-in-first-out: eject the oldest episode; sample episodes in the order they arrived."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from emote_core.errors import MemoryTableError
from emote_core.memory.strategies.base import EjectionStrategy, SampledWindows, SampleStrategy


class FifoEjectionStrategy(EjectionStrategy):
    """Ejects episodes in the order they were added."""

    def __init__(self) -> None:
        super().__init__()
        self._order: deque[tuple[int, int]] = deque()  # (slot, identity), oldest first

    def track(self, *, slot: int, identity: int) -> None:
        self._order.append((slot, identity))

    def track_block(self, slots: np.ndarray, identities: np.ndarray) -> None:
        self._order.extend(zip(slots.tolist(), identities.tolist(), strict=True))

    def forget(self, *, slot: int, identity: int) -> None:
        if self._order and self._order[0] == (slot, identity):
            self._order.popleft()
        else:
            self._order.remove((slot, identity))

    def clear(self) -> None:
        self._order.clear()

    def choose(self) -> int:
        if not self._order:
            raise MemoryTableError("no episode to eject: the memory table is empty")
        return self._order[0][0]

    def state(self) -> dict[str, Any]:
        return {"identities": [identity for _, identity in self._order]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Reorders the tracked episodes to the saved order (unknown identities are skipped)."""
        slot_of = self.index.slot_of
        saved = [int(i) for i in state.get("identities", []) if int(i) in slot_of]
        rest = [identity for _, identity in self._order if identity not in set(saved)]
        self._order = deque((slot_of[i], i) for i in saved + rest)


class FifoSampleStrategy(SampleStrategy):
    """Samples episodes oldest first, cycling, for on-policy style consumers.

    Args:
        per_episode: One window per episode per pass; otherwise an episode's consecutive,
            non-overlapping windows are handed out (across calls) before the next episode's.
        random_offset: With ``per_episode``, start each window at a random offset; otherwise at
            0. Consecutive windows always start at 0.
    """

    def __init__(self, *, per_episode: bool = True, random_offset: bool = True) -> None:
        super().__init__()
        self.per_episode = per_episode
        self.random_offset = random_offset
        self._order: deque[tuple[int, int]] = deque()
        self._cursor = 0  # next window within the head episode (per_episode=False)

    def track(self, *, slot: int, identity: int) -> None:
        self._order.append((slot, identity))

    def track_block(self, slots: np.ndarray, identities: np.ndarray) -> None:
        self._order.extend(zip(slots.tolist(), identities.tolist(), strict=True))

    def forget(self, *, slot: int, identity: int) -> None:
        if self._order and self._order[0] == (slot, identity):
            self._order.popleft()
            self._cursor = 0
        else:
            self._order.remove((slot, identity))

    def clear(self) -> None:
        self._order.clear()
        self._cursor = 0

    def sample(self, count: int, sequence_length: int, rng: np.random.Generator) -> SampledWindows:
        lengths = self.index.lengths
        if not any(lengths[slot] >= sequence_length for slot, _ in self._order):
            raise self.no_windows_error(sequence_length)
        if self.per_episode:
            return self._one_window_per_episode(count, sequence_length, rng)
        slots = np.empty(count, dtype=np.int64)
        offsets = np.empty(count, dtype=np.int64)
        for k in range(count):
            while lengths[self._order[0][0]] < sequence_length:  # too short: skip it for now
                self._order.rotate(-1)
                self._cursor = 0
            slot = self._order[0][0]
            slots[k], offsets[k] = slot, self._cursor
            self._cursor += sequence_length
            if self._cursor > lengths[slot] - sequence_length:  # episode served: next one
                self._order.rotate(-1)
                self._cursor = 0
        return SampledWindows(slots=slots, offsets=offsets)

    def _one_window_per_episode(
        self, count: int, sequence_length: int, rng: np.random.Generator
    ) -> SampledWindows:
        lengths = self.index.lengths
        eligible = [slot for slot, _ in self._order if lengths[slot] >= sequence_length]
        chosen = np.array([eligible[k % len(eligible)] for k in range(count)], dtype=np.int64)
        if self.random_offset:
            offsets = rng.integers(0, lengths[chosen] - sequence_length + 1)
        else:
            offsets = np.zeros(count, dtype=np.int64)
        self._rotate(eligible[: min(count, len(eligible))])
        return SampledWindows(slots=chosen, offsets=offsets)

    def _rotate(self, served: list[int]) -> None:
        """Moves episodes just served to the back, so the next sample starts with the oldest
        episode not yet served."""
        served_set = set(served)
        front = [entry for entry in self._order if entry[0] in served_set]
        back = [entry for entry in self._order if entry[0] not in served_set]
        self._order = deque(back + front)

    def state(self) -> dict[str, Any]:
        return {"identities": [identity for _, identity in self._order], "cursor": self._cursor}

    def load_state(self, state: dict[str, Any]) -> None:
        slot_of = self.index.slot_of
        saved = [int(i) for i in state.get("identities", []) if int(i) in slot_of]
        rest = [identity for _, identity in self._order if identity not in set(saved)]
        self._order = deque((slot_of[i], i) for i in saved + rest)
        self._cursor = int(state.get("cursor", 0))


__all__ = ["FifoEjectionStrategy", "FifoSampleStrategy"]
