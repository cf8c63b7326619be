"""Prioritized sampling: windows drawn in proportion to priorities set after each loss.

Priorities are kept per transition (a window is known by its first transition) in a sum and a min
segment tree with one leaf per storage row of the table: the transition at offset ``t`` of an
episode starting at row ``s`` is leaf ``s + t``. Row ``s + N`` of an episode of ``N`` transitions
(its final observation) and every free row hold 0 in the sum tree, so they are never drawn. When
the table moves episodes (a reallocation), :meth:`PrioritizedSampleStrategy.relocated` moves
their leaves along, so priorities follow their episodes.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from emote_core.errors import ConfigurationError, SamplingError
from emote_core.memory.storage import EpisodeIndex
from emote_core.memory.strategies.base import SampledWindows, SampleStrategy
from emote_core.memory.strategies.segment_tree import (
    MinSegmentTree,
    SumSegmentTree,
    next_power_of_two,
    update_trees,
)

_INITIAL_ROWS = 1024
_REJECTION_ROUNDS = 4


@runtime_checkable
class Schedule(Protocol):
    """Anything with a current ``value``, such as a ``BPStepScheduler``."""

    @property
    def value(self) -> float: ...


def _number(name: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number; got {value!r}")
    if value < minimum:
        raise ConfigurationError(f"{name} must be at least {minimum}; got {value!r}")
    return float(value)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenated ranges ``starts[k] : starts[k] + counts[k]``."""
    total = int(counts.sum())
    firsts = np.cumsum(counts) - counts
    return np.repeat(starts - firsts, counts) + np.arange(total, dtype=np.int64)


class PrioritizedSampleStrategy(SampleStrategy):
    """Samples windows with probability proportional to their priority (prioritized replay).

    A window's priority is that of its first transition, stored as ``(|p| + epsilon) ** alpha``
    for a ``p`` given to :meth:`update_priorities`; new transitions start at the largest stored
    priority (or ``initial_priority``). Only windows that fit in their episode are drawn, with
    probability exactly proportional to priority among them.

    Importance-sampling weights are ``(p_i / p_min) ** -beta``, ``p_min`` the smallest stored
    priority; for windows longer than one step the largest may fall short of 1.

    Args:
        alpha: How strongly priorities shape the distribution (0 is uniform).
        beta: Importance-sampling correction, 0 (none) to 1 (full); a float or a schedule with a
            ``value`` attribute (such as a ``BPStepScheduler``), read at every sample.
        epsilon: Added to every priority so that no window's probability reaches 0.
        initial_priority: Priority of new transitions; by default the largest stored so far.

    Raises:
        ConfigurationError: If ``alpha``, ``beta``, ``epsilon`` or ``initial_priority`` is
            negative, not finite, or (``epsilon``) not positive.
    """

    has_priorities: ClassVar[bool] = True

    def __init__(
        self,
        *,
        alpha: float = 0.6,
        beta: float | Schedule = 0.4,
        epsilon: float = 1e-6,
        initial_priority: float | None = None,
    ) -> None:
        super().__init__()
        self.alpha = _number("alpha", alpha, 0.0)
        self.beta = beta
        self.epsilon = _number("epsilon", epsilon, 0.0)
        if self.epsilon == 0.0:
            raise ConfigurationError(
                "epsilon must be positive so that every window keeps a chance to be drawn; got 0"
            )
        self.initial_priority = (
            None if initial_priority is None else _number("initial_priority", initial_priority, 0.0)
        )
        self._sums = SumSegmentTree(_INITIAL_ROWS)
        self._mins = MinSegmentTree(_INITIAL_ROWS)
        self._row_slot = np.full(_INITIAL_ROWS, -1, dtype=np.int64)
        self._max_priority = 1.0
        self._count_key: tuple[int, int] | None = None
        self._counts = (0, 0.0)

    # Priorities in tree space.

    def _transform(self, priorities: np.ndarray) -> np.ndarray:
        values = np.abs(priorities) + self.epsilon
        return values if self.alpha == 1.0 else values**self.alpha

    def _new_priority(self) -> float:
        if self.initial_priority is not None:
            return float(self._transform(np.asarray(self.initial_priority)))
        return self._max_priority

    @property
    def beta(self) -> float | Schedule:
        """The importance-sampling exponent: a number, or a schedule read at every sample."""
        return self._schedule if self._schedule is not None else self._beta

    @beta.setter
    def beta(self, beta: float | Schedule) -> None:
        if isinstance(beta, Schedule):
            self._schedule: Schedule | None = beta
            self._beta = 0.0
        else:
            self._schedule = None
            self._beta = _number("beta", beta, 0.0)

    def current_beta(self) -> float:
        """The importance-sampling exponent in effect (a schedule's current value)."""
        return self._beta if self._schedule is None else float(self._schedule.value)

    def priorities(self, slot: int) -> np.ndarray:
        """The stored priorities ``(|p| + epsilon) ** alpha`` of every transition of ``slot``."""
        start, length = int(self.index.starts[slot]), int(self.index.lengths[slot])
        return self._sums.leaves[start : start + length].copy()

    # Rows.

    def _ensure_rows(self, rows: int) -> None:
        if rows <= self._sums.capacity:
            return
        capacity = next_power_of_two(rows)
        self._sums.grow(capacity)
        self._mins.grow(capacity)
        grown = np.full(capacity, -1, dtype=np.int64)
        grown[: len(self._row_slot)] = self._row_slot
        self._row_slot = grown

    def _set_episode(self, slot: int, priorities: np.ndarray | float) -> None:
        start, length = int(self.index.starts[slot]), int(self.index.lengths[slot])
        self._ensure_rows(start + length + 1)
        values = np.empty(length + 1, dtype=np.float64)
        values[:length] = priorities
        values[length] = 0.0  # the final observation's row starts no window
        self._sums.set_range(start, values)
        values[length] = np.inf
        self._mins.set_range(start, values)

    # Episode events.

    def attach(self, index: EpisodeIndex) -> None:
        super().attach(index)
        self.clear()

    def track(self, *, slot: int, identity: int) -> None:
        self._set_episode(slot, self._new_priority())
        start, length = int(self.index.starts[slot]), int(self.index.lengths[slot])
        self._row_slot[start : start + length + 1] = slot

    def forget(self, *, slot: int, identity: int) -> None:
        start, length = int(self.index.starts[slot]), int(self.index.lengths[slot])
        self._sums.set_range(start, np.zeros(length + 1))
        self._mins.set_range(start, np.full(length + 1, np.inf))
        self._row_slot[start : start + length + 1] = -1

    def clear(self) -> None:
        self._sums.clear()
        self._mins.clear()
        self._row_slot.fill(-1)
        self._max_priority = 1.0
        self._count_key = None

    def relocated(self, moves: list[tuple[int, int, int]]) -> None:
        """Moves the priorities of relocated episodes to their new rows."""
        if moves:
            old_starts, new_starts, rows = np.asarray(moves, dtype=np.int64).reshape(-1, 3).T
            old_rows, new_rows = _ranges(old_starts, rows), _ranges(new_starts, rows)
            needed = int((new_starts + rows).max())
        else:
            old_rows = new_rows = np.zeros(0, dtype=np.int64)
            needed = 0
        capacity = max(self._sums.capacity, next_power_of_two(needed))
        for tree in (self._sums, self._mins):
            leaves = np.full(capacity, tree.neutral)
            leaves[new_rows] = tree.leaves[old_rows]
            if capacity > tree.capacity:
                tree.grow(capacity)
            tree.load(leaves)
        self._row_slot = np.full(capacity, -1, dtype=np.int64)
        slots = self.index.live_slots()
        rows = self.index.lengths[slots] + 1
        self._row_slot[_ranges(self.index.starts[slots], rows)] = np.repeat(slots, rows)

    # Sampling.

    def _window_counts(self, sequence_length: int) -> tuple[int, float]:
        """Windows of ``sequence_length`` held, and the share of transitions that start none."""
        key = (self.index.version, sequence_length)
        if key != self._count_key:
            windows = int(self.windows_per_episode(sequence_length).sum())
            transitions = int(self.index.lengths[self.index.live].sum())
            self._counts = (windows, 1.0 - windows / transitions if transitions else 1.0)
            self._count_key = key
        return self._counts

    def _locate(
        self, rows: np.ndarray, sequence_length: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slots and offsets of drawn rows, and which rows start a window that fits."""
        slots = self._row_slot[rows]
        offsets = rows - self.index.starts[slots]
        valid = (slots >= 0) & (offsets <= self.index.lengths[slots] - sequence_length)
        return slots, offsets, valid

    def sample(self, count: int, sequence_length: int, rng: np.random.Generator) -> SampledWindows:
        windows, invalid_share = self._window_counts(sequence_length)
        if windows == 0:
            raise self.no_windows_error(sequence_length)
        rows = self._draw(count, sequence_length, rng, invalid_share)
        slots, offsets, _ = self._locate(rows, sequence_length)
        beta = self.current_beta()
        if beta == 0.0:
            weights = np.ones(count, dtype=np.float64)
        else:
            weights = (self._sums[rows] / self._mins.min()) ** -beta
        return SampledWindows(slots=slots, offsets=offsets, weights=weights)

    def _draw(
        self, count: int, sequence_length: int, rng: np.random.Generator, invalid_share: float
    ) -> np.ndarray:
        if invalid_share == 0.0:  # single steps: every drawn row of positive priority is valid
            rows = self._sums.find_prefix_sum(rng.random(count) * self._sums.total())
            _, _, valid = self._locate(rows, sequence_length)
            if valid.all():
                return rows
            chosen = [rows[valid]]
        else:
            chosen = []
        # Rejection: draw a margin for the expected share of invalid draws, keep the valid ones.
        margin = min(invalid_share / max(1.0 - invalid_share, 1e-3), 16.0)
        needed = count - sum(len(c) for c in chosen)
        for _ in range(_REJECTION_ROUNDS):
            draws = needed + int(needed * margin * 1.5) + (4 if margin else 0)
            rows = self._sums.find_prefix_sum(rng.random(draws) * self._sums.total())
            _, _, valid = self._locate(rows, sequence_length)
            kept = rows[valid][:needed]
            chosen.append(kept)
            needed -= len(kept)
            if needed == 0:
                return np.concatenate(chosen)
        chosen.append(self._draw_masked(needed, sequence_length, rng))
        return np.concatenate(chosen)

    def _draw_masked(
        self, count: int, sequence_length: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Draws with the rows that start no window zeroed for the draw (exact, slower)."""
        index = self.index
        slots = index.live_slots()
        lengths = index.lengths[slots]
        windows = np.maximum(lengths - sequence_length + 1, 0)
        masked = _ranges(index.starts[slots] + windows, lengths - windows)
        saved = self._sums[masked]
        self._sums.update(masked, 0.0)
        try:
            total = self._sums.total()
            if total <= 0.0:
                raise SamplingError(
                    f"every window of {sequence_length} transitions has priority 0; priorities "
                    "underflowed — use a smaller alpha or a larger epsilon"
                )
            rows = self._sums.find_prefix_sum(rng.random(count) * total)
            # Rounding at a subtree's edge can still end on a masked row (vanishingly rare): give
            # those draws the first row of positive priority, which now starts a valid window.
            _, _, valid = self._locate(rows, sequence_length)
            if not valid.all():
                rows[~valid] = np.flatnonzero(self._sums.leaves > 0.0)[0]
        finally:
            self._sums.update(masked, saved)
        return rows

    def update_priorities(
        self, slots: np.ndarray, offsets: np.ndarray, priorities: np.ndarray
    ) -> None:
        """Sets the priorities of windows, typically the last sample's, from new TD errors.

        Stores ``(|p| + epsilon) ** alpha``. Windows of episodes that left the table since they
        were sampled are skipped. When a window appears twice, one of its values is kept.

        Raises:
            SamplingError: If a priority is not finite, or the arrays differ in length.
        """
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if not len(slots) == len(offsets) == len(priorities):
            raise SamplingError(
                f"update_priorities needs one priority per window; got {len(slots)} slots, "
                f"{len(offsets)} offsets and {len(priorities)} priorities"
            )
        if len(priorities) == 0:
            return
        values = self._transform(priorities)
        largest = float(values.max())  # NaN and inf propagate to the maximum
        if not math.isfinite(largest):
            bad = priorities[~np.isfinite(values)][0]
            raise SamplingError(
                f"priorities must be finite numbers; got {bad} — check the loss for NaN or inf"
            )
        index = self.index
        current = (offsets >= 0) & (offsets < index.lengths[slots]) & index.live[slots]
        if not current.all():
            slots, offsets, values = slots[current], offsets[current], values[current]
            if len(values) == 0:
                return
            largest = float(values.max())
        update_trees((self._sums, self._mins), index.starts[slots] + offsets, values)
        self._max_priority = max(self._max_priority, largest)

    # State.

    def state(self) -> dict[str, Any]:
        """Stored priorities per episode identity (JSON-compatible), and ``alpha``."""
        index = self.index
        return {
            "alpha": self.alpha,
            "max_priority": self._max_priority,
            "priorities": {
                str(int(index.ids[slot])): self.priorities(int(slot)).tolist()
                for slot in index.live_slots()
            },
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state` onto the held episodes.

        Episodes not in ``state``, or whose length changed, keep their current priorities.
        Priorities saved under another ``alpha`` are converted to this one.
        """
        saved_alpha = float(state.get("alpha", self.alpha))
        convert = saved_alpha != self.alpha and saved_alpha > 0.0
        slot_of = self.index.slot_of
        for key, values in state.get("priorities", {}).items():
            slot = slot_of.get(int(key))
            if slot is None:
                continue
            values = np.asarray(values, dtype=np.float64)
            if len(values) != self.index.lengths[slot]:
                continue
            if convert:
                values = values ** (self.alpha / saved_alpha)
            self._set_episode(slot, values)
        if "max_priority" in state:
            maximum = float(state["max_priority"])
            self._max_priority = maximum ** (self.alpha / saved_alpha) if convert else maximum


__all__ = ["PrioritizedSampleStrategy", "Schedule"]
