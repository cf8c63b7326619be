"""Writing emote-memory stores: creating them, and appending episodes to one shard.

Appends follow the commit protocol: every column's new rows and the episode table are written
first, the shard's commit record last. A writer killed at any moment leaves rows past the
commit (a torn tail) that readers ignore and that reopening for append cuts off.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from emote_core.errors import EmoteError, FormatError
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.stores.locations import storage_errors
from emote_core.stores.provenance import ENV_ID, PROVENANCE, Provenance, with_session
from emote_core.stores.stored import ColumnSchema, EpisodeRecord
from emote_core.stores.zarr_store.commits import commit_problems, malformed, table_problems
from emote_core.stores.zarr_store.groups import (
    child_names,
    creation_leftovers,
    is_store,
    keys_under,
    open_group,
    remove_leftover_temporaries,
    require_group,
)
from emote_core.stores.zarr_store.layout import (
    COLUMNS,
    DEFAULT_SHARD,
    EPISODE_FIELDS,
    EPISODES,
    FORMAT_NAME,
    SHARDS,
    TABLE_CHECKSUM,
    TABLE_CHECKSUM_DTYPE,
    RowKind,
    StoreColumn,
    StoreVersion,
    check_format,
    table_checksums,
)
from emote_core.stores.zarr_store.lease import DEFAULT_TIMEOUT, ShardLease, describe
from emote_core.stores.zarr_store.packing import PackedBatch
from emote_core.stores.zarr_store.raw_chunks import compressor, stores_raw, with_codecs
from emote_core.stores.zarr_store.reader import chunk_key

log = logging.getLogger(__name__)


def producer() -> dict[str, Any]:
    """What wrote a store: emote's version, the host's Python and platform, the process."""
    from emote_core import __version__

    return {
        "tool": "emote",
        "version": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pid": os.getpid(),
    }


def store_columns(
    columns: Sequence[ColumnSchema],
    episode: EpisodeRecord | None,
    length_key: str,
    observation_like: Sequence[str] = (),
) -> list[StoreColumn]:
    """Decides each stored column's rows per episode.

    Tag columns hold one row; a per-step column holds N + 1 rows when ``episode`` shows it does
    (or, with no episode to look at, when it is named in ``observation_like``), else N.
    """
    result = []
    length = len(episode[1][length_key]) if episode is not None else None
    for column in columns:
        if not column.stored:
            continue
        if column.kind == "TagColumn":
            rows = RowKind.EPISODE
        elif episode is not None and length is not None:
            extra = len(episode[1][column.name]) - length
            rows = RowKind.OBSERVATIONS if extra == 1 else RowKind.TRANSITIONS
        else:
            rows = RowKind.OBSERVATIONS if column.name in observation_like else RowKind.TRANSITIONS
        result.append(StoreColumn(column, rows))
    return result


def create_store(
    url: str | os.PathLike[str],
    *,
    columns: Sequence[StoreColumn],
    length_key: str,
    spaces: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    overwrite: bool = False,
    virtual: Sequence[ColumnSchema] = (),
    env_id: str | None = None,
) -> None:
    """Creates an empty emote-memory store (no shards yet).

    ``virtual`` columns (next observations, dones, masks) hold no data; the store records them so
    that the schema survives a round trip. ``env_id`` names the environment the store is made on
    (its root's ``env_id``; see :mod:`emote_core.stores.provenance`).

    Raises:
        FormatError: If something exists there and ``overwrite`` is false, or the schema is bad.
    """
    names = [c.name for c in columns]
    if length_key not in names:
        raise FormatError(f"length_key '{length_key}' is not a stored column ({names})")
    attributes = {
        "format": FORMAT_NAME,
        "format_version": int(StoreVersion.LATEST),
        "columns": [c.to_json() for c in columns],
        "virtual_columns": [StoreColumn(c, RowKind.VIRTUAL).to_json() for c in virtual],
        "length_key": length_key,
        "spaces": spaces,
        "producer": producer(),
        "created": datetime.now(UTC).isoformat(),
        "source": source,
    }
    if env_id is not None:
        attributes[ENV_ID] = env_id
    for path in (None if overwrite else creation_leftovers(url)) or []:
        path.unlink(missing_ok=True)
        log.info("removed '%s', left by creating a store there that was cut off", path)
    group = open_group(url, "w" if overwrite else "w-", attributes=attributes)
    require_group(group, SHARDS)


class ShardWriter:
    """Appends episodes to one shard of a store: the shard's only writer.

    Opening takes the shard's lease (:mod:`.lease`): a second writer on a held shard is refused,
    naming the holder; the lease of a writer that died is taken over, and the torn tail it may
    have left is cut. A shard whose metadata is missing or unreadable, or whose data has no
    commit record, is damaged: the writer refuses it rather than cut committed rows away.

    Args:
        url: The store (local path or fsspec URL).
        shard: The shard's name; each parallel writer needs its own.
        lease_timeout: Seconds without a heartbeat after which a remote lease is taken over.
        provenance: Who writes in this session: added to the shard's ``provenance`` list in the
            same write as the session's first commit (a session that commits nothing leaves
            no record).

    Raises:
        FormatError: If there is no emote-memory store at ``url``, or the shard is damaged.
        StorageError: If another writer holds the shard.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        shard: str = DEFAULT_SHARD,
        lease_timeout: float = DEFAULT_TIMEOUT,
        provenance: Provenance | None = None,
    ) -> None:
        self._provenance = provenance
        if not shard or "/" in shard or shard.startswith("."):
            raise FormatError(f"shard names are plain names without '/'; got {shard!r}")
        self.url = os.fspath(url)
        root = open_group(url, "r+")
        attributes = dict(root.attrs)
        check_format(attributes, self.url)
        self.columns = [StoreColumn.from_json(c, self.url) for c in attributes["columns"]]
        self.length_key = str(attributes["length_key"])
        self.shard = shard
        self.lease = ShardLease(self.url, shard, timeout=lease_timeout)
        try:
            if self.lease.previous:
                log.info(
                    "store '%s' shard '%s': took over the lease of %s (no longer writing)",
                    self.url, shard, describe(self.lease.previous),
                )  # fmt: skip
            remove_leftover_temporaries(self.url, shard=shard)  # local stores only
            self.group = self._open_shard(root)
            self._arrays = {
                c.name: self._require_array(f"{COLUMNS}/{c.name}", c) for c in self.columns
            }
            self._episode_arrays = {
                name: self._require_plain(f"{EPISODES}/{name}", dtype, shape)
                for name, (dtype, shape) in EPISODE_FIELDS.items()
            }
            commit = dict(self.group.attrs).get("commit")
            if commit is None:
                self._refuse_uncommitted_data()
                commit = _empty_commit(self.columns)
                self.group.attrs.update({"commit": commit, "writer": producer()})
            self.commit = self._checked(commit)
            self._repair()
            self._table_checksums = self._require_table_checksums()
        except BaseException:
            self.lease.release()
            raise

    def _open_shard(self, root: Any) -> Any:
        """The shard's group, created with an empty commit record in the same write."""
        path = f"{SHARDS}/{self.shard}"
        try:
            if path in root:
                return root[path]
        except ValueError as error:  # unparseable metadata
            raise FormatError(
                f"store '{self.url}' shard '{self.shard}': {path}/zarr.json is unreadable "
                f"({error}); the store is damaged — run `emote memory verify`"
            ) from error
        if keys_under(root, f"{path}/"):
            raise FormatError(
                f"store '{self.url}' shard '{self.shard}' holds data but {path}/zarr.json is "
                "missing; the store is damaged — run `emote memory verify` (emote will not "
                "write over it)"
            )
        shards = require_group(root, SHARDS)
        attributes = {"commit": _empty_commit(self.columns), "writer": producer()}
        return shards.create_group(self.shard, attributes=attributes)

    def _checked(self, commit: Any) -> dict[str, Any]:
        """The shard's commit record, refused where a reader would call it damaged (cutting
        the arrays back to a wrong record would lose committed rows)."""
        path = f"{SHARDS}/{self.shard}"
        where = f"store '{self.url}' shard '{self.shard}'"
        problems = commit_problems(commit, self.columns)
        count = 0 if problems else commit["episodes"]
        arrays = dict(self._episode_arrays)
        if TABLE_CHECKSUM in self.group[EPISODES]:
            arrays[TABLE_CHECKSUM] = self.group[f"{EPISODES}/{TABLE_CHECKSUM}"]
        if not problems and all(a.shape[0] >= count for a in arrays.values()):
            last = slice(max(0, count - 1), count)  # fewer rows: _repair names that damage
            problems = table_problems(commit, {n: a[last] for n, a in arrays.items()})
        if problems:
            error = malformed(where, path, problems)
            raise FormatError(
                f"{error}; the store is damaged — run `emote memory verify` (emote will not "
                "append to it)"
            )
        return commit

    def _require_table_checksums(self) -> Any:
        """The episode table's checksum array; a shard written before it had one gets it, over
        its committed rows as they are now (from then on a changed row is detected)."""
        count = int(self.commit["episodes"])
        array = self._require_plain(f"{EPISODES}/{TABLE_CHECKSUM}", TABLE_CHECKSUM_DTYPE, ())
        if array.shape[0] < count:
            table = {name: self._episode_arrays[name][:count] for name in EPISODE_FIELDS}
            _write_rows(array, 0, table_checksums(table))
            log.info(
                "store '%s' shard '%s': checksummed the episode table of %d episodes written "
                "by an earlier emote", self.url, self.shard, count,
            )  # fmt: skip
        elif array.shape[0] > count:
            self._truncate(array, count)
        return array

    def _refuse_uncommitted_data(self) -> None:
        arrays = [*self._arrays.values(), *self._episode_arrays.values()]
        holding = [array.path for array in arrays if array.shape[0] > 0]
        if holding:
            raise FormatError(
                f"store '{self.url}' shard '{self.shard}' has no commit record but its arrays "
                f"hold rows ({', '.join(holding[:3])}); the store is damaged — run `emote "
                "memory verify` (emote will not cut rows it cannot prove uncommitted)"
            )

    def close(self) -> None:
        """Lets go of the shard's lease; later appends are refused."""
        self.lease.release()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _require_array(self, name: str, column: StoreColumn) -> Any:
        schema = column.schema
        return self._require(name, schema.dtype, schema.shape, column.chunk_rows())

    def _require_plain(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
        row_bytes = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        return self._require(name, dtype, shape, max(1024, (1 << 18) // row_bytes))

    def _require(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...], rows: int) -> Any:
        if name in self.group:
            return self.group[name]
        return self.group.create_array(
            name,
            shape=(0, *shape),
            dtype=dtype,
            chunks=(rows, *shape) if shape else (rows,),
            compressors=compressor(),  # columns go raw at their first append where it pays
            fill_value=0,
        )

    def _choose_codecs(self, batch: PackedBatch) -> None:
        """Decides each column that this batch starts (none of its rows written yet): raw
        where Blosc barely shrinks its first chunk of rows (:func:`.raw_chunks.stores_raw`),
        else Blosc. Only the first batch decides: a column that holds rows keeps its codecs
        (and one a killed writer left empty is decided again, from this batch)."""
        for column in self.columns:
            array = self._arrays[column.name]
            if array.shape[0] or int(self.commit["rows"][column.name]):
                continue
            raw = stores_raw(batch.columns[column.name], int(array.chunks[0]))
            if raw != (len(array.metadata.codecs) == 1):
                try:
                    self._arrays[column.name] = with_codecs(array, raw=raw)
                except Exception as error:  # zarr's internals moved: write what its file says
                    import zarr

                    log.warning(
                        "store '%s': column '%s' keeps its codecs (%s: %s)",
                        self.url, column.name, type(error).__name__, error,
                    )  # fmt: skip
                    self._arrays[column.name] = zarr.open_array(
                        store=array.store, path=array.path, mode="r+", zarr_format=3
                    )

    def _repair(self) -> None:
        """Cuts every array back to the committed rows (a torn tail from a killed writer)."""
        cut = []
        for column in self.columns:
            cut += self._truncate(self._arrays[column.name], int(self.commit["rows"][column.name]))
        for array in self._episode_arrays.values():
            cut += self._truncate(array, int(self.commit["episodes"]))
        if cut:
            log.warning("store '%s' shard '%s': cut a torn tail from %s", self.url, self.shard, cut)

    @staticmethod
    def _truncate(array: Any, rows: int) -> list[str]:
        if array.shape[0] < rows:
            raise FormatError(
                f"array '{array.path}' has {array.shape[0]} rows but its commit counts {rows}; "
                "the store is damaged — run `emote memory verify`"
            )
        if array.shape[0] > rows:
            array.resize((rows, *array.shape[1:]))
            return [array.path]
        return []

    @property
    def episodes(self) -> int:
        """Episodes committed to this shard."""
        return int(self.commit["episodes"])

    def append(self, episodes: Sequence[EpisodeRecord]) -> None:
        """Appends a batch of episodes and commits them.

        Raises:
            SchemaError: If an episode does not match the store's columns (nothing is written).
        """
        if not episodes:
            return
        batch = PackedBatch(self.columns, self.length_key, episodes)
        with storage_errors(self.url):  # an object store that fails mid-run: one line
            self._append(batch)

    def append_batch(self, episodes: EpisodeBatch) -> None:
        """Appends episodes joined column by column and commits them, as :meth:`append` does
        their records; a batch whose columns are not exactly as the store keeps them is
        checked episode by episode.

        Raises:
            SchemaError: If an episode does not match the store's columns (nothing is written).
        """
        if not len(episodes):
            return
        batch = PackedBatch.joined(self.columns, self.length_key, episodes)
        if batch is None:
            self.append(list(episodes.episodes()))
            return
        with storage_errors(self.url):
            self._append(batch)

    def _append(self, batch: PackedBatch) -> None:
        self.lease.check()
        self._choose_codecs(batch)
        rows = dict(self.commit["rows"])
        first_episode = int(self.commit["episodes"])
        for column in self.columns:
            data = batch.columns[column.name]
            array = self._arrays[column.name]
            try:
                _write_rows(array, rows[column.name], data)
            except (EmoteError, OSError):
                raise
            except Exception as error:  # the chunk appended to does not decode: damage
                array.resize((rows[column.name], *array.shape[1:]))  # its shape as committed
                text = str(error).splitlines()[0] if str(error) else ""
                raise FormatError(
                    f"store '{self.url}' shard '{self.shard}': column '{column.name}' cannot be "
                    f"appended to: {chunk_key(array, rows[column.name])} does not decode "
                    f"({type(error).__name__}: {text}); the store is damaged — run `emote memory "
                    "verify` (nothing was committed)"
                ) from error
            rows[column.name] += len(data)
        transitions = int(self.commit["transitions"])
        step_offsets = transitions + batch.step_offsets
        offsets = np.stack([step_offsets, step_offsets + first_episode + np.arange(len(batch))], 1)
        fields = {
            "id": batch.identities,
            "offset": offsets,
            "length": batch.lengths,
            "end_state": batch.end_states,
            "return": batch.returns,
            "written_at": np.full(len(batch), time.time()),
            "checksum": batch.checksums,
        }
        for name, values in fields.items():
            _write_rows(self._episode_arrays[name], first_episode, values)
        _write_rows(self._table_checksums, first_episode, table_checksums(fields))
        commit = {
            "sequence": int(self.commit["sequence"]) + 1,
            "episodes": first_episode + len(batch),
            "transitions": transitions + int(batch.lengths.sum()),
            "rows": rows,
        }
        update: dict[str, Any] = {"commit": commit}
        if self._provenance is not None:
            attributes = dict(self.group.attrs)
            update[PROVENANCE] = with_session(attributes, self._provenance, first_episode)
        self.lease.check(refresh=False)  # a remote writer that lost its lease commits nothing
        self.group.attrs.update(update)  # the commit record goes last
        self._provenance = None  # recorded once per session
        self.commit = commit


def _empty_commit(columns: Sequence[StoreColumn]) -> dict[str, Any]:
    return {"sequence": 0, "episodes": 0, "transitions": 0, "rows": {c.name: 0 for c in columns}}


def _write_rows(array: Any, start: int, data: np.ndarray) -> None:
    array.resize((start + len(data), *array.shape[1:]))
    array[start : start + len(data)] = data


__all__ = [
    "ShardWriter",
    "child_names",
    "create_store",
    "is_store",
    "keys_under",
    "open_group",
    "producer",
    "store_columns",
]
