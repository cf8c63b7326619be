"""Upstream emote's V1 memory zip: JSON configuration plus raw ``.npy`` arrays, no pickles.

Members: ``version`` (``"1"``), ``configuration.json`` (strategies, ``length_key``, ``maxlen``,
ids, columns, and emote's ``end_states``, which upstream ignores; files without it read as all
TERMINAL), ``<col>.npy`` (every episode's rows, concatenated) and ``<col>.ranges.npy``
(``[episode id, first row, row count]``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError, StorageError
from emote_core.integrations.upstream.versions import TableSerializationVersion
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.safe_pickle import read_npy
from emote_core.stores.stored import (
    COLUMN_KINDS,
    ColumnSchema,
    EpisodeRecord,
    StoredTable,
    check_schema,
    read_member,
    signed_identity,
)
from emote_core.typing import EpisodeState

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

CONFIGURATION = "configuration.json"
VERSION = "version"
_END_STATES = {"TERMINAL": EpisodeState.TERMINAL, "INTERRUPTED": EpisodeState.INTERRUPTED}


# Writing.


def _dtype_name(dtype: np.dtype[Any]) -> str:
    # Upstream resolves names with getattr(numpy, name) ("bool" specially): prefer those names.
    return dtype.name if np.dtype(dtype.name) == dtype else dtype.str


def _column_entry(schema: ColumnSchema) -> list[Any]:
    config: dict[str, Any] = {"shape": list(schema.shape), "dtype": _dtype_name(schema.dtype)}
    if schema.kind == "VirtualColumn":
        config["target_name"] = schema.target_name
        config["mapper"] = schema.mapper
    return [schema.name, schema.kind, config]


def _strategy_state(
    type_name: str, state: dict[str, Any] | None, lengths: dict[int, int]
) -> dict[str, Any] | None:
    state = dict(state or {})
    if not state:
        return None
    # Upstream's FIFO strategies load "sequence_lengths" alongside "identities"; add them so
    # upstream emote can read what emote writes.
    if type_name.startswith("Fifo") and "identities" in state:
        state.setdefault(
            "sequence_lengths",
            [[int(i), lengths[int(i)]] for i in state["identities"] if int(i) in lengths],
        )
    return state


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_v1(table: ArrayMemoryTable, path: str | os.PathLike[str]) -> None:
    """Writes ``table`` to ``path`` as a V1 zip that upstream emote can read too.

    The zip is written to a temporary file next to ``path`` and moved over it at the end, so
    ``path`` never holds a half-written store.

    Raises:
        StorageError: If the file cannot be written (missing directory, permissions, disk full).
    """
    episodes = list(table.episodes())
    lengths = {identity: len(data[table.length_key]) for identity, data, _ in episodes}
    configuration: dict[str, Any] = {
        "ejector_type": type(table.ejector).__name__,
        "sampler_type": type(table.sampler).__name__,
        "length_key": table.length_key,
        "maxlen": table.maxlen,
    }
    states = {
        "ejector_state": _strategy_state(
            type(table.ejector).__name__, table.ejector.state(), lengths
        ),
        "sampler_state": _strategy_state(
            type(table.sampler).__name__, table.sampler.state(), lengths
        ),
    }
    schemas = [ColumnSchema.of(c) for c in table.columns.values()]
    _write(Path(path), configuration, states, schemas, episodes)


def write_v1_stored(
    stored: StoredTable,
    path: str | os.PathLike[str],
    *,
    source: dict[str, Any] | None = None,
) -> None:
    """Writes a :class:`StoredTable` (any reader's output) to ``path`` as a V1 zip.

    Strategy types and state are kept when the source recorded them; otherwise the zip names a
    FIFO ejector (holding the episodes oldest first) and a uniform sampler, which is what
    upstream emote's tables use. ``maxlen`` is the source's, raised to the transitions held.

    Args:
        stored: The episodes and column schemas to write.
        path: The file to write; replaced atomically if it exists.
        source: Where the episodes came from (``{"format", "sha256", "path"}``), recorded in
            ``configuration.json`` under ``"source"`` (upstream readers ignore it).

    Raises:
        FormatError: If ``stored`` has no length key.
        StorageError: If the file cannot be written.
    """
    if stored.length_key is None:
        raise FormatError(
            f"{stored.source} records no length key (the column that counts transitions); "
            "a V1 zip needs one"
        )
    key = stored.length_key
    lengths = {identity: len(data[key]) for identity, data, _ in stored.episodes}
    ejector_type = stored.ejector_type or "FifoEjectionStrategy"
    ejector_state = stored.ejector_state
    if ejector_state is None and ejector_type.startswith("Fifo"):
        ejector_state = {"identities": list(lengths)}
    configuration: dict[str, Any] = {
        "ejector_type": ejector_type,
        "sampler_type": stored.sampler_type or "UniformSampleStrategy",
        "length_key": key,
        "maxlen": max(stored.maxlen or 0, sum(lengths.values()), 1),
    }
    states = {
        "ejector_state": _strategy_state(ejector_type, ejector_state, lengths),
        "sampler_state": _strategy_state(
            configuration["sampler_type"], stored.sampler_state, lengths
        ),
    }
    extra = {"source": source} if source is not None else {}
    _write(Path(path), configuration, states, list(stored.columns), stored.episodes, extra)


def _write(
    path: Path,
    configuration: dict[str, Any],
    states: dict[str, dict[str, Any] | None],
    schemas: list[ColumnSchema],
    episodes: Sequence[EpisodeRecord],
    extra: dict[str, Any] | None = None,
) -> None:
    """Writes the zip: ``configuration`` completed with ids, states, columns and end states."""
    ids = [identity for identity, _, _ in episodes]
    stored = [schema for schema in schemas if schema.stored]
    configuration = {**configuration, "ids": ids}
    for key, state in states.items():
        if state is not None:
            configuration[key] = state
    configuration["columns"] = [_column_entry(schema) for schema in schemas]
    configuration["part_keys"] = [schema.name for schema in stored]
    configuration["end_states"] = [EpisodeState(end).name for _, _, end in episodes]
    configuration.update(extra or {})
    text = json.dumps(configuration, default=_json_default)

    def write_members(archive: zipfile.ZipFile) -> None:
        archive.writestr(VERSION, str(TableSerializationVersion.V1.value))
        archive.writestr(CONFIGURATION, text)
        for schema in stored:
            chunks = [np.asarray(data[schema.name]) for _, data, _ in episodes]
            if schema.kind == "TagColumn":
                chunks = [chunk.reshape(1, *schema.shape) for chunk in chunks]
            counts = np.array([len(chunk) for chunk in chunks], dtype=np.int64)
            ranges = np.zeros((len(ids), 3), dtype=np.int64)
            ranges[:, 0] = ids
            ranges[:, 1] = np.cumsum(counts) - counts
            ranges[:, 2] = counts
            if chunks:
                values = np.concatenate(chunks, axis=0).astype(schema.dtype, copy=False)
            else:
                values = np.zeros((0, *schema.shape), dtype=schema.dtype)
            for name, array in (
                (f"{schema.name}.ranges.npy", ranges),
                (f"{schema.name}.npy", values),
            ):
                with archive.open(name, "w", force_zip64=True) as member:
                    np.lib.format.write_array(
                        member, np.ascontiguousarray(array), allow_pickle=False
                    )

    write_atomically(path, write_members)


def write_atomically(path: Path, write_members: Callable[[zipfile.ZipFile], None]) -> None:
    """Writes a zip by ``write_members`` to a temporary file next to ``path``, readable by all
    (0644, as upstream's), then moves it over ``path``.

    Raises:
        StorageError: If the file cannot be written.
    """
    directory = path.parent
    if not directory.is_dir():
        raise StorageError(f"cannot write '{path}': directory '{directory}' does not exist")
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise StorageError(f"cannot write '{path}' ({error})") from error
    try:
        with os.fdopen(handle, "wb") as file:
            with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                write_members(archive)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise StorageError(f"cannot write '{path}' ({error})") from error
        raise


# Reading.


def _expect(condition: bool, source: str, what: str) -> None:
    if not condition:
        raise FormatError(f"{source} has a malformed {CONFIGURATION}: {what}")


def _parse_columns(entries: Any, source: str) -> list[ColumnSchema]:
    _expect(isinstance(entries, list), source, "'columns' must be a list")
    columns = []
    for entry in entries:
        _expect(
            isinstance(entry, list | tuple)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and entry[1] in COLUMN_KINDS
            and isinstance(entry[2], dict),
            source,
            f"column entry {str(entry)[:80]} is not [name, kind, {{shape, dtype}}]",
        )
        name, kind, config = entry
        shape = config.get("shape")
        _expect(
            isinstance(shape, list | tuple)
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape),
            source,
            f"column '{name}' has shape {shape!r}",
        )
        try:
            dtype = np.dtype(config.get("dtype"))
        except TypeError:
            raise FormatError(
                f"{source}: column '{name}' has dtype {config.get('dtype')!r}, which numpy "
                "does not know"
            ) from None
        _expect(not dtype.hasobject, source, f"column '{name}' has an object dtype")
        mapper = config.get("mapper")
        columns.append(
            ColumnSchema(
                name,
                kind,
                tuple(shape),
                dtype,
                config.get("target_name"),
                mapper if isinstance(mapper, dict) else None,
            )
        )
    return columns


def _parse_end_states(configuration: dict[str, Any], count: int, source: str) -> list[Any]:
    names = configuration.get("end_states")
    if names is None:
        return [EpisodeState.TERMINAL] * count
    _expect(
        isinstance(names, list) and len(names) == count and all(n in _END_STATES for n in names),
        source,
        f"'end_states' must list TERMINAL or INTERRUPTED for each of the {count} ids",
    )
    return [_END_STATES[name] for name in names]


def _column_members(schema: ColumnSchema) -> tuple[str, str]:
    return f"{schema.name}.npy", f"{schema.name}.ranges.npy"


def _read_column(
    archive: zipfile.ZipFile, schema: ColumnSchema, source: str
) -> tuple[np.ndarray, dict[int, tuple[int, int]]]:
    values_member, ranges_member = _column_members(schema)
    values = read_npy(read_member(archive, values_member, source=source), objects=False)
    ranges = read_npy(read_member(archive, ranges_member, source=source), objects=False)
    if values.ndim == 0 or values.shape[1:] != schema.shape:
        raise FormatError(
            f"{source}: '{schema.name}.npy' holds rows of shape {values.shape[1:]}, but "
            f"{CONFIGURATION} declares the column as {schema.describe()}"
        )
    if values.dtype != schema.dtype:
        if not np.can_cast(values.dtype, schema.dtype, "equiv"):
            raise FormatError(
                f"{source}: '{schema.name}.npy' has dtype {values.dtype}, but {CONFIGURATION} "
                f"declares the column as {schema.describe()}"
            )
        values = values.astype(schema.dtype)
    if ranges.ndim != 2 or ranges.shape[1] != 3 or ranges.dtype.kind not in "iu":
        raise FormatError(
            f"{source}: '{schema.name}.ranges.npy' must hold integer rows of [id, start, "
            f"length]; it holds {ranges.dtype} of shape {ranges.shape}"
        )
    spans: dict[int, tuple[int, int]] = {}
    for raw_id, start, count in ranges.tolist():
        identity = signed_identity(raw_id, source=source)
        if identity in spans:
            raise FormatError(f"{source}: '{schema.name}.ranges.npy' lists id {identity} twice")
        if start < 0 or count < 0 or start + count > len(values):
            raise FormatError(
                f"{source}: '{schema.name}.ranges.npy' gives episode {identity} rows "
                f"{start}..{start + count} of a column with {len(values)} rows"
            )
        spans[identity] = (start, count)
    return values, spans


def read_v1(
    archive: zipfile.ZipFile, *, source: str, table: ArrayMemoryTable | None = None
) -> StoredTable:
    """Reads a V1 zip.

    Args:
        archive: The open zip.
        source: The file's name, for messages.
        table: When given, its schema is checked against the file's before any data is read,
            and only its stored and tag columns are loaded.

    Raises:
        FormatError: If the configuration or the arrays are malformed or inconsistent, the
            file's columns differ from ``table``'s, or the members it reads declare more than
            the file's size and the free memory allow (checked before any is read).
    """
    budget = AllocationBudget.for_zip(archive, source)
    budget.charge_zip(archive, [CONFIGURATION])
    raw = read_member(archive, CONFIGURATION, source=source)
    try:
        configuration = json.loads(raw)
    except ValueError as error:
        raise FormatError(f"{source}: {CONFIGURATION} is not valid JSON ({error})") from error
    _expect(isinstance(configuration, dict), source, "it must be a JSON object")
    columns = _parse_columns(configuration.get("columns"), source)
    ids_raw = configuration.get("ids")
    _expect(isinstance(ids_raw, list), source, "'ids' must be a list of episode ids")
    ids = [signed_identity(value, source=source) for value in ids_raw]
    _expect(len(set(ids)) == len(ids), source, "'ids' lists an episode twice")
    part_keys = configuration.get("part_keys", [c.name for c in columns if c.stored])
    _expect(
        isinstance(part_keys, list) and all(isinstance(k, str) for k in part_keys),
        source,
        "'part_keys' must be a list of column names",
    )
    length_key, maxlen = configuration.get("length_key"), configuration.get("maxlen")
    _expect(length_key is None or isinstance(length_key, str), source, "bad 'length_key'")
    _expect(maxlen is None or isinstance(maxlen, int), source, "bad 'maxlen'")
    end_states = _parse_end_states(configuration, len(ids), source)
    by_name = {c.name: c for c in columns}
    stored_in_file = [by_name[k] for k in part_keys if k in by_name and by_name[k].stored]
    columns = [c for c in columns if not c.stored or c.name in part_keys]
    if table is not None:
        check_schema(table, columns, source=source)
        wanted = {c.name for c in (*table.stored, *table.tags)}
        stored_in_file = [c for c in stored_in_file if c.name in wanted]
    budget.charge_zip(archive, [name for c in stored_in_file for name in _column_members(c)])
    episodes_data: list[dict[str, np.ndarray]] = [{} for _ in ids]
    for schema in stored_in_file:
        values, spans = _read_column(archive, schema, source)
        for data, identity in zip(episodes_data, ids, strict=True):
            if identity not in spans:
                raise FormatError(
                    f"{source}: '{schema.name}.ranges.npy' has no rows for episode {identity}"
                )
            start, count = spans[identity]
            if schema.kind == "TagColumn":
                if count != 1:
                    raise FormatError(
                        f"{source}: tag column '{schema.name}' has {count} rows for episode "
                        f"{identity}; a tag has exactly one"
                    )
                data[schema.name] = values[start]
            else:
                data[schema.name] = values[start : start + count]
    sampler_state = configuration.get("sampler_state")
    ejector_state = configuration.get("ejector_state")
    return StoredTable(
        source=source,
        format="emote-v1",
        columns=columns,
        episodes=list(zip(ids, episodes_data, end_states, strict=True)),
        length_key=length_key,
        maxlen=maxlen,
        ejector_type=configuration.get("ejector_type"),
        ejector_state=ejector_state if isinstance(ejector_state, dict) else None,
        sampler_type=configuration.get("sampler_type"),
        sampler_state=sampler_state if isinstance(sampler_state, dict) else None,
    )


__all__ = [
    "CONFIGURATION",
    "VERSION",
    "EpisodeRecord",
    "read_v1",
    "write_atomically",
    "write_v1",
    "write_v1_stored",
]
