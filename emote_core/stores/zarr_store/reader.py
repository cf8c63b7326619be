"""Reading emote-memory stores: the union of their shards, as committed."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.locations import storage_errors
from emote_core.stores.stored import ColumnSchema, EpisodeRecord, StoredTable
from emote_core.stores.summary import bytes_on_disk, columns_summary, episode_summary
from emote_core.stores.zarr_store.acceleration import (
    open_array,
    read_into,
    uses_zarrs,
    with_default_pipeline,
)
from emote_core.stores.zarr_store.checks import EpisodeChecks, episode_rows
from emote_core.stores.zarr_store.commits import malformed, shard_commit, table_problems
from emote_core.stores.zarr_store.groups import child_names, open_group
from emote_core.stores.zarr_store.layout import (
    COLUMNS,
    EPISODE_FIELDS,
    EPISODES,
    FORMAT_NAME,
    SHARDS,
    TABLE_CHECKSUM,
    RowKind,
    StoreColumn,
    check_format,
)
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)


@dataclass
class ShardView:
    """One shard as committed: its commit record and episode table (committed rows only)."""

    name: str
    group: Any
    commit: dict[str, Any]
    table: dict[str, np.ndarray]

    @property
    def episodes(self) -> int:
        return int(self.commit["episodes"])


def read_rows(array: Any, rows: int, *, start: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows ``start:rows`` of an array (the first ``rows`` by default), and which of them could
    not be read.

    One read of the whole range when it decodes; chunk by chunk otherwise, so a damaged chunk
    costs only its rows (named in the returned problems), not the column.
    """
    import zarr

    with zarr.config.set({"threading.max_workers": os.cpu_count() or 1}):
        try:
            whole = np.empty((rows - start, *array.shape[1:]), dtype=array.dtype)
            return read_into(array, start, rows, whole), np.zeros(rows - start, dtype=bool), []
        except Exception:  # a damaged chunk somewhere: find which, with zarr's own pipeline
            if uses_zarrs(array):
                array = with_default_pipeline(array)
        data = np.zeros((rows - start, *array.shape[1:]), dtype=array.dtype)
        bad = np.zeros(rows - start, dtype=bool)
        problems = []
        step = int(array.chunks[0])
        for first in range(start - start % step, rows, step):
            low, stop = max(first, start), min(rows, first + step)
            try:
                data[low - start : stop - start] = array[low:stop]
            except Exception as error:  # any codec or I/O error
                bad[low - start : stop - start] = True
                text = str(error).splitlines()[0] if str(error) else ""
                name = str(array.path).rsplit("/", 1)[-1]
                problems.append(
                    f"column '{name}' rows {low}:{stop} unreadable in "
                    f"{chunk_key(array, low)} ({type(error).__name__}: {text})"
                )
        return data, bad, problems


def chunk_key(array: Any, row: int) -> str:
    """The store key of the chunk that holds ``row`` of a column (its only chunk across)."""
    coords = (row // int(array.chunks[0]), *([0] * (len(array.shape) - 1)))
    return f"{array.path}/{array.metadata.encode_chunk_key(coords)}"


def read_fields(group: Any, fields: list[str], start: int, stop: int) -> list[Any]:
    """Rows ``start:stop`` of each episode-table field of a shard, read concurrently: per field
    its rows, its row count where it holds fewer than ``stop``, or the error reading it raised."""
    import asyncio

    from zarr.core.sync import sync

    async def read(field: str) -> np.ndarray | int:
        array = await group._async_group.getitem(f"{EPISODES}/{field}")
        if array.shape[0] < stop:
            return int(array.shape[0])
        return np.asarray(await array.getitem(slice(start, stop)))

    async def read_all() -> list[Any]:
        return await asyncio.gather(*(read(field) for field in fields), return_exceptions=True)

    return sync(read_all())


class MemoryStore:
    """A read-only view of an emote-memory store: its schema and the union of its shards.

    Args:
        url: A local path or an fsspec URL.

    Raises:
        FormatError: If there is no emote-memory store there, it is from a newer emote, or its
            metadata is damaged.
    """

    def __init__(self, url: str | os.PathLike[str]) -> None:
        self.url = os.fspath(url)
        self.root = open_group(url, "r")
        attributes = dict(self.root.attrs)
        self.format_version = check_format(attributes, self.url)
        self.attributes = attributes
        self.columns = [StoreColumn.from_json(c, self.url) for c in attributes.get("columns", [])]
        self.virtual_columns = [
            StoreColumn.from_json(c, self.url) for c in attributes.get("virtual_columns", [])
        ]
        self.length_key = str(attributes.get("length_key"))
        if self.length_key not in {c.name for c in self.columns}:
            raise FormatError(
                f"store '{self.url}' names length_key '{self.length_key}' among no column"
            )
        self._unique_ids: dict[str, list[int]] | None = None
        self.shards: list[ShardView] = []
        self.damaged_shards: dict[str, str] = {}
        """Shards that cannot be read at all, with one line saying why (their file)."""
        with storage_errors(self.url):
            self._read_shards()

    def _read_shards(self) -> None:
        for name in child_names(self.root, SHARDS):
            try:
                shard = self._shard(name)
            except FormatError as error:
                self.damaged_shards[name] = str(error)
                continue
            if shard is not None:
                self.shards.append(shard)

    def _shard(self, name: str) -> ShardView | None:
        """The shard as committed; ``None`` for a shard being created (no commit record yet, or
        a folder holding no data yet)."""
        path = f"{SHARDS}/{name}"
        where = f"store '{self.url}' shard '{name}'"
        found = shard_commit(self.root, self.url, name, self.columns)
        if found is None:
            return None
        group, commit = found
        count = int(commit["episodes"])
        if count == 0:  # nothing committed: its arrays may not even exist yet
            empty = {f: np.zeros((0, *sh), dtype) for f, (dtype, sh) in EPISODE_FIELDS.items()}
            if problems := table_problems(commit, empty):
                raise malformed(where, path, problems)
            return ShardView(name, group, commit, empty)
        fields = [*EPISODE_FIELDS, TABLE_CHECKSUM]
        found = read_fields(group, fields, 0, count)
        table = {}
        for field, value in zip(fields, found, strict=True):
            if isinstance(value, np.ndarray):
                table[field] = value
            elif isinstance(value, int):
                raise FormatError(
                    f"{where}: {path}/{EPISODES}/{field} has {value} rows but the "
                    f"commit counts {count} episodes"
                )
            elif field == TABLE_CHECKSUM and isinstance(value, KeyError):
                continue  # shards written before it have none
            else:  # missing or undecodable metadata or chunks
                text = str(value).splitlines()[0] if str(value) else ""
                raise FormatError(
                    f"{where}: {path}/{EPISODES}/{field} is unreadable "
                    f"({type(value).__name__}: {text})"
                ) from value
        if problems := table_problems(commit, table):
            raise malformed(where, path, problems)
        return ShardView(name, group, commit, table)

    def check_readable(self) -> None:
        """Refuses a store with shards that cannot be read at all.

        Raises:
            FormatError: Naming the first damaged shard and its file, and how many there are.
        """
        if self.damaged_shards:
            first = next(iter(self.damaged_shards.values()))
            more = len(self.damaged_shards) - 1
            raise FormatError(
                f"{first}{f' (and {more} more damaged shards)' if more else ''} — run `emote "
                "memory verify`, or pass `skip_damaged=True` to read the other shards"
            )

    @property
    def spaces(self) -> dict[str, Any] | None:
        return self.attributes.get("spaces")

    @property
    def episode_count(self) -> int:
        return sum(s.episodes for s in self.shards)

    @property
    def transition_count(self) -> int:
        return int(sum(int(s.table["length"].sum()) for s in self.shards))

    def schemas(self) -> list[ColumnSchema]:
        """Stored columns, then the virtual columns recorded at creation."""
        return [c.schema for c in (*self.columns, *self.virtual_columns)]

    def committed(self) -> dict[str, int]:
        """Episodes committed per shard (readable shards only)."""
        return {shard.name: shard.episodes for shard in self.shards}

    def episodes(
        self,
        *,
        max_transitions: int | None = None,
        skip_damaged: bool = False,
        limits: Mapping[str, int] | None = None,
    ) -> Iterator[EpisodeRecord]:
        """Every committed episode, oldest first across shards (by commit time).

        Args:
            max_transitions: Keep only the most recent episodes that fit in this many transitions.
            skip_damaged: Read the readable shards of a store with damaged ones.
            limits: Read only the first ``limits[shard]`` episodes of the shards it names, and
                nothing of other shards (what a checkpoint saw of a store that grew since).

        Raises:
            FormatError: If a shard is damaged and ``skip_damaged`` is false, or ``limits`` asks
                for more episodes than a shard holds.
        """
        if not skip_damaged:
            self.check_readable()
        if limits is not None:
            self._check_limits(limits)
        order = self._order(max_transitions, limits)
        for shard_index, shard in enumerate(self.shards):
            chosen = order[order[:, 0] == shard_index][:, 1] if len(order) else np.zeros(0, int)
            if len(chosen) == 0:
                continue
            problems: list[str] = []
            read = {c.name: self._committed_rows(shard, c.name, problems) for c in self.columns}
            damaged = EpisodeChecks(self.columns, shard.table, read, chosen).all_damaged()
            if damaged.any():
                self._damaged(shard, chosen[damaged], skip_damaged, problems)
            data = {name: values for name, (values, _) in read.items()}
            for k in chosen[~damaged]:
                yield self._episode(shard, data, int(k))

    def _committed_rows(
        self, shard: ShardView, name: str, problems: list[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """A column's committed rows and unreadable-row mask (nothing readable: empty)."""
        path = f"{SHARDS}/{shard.name}/{COLUMNS}/{name}"
        try:
            array = open_array(shard.group, f"{COLUMNS}/{name}")
        except Exception as error:  # missing or unparseable array metadata
            problems.append(f"{path}/zarr.json is unreadable ({type(error).__name__})")
            return np.zeros(0), np.zeros(0, dtype=bool)
        values, bad, found = read_rows(array, min(int(shard.commit["rows"][name]), array.shape[0]))
        problems += found
        return values, bad

    def _damaged(
        self, shard: ShardView, indices: np.ndarray, skip: bool, problems: list[str]
    ) -> None:
        ids = [self._ids()[shard.name][k] for k in indices[:10]]
        more = " ..." if len(indices) > 10 else ""
        cause = f"; {problems[0]}" if problems else ""
        what = (
            f"store '{self.url}' shard '{shard.name}': {len(indices)} damaged episodes "
            f"(checksum mismatch or unreadable chunks), ids {ids}{more}{cause}"
        )
        if not skip:
            raise FormatError(
                f"{what}; nothing is read from a damaged store — run `emote memory verify`, or "
                "pass `skip_damaged=True` to use the other episodes"
            )
        log.warning("%s: skipped", what)

    def _check_limits(self, limits: Mapping[str, int]) -> None:
        held = self.committed()
        for name, count in limits.items():
            if held.get(name, 0) < count:
                raise FormatError(
                    f"store '{self.url}' shard '{name}' holds {held.get(name, 0)} committed "
                    f"episodes, fewer than the {count} it held when they were read before — "
                    "episodes were lost since; run `emote memory verify`"
                )

    def _order(
        self, max_transitions: int | None, limits: Mapping[str, int] | None = None
    ) -> np.ndarray:
        """``(shard, episode)`` pairs oldest first, trimmed to the newest that fit."""
        keys = [
            (float(t), s, k)
            for s, shard in enumerate(self.shards)
            for k, t in enumerate(shard.table["written_at"])
            if limits is None or k < limits.get(shard.name, 0)
        ]
        keys.sort()
        if max_transitions is not None:
            lengths = [int(self.shards[s].table["length"][k]) for _, s, k in keys]
            kept, total = 0, 0
            for length in reversed(lengths):
                if total + length > max_transitions:
                    break
                total += length
                kept += 1
            keys = keys[len(keys) - kept :]
        return np.array([(s, k) for _, s, k in keys], dtype=np.int64).reshape(-1, 2)

    def _episode(self, shard: ShardView, data: dict[str, np.ndarray], k: int) -> EpisodeRecord:
        step, observation = (int(v) for v in shard.table["offset"][k])
        length = int(shard.table["length"][k])
        episode = {}
        for column in self.columns:
            if column.rows == RowKind.EPISODE:
                episode[column.name] = data[column.name][k]
            elif column.rows == RowKind.OBSERVATIONS:
                episode[column.name] = data[column.name][observation : observation + length + 1]
            else:
                episode[column.name] = data[column.name][step : step + length]
        end_state = EpisodeState(int(shard.table["end_state"][k]))
        return self._ids()[shard.name][k], episode, end_state

    def _ids(self) -> dict[str, list[int]]:
        """Store-unique episode ids by shard: each stored id, except that an id already handed
        to an earlier episode (by shard name, then position) gets the next id above the store's
        largest. Parallel collectors and repeated collects all count from 0; their episodes keep
        apart in every export this way, and the same store always reads the same ids."""
        if self._unique_ids is None:
            stored = {s.name: [int(i) for i in s.table["id"]] for s in self.shards}
            seen: set[int] = set()
            fresh = max((max(ids) for ids in stored.values() if ids), default=-1) + 1
            unique: dict[str, list[int]] = {}
            for name, ids in stored.items():
                unique[name] = []
                for identity in ids:
                    if identity in seen:
                        identity, fresh = fresh, fresh + 1
                    seen.add(identity)
                    unique[name].append(identity)
            self._unique_ids = unique
        return self._unique_ids

    def info(self) -> dict[str, Any]:
        """The ``emote memory inspect`` report; reads only the episode tables, not the columns."""
        tables = [s.table for s in self.shards]

        def joined(field: str) -> np.ndarray:
            return np.concatenate([t[field] for t in tables]) if tables else np.zeros(0)

        columns = columns_summary(self.schemas())
        for column in (*self.columns, *self.virtual_columns):
            columns[column.name]["rows"] = column.rows
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "store": self.url,
            "columns": columns,
            "length_key": self.length_key,
            "spaces": self.spaces,
            "producer": self.attributes.get("producer"),
            "created": self.attributes.get("created"),
            "source": self.attributes.get("source"),
            **episode_summary(
                lengths=joined("length"), returns=joined("return"), end_states=joined("end_state")
            ),
            "shards": [
                {
                    "name": s.name,
                    "episodes": s.episodes,
                    "transitions": int(s.table["length"].sum()),
                    "commit_sequence": int(s.commit.get("sequence", 0)),
                    "writer": dict(s.group.attrs).get("writer"),
                }
                for s in self.shards
            ],
            "damaged_shards": self.damaged_shards,
            "bytes_on_disk": bytes_on_disk(self.url),
        }

    def read(
        self, *, max_transitions: int | None = None, skip_damaged: bool = False
    ) -> StoredTable:
        """The store as a :class:`StoredTable` (the common form of every reader).

        Raises:
            FormatError: If a shard is damaged and ``skip_damaged`` is false.
        """
        return StoredTable(
            source=self.url,
            format=FORMAT_NAME,
            columns=self.schemas(),
            episodes=list(
                self.episodes(max_transitions=max_transitions, skip_damaged=skip_damaged)
            ),
            length_key=self.length_key,
            spaces=self.spaces,
            metadata={"source": self.attributes.get("source"), "shards": len(self.shards)},
        )


__all__ = [
    "MemoryStore",
    "ShardView",
    "chunk_key",
    "episode_rows",
    "read_fields",
    "read_rows",
]
