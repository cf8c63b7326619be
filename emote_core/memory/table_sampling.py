"""How an :class:`~emote_core.memory.table.ArrayMemoryTable` is sampled: windows chosen by its
sample strategy, gathered from its columns, passed through its adaptors; and the feedback of
prioritized strategies (the most recent sample's windows and their new priorities).

The table's storage and episode bookkeeping live in ``table.py``; this mixin reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from emote_core.errors import SamplingError
from emote_core.memory.mappers import SampleContext
from emote_core.memory.strategies.base import SampledWindows

IMPORTANCE_WEIGHTS_KEY = "importance_weights"
"""The batch key of prioritized sampling's importance weights, one per step: ``(count * L, 1)``."""

_Method = TypeVar("_Method", bound=Callable[..., Any])


def synchronized(method: _Method) -> _Method:
    """Runs a table method under the table's lock (collector threads add while trainers sample)."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class TableSampling:
    """The sampling half of :class:`~emote_core.memory.table.ArrayMemoryTable`."""

    # Sampling.

    @synchronized
    def sample(self, count: int, sequence_length: int) -> dict[str, Any]:
        """Samples ``count`` windows of ``sequence_length`` transitions each.

        Returns:
            Per-step columns with ``count * sequence_length`` rows (window-major), per-window
            columns (tags, only-last) with ``count`` rows, and prioritized strategies'
            ``importance_weights``; then transformed by the table's adaptors.

        Raises:
            SamplingError: The table is empty or no episode is long enough; the table is unchanged.
        """
        if count < 1 or sequence_length < 1:
            raise SamplingError(
                f"count and sequence_length must be at least 1; got {count} and {sequence_length}"
            )
        windows = self.sampler.sample(count, sequence_length, self.rng)
        return self._gather(windows, sequence_length)

    @synchronized
    def sample_by_index(
        self, identities: Sequence[int] | np.ndarray, offsets: Sequence[int] | np.ndarray,
        sequence_length: int,
    ) -> dict[str, Any]:  # fmt: skip
        """Returns the windows starting at ``offsets`` of the episodes ``identities``.

        Raises:
            SamplingError: An identity is not held, or a window does not fit in its episode.
        """
        identities = np.asarray(identities, dtype=np.int64).reshape(-1)
        offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
        if len(identities) != len(offsets) or len(identities) == 0:
            raise SamplingError(
                f"sample_by_index needs as many offsets as identities (at least one); got "
                f"{len(identities)} identities and {len(offsets)} offsets"
            )
        unknown = [int(i) for i in identities if int(i) not in self.index.slot_of]
        if unknown:
            raise SamplingError(f"episodes {unknown[:10]} are not in the table")
        slots = np.array([self.index.slot_of[int(i)] for i in identities], dtype=np.int64)
        lengths = self.index.lengths[slots]
        bad = (offsets < 0) | (offsets + sequence_length > lengths)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise SamplingError(
                f"a window of {sequence_length} at offset {int(offsets[k])} does not fit episode "
                f"{int(identities[k])} of {int(lengths[k])} transitions"
            )
        return self._gather(SampledWindows(slots=slots, offsets=offsets), sequence_length)

    @synchronized
    def sample_all(self) -> dict[str, Any]:
        """Every transition held, episode by episode in insertion order, as one batch."""
        if self._size == 0:
            raise SamplingError("cannot sample an empty memory table; add episodes first")
        slots, offsets = self._all_windows(1)
        return self._gather(SampledWindows(slots=slots, offsets=offsets), 1)

    def mini_batches(
        self, count: int, sequence_length: int = 1, *, shuffle: bool = True
    ) -> Iterator[dict[str, Any]]:
        """One pass over every non-overlapping window, ``count`` windows per batch.

        The last batch may be smaller. For on-policy consumers (several epochs over the data);
        the windows are fixed when iteration starts, so do not add episodes until it ends.
        """
        slots, offsets = self._all_windows(sequence_length)
        if len(slots) == 0:
            raise SamplingError(
                f"no episode holds a window of {sequence_length} transitions; nothing to iterate"
            )
        order = self.rng.permutation(len(slots)) if shuffle else np.arange(len(slots))
        for first in range(0, len(order), count):
            chosen = order[first : first + count]
            windows = SampledWindows(slots=slots[chosen], offsets=offsets[chosen])
            with self._lock:
                batch = self._gather(windows, sequence_length)
            yield batch

    def _all_windows(self, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
        slots = self.live_slots_in_order()
        per_episode = self.index.lengths[slots] // sequence_length
        repeated = np.repeat(slots, per_episode)
        firsts = np.cumsum(per_episode) - per_episode
        within = np.arange(len(repeated)) - np.repeat(firsts, per_episode)
        return repeated, within * sequence_length

    def live_slots_in_order(self) -> np.ndarray:
        """Held slots, in the order their episodes were added."""
        return np.array(self._allocator.slots_in_order(), dtype=np.int64)

    def _gather(self, windows: SampledWindows, sequence_length: int) -> dict[str, Any]:
        index = self.index
        slots = windows.slots
        context = SampleContext(
            slots=slots,
            offsets=windows.offsets,
            sequence_length=sequence_length,
            starts=index.starts[slots],
            lengths=index.lengths[slots],
            terminal=index.terminal[slots],
            device=self.device,
        )
        batch: dict[str, Any] = {}
        for column in self.sampled:
            batch[column.name] = self._arrays[column.name].gather(context.rows, context.device_rows)
        for column in self.tags:
            batch[column.name] = context.to_device(self._tag_values[column.name][slots])
        for column in self.virtual:
            target = self._arrays.get(column.target_name)
            batch[column.name] = column.mapper.map(context, target, column.shape, column.dtype)
        if windows.weights is not None:
            weights = np.repeat(windows.weights.astype(np.float32), sequence_length)
            batch[IMPORTANCE_WEIGHTS_KEY] = context.to_device(weights.reshape(-1, 1))
        self._last_sample = windows
        self._last_identities = index.ids[slots]  # fancy indexing: already a copy
        self._last_sequence_length = sequence_length
        for adaptor in self.adaptors:
            batch = adaptor(batch, len(slots), sequence_length)
        return batch

    @property
    def last_sample_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """``(episode identities, window offsets)`` of the most recent sample."""
        if self._last_sample is None:
            raise SamplingError("the table has not been sampled yet")
        return self._last_identities.copy(), self._last_sample.offsets.copy()

    @synchronized
    def update_priorities(self, priorities: np.ndarray | torch.Tensor) -> None:
        """Sets the priorities of the windows of the most recent sample (prioritized tables).

        Args:
            priorities: One value per sampled window, or one per sampled step (the window's
                maximum is used).
        """
        if self._last_sample is None:
            raise SamplingError("update_priorities needs a sample first")
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu().numpy()
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
        count = len(self._last_sample.slots)
        if len(values) == count * self._last_sequence_length and self._last_sequence_length > 1:
            values = values.reshape(count, -1).max(axis=1)
        if len(values) != count:
            raise SamplingError(
                f"update_priorities got {len(values)} values for a sample of {count} windows"
            )
        # Episodes may have been ejected (and their slots reused) since the sample: skip those.
        slots = self._last_sample.slots
        current = self.index.live[slots] & (self.index.ids[slots] == self._last_identities)
        self.sampler.update_priorities(
            slots[current], self._last_sample.offsets[current], values[current]
        )

    @property
    def prioritized(self) -> bool:
        """Whether the sample strategy keeps priorities fed back by :meth:`update_priorities`."""
        return self.sampler.has_priorities
