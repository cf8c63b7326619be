"""Loading stores into an empty table in bulk: each column of each shard decoded once, straight
into the table's arrays where the layouts agree, and every episode checked against its checksum.

Raw columns are read from their chunk files here (:class:`~.raw_chunks.RawColumnReader`), two
threads reading and checking parts while more read the files ahead into the page cache in large
pages: through zarr alone (zarrs too) a load takes more than twice ``np.load``'s time.

The fast path of :func:`~emote_core.stores.zarr_store.tables.load_table`. It gives exactly the
table that adding the episodes one by one gives; where it does not apply (a table that holds
episodes, columns that do not fit, damaged episodes, unreadable chunks) it steps aside, leaving
the table empty, and the episode-by-episode path reads the stores and says what is wrong.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from emote_core.errors import FormatError, MemoryTableError
from emote_core.stores.stored import check_schema
from emote_core.stores.zarr_store.acceleration import open_array, read_into
from emote_core.stores.zarr_store.checks import EpisodeChecks, episode_rows
from emote_core.stores.zarr_store.layout import COLUMNS, RowKind, StoreColumn
from emote_core.stores.zarr_store.raw_chunks import RawChunkError, RawColumnReader, raw_files
from emote_core.stores.zarr_store.reader import MemoryStore, ShardView
from emote_core.typing import EpisodeState
from emote_core.utils.arrays import aligned_empty
from emote_core.utils.page_cache import needs_reading, read_ahead

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)


class _StepAside(Exception):
    """The bulk path does not apply; the episode-by-episode path reads (and reports)."""


def load_in_bulk(
    table: ArrayMemoryTable,
    stores: Sequence[MemoryStore],
    limits: Sequence[Mapping[str, int] | None],
    *,
    skip_damaged: bool,
) -> int | None:
    """Fills the empty ``table`` with the newest episodes of ``stores`` that fit it, as
    :func:`~emote_core.stores.zarr_store.tables.load_table` does.

    Returns:
        The episodes loaded, or ``None`` (the table left empty) where the bulk path does not
        apply or found damage: the caller then reads episode by episode.
    """
    if table.episode_count or not stores:
        return None
    try:
        plan = _plan(table, stores, limits, skip_damaged)
    except (_StepAside, FormatError) as why:
        log.debug("loading episode by episode: %s", why)
        return None
    picks, extra_rows = plan
    episode = picks[:, 2]
    lengths = _gathered(picks, lambda i, s: stores[i].shards[s].table["length"])
    ends = _gathered(picks, lambda i, s: stores[i].shards[s].table["end_state"])
    if np.any((ends != EpisodeState.TERMINAL) & (ends != EpisodeState.INTERRUPTED)):
        return None
    identities = _gathered(picks, lambda i, s: stores[i]._ids()[stores[i].shards[s].name])
    if len(np.unique(identities)) != len(identities):
        log.info(
            "episode ids repeat across stores or shards; renumbering them 0..%d", len(identities)
        )
        identities = np.arange(len(identities), dtype=np.int64)
    tags = {c.name: np.empty((len(picks), *c.shape), c.dtype) for c in table.tags}

    def write(destinations: dict[str, np.ndarray], starts: np.ndarray) -> None:
        for i, s, positions in _shard_groups(picks):
            _read_shard(
                stores[i], stores[i].shards[s], episode[positions], positions,
                starts, lengths, destinations, tags,
            )  # fmt: skip

    try:
        table.fill_empty(
            identities=identities,
            lengths=lengths,
            terminal=ends == EpisodeState.TERMINAL,
            extra_rows=extra_rows,
            tags=tags,
            write=write,
        )
    except (_StepAside, MemoryTableError) as why:
        log.debug("loading episode by episode: %s", why)
        return None
    except Exception as error:  # an unreadable chunk: the other path names it
        log.debug("loading episode by episode: %s: %s", type(error).__name__, error)
        return None
    return len(picks)


def _shard_groups(picks: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """``(store, shard, positions)``: which picks come from each shard, in pick order."""
    if not len(picks):
        return []
    key = picks[:, 0] * (int(picks[:, 1].max()) + 1) + picks[:, 1]
    keys, where = np.unique(key, return_inverse=True)
    order = np.argsort(where.reshape(-1), kind="stable")
    bounds = np.searchsorted(where.reshape(-1)[order], np.arange(len(keys) + 1))
    return [
        (int(picks[order[a], 0]), int(picks[order[a], 1]), order[a:b])
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
    ]


def _gathered(picks: np.ndarray, field: Any) -> np.ndarray:
    """``field(store, shard)[episode]`` of each pick as int64: one gather per shard."""
    result = np.zeros(len(picks), dtype=np.int64)
    for i, s, positions in _shard_groups(picks):
        result[positions] = np.asarray(field(i, s))[picks[positions, 2]]
    return result


def _plan(
    table: ArrayMemoryTable,
    stores: Sequence[MemoryStore],
    limits: Sequence[Mapping[str, int] | None],
    skip_damaged: bool,
) -> tuple[np.ndarray, dict[str, int]]:
    """The ``(store, shard, episode)`` picks, oldest first, and the rows per stored column."""
    extra_rows: dict[str, int] = {}
    for store in stores:
        if store.length_key != table.length_key or (store.damaged_shards and not skip_damaged):
            raise _StepAside("length keys differ or shards are damaged")
        check_schema(table, store.schemas(), source=store.url)
        kinds = {column.name: column.rows for column in store.columns}
        for column in table.stored:
            kind = kinds.get(column.name)
            if kind not in (RowKind.TRANSITIONS, RowKind.OBSERVATIONS):
                raise _StepAside(f"column '{column.name}' is stored as {kind}")
            extra = int(kind == RowKind.OBSERVATIONS)
            if extra_rows.setdefault(column.name, extra) != extra:
                raise _StepAside(f"stores keep column '{column.name}' differently")
        if any(kinds.get(column.name) != RowKind.EPISODE for column in table.tags):
            raise _StepAside("a tag column is not stored once per episode")
    parts = [np.zeros((0, 3), dtype=np.int64)]
    for i, (store, limit) in enumerate(zip(stores, limits, strict=True)):
        if limit is not None:
            store._check_limits(limit)
        order = store._order(table.maxlen, limit)
        for s in range(len(store.shards)):  # shard by shard, as MemoryStore.episodes yields
            chosen = order[order[:, 0] == s, 1]
            parts.append(np.stack([np.full_like(chosen, i), np.full_like(chosen, s), chosen], 1))
    picks = np.concatenate(parts).astype(np.int64)
    lengths = _gathered(picks, lambda i, s: stores[i].shards[s].table["length"])
    within = np.cumsum(lengths[::-1]) <= table.maxlen  # the newest that fit, as load_table
    kept = int(np.argmin(within)) if not within.all() else len(picks)  # keeps them
    chosen = picks[len(picks) - kept :]
    return chosen, extra_rows


def _read_shard(
    store: MemoryStore,
    shard: ShardView,
    indices: np.ndarray,
    positions: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    destinations: dict[str, np.ndarray],
    tags: dict[str, np.ndarray],
) -> None:
    """Reads the episodes ``indices`` of a shard into table positions ``positions``: one read
    per column, decoded in place where the shard's rows and the table's agree, then checked.

    Raises:
        _StepAside: An episode is damaged.
    """
    # Runs: consecutive episodes of the shard that are consecutive in the table too.
    breaks = np.flatnonzero((np.diff(indices) != 1) | (np.diff(positions) != 1)) + 1
    runs = list(zip([0, *breaks.tolist()], [*breaks.tolist(), len(indices)], strict=True))
    data: dict[str, tuple[np.ndarray, None]] = {}
    rows_at: dict[str, np.ndarray] = {}  # per column, the row of data each episode starts at
    raw: list[_RawRead] = []
    placed: list[tuple[StoreColumn, np.ndarray, np.ndarray]] = []
    with ExitStack() as files:
        arrays = [open_array(shard.group, f"{COLUMNS}/{c.name}") for c in store.columns]
        decoded = []  # metadata first: read-ahead of raw columns would queue it
        for column, array in zip(store.columns, arrays, strict=True):
            first, stops = episode_rows(column.rows, shard.table, indices)
            low, high = int(first.min()), int(stops.max())
            if high > int(shard.commit["rows"].get(column.name, -1)):
                raise _StepAside(f"column '{column.name}' commits fewer rows than its episodes")
            if high > array.shape[0]:
                raise _StepAside(f"{array.path} holds fewer rows than committed")
            target = destinations.get(column.name)
            directory = raw_files(array)
            if directory is not None and target is not None and _fits(target, array):
                values, at = target, starts[positions]  # raw: read to the table's rows
            elif target is not None and column.rows == RowKind.OBSERVATIONS and len(runs) == 1:
                row = int(starts[positions[0]])  # the same layout: decode in place
                values, at = target[row : row + high - low], first - low
            else:
                values = aligned_empty((high - low, *array.shape[1:]), array.dtype)
                at = first - low
                placed.append((column, values, at))
            if directory is not None and _fits(values, array):
                reader = files.enter_context(RawColumnReader(array, directory))
                raw.append(_RawRead(reader, first, stops - first, values, at))
            else:
                decoded.append((array, low, high, values))
            data[column.name] = (values, None)
            rows_at[column.name] = at
        for array, low, high, values in decoded:
            _touch_pages(values)  # before zarr's decoding threads write it
            read_into(array, low, high, values)
        try:
            for read in raw:
                read.reader.open(int(read.first.min()), int((read.first + read.counts).max()))
            damaged = _read_and_check(store.columns, shard.table, indices, raw, data, rows_at)
        except (OSError, RawChunkError) as error:  # the other path names the damage
            raise _StepAside(f"shard '{shard.name}': {error}") from error
    for column, values, offsets in placed:
        target = destinations.get(column.name)
        if target is not None:
            _place(column, values, offsets, runs, positions, starts, lengths, target)
        elif column.name in tags:
            tags[column.name][positions] = values[offsets]
    if damaged.any():
        raise _StepAside(f"shard '{shard.name}' holds {int(damaged.sum())} damaged episodes")


def _fits(values: np.ndarray, array: Any) -> bool:
    """Whether a raw column's chunk bytes can be read straight into ``values``."""
    return values.dtype == array.dtype and values.flags.c_contiguous


class _RawRead(NamedTuple):
    """A raw column's episodes to read: ``counts[j]`` rows from row ``first[j]`` of the
    column into ``values[at[j]:]``."""

    reader: RawColumnReader
    first: np.ndarray
    counts: np.ndarray
    values: np.ndarray
    at: np.ndarray


PART_BYTES = 8 << 20
"""Raw columns are read in parts of about this many bytes, which two threads take in turn,
each reading a part's rows and then checking its episodes (smaller parts cost more than they
spread)."""

READ_THREADS = 2
"""Threads that read and check the parts (one where the machine has one core)."""


def _read_and_check(
    columns: list[StoreColumn],
    table: dict[str, np.ndarray],
    indices: np.ndarray,
    raw: list[_RawRead],
    data: dict[str, tuple[np.ndarray, None]],
    rows_at: dict[str, np.ndarray],
) -> np.ndarray:
    """Reads the raw columns' episodes (their chunk files opened) part by part on
    :data:`READ_THREADS` threads, each checking a part's episodes right after reading it, while
    more threads read the chunk files not yet cached ahead of the parts; returns which episodes
    are damaged. The other columns are in ``data`` already, each episode's rows from row
    ``rows_at[column][j]`` on."""
    checks = EpisodeChecks(columns, table, data, indices, row_starts=rows_at)
    total = sum(int(r.counts.sum()) * r.values[:1].nbytes for r in raw)
    parts = max(1, min(len(indices), total // PART_BYTES))
    bounds = np.linspace(0, len(indices), parts + 1).astype(int)
    heads, ends = bounds[:-1].tolist(), bounds[1:].tolist()
    plans = [r.reader.plan(r.first, r.counts, r.at, ends) for r in raw]
    ahead = _not_cached(raw, bounds[:-1]) if len(indices) else []
    found: list[np.ndarray] = [np.zeros(0, dtype=np.uint32)] * parts
    pending = iter(range(parts))  # each thread takes the next part (one call: thread-safe)
    failed = []

    def work() -> None:
        for k in pending:
            if failed:
                return
            try:
                for r, plan in zip(raw, plans, strict=True):
                    r.reader.read_planned(plan[k], r.values)
                found[k] = checks.checksums(heads[k], ends[k])
            except BaseException:
                failed.append(k)  # the other threads stop at their next part
                raise

    threads = 1 if (os.cpu_count() or 1) == 1 else READ_THREADS
    with (
        ThreadPoolExecutor(max(1, threads - 1)) as helpers,
        ThreadPoolExecutor(max(1, min(READ_AHEAD_THREADS, len(ahead)))) as reading_ahead,
    ):
        try:
            for file in ahead:
                reading_ahead.submit(read_ahead, *file)
            helping = [helpers.submit(work) for _ in range(threads - 1)]
            try:
                work()
            finally:  # the files stay open until every thread is done with them
                errors = [error for future in helping if (error := future.exception())]
            if errors:
                raise errors[0]
        finally:  # before the files close: nothing left to read ahead once read
            reading_ahead.shutdown(cancel_futures=True)
    return checks.damaged(np.concatenate(found))


def _not_cached(raw: list[_RawRead], heads: np.ndarray) -> list[tuple[int, int, int]]:
    """The chunk files' spans that the parts starting at episodes ``heads`` read, in the order
    the parts read them, of the files the page cache does not hold whole (one question per
    file, whichever parts share it)."""
    spans = [
        (
            np.minimum.reduceat(r.first, heads).tolist(),
            np.maximum.reduceat(r.first + r.counts, heads).tolist(),
        )
        for r in raw
    ]
    files = [
        file
        for k in range(len(heads))
        for r, (lows, highs) in zip(raw, spans, strict=True)
        for file in r.reader.to_read_ahead(lows[k], highs[k])
    ]
    reach: dict[int, tuple[int, int]] = {}  # per file, the bytes read from it
    for descriptor, offset, size in files:
        low, high = reach.get(descriptor, (offset, offset + size))
        reach[descriptor] = (min(low, offset), max(high, offset + size))
    wanted = {d for d, (low, high) in reach.items() if needs_reading(d, low, high - low)}
    return [file for file in files if file[0] in wanted]


READ_AHEAD_THREADS = 8
"""Threads that read chunk files ahead of the loader (:func:`~emote_core.utils.page_cache.
read_ahead` waits for each file's read: several keep the disk busy)."""


def _touch_pages(rows: np.ndarray) -> None:
    """Faults the pages of a fresh destination in, one thread in order: zarr's decoders writing
    them from several threads at once contend in the kernel's page faults. Raw columns need
    none: each read thread faults in its own parts' pages."""
    flat = rows.reshape(-1).view(np.uint8)
    flat[:: 1 << 12] = 0


def _place(
    column: StoreColumn,
    values: np.ndarray,
    first: np.ndarray,
    runs: list[tuple[int, int]],
    positions: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    target: np.ndarray,
) -> None:
    """Copies a shard's rows (``values``, episode ``j``'s from row ``first[j]``) to the table's
    layout: per run, one copy; columns of N rows skip the row the table keeps after each."""
    extra = column.extra_rows
    for a, b in runs:
        at, held = starts[positions[a:b]], lengths[positions[a:b]]
        if extra:  # the table's layout: one copy per run
            target[at[0] : at[-1] + held[-1] + 1] = values[first[a] : first[b - 1] + held[-1] + 1]
            continue
        # Leave out the row the table keeps after each episode: for short episodes one
        # gather of whole rows (each row one item), for long ones a slice copy per episode.
        if int(held.sum()) < SHORT_EPISODE_ROWS * len(held) and _whole_rows(target, values):
            before = np.cumsum(held) - held  # rows of the run ahead of each episode
            step = np.arange(int(held.sum()))
            rows, sources = np.repeat(at - before, held), np.repeat(first[a:b] - before, held)
            _as_items(target)[rows + step] = _as_items(values)[sources + step]
            continue
        for start, source, count in zip(
            at.tolist(), first[a:b].tolist(), held.tolist(), strict=True
        ):
            target[start : start + count] = values[source : source + count]


SHORT_EPISODE_ROWS = 256
"""Episodes of N-row columns shorter than this on average are placed by one gather."""


def _whole_rows(*arrays: np.ndarray) -> bool:
    """Whether the arrays are C-contiguous with rows of some bytes (see :func:`_as_items`)."""
    return all(a.flags.c_contiguous and a.dtype.itemsize * a[0:1].size > 0 for a in arrays)


def _as_items(rows: np.ndarray) -> np.ndarray:
    """A C-contiguous array viewed as one item per row (an unsigned integer or raw bytes), so
    that fancy indexing moves whole rows at once."""
    size = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
    kinds = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    kind = np.dtype(kinds[size]) if size in kinds else np.dtype((np.void, size))
    return rows.reshape(len(rows), -1).view(np.uint8).view(kind).reshape(len(rows))


__all__ = ["load_in_bulk"]
