"""Writing a :class:`StoredTable` as a skrl ``Memory.save`` export: ``.npz``, ``.pt`` or ``.csv``.

The episodes become one env stream, one row per transition, oldest first: ``obs`` as
``states``/``next_states`` (or ``observations``/``next_observations``, :class:`SkrlLayout`),
other observation columns as ``X``/``next_X``, ``terminated``/``truncated`` on each episode's
last row. skrl's ``Memory.load`` takes the ``.npz``/``.pt`` files and
:func:`~emote_core.integrations.skrl.reader.read_skrl_memory` reads back the same episodes.
"""

from __future__ import annotations

import enum
import logging
import os
import secrets
from dataclasses import replace
from pathlib import Path

import numpy as np

from emote_core.errors import FormatError, StorageError
from emote_core.integrations.skrl.csv_tensors import write_csv_tensors
from emote_core.integrations.streams import ACTIONS_KEY, OBS_KEY, REWARDS_KEY, rows_flat
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)

WRITE_FORMATS = ("npz", "pt", "csv")
"""The file kinds :func:`write_skrl_memory` writes."""


class SkrlLayout(enum.Enum):
    """The tensor names of the primary observation in a written skrl export."""

    V1 = "states"
    """skrl 1.x and rofunc: ``states`` / ``next_states`` (what their off-policy agents create)."""
    V2 = "observations"
    """skrl 2.x: ``observations`` / ``next_observations``."""
    LATEST = "observations"
    """The newest skrl's names (an alias of :attr:`V2`)."""


def _observation_columns(table: StoredTable, names: list[str]) -> list[str]:
    """The columns holding ``N + 1`` rows per episode (all but actions/rewards when empty)."""
    if not table.episodes:
        return [name for name in names if name not in (ACTIONS_KEY, REWARDS_KEY)]
    _, data, _ = table.episodes[0]
    length = len(data[ACTIONS_KEY])
    return [name for name in names if len(data[name]) == length + 1]


def _joined(table: StoredTable, observed: list[str]) -> StoredTable:
    """The table with its observation columns flattened and joined into one ``obs`` column."""
    schema = {c.name: c for c in table.columns}
    size = sum(int(np.prod(schema[name].shape)) for name in observed)
    joined = ColumnSchema(OBS_KEY, "Column", (size,), schema[observed[0]].dtype)
    episodes = []
    for identity, data, end_state in table.episodes:
        parts = [rows_flat(np.asarray(data[name])) for name in observed]
        rest = {k: v for k, v in data.items() if k not in observed}
        episodes.append((identity, {OBS_KEY: np.concatenate(parts, axis=1), **rest}, end_state))
    columns = [joined, *(c for c in table.columns if c.name not in observed)]
    return replace(table, columns=columns, episodes=episodes)


def skrl_tensors(table: StoredTable, layout: SkrlLayout = SkrlLayout.V1) -> dict[str, np.ndarray]:
    """The table's episodes as one env stream of skrl tensors ``(rows, 1, ...)``.

    Raises:
        FormatError: If the table lacks ``actions`` or ``rewards``, an episode's row counts
            break the ``N + 1`` / ``N`` rule, or two tensors would get one name.
    """
    names = [c.name for c in table.columns if c.kind == "Column"]
    skipped = [c.name for c in table.columns if c.kind == "TagColumn"]
    if skipped:
        log.warning(
            "%s: per-episode tag columns %s have no place in skrl's layout; not written",
            table.source,
            skipped,
        )
    missing = [name for name in (ACTIONS_KEY, REWARDS_KEY) if name not in names]
    if missing:
        raise FormatError(
            f"{table.source} has no {missing} column(s) (columns: {names}); skrl's memory layout "
            "needs per-transition 'actions' and 'rewards'"
        )
    observed = _observation_columns(table, names)
    if not observed:
        raise FormatError(f"{table.source} has no observation column (N + 1 rows per episode)")
    dtypes = {c.dtype for c in table.columns if c.name in observed}
    if OBS_KEY not in observed and len(observed) > 1 and len(dtypes) == 1:
        # Like skrl with dict spaces: one flat observation vector, the columns in table order.
        return skrl_tensors(_joined(table, observed), layout)
    primary = OBS_KEY if OBS_KEY in observed else observed[0]
    tensor_names = {primary: (layout.value, f"next_{layout.value}")}
    for name in observed:
        if name != primary:
            tensor_names[name] = (name, f"next_{name}")
    per_row = [name for name in names if name not in observed]
    taken = [n for pair in tensor_names.values() for n in pair] + per_row
    taken += ["terminated", "truncated"]
    clashes = sorted({n for n in taken if taken.count(n) > 1})
    if clashes:
        raise FormatError(
            f"{table.source}: columns would share the skrl tensor names {clashes}; rename them"
        )
    schema = {c.name: c for c in table.columns}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in taken}
    for identity, data, end_state in table.episodes:
        absent = [name for name in (*tensor_names, *per_row) if name not in data]
        if absent:
            raise FormatError(f"{table.source}: episode {identity} has no {absent} data")
        length = len(data[ACTIONS_KEY])
        for name, (now, after) in tensor_names.items():
            rows = np.asarray(data[name])
            if len(rows) != length + 1:
                raise FormatError(
                    f"{table.source}: episode {identity} has {len(rows)} rows of '{name}' and "
                    f"{length} actions; observations need N + 1 rows"
                )
            parts[now].append(rows[:-1])
            parts[after].append(rows[1:])
        for name in per_row:
            rows = np.asarray(data[name])
            if len(rows) != length:
                raise FormatError(
                    f"{table.source}: episode {identity} has {len(rows)} rows of '{name}' and "
                    f"{length} actions; per-transition columns need N rows"
                )
            parts[name].append(rows)
        last = np.arange(length) == length - 1
        terminal = EpisodeState(end_state) == EpisodeState.TERMINAL
        parts["terminated"].append(last & terminal)
        parts["truncated"].append(last & ~terminal)
    tensors = {}
    for name, chunks in parts.items():
        source_column = next((c for c, pair in tensor_names.items() if name in pair), name)
        if name in ("terminated", "truncated"):
            shape, dtype = (), np.dtype(bool)
        else:
            shape, dtype = schema[source_column].shape, schema[source_column].dtype
        if name == REWARDS_KEY:
            dtype = np.dtype(np.float32)
        rows = np.concatenate(chunks) if chunks else np.zeros((0, *shape), dtype)
        rows = rows.astype(dtype, copy=False)
        tensors[name] = rows.reshape(len(rows), 1, *(rows.shape[1:] or (1,)))
    return dict(sorted(tensors.items()))


def _write(tensors: dict[str, np.ndarray], target: Path, kind: str) -> None:
    if kind == "npz":
        with target.open("xb") as file:
            np.savez(file, **tensors)
    elif kind == "pt":
        import torch

        try:
            data = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in tensors.items()}
        except TypeError as error:
            raise FormatError(f"a column's dtype has no torch equivalent ({error})") from error
        with target.open("xb") as file:
            torch.save(data, file)
    else:
        with target.open("x", newline="", encoding="utf-8") as file:
            write_csv_tensors(tensors, file)


def write_skrl_memory(
    table: StoredTable,
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    layout: SkrlLayout = SkrlLayout.V1,
) -> Path:
    """Writes ``table`` as a skrl memory export, atomically.

    Args:
        table: What a reader returned (any format).
        path: The file to write (exactly that name); an existing file is replaced.
        format: ``"npz"``, ``"pt"`` or ``"csv"``; taken from ``path``'s suffix when ``None``.
        layout: The primary observation's tensor names (skrl 1.x / rofunc by default).

    Returns:
        The written path.

    Raises:
        FormatError: If the format is unknown or the table does not fit skrl's layout (see
            :func:`skrl_tensors`); nothing is left at ``path`` then.
        StorageError: If the file cannot be written (no such folder, disk full).
    """
    target = Path(path)
    kind = (format or target.suffix.lstrip(".")).lower()
    if kind not in WRITE_FORMATS:
        raise FormatError(
            f"cannot write a skrl memory as {kind!r} ('{path}'); choose one of "
            f"{list(WRITE_FORMATS)}"
        )
    tensors = skrl_tensors(table, SkrlLayout(layout))
    # A fresh name beside the target, created with the user's umask (mkstemp would make it 0600).
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    try:
        _write(tensors, temporary, kind)
        os.replace(temporary, target)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise StorageError(
                f"cannot write '{path}' ({error}); check the folder exists"
            ) from error
        raise
    return target


__all__ = ["WRITE_FORMATS", "SkrlLayout", "skrl_tensors", "write_skrl_memory"]
