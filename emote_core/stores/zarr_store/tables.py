"""Memory tables and stores: save a table to a store, load stores into a table, append as you go."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.stores.provenance import Provenance
from emote_core.stores.stored import (
    ColumnSchema,
    EpisodeRecord,
    StoredTable,
    restore_stored,
)
from emote_core.stores.zarr_store.bulk import load_in_bulk
from emote_core.stores.zarr_store.layout import DEFAULT_SHARD
from emote_core.stores.zarr_store.reader import MemoryStore
from emote_core.stores.zarr_store.writer import (
    ShardWriter,
    create_store,
    is_store,
    store_columns,
)

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

BATCH_BYTES = 64 << 20
"""Episodes are appended in batches of about this many bytes (one commit per batch)."""


def _observation_like(table: ArrayMemoryTable) -> list[str]:
    """Stored columns that hold N + 1 rows: learned from added episodes, or read by mappers."""
    learned = [name for name, extra in table.schema.extra_rows.items() if extra == 1]
    read_ahead = [
        c.target_name for c in table.virtual if c.mapper.needs_target and c.mapper.target_extra_rows
    ]
    return sorted(set(learned) | set(read_ahead))


def _virtual(table: ArrayMemoryTable) -> list[ColumnSchema]:
    return [ColumnSchema.of(column) for column in table.virtual]


def table_schemas(table: ArrayMemoryTable) -> list[ColumnSchema]:
    return [ColumnSchema.of(column) for column in table.columns.values()]


class StoreAppender:
    """Appends a table's episodes to a store as they complete (an incremental export).

    Creates the store with the table's schema if it does not exist.

    Args:
        url: The store.
        table: The table whose schema the store takes.
        spaces: The MDP spaces to record (``MDPSpace.to_json()``), if known.
        shard: This writer's shard.
        provenance: Who writes: recorded in the shard with the first commit; its ``env_id``
            also names the environment of a store created now.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        table: ArrayMemoryTable,
        *,
        spaces: dict[str, Any] | None = None,
        shard: str = DEFAULT_SHARD,
        provenance: Provenance | None = None,
    ) -> None:
        self.url = os.fspath(url)
        if not is_store(self.url):
            columns = store_columns(
                table_schemas(table), None, table.length_key, _observation_like(table)
            )
            try:
                create_store(
                    self.url,
                    columns=columns,
                    length_key=table.length_key,
                    spaces=spaces,
                    virtual=_virtual(table),
                    env_id=provenance.env_id if provenance is not None else None,
                )
            except FormatError:
                # Another writer (on another shard) created it a moment ago: append to theirs.
                if not _wait_for_store(self.url):
                    raise
        self.writer = ShardWriter(self.url, shard=shard, provenance=provenance)
        self._stored_sequence = table.stored_sequence
        self._as_given = table.stores_as_given

    def append(self, episodes: Sequence[EpisodeRecord]) -> None:
        """Commits ``episodes`` in batches of about :data:`BATCH_BYTES`, each in the form the
        table stores it (frame stacks as single frames; see
        :meth:`~emote_core.memory.table.ArrayMemoryTable.stored_sequence`)."""
        stored = [(k, self._stored_sequence(data), end) for k, data, end in episodes]
        for batch in batches(stored, BATCH_BYTES):
            self.writer.append(batch)

    def append_batch(self, episodes: EpisodeBatch) -> None:
        """Commits ``episodes``, joined column by column as a collector hands them out, in one
        append; episode by episode, as :meth:`append` commits them, where the table stores
        sequences in another form."""
        if self._as_given:
            self.writer.append_batch(episodes)
        else:
            self.append(list(episodes.episodes()))

    def close(self) -> None:
        """Lets go of the shard's lease (committed episodes stay)."""
        self.writer.close()

    def __enter__(self) -> StoreAppender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def batches(episodes: Sequence[EpisodeRecord], limit: int) -> Iterator[list[EpisodeRecord]]:
    """Consecutive runs of ``episodes`` holding about ``limit`` bytes each (one commit each)."""
    batch: list[EpisodeRecord] = []
    size = 0
    for episode in episodes:
        batch.append(episode)
        size += sum(np.asarray(value).nbytes for value in episode[1].values())
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _wait_for_store(url: str, seconds: float = 2.0) -> bool:
    """Whether a store appears at ``url`` within ``seconds`` (another creator mid-write)."""
    deadline = time.monotonic() + seconds
    while True:
        if is_store(url):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def save_table(
    table: ArrayMemoryTable,
    url: str | os.PathLike[str],
    *,
    spaces: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> int:
    """Writes every episode of ``table`` to a new store; returns the episodes written."""
    episodes = list(table.episodes())
    columns = store_columns(
        table_schemas(table), episodes[0] if episodes else None, table.length_key,
        _observation_like(table),
    )  # fmt: skip
    create_store(
        url,
        columns=columns,
        length_key=table.length_key,
        spaces=spaces,
        overwrite=overwrite,
        virtual=_virtual(table),
    )
    with StoreAppender(url, table) as appender:
        appender.append(episodes)
    return len(episodes)


def load_table(
    table: ArrayMemoryTable,
    urls: Sequence[str | os.PathLike[str] | MemoryStore],
    *,
    skip_damaged: bool = False,
    limits: Sequence[Mapping[str, int] | None] | None = None,
) -> int:
    """Replaces ``table``'s content with the newest episodes of one or more stores.

    Beyond the table's ``maxlen`` the oldest episodes are left out; identities that repeat
    across stores or shards are renumbered. Every episode is checked against its checksum. All
    or nothing: on any error the table keeps its content.

    Args:
        table: The table to fill.
        urls: The stores (paths or URLs, or stores already open).
        skip_damaged: Leave damaged episodes (and unreadable shards) out instead of refusing.
        limits: Per store, ``None`` or the episodes to read per shard (see
            :meth:`MemoryStore.episodes`).

    Returns:
        The number of episodes loaded.

    Raises:
        FormatError: If a store is missing or its columns do not fit the table, or (unless
            ``skip_damaged``) it holds damaged episodes, naming them.
    """
    stores = [url if isinstance(url, MemoryStore) else MemoryStore(url) for url in urls]
    per_store = list(limits) if limits is not None else [None] * len(stores)
    if len(per_store) != len(stores):
        raise ValueError(f"load_table got {len(per_store)} limits for {len(stores)} stores")
    loaded = load_in_bulk(table, stores, per_store, skip_damaged=skip_damaged)
    if loaded is not None:
        return loaded
    episodes: list[EpisodeRecord] = []
    for store, limit in zip(stores, per_store, strict=True):
        episodes.extend(
            store.episodes(max_transitions=table.maxlen, skip_damaged=skip_damaged, limits=limit)
        )
    kept, total = [], 0
    for episode in reversed(episodes):
        length = len(episode[1][table.length_key])
        if total + length > table.maxlen:
            break
        kept.append(episode)
        total += length
    kept.reverse()
    identities = [identity for identity, _, _ in kept]
    if len(set(identities)) != len(identities):
        log.info("episode ids repeat across stores or shards; renumbering them 0..%d", len(kept))
        kept = [(k, data, end) for k, (_, data, end) in enumerate(kept)]
    stored = StoredTable(
        source=", ".join(s.url for s in stores),
        format=stores[0].attributes["format"] if stores else "emote-memory",
        columns=stores[0].schemas() if stores else table_schemas(table),
        episodes=kept,
        length_key=stores[0].length_key if stores else table.length_key,
    )
    restore_stored(table, stored)
    return len(kept)


__all__ = ["BATCH_BYTES", "StoreAppender", "batches", "load_table", "save_table", "table_schemas"]
