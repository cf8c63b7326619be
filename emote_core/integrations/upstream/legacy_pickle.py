"""The older legacy ``.pickle`` memory dump: flat arrays of steps split into episodes at dones.

The dict's ``obs``, ``next_obs``, ``actions``, ``rewards`` and ``dones`` are flattened over steps,
envs and agents; an episode ends at a ``done`` (TERMINAL, final observation ``next_obs``), the
steps after the last done form an INTERRUPTED episode. Episodes come back with columns ``obs``
(``N + 1`` rows), ``actions`` and ``rewards`` and ids ``0, 1, ...`` in file order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.safe_pickle import safe_loads
from emote_core.stores.stored import (
    ColumnSchema,
    EpisodeRecord,
    StoredTable,
    fit_episodes,
    replace_content,
)
from emote_core.typing import EpisodeState

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

LEGACY_KEYS = ("obs", "next_obs", "actions", "rewards", "dones")
"""The keys of a legacy dump."""

EPISODE_COLUMNS = ("obs", "actions", "rewards")
"""The columns of the episodes read from a legacy dump."""


def _load(path: Path, trust_pickle: bool) -> tuple[Any, AllocationBudget]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise FormatError(f"cannot read legacy dump '{path}' ({error})") from error
    if not data:
        raise FormatError(f"legacy dump '{path}' is empty")
    if trust_pickle:
        log.warning("unpickling %s without restrictions (--trust-pickle): it may run code", path)
    budget = AllocationBudget(f"legacy dump '{path}'", len(data))
    return safe_loads(data, trust=trust_pickle, budget=budget), budget


def split_legacy_dump(
    state: Any, *, source: str, budget: AllocationBudget | None = None
) -> list[EpisodeRecord]:
    """Splits a legacy dump's arrays into episodes.

    Args:
        state: The unpickled dump: a dict with :data:`LEGACY_KEYS`.
        source: The file, for messages.
        budget: When given, charged with each field's array before it is made from lists.

    Returns:
        ``(identity, {"obs", "actions", "rewards"}, end_state)`` per episode, in file order.

    Raises:
        FormatError: If keys are missing, the arrays' step counts disagree, or a field expands
            beyond ``budget``.
    """
    if not isinstance(state, Mapping):
        raise FormatError(f"{source} holds a {type(state).__name__}; a legacy dump is a dict")
    missing = [key for key in LEGACY_KEYS if key not in state]
    if missing:
        raise FormatError(
            f"{source} lacks {missing}; a legacy dump has {list(LEGACY_KEYS)} "
            f"(it has {sorted(map(str, state))[:10]})"
        )
    arrays = {}
    for key in LEGACY_KEYS:
        if budget is not None and not isinstance(state[key], np.ndarray):
            budget.charge_nested(f"field '{key}'", state[key])
        try:
            array = np.asarray(state[key])
        except (ValueError, TypeError) as error:
            raise FormatError(f"{source}: '{key}' is not an array ({error})") from error
        if array.dtype.hasobject or array.dtype.kind not in "biuf":
            raise FormatError(f"{source}: '{key}' has dtype {array.dtype}; expected numbers")
        arrays[key] = array
    flat = {k: arrays[k].reshape(-1, *arrays[k].shape[3:]) for k in LEGACY_KEYS if k != "actions"}
    steps = len(flat["dones"])
    counts = {key: len(flat[key]) for key in ("obs", "next_obs", "rewards")}
    if any(count != steps for count in counts.values()):
        raise FormatError(
            f"{source}: 'dones' has {steps} steps but the other arrays have {counts}; they must "
            "agree after flattening steps x envs x agents"
        )
    if steps == 0:
        return []
    actions = arrays["actions"]
    if actions.size % steps:
        raise FormatError(
            f"{source}: 'actions' holds {actions.size} values, not a multiple of the {steps} steps"
        )
    actions = actions.reshape(steps, actions.size // steps)
    dones = flat["dones"].reshape(steps, -1).any(axis=1)
    obs, next_obs, rewards = flat["obs"], flat["next_obs"], flat["rewards"]
    episodes: list[EpisodeRecord] = []
    bounds = [(int(end), EpisodeState.TERMINAL) for end in np.flatnonzero(dones)]
    if not bounds or bounds[-1][0] < steps - 1:
        bounds.append((steps - 1, EpisodeState.INTERRUPTED))
    start = 0
    for end, end_state in bounds:
        data = {
            "obs": np.concatenate([obs[start : end + 1], next_obs[end : end + 1]]),
            "actions": actions[start : end + 1],
            "rewards": rewards[start : end + 1],
        }
        episodes.append((len(episodes), data, end_state))
        start = end + 1
    return episodes


def read_legacy_pickle_episodes(
    path: str | os.PathLike[str], *, trust_pickle: bool = False
) -> list[EpisodeRecord]:
    """Reads a legacy ``.pickle`` dump as episodes, through the restricted unpickler.

    Args:
        path: The dump.
        trust_pickle: Unpickle without restrictions (runs the file's code): only for files
            whose origin the user vouches for.

    Returns:
        ``(identity, {"obs", "actions", "rewards"}, end_state)`` per episode: TERMINAL where
        the dump has a done, INTERRUPTED for the steps after the last done.

    Raises:
        UnsafePickleError: The pickle names a global outside the allowlist; nothing ran.
        FormatError: The file is not a readable legacy dump, or declares more than its size
            and the free memory allow.
    """
    path = Path(path)
    state, budget = _load(path, trust_pickle)
    return split_legacy_dump(state, source=f"legacy dump '{path}'", budget=budget)


def read_legacy_pickle(path: str | os.PathLike[str], *, trust_pickle: bool = False) -> StoredTable:
    """Reads a legacy dump as a :class:`StoredTable` (schemas taken from the arrays)."""
    episodes = read_legacy_pickle_episodes(path, trust_pickle=trust_pickle)
    columns = []
    if episodes:
        first = episodes[0][1]
        columns = [
            ColumnSchema(name, "Column", first[name].shape[1:], first[name].dtype)
            for name in EPISODE_COLUMNS
        ]
    return StoredTable(
        source=f"legacy dump '{path}'",
        format="legacy-pickle",
        columns=columns,
        episodes=episodes,
        length_key="actions",
    )


def restore_legacy_pickle(
    table: ArrayMemoryTable,
    path: str | os.PathLike[str],
    *,
    fields: Mapping[str, str] | None = None,
    trust_pickle: bool = False,
) -> None:
    """Replaces ``table``'s content with a legacy dump's episodes, all or nothing.

    Each stored column of the table is filled from a dump field (``obs``, ``actions`` or
    ``rewards``); per-step values are reshaped to the column's shape when their sizes match.

    Args:
        table: The table to fill.
        path: The dump.
        fields: Table column -> dump field, for columns not named like the fields.
        trust_pickle: See :func:`read_legacy_pickle_episodes`.

    Raises:
        UnsafePickleError: The pickle names a global outside the allowlist; nothing ran.
        FormatError: The dump cannot fill the table's columns; the table is unchanged.
    """
    source = f"legacy dump '{path}'"
    fields = dict(fields or {})
    if table.tags:
        raise FormatError(
            f"{source} has no per-episode values for tag columns {[c.name for c in table.tags]}"
        )
    for column in table.stored:
        field = fields.setdefault(column.name, column.name)
        if field not in EPISODE_COLUMNS:
            raise FormatError(
                f"the table's column '{column.name}' has no counterpart in {source}, which holds "
                f"{list(EPISODE_COLUMNS)}; map it with fields={{'{column.name}': 'obs'}} or similar"
            )
    episodes = read_legacy_pickle_episodes(path, trust_pickle=trust_pickle)
    mapped = []
    for identity, data, end_state in episodes:
        values = {}
        for column in table.stored:
            array = data[fields[column.name]]
            if array.shape[1:] != column.shape:
                if int(np.prod(array.shape[1:])) != int(np.prod(column.shape)):
                    raise FormatError(
                        f"{source}: field '{fields[column.name]}' has per-step shape "
                        f"{array.shape[1:]}, which does not fit the table's column "
                        f"'{column.name}' of shape {column.shape}"
                    )
                array = array.reshape(len(array), *column.shape)
            values[column.name] = array
        mapped.append((identity, values, end_state))
    replace_content(table, fit_episodes(table, mapped, source=source), source=source)


__all__ = [
    "EPISODE_COLUMNS",
    "LEGACY_KEYS",
    "read_legacy_pickle",
    "read_legacy_pickle_episodes",
    "restore_legacy_pickle",
    "split_legacy_dump",
]
