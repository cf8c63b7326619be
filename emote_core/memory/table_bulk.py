"""Filling an empty :class:`~emote_core.memory.table.ArrayMemoryTable` with many episodes at
once, their rows written straight into the table's arrays (loading a store decodes each column
once, in place, instead of handing episodes to :meth:`add_sequence` one by one).

The table's storage and episode bookkeeping live in ``table.py``; this mixin writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from emote_core.errors import MemoryTableError, SchemaError
from emote_core.memory.table_sampling import synchronized
from emote_core.utils.arrays import aligned_empty

BlockWriter = Callable[[dict[str, np.ndarray], np.ndarray], None]
"""``write(destinations, starts)``: fills, per stored column, the rows of a block laid out as
the table lays out episodes (episode ``j`` from row ``starts[j]``, ``N + 1`` rows apart).
The destinations may be fresh memory: a writer that decodes on several threads faults their
pages in first (see ``emote_core.stores.zarr_store.bulk``)."""


def block_starts(lengths: np.ndarray) -> np.ndarray:
    """The first row of each episode of a block: episodes back to back, ``N + 1`` rows each
    (the table keeps a row after each episode's transitions for its final observation)."""
    rows = np.asarray(lengths, dtype=np.int64) + 1
    return np.cumsum(rows) - rows


class TableBulkFill:
    """The bulk-fill half of :class:`~emote_core.memory.table.ArrayMemoryTable`."""

    @synchronized
    def fill_empty(
        self,
        *,
        identities: np.ndarray,
        lengths: np.ndarray,
        terminal: np.ndarray,
        extra_rows: Mapping[str, int],
        tags: Mapping[str, np.ndarray],
        write: BlockWriter,
    ) -> None:
        """Fills the empty table with episodes, oldest first, whose rows ``write`` puts in place.

        The table ends as if each episode had been added with :meth:`add_sequence` in order.
        On the CPU ``write`` gets views of the table's own arrays; on a GPU, host arrays that
        are then copied to the device in one transfer per column.

        Args:
            identities: Unique int64 episode ids.
            lengths: Transitions per episode (each at least 1; together at most ``maxlen``).
            terminal: Whether each episode ended TERMINAL (else INTERRUPTED).
            extra_rows: Per stored column, 0 for ``N`` rows per episode, 1 for ``N + 1``.
            tags: Per tag column, one value per episode.
            write: Writes the stored columns (see :data:`BlockWriter`).

        Raises:
            MemoryTableError: The table holds episodes.
            SchemaError: The block breaks the table's rules (the table stays empty).
        """
        table: Any = self
        if table.episode_count:
            raise MemoryTableError("fill_empty needs an empty table; clear() it first")
        identities = np.asarray(identities, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        _check_block(table, identities, lengths, extra_rows, tags)
        starts = block_starts(lengths)
        rows = int(starts[-1] + lengths[-1] + 1) if len(lengths) else 0
        if rows > table._allocator.capacity:
            table._compact(extra_rows=rows)
        arrays = table._arrays
        destinations = {
            name: array.host[:rows]
            if array.host is not None
            else aligned_empty((rows, *array.shape), array.dtype)
            for name, array in arrays.items()
        }
        try:
            write(destinations, starts)
            for name, array in arrays.items():
                if array.host is None:
                    array.write(0, destinations[name])
        except BaseException:
            table.clear()
            raise
        table.schema.extra_rows.update(extra_rows)
        index = table.index
        index.clear()  # slots 0, 1, 2, ... as add_sequence hands them out (the sampler's
        # draws go by slot: other slots would give other batches)
        slots = index.add_block(identities, starts, lengths, np.asarray(terminal, dtype=bool))
        table._sync_tag_capacity()
        for name, values in tags.items():
            table._tag_values[name][slots] = values
        table._allocator.commit_block(slots, starts, lengths + 1)
        table.sampler.track_block(slots, identities)
        table.ejector.track_block(slots, identities)
        table._size = int(lengths.sum())


def _check_block(
    table: Any,
    identities: np.ndarray,
    lengths: np.ndarray,
    extra_rows: Mapping[str, int],
    tags: Mapping[str, np.ndarray],
) -> None:
    """The checks :meth:`add_sequence` applies to each episode, on the whole block."""
    count = len(identities)
    if len(lengths) != count or len(np.unique(identities)) != count:
        raise SchemaError(f"a block of {count} episodes needs as many lengths and unique ids")
    if count and (lengths.min() < 1 or lengths.sum() > table.maxlen):
        raise SchemaError(
            f"a block's episodes need 1 or more transitions each and at most maxlen "
            f"{table.maxlen} in all; got {int(lengths.min())}..{int(lengths.max())}, "
            f"{int(lengths.sum())} in all"
        )
    stored = {column.name for column in table.stored}
    if set(extra_rows) != stored or any(extra not in (0, 1) for extra in extra_rows.values()):
        raise SchemaError(f"a block gives rows {dict(extra_rows)}; stored columns are {stored}")
    for column in table.virtual:
        if column.mapper.needs_target and (
            extra_rows[column.target_name] < column.mapper.target_extra_rows
        ):
            raise SchemaError(
                f"virtual column '{column.name}' reads the row after each transition of "
                f"'{column.target_name}', which a block gives N rows of"
            )
    missing = {column.name for column in table.tags} - set(tags)
    if missing or any(len(tags[name]) != count for name in tags):
        raise SchemaError(f"a block needs one value per episode of tag columns {missing}")


__all__ = ["BlockWriter", "TableBulkFill", "block_starts"]
