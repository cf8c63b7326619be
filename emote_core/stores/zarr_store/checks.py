"""Per-episode checks of stored rows: each episode's crc32 over its bytes in every column, and
its row of the episode table against the table's own checksum.

Readers (loading, bulk loading, following) and ``verify`` check episodes through here.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from emote_core.stores.zarr_store.acceleration import FAST_CRC32, crc32
from emote_core.stores.zarr_store.layout import (
    TABLE_CHECKSUM,
    RowKind,
    StoreColumn,
    table_checksums,
)


def episode_rows(
    rows: str, table: dict[str, np.ndarray], indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, stops)`` of episodes ``indices`` in a column holding ``rows`` per episode."""
    lengths = table["length"][indices].astype(np.int64)
    if rows == RowKind.EPISODE:
        return indices, indices + 1
    if rows == RowKind.OBSERVATIONS:
        starts = table["offset"][indices, 1] if len(indices) else np.zeros(0, dtype=np.int64)
        return starts, starts + lengths + 1
    starts = table["offset"][indices, 0] if len(indices) else np.zeros(0, dtype=np.int64)
    return starts, starts + lengths


class EpisodeChecks:
    """Which of episodes ``indices`` have unreadable rows, data that does not match their
    checksum, or a row of the episode table (id, offsets, length, end state, return) that does
    not match the table's checksum (where the shard has one): :meth:`all_damaged` answers for
    every episode at once; :meth:`checksums` of a few episodes at a time (on any thread), then
    :meth:`damaged`, give the same answer.

    Args:
        columns: The stored columns, in the store's order (the order checksums chain them in).
        table: The shard's committed episode table (or a run of its rows).
        data: Each column's rows and unreadable-row mask (:func:`read_rows`; ``None`` when
            every row was read).
        indices: The episodes to check.
        row_base: Per column, the row of the column that ``data``'s first row is (0 when
            ``data`` starts at the column's first row).
        row_starts: Per column, the row of ``data`` each episode's rows start at, where they
            are not laid out as in the column (scattered to their places in a table).
    """

    def __init__(
        self,
        columns: list[StoreColumn],
        table: dict[str, np.ndarray],
        data: Mapping[str, tuple[np.ndarray, np.ndarray | None]],
        indices: np.ndarray,
        *,
        row_base: Mapping[str, int] | None = None,
        row_starts: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self._table, self._indices = table, np.asarray(indices)
        self.unreadable = np.zeros(len(indices), dtype=bool)
        """Episodes with rows outside their column's data or marked unreadable."""
        self._pieces: list[tuple[Any, list[int], list[int]]] = []
        self.nbytes = 0
        """The bytes of data the checks read."""
        for column in columns:  # in the store's order: each episode's checksum chains them
            values, bad = data[column.name]
            starts, stops, base = _rows_in_data(column, table, self._indices, row_base, row_starts)
            starts, stops = starts - base, stops - base
            outside = (starts < 0) | (stops > len(values))
            if bad is not None and bad.any():  # an unreadable row among an episode's?
                rows = np.flatnonzero(bad)  # (no array the size of the column: fresh memory
                # costs, and this runs once per column in verify)
                outside |= np.searchsorted(rows, starts) < np.searchsorted(rows, stops)
            self.unreadable |= outside
            self.nbytes += values.nbytes
            if values.flags.c_contiguous:  # byte ranges of one flat view: no array per episode
                row = values.dtype.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
                source: Any = memoryview(values.reshape(-1).view(np.uint8))
                starts, stops = starts * row, stops * row
            else:
                source = values
            self._pieces.append((source, starts.tolist(), stops.tolist()))

    def all_damaged(self) -> np.ndarray:
        """Which of the episodes are damaged, every one checked."""
        count = len(self._indices)
        parts = 1 if FAST_CRC32 else min(count, os.cpu_count() or 1, 4)
        if parts > 1 and self.nbytes > PARALLEL_CHECKSUM_BYTES:
            from concurrent.futures import ThreadPoolExecutor

            # zlib's crc32 lets go of the GIL: spread the episodes over threads
            bounds = np.linspace(0, count, parts + 1).astype(int).tolist()
            with ThreadPoolExecutor(parts) as pool:
                found = list(pool.map(lambda b: self.checksums(*b), itertools.pairwise(bounds)))
            return self.damaged(np.concatenate(found))
        return self.damaged(self.checksums(0, count))

    def checksums(self, low: int, high: int) -> np.ndarray:
        """The crc32 of episodes ``low:high`` (positions in ``indices``), chained over the
        columns; 0 for unreadable episodes."""
        skip = self.unreadable[low:high].tolist()
        found = [0] * (high - low)
        for source, starts, stops in self._pieces:
            flat = isinstance(source, memoryview)
            for j, (start, stop) in enumerate(zip(starts[low:high], stops[low:high], strict=True)):
                if skip[j]:
                    continue
                rows = source[start:stop] if flat else np.ascontiguousarray(source[start:stop])
                found[j] = crc32(rows, found[j])
        return np.array(found, dtype=np.uint32)

    def damaged(self, checksums: np.ndarray) -> np.ndarray:
        """Which episodes are damaged, given every episode's :meth:`checksums` in order."""
        table, indices = self._table, self._indices
        damaged = self.unreadable | (checksums != table["checksum"][indices])
        if TABLE_CHECKSUM in table:
            expected = table[TABLE_CHECKSUM]
            inside = indices < len(expected)
            damaged[~inside] = True  # committed rows the checksum array does not reach
            damaged[inside] |= table_checksums(table, indices[inside]) != expected[indices[inside]]
        return damaged


def _rows_in_data(
    column: StoreColumn,
    table: dict[str, np.ndarray],
    indices: np.ndarray,
    row_base: Mapping[str, int] | None,
    row_starts: Mapping[str, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(starts, stops, base)``: where the episodes' rows of ``column`` are in its data."""
    starts, stops = episode_rows(column.rows, table, indices)
    if row_starts is not None and column.name in row_starts:
        at = np.asarray(row_starts[column.name], dtype=np.int64)
        return at, at + (stops - starts), 0
    return starts, stops, (row_base or {}).get(column.name, 0)


PARALLEL_CHECKSUM_BYTES = 16 << 20
"""Above this many bytes, zlib's crc32 (without zlib-ng) runs on several threads."""


__all__ = ["PARALLEL_CHECKSUM_BYTES", "EpisodeChecks", "episode_rows"]
