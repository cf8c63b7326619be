"""Upstream emote-rl 23's Legacy memory zip, read without upstream emote and without running it.

The zip holds ``data.pickle`` (strategies, columns, episode lengths) and one pickled storage per
column (``<col>.npy``); all of it is read by :mod:`emote_core.stores.safe_pickle`, upstream
classes as inert stand-ins. Negative ids stored as ``id + 2**64`` read back negative; the format
records no end states, so every episode is TERMINAL.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.safe_pickle import read_npy, safe_loads, upstream_name
from emote_core.stores.stored import (
    COLUMN_KINDS,
    ColumnSchema,
    StoredTable,
    check_schema,
    read_member,
    signed_identity,
)
from emote_core.typing import EpisodeState

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

DATA_PICKLE = "data.pickle"

_MAPPERS = {
    "NextElementMapper": {"type": "NextElementMapper", "n": 1},
    "NextElementMapper.with_only_last": {"type": "OnlyLastMapper"},
    "SyntheticDones": {"type": "SyntheticDones"},
    "SyntheticDones.as_mask": {"type": "SyntheticMasks"},
}


def _class_name(value: Any) -> str:
    """The upstream class (or function) name of a stand-in, or of a real object when trusted."""
    name = upstream_name(value)
    if name is not None:
        return name.split(".memory.", 1)[-1].split(".", 1)[-1]
    if isinstance(value, type):
        return value.__qualname__
    return getattr(value, "__qualname__", type(value).__qualname__)


def _dtype_of(value: Any, where: str) -> np.dtype[Any]:
    if value is not None and upstream_name(value) is None:
        try:
            dtype = np.dtype(value)
        except TypeError:
            pass
        else:
            if not dtype.hasobject:
                return dtype
    raise FormatError(f"{where} has dtype {value!r}; expected a numpy dtype or scalar type")


def _column_schema(name: str, column: Any, source: str) -> ColumnSchema:
    where = f"column '{name}' in {source}'s {DATA_PICKLE}"
    kind = _class_name(column)
    if kind not in COLUMN_KINDS:
        raise FormatError(f"{where} is a {kind}; expected one of {list(COLUMN_KINDS)}")
    shape = getattr(column, "shape", None)
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, tuple | list) or not all(
        isinstance(s, int | np.integer) and s >= 0 for s in shape
    ):
        raise FormatError(f"{where} has shape {shape!r}; expected a tuple of sizes")
    dtype = _dtype_of(getattr(column, "dtype", None), where)
    target, mapper = None, None
    if kind == "VirtualColumn":
        target = getattr(column, "target_name", None)
        mapper_name = _class_name(getattr(column, "mapper", None))
        mapper = _MAPPERS.get(mapper_name, {"type": mapper_name})
    return ColumnSchema(name, kind, tuple(int(s) for s in shape), dtype, target, mapper)


def _read_parts(
    archive: zipfile.ZipFile, source: str, trust: bool, budget: AllocationBudget
) -> dict[str, Any]:
    budget.charge_zip(archive, [DATA_PICKLE])
    raw = read_member(archive, DATA_PICKLE, source=source)
    parts = safe_loads(raw, trust=trust, budget=budget)
    if not isinstance(parts, Mapping):
        raise FormatError(f"{source}'s {DATA_PICKLE} holds a {type(parts).__name__}, not a dict")
    missing = sorted({"columns", "lengths", "length_key"} - set(parts))
    if missing:
        raise FormatError(f"{source}'s {DATA_PICKLE} lacks {missing}; keys: {sorted(parts)}")
    if not isinstance(parts["columns"], Mapping) or not isinstance(parts["lengths"], Mapping):
        raise FormatError(f"{source}'s {DATA_PICKLE} must map 'columns' and 'lengths' in dicts")
    return dict(parts)


def _episode_order(parts: dict[str, Any], source: str) -> list[int]:
    lengths = {signed_identity(k, source=source): v for k, v in parts["lengths"].items()}
    for identity, length in lengths.items():
        if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 0:
            raise FormatError(f"{source} gives episode {identity} length {length!r}")
    # A FIFO ejector's queue is the insertion order; otherwise use the lengths dict's order.
    queue = getattr(parts.get("ejector"), "_identities", None)
    if queue is not None and not isinstance(queue, str):
        try:
            order = [signed_identity(i, source=source) for i in queue]
        except (FormatError, TypeError):
            order = []
        if sorted(order) == sorted(lengths) and len(set(order)) == len(order):
            return order
    return list(lengths)


def _episode_value(
    storage: Mapping[Any, Any], raw_id: Any, schema: ColumnSchema, source: str
) -> np.ndarray:
    if raw_id not in storage:
        raise FormatError(f"{source}: '{schema.name}.npy' has no data for episode {raw_id}")
    value = storage[raw_id]
    if not isinstance(value, np.ndarray) or value.dtype.hasobject:
        raise FormatError(
            f"{source}: '{schema.name}.npy' holds a {type(value).__name__} for episode {raw_id}; "
            "expected a numeric array"
        )
    if schema.kind == "TagColumn" and value.shape == (1, *schema.shape):
        return value[0]  # upstream keeps a tag as one row
    return value


def read_legacy_zip(
    archive: zipfile.ZipFile,
    *,
    source: str,
    table: ArrayMemoryTable | None = None,
    trust_pickle: bool = False,
) -> StoredTable:
    """Reads a Legacy zip through the restricted unpickler.

    Args:
        archive: The open zip.
        source: The file's name, for messages.
        table: When given, its schema is checked against the file's before the column data is
            read, and only its stored and tag columns are loaded.
        trust_pickle: Unpickle with plain :mod:`pickle` (runs the file's code; upstream emote
            must then be importable). Only for files whose origin the user vouches for.

    Raises:
        UnsafePickleError: A pickle names a global outside the allowlist; nothing ran.
        FormatError: The zip's pickles are not the Legacy layout or are inconsistent, its
            columns differ from ``table``'s, or its members declare more than the file's size
            and the free memory allow.
    """
    if trust_pickle:
        log.warning("unpickling %s without restrictions (--trust-pickle): it may run code", source)
    budget = AllocationBudget.for_zip(archive, source)
    parts = _read_parts(archive, source, trust_pickle, budget)
    columns = [_column_schema(str(n), c, source) for n, c in parts["columns"].items()]
    length_key = parts["length_key"]
    if not isinstance(length_key, str):
        raise FormatError(f"{source}'s {DATA_PICKLE} has length_key {length_key!r}")
    wanted = [c for c in columns if c.stored]
    if table is not None:
        check_schema(table, columns, source=source)
        names = {c.name for c in (*table.stored, *table.tags)}
        wanted = [c for c in wanted if c.name in names]
    order = _episode_order(parts, source)
    raw_ids = {signed_identity(k, source=source): k for k in parts["lengths"]}
    episodes_data: list[dict[str, np.ndarray]] = [{} for _ in order]
    budget.charge_zip(archive, [f"{schema.name}.npy" for schema in wanted])
    for schema in wanted:
        array = read_npy(
            read_member(archive, f"{schema.name}.npy", source=source),
            trust=trust_pickle,
            budget=budget,
        )
        storage = array[()] if array.shape == () else None
        if not isinstance(storage, Mapping):
            raise FormatError(
                f"{source}: '{schema.name}.npy' holds {type(storage).__name__}, not upstream's "
                "dict of episode id -> array"
            )
        for data, identity in zip(episodes_data, order, strict=True):
            data[schema.name] = _episode_value(storage, raw_ids[identity], schema, source)
    for data, identity in zip(episodes_data, order, strict=True):
        length = parts["lengths"][raw_ids[identity]]
        if length_key in data and len(data[length_key]) != length:
            raise FormatError(
                f"{source}: episode {identity} has {len(data[length_key])} rows of "
                f"'{length_key}' but its recorded length is {length}"
            )
    maxlen = parts.get("maxlen")
    return StoredTable(
        source=source,
        format="emote-legacy",
        columns=columns,
        episodes=[(i, d, EpisodeState.TERMINAL) for i, d in zip(order, episodes_data, strict=True)],
        length_key=length_key,
        maxlen=int(maxlen) if isinstance(maxlen, int | np.integer) else None,
        ejector_type=_class_name(parts["ejector"]) if "ejector" in parts else None,
        sampler_type=_class_name(parts["sampler"]) if "sampler" in parts else None,
    )


__all__ = ["DATA_PICKLE", "read_legacy_zip"]
