"""skrl (and rofunc) ``Memory.save`` exports read as episodes.

The primary observation (``observations``, else ``states``) becomes column ``obs``, other
``X``/``next_X`` pairs observation columns ``X``, other tensors per-transition columns. Each
env's rows are split at ``terminated`` (TERMINAL), ``truncated`` or an unflagged reset
(INTERRUPTED, counted in ``metadata["inferred_cuts"]``); rows skrl never wrote are left out.
On-policy memories (no ``next_*`` tensors) are refused: they lack each episode's final
observation. A memory saved after its ring wrapped reads in storage order; ``.csv`` files record
no env count, shapes or exact dtypes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.integrations.skrl.files import load_tensors
from emote_core.integrations.streams import (
    ACTIONS_KEY,
    INTERRUPTED,
    OBS_KEY,
    REWARDS_KEY,
    RUNNING,
    EnvStream,
    end_codes,
    peer_table,
    read_file_bytes,
    rewards_column,
    rows_flat,
)
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.stored import StoredTable

log = logging.getLogger(__name__)

SKRL_FORMAT = "skrl-memory"
"""The format name of skrl/rofunc memory exports."""

PRIMARY_OBSERVATIONS = ("observations", "states")
"""Names of the primary observation tensor: skrl 2.x's first, then skrl 1.x's and rofunc's."""

FLAG_TENSORS = ("terminated", "truncated", "dones")
"""End flags; ``dones`` (skrl before 1.0) counts as ``terminated``."""

_INFERENCE_ROWS = 4096
_MAX_INFERRED_ENVS = 256


def _pairs(names: set[str], source: str) -> dict[str, tuple[str, str]]:
    """Observation column -> (tensor, next tensor)."""
    primary = next((n for n in PRIMARY_OBSERVATIONS if n in names and f"next_{n}" in names), None)
    if primary is None:
        observed = next((n for n in PRIMARY_OBSERVATIONS if n in names), None)
        if observed is not None:
            raise FormatError(
                f"{source} was written by an on-policy agent (PPO, A2C, ...): it has "
                f"'{observed}' but no 'next_{observed}' (tensors {sorted(names)}), so its "
                "episodes' final observations are not in the file and emote cannot rebuild "
                "whole episodes; save the memory of an off-policy agent (SAC, TD3, DDPG, DQN), "
                "which stores next observations"
            )
        raise FormatError(
            f"{source} has tensors {sorted(names)} but no observations/next_observations (skrl "
            "2.x) or states/next_states (skrl 1.x, rofunc) pair; emote needs an observation and "
            "its next observation per row to rebuild episodes"
        )
    pairs = {OBS_KEY: (primary, f"next_{primary}")}
    for name in sorted(names):
        if name != primary and f"next_{name}" in names and name not in (ACTIONS_KEY, REWARDS_KEY):
            pairs[name] = (name, f"next_{name}")
    return pairs


def _check_names(names: set[str], pairs: dict[str, tuple[str, str]], source: str) -> None:
    missing = [name for name in (ACTIONS_KEY, REWARDS_KEY) if name not in names]
    if missing:
        raise FormatError(f"{source} has no {missing} tensor(s); its tensors are {sorted(names)}")
    if OBS_KEY in names and pairs[OBS_KEY][0] != OBS_KEY:
        raise FormatError(f"{source} has a tensor named 'obs', which clashes with emote's column")


def _blocks(tensors: dict[str, np.ndarray], source: str) -> tuple[dict[str, np.ndarray], int, int]:
    """``.pt``/``.npz`` tensors as ``(memory_size, num_envs, ...)`` with a common lead."""
    lead = None
    shaped = {}
    for name, array in tensors.items():
        if array.ndim < 2:
            raise FormatError(
                f"{source}: tensor '{name}' has shape {array.shape}; skrl tensors are "
                "(memory_size, num_envs, ...)"
            )
        array = array[..., None] if array.ndim == 2 else array
        if lead is None:
            lead = array.shape[:2]
        if array.shape[:2] != lead:
            raise FormatError(
                f"{source}: tensor '{name}' has shape {array.shape}, others start with {lead}; "
                "all tensors of a memory share (memory_size, num_envs)"
            )
        shaped[name] = array
    if lead is None:
        raise FormatError(f"{source} holds no tensors")
    return shaped, int(lead[0]), int(lead[1])


def _rows_match(next_obs: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """Per row: whether two ``(rows, ...)`` arrays hold the same values (NaN equal to NaN)."""
    same = next_obs == obs
    if next_obs.dtype.kind == "f":
        same |= np.isnan(next_obs) & np.isnan(obs)
    return rows_flat(same).all(axis=1)


def infer_num_envs(tensors: dict[str, np.ndarray], pair: tuple[str, str]) -> int:
    """The env count of a ``.csv`` export: the row offset at which next observations continue.

    Within an episode, row ``r``'s next observation is row ``r + num_envs``'s observation; the
    offset (up to 256) that matches most rows among the first 4096 wins, the smallest on ties.
    """
    obs = tensors[pair[0]][:_INFERENCE_ROWS]
    next_obs = tensors[pair[1]][:_INFERENCE_ROWS]
    best, best_matches = 1, 0
    for offset in range(1, min(len(obs), _MAX_INFERRED_ENVS + 1)):
        matches = int(_rows_match(next_obs[:-offset], obs[offset:]).sum())
        if matches > best_matches:
            best, best_matches = offset, matches
    return best


def _written_rows(columns: dict[str, np.ndarray]) -> int:
    """Rows before the trailing block skrl never wrote (float values NaN, others zero)."""
    rows = len(next(iter(columns.values())))
    unwritten = np.ones(rows, dtype=bool)
    for array in columns.values():
        flat = rows_flat(array)
        blank = np.isnan(flat) if array.dtype.kind == "f" else flat == 0
        unwritten &= blank.all(axis=1)
    written = np.flatnonzero(~unwritten)
    return int(written[-1]) + 1 if len(written) else 0


def _stream(
    rows: dict[str, np.ndarray],
    pairs: dict[str, tuple[str, str]],
    env: int,
    source: str,
    options: dict[str, Any],
    counts: dict[str, int],
) -> EnvStream:
    """One env's rows (name -> ``(T, ...)``) as a stream, with flags, cuts and autoresets."""
    count = len(rows[REWARDS_KEY])
    flags = {n: rows_flat(rows[n]).any(axis=1) for n in FLAG_TENSORS if n in rows}
    terminal = flags.get("terminated", np.zeros(count, bool)) | flags.get("dones", False)
    ends = end_codes(terminal=terminal, interrupted=flags.get("truncated", np.zeros(count, bool)))
    observations = {column: rows[names[0]] for column, names in pairs.items()}
    next_observations = {column: rows[names[1]] for column, names in pairs.items()}
    # The row after an end whose observation is that end's final one: a next-step autoreset.
    repeats = np.ones(max(count - 1, 0), dtype=bool)
    for column in pairs:
        repeats &= _rows_match(next_observations[column][:-1], observations[column][1:])
    suspected = np.flatnonzero((ends[:-1] != RUNNING) & repeats) + 1
    counts["suspected_autoreset_steps"] += len(suspected)
    keep = np.ones(count, dtype=bool)
    if options["drop_autoreset_steps"]:
        keep[suspected] = False
        counts["dropped_autoreset_steps"] += len(suspected)
    skip = {name for names in pairs.values() for name in names} | set(FLAG_TENSORS)
    steps = {ACTIONS_KEY: rows[ACTIONS_KEY][keep]}
    steps[REWARDS_KEY] = rewards_column(rows[REWARDS_KEY][keep], int(keep.sum()), source=source)
    for name, values in rows.items():
        if name not in skip and name not in steps:
            steps[name] = values[keep]
    stream = EnvStream(
        observations={k: v[keep] for k, v in observations.items()},
        next_observations={k: v[keep] for k, v in next_observations.items()},
        steps=steps,
        ends=ends[keep],
        env=env,
    )
    if options["infer_cuts"] and len(stream) > 1:
        continues = np.ones(len(stream) - 1, dtype=bool)
        for column in pairs:
            kept_next, kept_obs = stream.next_observations[column], stream.observations[column]
            continues &= _rows_match(kept_next[:-1], kept_obs[1:])
        cuts = np.flatnonzero((stream.ends[:-1] == RUNNING) & ~continues)
        stream.ends[cuts] = INTERRUPTED
        counts["inferred_cuts"] += len(cuts)
    return stream


def read_skrl_memory(
    path: str | os.PathLike[str],
    *,
    num_envs: int | None = None,
    infer_cuts: bool = True,
    drop_autoreset_steps: bool = False,
    trust_pickle: bool = False,
) -> StoredTable:
    """Reads a skrl/rofunc ``Memory.save`` export (``.pt``, ``.npz`` or ``.csv``) as episodes.

    Args:
        path: The exported file.
        num_envs: The memory's env count, for ``.csv`` files (which do not record it); inferred
            when ``None``. Ignored for ``.pt``/``.npz``, whose tensors carry it.
        infer_cuts: End an episode (INTERRUPTED) where a row's next observation differs from
            the following row's observation although no flag is set.
        drop_autoreset_steps: Drop the row after each episode end whose observation repeats that
            end's final observation (skrl with next-step-autoreset vector envs).
        trust_pickle: Load ``.pt`` files with ``weights_only=False`` (runs the file's code).

    Returns:
        Columns ``obs`` (``N + 1`` rows per episode), any further observation columns,
        ``actions``, ``rewards`` (float32, ``(1,)``) and any other per-row tensors; ``metadata``
        with ``num_envs``, ``memory_size``, ``layout``, ``file_kind``, ``valid_rows`` per env,
        ``episode_envs``, ``inferred_cuts`` and the autoreset counts. ``spaces`` is ``None``.

    Raises:
        FormatError: The file is missing, empty, damaged, not a skrl export, a ``.pt`` that
            ``weights_only`` loading refuses (the message names ``--trust-pickle``), or it
            declares more than its size and the free memory allow.
    """
    source = f"skrl memory '{path}'"
    resolved, data = read_file_bytes(path, "skrl memory")
    loaded = load_tensors(
        data,
        suffix=Path(resolved).suffix,
        source=source,
        trust_pickle=trust_pickle,
        budget=AllocationBudget(source, len(data)),
    )
    names = set(loaded.tensors)
    pairs = _pairs(names, source)
    _check_names(names, pairs, source)
    per_env: list[dict[str, np.ndarray]]
    memory_size: int | None
    if loaded.kind == "csv":
        inferred = num_envs is None
        envs = infer_num_envs(loaded.tensors, pairs[OBS_KEY]) if inferred else int(num_envs)
        if envs < 1:
            raise FormatError(f"num_envs must be at least 1; got {num_envs}")
        per_env = [{n: t[env::envs] for n, t in loaded.tensors.items()} for env in range(envs)]
        memory_size = None  # a .csv holds only the written rows
        valid = [len(rows[REWARDS_KEY]) for rows in per_env]
    else:
        inferred = False
        blocks, memory_size, envs = _blocks(loaded.tensors, source)
        per_env = [{name: array[:, env] for name, array in blocks.items()} for env in range(envs)]
        valid = [_written_rows(rows) for rows in per_env]
        per_env = [
            {n: a[:rows] for n, a in env.items()} for env, rows in zip(per_env, valid, strict=True)
        ]
    counts = {"inferred_cuts": 0, "suspected_autoreset_steps": 0, "dropped_autoreset_steps": 0}
    options = {"infer_cuts": infer_cuts, "drop_autoreset_steps": drop_autoreset_steps}
    streams = [_stream(rows, pairs, i, source, options, counts) for i, rows in enumerate(per_env)]
    if counts["suspected_autoreset_steps"] and not drop_autoreset_steps:
        log.warning(
            "%s: %d rows right after an episode end repeat its final observation (a vector env "
            "that autoresets on the next step); pass drop_autoreset_steps=True to drop them",
            source,
            counts["suspected_autoreset_steps"],
        )
    metadata = {
        "num_envs": envs,
        "num_envs_inferred": inferred,
        "memory_size": memory_size,
        "layout": pairs[OBS_KEY][0],
        "file_kind": loaded.kind,
        "tensors": sorted(names),
        "valid_rows": valid,
        **counts,
    }
    return peer_table(source=source, format=SKRL_FORMAT, streams=streams, metadata=metadata)


__all__ = [
    "FLAG_TENSORS",
    "PRIMARY_OBSERVATIONS",
    "SKRL_FORMAT",
    "infer_num_envs",
    "read_skrl_memory",
]
