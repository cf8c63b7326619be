"""Upstream emote-rl 23's Legacy memory zip, read without upstream emote and without running it.

The zip holds ``data.pickle`` (strategies, columns, episode lengths) and one pickled storage per
column (``<col>.npy``); all of it is read by :mod:`emote_core.stores.safe_pickle`, upstream
classes as inert stand-ins. Negative ids stored as ``id + 2**64`` read back negative; the format
records no end states, so every episode is TERMINAL. :func:`write_legacy_zip` writes the layout
(deprecated, as upstream's writer was), naming upstream's classes without importing them.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.integrations.upstream.v1 import write_atomically
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


# Writing.

_COLUMN = "emote.memory.column"
_STORAGE = "emote.memory.storage"
_FIFO, _UNIFORM = "emote.memory.fifo_strategy", "emote.memory.uniform_strategy"
_COVERAGE = "emote.memory.coverage_based_strategy"
_STRATEGY_MODULES = {
    "FifoEjectionStrategy": _FIFO, "FifoSampleStrategy": _FIFO,
    "UniformEjectionStrategy": _UNIFORM, "UniformSampleStrategy": _UNIFORM,
    "CoverageBasedSampleStrategy": _COVERAGE,
}  # fmt: skip
_MAPPER_NAMES = {
    "OnlyLastMapper": "NextElementMapper.with_only_last",
    "SyntheticDones": "SyntheticDones",
    "SyntheticMasks": "SyntheticDones.as_mask",
}


class _UpstreamInstance:
    """An object pickled as an instance of the upstream class its type names (``upstream``)."""

    upstream: tuple[str, str] = ("", "")


_classes: dict[tuple[str, str], type] = {}


def _upstream_class(module: str, qualname: str) -> type:
    key = (module, qualname)
    if key not in _classes:
        _classes[key] = type(qualname.replace(".", "_"), (_UpstreamInstance,), {"upstream": key})
    return _classes[key]


def _upstream_object(module: str, qualname: str, state: dict[str, Any]) -> Any:
    instance = _upstream_class(module, qualname)()
    instance.__dict__.update(state)
    return instance


class _UpstreamPickler(pickle._Pickler):  # type: ignore[name-defined]
    """Pickles :func:`_upstream_class` classes by upstream's names (the pure-Python pickler is
    the one whose ``save_global`` can be overridden); everything else as pickle does."""

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if isinstance(obj, type) and issubclass(obj, _UpstreamInstance):
            module, qualname = obj.upstream
            self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


def _unsigned(identity: int) -> int:
    return identity % 2**64  # upstream keys negative ids as id + 2**64


def _strategy(strategy: Any, lengths: dict[int, int]) -> Any:
    kind = type(strategy).__name__
    module = _STRATEGY_MODULES.get(kind)
    if module is None:
        raise FormatError(
            f"the Legacy format records only upstream's strategies {sorted(_STRATEGY_MODULES)}; "
            f"the table uses a {kind}: store with TableSerializationVersion.V1"
        )
    state: dict[str, Any] = {"_in_simple_import": False}
    if module == _FIFO:
        state["_sequence_lengths"] = dict(lengths)
        state["_identities"] = collections.deque(lengths)
        if kind == "FifoSampleStrategy":
            state["_per_episode"] = bool(strategy.per_episode)
            state["_random_offset"] = bool(strategy.random_offset)
    else:  # uniform and coverage weights are rebuilt from the lengths on first use
        state.update(_identities=dict(lengths), _ids=[], _prios=[], _dirty=True)
        if module == _COVERAGE:
            state.update(_sample_count=dict.fromkeys(lengths, 0), _alpha=float(strategy.alpha))
    return _upstream_object(module, kind, state)


def _column(column: Any) -> Any:
    kind = type(column).__name__
    state: dict[str, Any] = {"name": column.name, "shape": column.shape, "dtype": column.dtype}
    if kind == "VirtualColumn":
        description = column.mapper.describe()
        mapper = description["type"]
        if mapper == "NextElementMapper" and description.get("n", 1) == 1:
            qualname = "NextElementMapper"
        elif mapper in _MAPPER_NAMES:
            qualname = _MAPPER_NAMES[mapper]
        else:
            raise FormatError(
                f"virtual column '{column.name}' uses {description}, which the Legacy format "
                "cannot name; store with TableSerializationVersion.V1"
            )
        state.update(target_name=column.target_name, mapper=_upstream_class(_STORAGE, qualname))
    return _upstream_object(_COLUMN, kind, state)


def write_legacy_zip(table: ArrayMemoryTable, path: str | os.PathLike[str]) -> None:
    """Writes ``table`` to ``path`` in upstream emote-rl 23's Legacy layout (pickles).

    Deprecated, as upstream's: prefer V1. The pickles name upstream's classes (columns, FIFO,
    uniform or coverage strategies) with their state as upstream kept it; episode ids are
    keyed as upstream did (negative ones as ``id + 2**64``).

    Warns:
        DeprecationWarning: Always.
        UserWarning: If episodes ended INTERRUPTED: the format records no end states, so they
            read back TERMINAL.

    Raises:
        FormatError: If a strategy or mapper has no upstream counterpart the format can name.
        StorageError: If the file cannot be written.
    """
    warnings.warn(
        "Legacy memory export uses pickles, which are unsafe to read and break when classes "
        "move; store with TableSerializationVersion.V1",
        DeprecationWarning,
        stacklevel=3,  # the caller of store_table
    )
    episodes = list(table.episodes())
    interrupted = sum(end != EpisodeState.TERMINAL for _, _, end in episodes)
    if interrupted:
        warnings.warn(
            f"the Legacy format records no end states: {interrupted} INTERRUPTED episodes will "
            "read back TERMINAL; store with TableSerializationVersion.V1 to keep them",
            UserWarning,
            stacklevel=3,
        )
    lengths = {_unsigned(i): len(data[table.length_key]) for i, data, _ in episodes}
    parts = {
        "ejector": _strategy(table.ejector, lengths),
        "sampler": _strategy(table.sampler, lengths),
        "length_key": table.length_key,
        "maxlen": table.maxlen,
        "columns": {name: _column(column) for name, column in table.columns.items()},
        "lengths": lengths,
        "filled": bool(table.full()),
    }
    data_pickle = io.BytesIO()
    _UpstreamPickler(data_pickle, protocol=4).dump(parts)
    stored = [*table.stored, *table.tags]

    def write_members(archive: zipfile.ZipFile) -> None:
        archive.writestr(DATA_PICKLE, data_pickle.getvalue())
        for column in stored:
            # upstream keeps a tag as one row, like a per-step column of one step
            storage = {
                _unsigned(i): np.asarray(data[column.name]).reshape(-1, *column.shape)
                for i, data, _ in episodes
            }
            with archive.open(f"{column.name}.npy", "w", force_zip64=True) as member:
                np.save(member, np.array(storage, dtype=object), allow_pickle=True)

    write_atomically(Path(path), write_members)


__all__ = ["DATA_PICKLE", "read_legacy_zip", "write_legacy_zip"]
