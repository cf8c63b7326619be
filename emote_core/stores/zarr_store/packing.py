"""Episodes packed for one append to a shard: each column's rows joined, and the episode table's
fields (lengths, end states, returns, per-episode checksums) computed for the whole batch.

Collectors hand over many short episodes, so the work per episode is a few attribute checks: an
array that already has its column's dtype and rows is taken as it is, checksums and returns are
computed over the joined columns, and anything else goes through :func:`conform`, which says
what does not fit. An :class:`~emote_core.stores.episode_batch.EpisodeBatch` is checked column
by column instead (:meth:`PackedBatch.joined`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from emote_core.errors import SchemaError
from emote_core.stores.episode_batch import EpisodeBatch, segment_sums
from emote_core.stores.stored import EpisodeRecord
from emote_core.stores.summary import reward_column
from emote_core.stores.zarr_store.layout import RowKind, StoreColumn
from emote_core.typing import EpisodeState

_ENDS = frozenset({EpisodeState.TERMINAL, EpisodeState.INTERRUPTED})
_END_CODES = np.array([int(state) for state in _ENDS], dtype=np.int8)


class PackedBatch:
    """A batch of episodes checked against the store's columns and packed for writing.

    Attributes:
        columns: Column name -> the batch's rows of it, episode after episode.
        identities, lengths, end_states, returns, checksums: Per-episode fields (``returns``
            sums the reward column in float64; NaN without one; ``checksums`` is the CRC-32 of
            the episode's bytes, column after column).
        step_offsets: Each episode's first transition within the batch.

    Raises:
        SchemaError: If an episode does not end TERMINAL or INTERRUPTED, or a column is missing
            or has another shape or an incompatible dtype.
    """

    def __init__(
        self, columns: Sequence[StoreColumn], length_key: str, episodes: Sequence[EpisodeRecord]
    ) -> None:
        count = len(episodes)
        self.identities = np.empty(count, dtype=np.int64)
        self.lengths = np.empty(count, dtype=np.int64)
        self.end_states = np.empty(count, dtype=np.int8)
        parts: dict[str, list[np.ndarray]] = {c.name: [] for c in columns}
        reward = reward_column({c.name for c in columns})
        # The returns are summed from the joined column when every episode's rewards are
        # stored as given (no cast): the same float64 sums as one np.sum per episode.
        raw_rewards: list[Any] = []
        rewards_as_given = reward is not None
        plain = [(c, parts[c.name], c.schema.dtype, c.schema.shape, c.extra_rows) for c in columns]
        for k, (identity, data, end_state) in enumerate(episodes):
            if end_state not in _ENDS:
                raise SchemaError(f"episode {identity} ends {EpisodeState(end_state).name}")
            if length_key not in data:
                raise SchemaError(f"episode {identity} has no '{length_key}' column")
            length = len(data[length_key])
            for column, part, dtype, shape, extra in plain:
                value = data.get(column.name)
                array = None
                if type(value) is np.ndarray and value.dtype == dtype:
                    if value.shape[1:] == shape and len(value) == length + extra:
                        array = value
                    elif shape == (1,) and value.shape == (length + extra,):
                        array = value.reshape(-1, 1)
                if array is None or column.rows == RowKind.EPISODE:
                    array = conform(identity, column, value, length)
                    if column.name == reward:
                        rewards_as_given = (
                            rewards_as_given and getattr(value, "dtype", None) == dtype
                        )
                part.append(array)
            if reward is not None:
                raw_rewards.append(data[reward])
            self.identities[k] = identity
            self.lengths[k] = length
            self.end_states[k] = int(end_state)
        self.columns = {name: np.concatenate(arrays) for name, arrays in parts.items()}
        returns = None
        if reward is not None and not (
            rewards_as_given and self.columns[reward].size == int(self.lengths.sum())
        ):
            returns = np.array([float(np.sum(r, dtype=np.float64)) for r in raw_rewards])
        self._derive(columns, reward, returns)

    @classmethod
    def joined(
        cls, columns: Sequence[StoreColumn], length_key: str, batch: EpisodeBatch
    ) -> PackedBatch | None:
        """``batch`` packed as it is: ``None`` unless every column of the store is there with
        its rows per episode and its shape, in a dtype that casts to the store's, and every
        episode ends TERMINAL or INTERRUPTED (the episode-by-episode packing then says what is
        wrong)."""
        count = len(batch)
        if length_key not in batch.columns or not np.isin(batch.end_states, _END_CODES).all():
            return None
        packed = {}
        for column in columns:
            rows, schema = batch.columns.get(column.name), column.schema
            if (
                column.rows == RowKind.EPISODE
                or type(rows) is not np.ndarray
                or batch.extra_rows.get(column.name) != column.extra_rows
                or len(rows) != int(batch.lengths.sum()) + column.extra_rows * count
                or not np.can_cast(rows.dtype, schema.dtype, casting="same_kind")
            ):
                return None
            if rows.shape[1:] != schema.shape:
                if not (rows.ndim == 1 and schema.shape == (1,)):
                    return None
                rows = rows.reshape(-1, 1)
            packed[column.name] = np.ascontiguousarray(rows, dtype=schema.dtype)
        self = cls.__new__(cls)
        self.identities = batch.identities.astype(np.int64, copy=False)
        self.lengths = batch.lengths.astype(np.int64, copy=False)
        self.end_states = batch.end_states.astype(np.int8, copy=False)
        self.columns = packed
        self._derive(columns, reward_column(set(packed)))
        return self

    def __len__(self) -> int:
        return len(self.lengths)

    def _derive(
        self, columns: Sequence[StoreColumn], reward: str | None, returns: np.ndarray | None = None
    ) -> None:
        """The step offsets, checksums and returns (summed from the packed rows unless given)
        of the packed episodes."""
        count = len(self.lengths)
        self.step_offsets = np.cumsum(self.lengths) - self.lengths
        self.checksums = self._checksums(columns, count)
        if reward is None:
            self.returns = np.full(count, np.nan)
        elif returns is None:
            self.returns = segment_sums(self.columns[reward].reshape(-1), self.lengths)
        else:
            self.returns = returns

    def _checksums(self, columns: Sequence[StoreColumn], count: int) -> np.ndarray:
        """Each episode's CRC-32 over its rows of every column in turn (the bytes as stored)."""
        spans = []
        for column in columns:
            joined = self.columns[column.name]
            row_bytes = joined.itemsize * int(np.prod(joined.shape[1:], dtype=np.int64))
            if column.rows == RowKind.EPISODE:
                rows = np.ones(count, dtype=np.int64)
            else:
                rows = self.lengths + column.extra_rows
            ends = np.cumsum(rows) * row_bytes
            spans.append((memoryview(joined).cast("B"), (ends - rows * row_bytes).tolist(),
                          ends.tolist()))  # fmt: skip
        checksums = np.empty(count, dtype=np.uint32)
        for k in range(count):
            checksum = 0
            for view, starts, ends in spans:
                checksum = zlib.crc32(view[starts[k] : ends[k]], checksum)
            checksums[k] = checksum
        return checksums


def conform(identity: int, column: StoreColumn, value: Any, length: int) -> np.ndarray:
    """``value`` as column ``column`` stores it for an episode of ``length`` transitions.

    Raises:
        SchemaError: If it is missing, or has another shape or an incompatible dtype.
    """
    schema = column.schema
    if value is None:
        raise SchemaError(f"episode {identity} has no '{schema.name}' column")
    array = np.asarray(value)
    if column.rows == RowKind.EPISODE:
        array = array.reshape(1, *schema.shape) if array.size == np.prod(schema.shape) else array
        expected_rows = 1
    else:
        if array.ndim == 1 and schema.shape == (1,):
            array = array.reshape(-1, 1)
        expected_rows = length + column.extra_rows
    if array.shape != (expected_rows, *schema.shape):
        raise SchemaError(
            f"column '{schema.name}' of episode {identity} has shape {array.shape}; the store "
            f"expects {(expected_rows, *schema.shape)} for {length} transitions"
        )
    if not np.can_cast(array.dtype, schema.dtype, casting="same_kind"):
        raise SchemaError(
            f"column '{schema.name}' of episode {identity} has dtype {array.dtype}; the store "
            f"holds {schema.dtype}"
        )
    return np.ascontiguousarray(array, dtype=schema.dtype)


__all__ = ["PackedBatch", "conform"]
