"""tmrl ``data.pkl`` datasets (the ``dataset_path`` of tmrl's memories) read as episodes.

A dataset is the ``data.pkl`` file or the folder holding it: seven per-entry lists (actions,
observations, rewards, terminated, truncated, infos, dones). An episode runs from a reset (entry
0, or an entry after a done) to the next done: TERMINAL where ``terminated`` is set, else
INTERRUPTED. Tuple observations whose parts share one numeric dtype are joined into one ``obs``
vector (``metadata["observation_parts"]`` says how to split it); otherwise each part is a column
``obs_0``, ``obs_1``, ...
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.integrations.streams import (
    ACTIONS_KEY,
    OBS_KEY,
    REWARDS_KEY,
    EnvStream,
    end_codes,
    peer_table,
    read_file_bytes,
    rewards_column,
    rows_flat,
)
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.safe_pickle import safe_loads
from emote_core.stores.stored import StoredTable

log = logging.getLogger(__name__)

TMRL_FORMAT = "tmrl-dataset"
"""The format name of tmrl ``data.pkl`` datasets."""

TMRL_LISTS = ("actions", "observations", "rewards", "terminated", "truncated", "infos", "dones")
"""The seven per-entry lists of a dataset, in file order."""

DATASET_FILE = "data.pkl"
"""The file in a tmrl ``dataset_path`` folder that holds the dataset."""


def _numeric(values: list[Any], what: str, source: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except (ValueError, TypeError) as error:
        raise FormatError(f"{source}: {what} do not form one array ({error})") from error
    if array.dtype.kind not in "biuf":
        raise FormatError(
            f"{source}: {what} have dtype {array.dtype} (or differ in shape); expected numbers of "
            "one shape per entry"
        )
    return array


def _observation_columns(observations: list[Any], source: str) -> tuple[dict, dict[str, Any]]:
    """Observation column -> ``(entries, ...)`` array, and what to record about the parts."""
    first = observations[0]
    if not isinstance(first, tuple | list):
        return {OBS_KEY: _numeric(observations, "observations", source)}, {}
    parts = len(first)
    if parts == 0 or any(not isinstance(o, tuple | list) or len(o) != parts for o in observations):
        raise FormatError(
            f"{source}: observations are tuples of differing lengths; expected {parts} parts in "
            "every entry"
        )
    arrays = [
        _numeric([o[i] for o in observations], f"observation part {i}", source)
        for i in range(parts)
    ]
    described = [{"shape": list(a.shape[1:]), "dtype": a.dtype.str} for a in arrays]
    if len({a.dtype for a in arrays}) == 1:
        joined = np.concatenate([rows_flat(a) for a in arrays], axis=1)
        return {OBS_KEY: joined}, {"observation_parts": described, "observation_flattened": True}
    columns = {f"{OBS_KEY}_{i}": array for i, array in enumerate(arrays)}
    return columns, {"observation_parts": described, "observation_flattened": False}


def _actions(actions: list[Any], starts: np.ndarray, source: str) -> np.ndarray:
    """The actions of the non-reset entries; reset placeholders (maybe ``None``) are skipped."""
    taken = [a for a, start in zip(actions, starts, strict=True) if not start]
    if not taken:
        return np.zeros((0, 1), dtype=np.float32)
    array = _numeric(taken, "actions", source)
    return array.reshape(len(array), 1) if array.ndim == 1 else array


def split_tmrl_lists(
    lists: Sequence[Sequence[Any]], *, source: str, budget: AllocationBudget | None = None
) -> tuple[EnvStream, dict]:
    """The dataset's entries as one stream of transitions (entry ``i - 1`` -> entry ``i``).

    Args:
        lists: The seven per-entry lists.
        source: The dataset, for messages.
        budget: When given, charged with the arrays the lists expand into before they are made
            (a list shared by many entries counts once per entry).

    Returns:
        The stream and metadata about the observation parts.

    Raises:
        FormatError: If the lists differ in length, hold values that are not numbers, or expand
            beyond ``budget``.
    """
    lengths = {name: len(values) for name, values in zip(TMRL_LISTS, lists, strict=True)}
    if len(set(lengths.values())) != 1:
        raise FormatError(f"{source}: the seven lists differ in length: {lengths}")
    if budget is not None:
        for name, values in zip(TMRL_LISTS[:3], lists[:3], strict=True):
            budget.charge_nested(f"the {name} list", values)
    entries = lengths["actions"]
    actions, observations, rewards, terminated, truncated, _, dones = lists
    dones_array = np.asarray([bool(d) for d in dones], dtype=bool)
    starts = np.zeros(entries, dtype=bool)
    if entries:
        starts[0] = True
        starts[1:] = dones_array[:-1]
    columns, info = _observation_columns(list(observations), source)
    # Transition t goes from entry t to entry t + 1 when entry t + 1 is not a reset.
    steps = np.flatnonzero(~starts[1:]) if entries else np.zeros(0, dtype=np.int64)
    targets = steps + 1
    taken = _actions(list(actions), starts, source)
    reward_values = _numeric([rewards[i] for i in targets], "rewards", source)
    term = np.asarray([bool(terminated[i]) for i in targets], dtype=bool)
    trunc = np.asarray([bool(truncated[i]) for i in targets], dtype=bool)
    ended = dones_array[targets] | term | trunc
    stream = EnvStream(
        observations={key: array[steps] for key, array in columns.items()},
        next_observations={key: array[targets] for key, array in columns.items()},
        steps={
            ACTIONS_KEY: taken,
            REWARDS_KEY: rewards_column(reward_values, len(targets), source=source),
        },
        ends=end_codes(terminal=ended & term, interrupted=ended & ~term),
    )
    info["entries"] = entries
    info["empty_resets_skipped"] = int(
        np.sum(starts & np.append(starts[1:], True)) if entries else 0
    )
    return stream, info


def dataset_file(path: str | os.PathLike[str]) -> Path:
    """The ``data.pkl`` of a dataset given as the file or as the folder holding it.

    tmrl's ``dataset_path`` is a folder holding ``data.pkl``; both spellings are accepted.

    Raises:
        FormatError: If ``path`` is a folder without a ``data.pkl`` file.
    """
    resolved = Path(path)
    if not resolved.is_dir():
        return resolved
    pickled = resolved / DATASET_FILE
    if not pickled.is_file():
        found = sorted(p.name for p in resolved.iterdir())[:8]
        raise FormatError(
            f"'{path}' is a directory without {DATASET_FILE} (it holds {found}); a tmrl dataset "
            f"folder (tmrl's dataset_path) holds {DATASET_FILE} — pass that folder or the file"
        )
    return pickled


def load_tmrl_lists(
    path: str | os.PathLike[str],
    *,
    trust_pickle: bool = False,
    budget: AllocationBudget | None = None,
) -> list[list]:
    """The seven per-entry lists of a tmrl dataset, unpickled through the restricted unpickler.

    Args:
        path: The ``data.pkl`` file or the folder holding it.
        trust_pickle: Unpickle without restrictions (runs the file's code).
        budget: What unpickling may allocate; by default the budget of the file's size.

    Raises:
        UnsafePickleError: The pickle names a global outside the allowlist; nothing ran.
        FormatError: The file is missing, empty, damaged, not a tmrl dataset, or declares more
            than its budget allows.
    """
    file = dataset_file(path)
    source = f"tmrl dataset '{path}'"
    _, data = read_file_bytes(file, "tmrl dataset")
    if trust_pickle:
        log.warning("unpickling %s without restrictions (--trust-pickle): it may run code", file)
    budget = budget or AllocationBudget(source, len(data))
    lists = safe_loads(data, trust=trust_pickle, budget=budget)
    if (
        not isinstance(lists, list | tuple)
        or len(lists) != len(TMRL_LISTS)
        or not all(isinstance(values, list | tuple) for values in lists)
    ):
        shape = f"{len(lists)} items" if isinstance(lists, list | tuple) else type(lists).__name__
        raise FormatError(
            f"{source} holds {shape}; a tmrl dataset is a list of seven lists "
            f"({', '.join(TMRL_LISTS)}), as GenericTorchMemory keeps them"
        )
    return [list(values) for values in lists]


def read_tmrl_dataset(path: str | os.PathLike[str], *, trust_pickle: bool = False) -> StoredTable:
    """Reads a tmrl dataset (``data.pkl``, or the folder holding it) as episodes.

    Args:
        path: The ``data.pkl`` file, or the folder holding it (tmrl's ``dataset_path``).
        trust_pickle: Unpickle without restrictions (runs the file's code): only for files
            whose origin the user vouches for.

    Returns:
        Columns ``obs`` (or ``obs_0``, ``obs_1``, ...; ``N + 1`` rows per episode), ``actions``
        and ``rewards`` (float32, ``(1,)``); ``metadata`` with the entry count and the
        observation parts. ``spaces`` is ``None`` (the file records none).

    Raises:
        UnsafePickleError: The pickle names a global outside the allowlist; nothing ran.
        FormatError: The file is missing, empty, damaged, not a tmrl dataset, or declares
            more than its size and the free memory allow (:mod:`emote_core.stores.budget`).
    """
    source = f"tmrl dataset '{path}'"
    budget = AllocationBudget.for_path(dataset_file(path), source)
    lists = load_tmrl_lists(path, trust_pickle=trust_pickle, budget=budget)
    if not lists[0]:
        raise FormatError(f"{source} holds seven empty lists: the dataset has no entries")
    stream, info = split_tmrl_lists(lists, source=source, budget=budget)
    return peer_table(source=source, format=TMRL_FORMAT, streams=[stream], metadata=info)


__all__ = [
    "DATASET_FILE",
    "TMRL_FORMAT",
    "TMRL_LISTS",
    "dataset_file",
    "load_tmrl_lists",
    "read_tmrl_dataset",
    "split_tmrl_lists",
]
