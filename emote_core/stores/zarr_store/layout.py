"""The "emote-memory" Zarr layout: names, versions and the schema kept in group attributes.

::

    <store>/                         attrs: format, format_version, columns, length_key, spaces,
                                            producer, created, source (converted stores),
                                            env_id (optional: the env it was made on)
      shards/<name>/                 attrs: commit {sequence, episodes, rows {column: n}}, writer,
                                            provenance (optional: one record per writing
                                            session, see emote_core.stores.provenance)
        columns/<column>             per-step columns: all episodes' rows back to back
                                     (observations N + 1 rows, actions and rewards N);
                                     tag columns: one row per episode
        episodes/id                  int64
        episodes/offset              int64 (E, 2): first row in N-row and in (N + 1)-row columns
        episodes/length              int64 transitions
        episodes/end_state           int8 (2 TERMINAL, 1 INTERRUPTED)
        episodes/return              float64 sum of rewards
        episodes/written_at          float64 unix time of the commit that added the episode
        episodes/checksum            uint32 crc32 over the episode's bytes in every stored column
        episodes/table_checksum      uint32 crc32 over the episode's row of the fields above
                                     (stores written before it have none; verify says so)

Readers trust only what a shard's commit record counts; rows past it are a torn tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.stored import ColumnSchema

FORMAT_NAME = "emote-memory"
SHARDS = "shards"
COLUMNS = "columns"
EPISODES = "episodes"
DEFAULT_SHARD = "main"
CHUNK_BYTES = 1 << 20
"""Target bytes per chunk along the row axis (about 1 MB: fewer, larger chunks load faster, see
benchmarks/RESULTS.md; the last chunk of a column stays partial between appends)."""

EPISODE_FIELDS: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {
    "id": (np.dtype(np.int64), ()),
    "offset": (np.dtype(np.int64), (2,)),
    "length": (np.dtype(np.int64), ()),
    "end_state": (np.dtype(np.int8), ()),
    "return": (np.dtype(np.float64), ()),
    "written_at": (np.dtype(np.float64), ()),
    "checksum": (np.dtype(np.uint32), ()),
}


TABLE_CHECKSUM = "table_checksum"
"""The episode table's own checksum field: optional for reading (older shards lack it)."""
TABLE_CHECKSUM_DTYPE = np.dtype(np.uint32)


def table_checksums(table: dict[str, np.ndarray], rows: np.ndarray | None = None) -> np.ndarray:
    """crc32 of each episode's row of :data:`EPISODE_FIELDS` (little-endian bytes, field order).

    Args:
        table: The episode table, field -> array.
        rows: Which rows (all when ``None``).
    """
    import zlib

    picked = {
        name: np.ascontiguousarray(table[name] if rows is None else table[name][rows])
        .astype(dtype.newbyteorder("<"), copy=False)
        .reshape(-1, int(np.prod(shape, dtype=np.int64)) if shape else 1)
        for name, (dtype, shape) in EPISODE_FIELDS.items()
    }
    count = len(next(iter(picked.values())))
    joined = np.concatenate([picked[name].view(np.uint8).reshape(count, -1) for name in picked], 1)
    return np.fromiter((zlib.crc32(row) for row in joined), dtype=TABLE_CHECKSUM_DTYPE, count=count)


class StoreVersion(IntEnum):
    """Versions of the emote-memory Zarr layout."""

    V1 = 1
    """Zarr v3 group; shards of flat per-column arrays, an episode table and a commit record.

    Later additions within V1 are optional attributes that readers take as unknown when absent
    (and older readers ignore): the root's ``env_id``, the shards' ``provenance`` records."""
    LATEST = V1


class RowKind:
    """How many rows a column holds per episode."""

    TRANSITIONS = "transitions"
    """N rows (actions, rewards)."""
    OBSERVATIONS = "observations"
    """N + 1 rows (observations, including the final one)."""
    EPISODE = "episode"
    """One row (tag columns)."""
    VIRTUAL = "virtual"
    """No rows: derived when sampling (recorded in ``virtual_columns`` for the schema only)."""


@dataclass(frozen=True)
class StoreColumn:
    """A stored column of an emote-memory store.

    Attributes:
        schema: Name, kind, shape and dtype.
        rows: A :class:`RowKind` value.
    """

    schema: ColumnSchema
    rows: str

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def extra_rows(self) -> int:
        return 1 if self.rows == RowKind.OBSERVATIONS else 0

    def chunk_rows(self) -> int:
        row_bytes = max(
            1, int(np.prod(self.schema.shape, dtype=np.int64)) * self.schema.dtype.itemsize
        )
        return max(1, 1 << max(0, (CHUNK_BYTES // row_bytes).bit_length() - 1))

    def to_json(self) -> dict[str, Any]:
        column = self.schema
        return {
            "name": column.name,
            "kind": column.kind,
            "shape": list(column.shape),
            "dtype": column.dtype.str,
            "rows": self.rows,
            "target_name": column.target_name,
            "mapper": column.mapper,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any], source: str) -> StoreColumn:
        try:
            schema = ColumnSchema(
                name=str(document["name"]),
                kind=str(document["kind"]),
                shape=tuple(int(s) for s in document["shape"]),
                dtype=np.dtype(document["dtype"]),
                target_name=document.get("target_name"),
                mapper=document.get("mapper"),
            )
            rows = str(document["rows"])
        except (KeyError, TypeError, ValueError) as error:
            raise FormatError(
                f"store '{source}' has a malformed column entry: {error!r}"
            ) from error
        if rows not in (
            RowKind.TRANSITIONS,
            RowKind.OBSERVATIONS,
            RowKind.EPISODE,
            RowKind.VIRTUAL,
        ):
            raise FormatError(f"store '{source}' column '{schema.name}' has unknown rows '{rows}'")
        return cls(schema, rows)


def check_format(attributes: dict[str, Any], source: str) -> int:
    """Checks the root attributes name this format in a version this emote reads.

    Raises:
        FormatError: If not an emote-memory store, or written by a newer emote.
    """
    if attributes.get("format") != FORMAT_NAME:
        raise FormatError(
            f"'{source}' is not an emote memory store (its format is "
            f"{attributes.get('format')!r}, expected '{FORMAT_NAME}')"
        )
    version = attributes.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise FormatError(f"store '{source}' has an invalid format_version {version!r}")
    if version > StoreVersion.LATEST:
        raise FormatError(
            f"store '{source}' has format_version {version}; this emote reads up to "
            f"{int(StoreVersion.LATEST)} — upgrade emote"
        )
    return version


__all__ = [
    "CHUNK_BYTES",
    "COLUMNS",
    "DEFAULT_SHARD",
    "EPISODES",
    "EPISODE_FIELDS",
    "FORMAT_NAME",
    "SHARDS",
    "TABLE_CHECKSUM",
    "RowKind",
    "StoreColumn",
    "StoreVersion",
    "check_format",
    "table_checksums",
]
