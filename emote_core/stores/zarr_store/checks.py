"""Per-episode checks of stored rows: each episode's crc32 over its bytes in every column, and
its row of the episode table against the table's own checksum.

Readers (loading, bulk loading, following) and ``verify`` check episodes through here.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping

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


def damaged_episodes(
    columns: list[StoreColumn],
    table: dict[str, np.ndarray],
    data: Mapping[str, tuple[np.ndarray, np.ndarray | None]],
    indices: np.ndarray,
    *,
    row_base: Mapping[str, int] | None = None,
    row_starts: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Which of episodes ``indices`` have unreadable rows, data that does not match their
    checksum, or a row of the episode table (id, offsets, length, end state, return) that does
    not match the table's checksum (where the shard has one).

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
    rows = [
        (data[c.name], *_rows_in_data(c, table, indices, row_base, row_starts)) for c in columns
    ]
    parts = 1 if FAST_CRC32 else min(len(indices), os.cpu_count() or 1, 4)
    if parts > 1 and sum(v.nbytes for (v, _), *_ in rows) > PARALLEL_CHECKSUM_BYTES:
        from concurrent.futures import ThreadPoolExecutor

        # zlib's crc32 lets go of the GIL: spread the episodes over threads
        bounds = np.linspace(0, len(indices), parts + 1).astype(int)
        with ThreadPoolExecutor(parts) as pool:
            found = list(
                pool.map(lambda b: _checksums(rows, slice(*b)), itertools.pairwise(bounds))
            )
        checksums = np.concatenate([f[0] for f in found])
        unreadable = np.concatenate([f[1] for f in found])
    else:
        checksums, unreadable = _checksums(rows, slice(0, len(indices)))
    damaged = unreadable | (checksums != table["checksum"][indices])
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


def _checksums(
    rows: list[tuple[tuple[np.ndarray, np.ndarray | None], np.ndarray, np.ndarray, int]],
    part: slice,
) -> tuple[np.ndarray, np.ndarray]:
    """crc32 of each episode of ``part`` chained over the columns, and which are unreadable."""
    count = len(range(*part.indices(len(rows[0][1])))) if rows else 0
    checksums = np.zeros(count, dtype=np.uint32)
    unreadable = np.zeros(count, dtype=bool)
    for (values, bad), starts, stops, base in rows:
        starts, stops = starts[part] - base, stops[part] - base
        found = checksums.tolist()
        contiguous = values.flags.c_contiguous
        if contiguous:  # slices of one flat view: no array per episode
            flat = memoryview(values.reshape(-1).view(np.uint8))
            row = values.dtype.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
        for j, (start, stop) in enumerate(zip(starts.tolist(), stops.tolist(), strict=True)):
            if unreadable[j]:
                continue
            if start < 0 or stop > len(values) or (bad is not None and bad[start:stop].any()):
                unreadable[j] = True
                continue
            if contiguous:
                found[j] = crc32(flat[start * row : stop * row], found[j])
            else:
                found[j] = crc32(np.ascontiguousarray(values[start:stop]), found[j])
        checksums = np.array(found, dtype=np.uint32)
    return checksums, unreadable


__all__ = ["PARALLEL_CHECKSUM_BYTES", "damaged_episodes", "episode_rows"]
