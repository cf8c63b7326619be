"""From per-env step streams to episodes: what every peer reader shares.

Peers store transitions as rows: observation, action, reward, next observation and end flags.
One env's rows in time order form a *stream*; an episode is a run of rows that ends at a row
flagged TERMINAL or INTERRUPTED, or at the end of the stream (an unfinished tail, kept as
INTERRUPTED). An episode of ``N`` rows becomes ``N + 1`` observations (the rows' observations
and the last row's next observation), ``N`` actions and ``N`` rewards.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.stored import ColumnSchema, EpisodeRecord, StoredTable
from emote_core.typing import EpisodeState

RUNNING = int(EpisodeState.RUNNING)
INTERRUPTED = int(EpisodeState.INTERRUPTED)
TERMINAL = int(EpisodeState.TERMINAL)
"""The per-row end codes of a stream (the :class:`EpisodeState` values)."""

OBS_KEY = "obs"
ACTIONS_KEY = "actions"
REWARDS_KEY = "rewards"


@dataclass
class EnvStream:
    """One env's rows in time order.

    Attributes:
        observations: Observation column -> the rows' observations, ``(T, ...)``.
        next_observations: Observation column -> the observation after each row, ``(T, ...)``.
        steps: Per-transition column (``actions``, ``rewards``, ...) -> ``(T, ...)``.
        ends: ``(T,)`` end codes: :data:`RUNNING`, :data:`TERMINAL` or :data:`INTERRUPTED`.
        env: The env's index, for ordering and metadata.
    """

    observations: dict[str, np.ndarray]
    next_observations: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    ends: np.ndarray
    env: int = 0

    def __len__(self) -> int:
        return len(self.ends)


def rows_flat(array: np.ndarray) -> np.ndarray:
    """``(rows, ...)`` as ``(rows, size)``; unlike ``reshape(rows, -1)`` also for zero rows."""
    return array.reshape(len(array), int(np.prod(array.shape[1:], dtype=np.int64)))


def end_codes(*, terminal: np.ndarray, interrupted: np.ndarray) -> np.ndarray:
    """Per-row end codes; a row flagged both ways ended its task, so it is TERMINAL."""
    codes = np.where(np.asarray(interrupted, dtype=bool), INTERRUPTED, RUNNING)
    return np.where(np.asarray(terminal, dtype=bool), TERMINAL, codes).astype(np.int8)


def rewards_column(rewards: np.ndarray, rows: int, *, source: str) -> np.ndarray:
    """Rewards as ``(rows, 1)`` float32, from ``(rows,)`` or ``(rows, 1)`` numbers."""
    array = np.asarray(rewards)
    if array.dtype.kind not in "biuf" or array.size != rows:
        raise FormatError(
            f"{source}: rewards hold {array.size} values of dtype {array.dtype}; expected "
            f"{rows} numbers (one per transition)"
        )
    return array.reshape(rows, 1).astype(np.float32, copy=False)


def split_stream(stream: EnvStream) -> list[tuple[int, EpisodeRecord]]:
    """Cuts a stream into episodes at its end codes; a tail without an end is INTERRUPTED.

    Returns:
        ``(row of the episode's last transition, (0, data, end_state))`` per episode, in order;
        identities are assigned later by :func:`merge_streams`.
    """
    episodes: list[tuple[int, EpisodeRecord]] = []
    rows = len(stream)
    if rows == 0:
        return episodes
    bounds = [int(row) for row in np.flatnonzero(stream.ends != RUNNING)]
    if not bounds or bounds[-1] != rows - 1:
        bounds.append(rows - 1)
    start = 0
    for end in bounds:
        data = {}
        for key, observations in stream.observations.items():
            final = stream.next_observations[key][end : end + 1]
            data[key] = np.concatenate([observations[start : end + 1], final])
        for key, values in stream.steps.items():
            data[key] = np.ascontiguousarray(values[start : end + 1])
        state = EpisodeState(int(stream.ends[end]) or INTERRUPTED)
        episodes.append((end, (0, data, state)))
        start = end + 1
    return episodes


def merge_streams(streams: list[EnvStream]) -> tuple[list[EpisodeRecord], list[int]]:
    """Episodes of all streams, ordered by the row they end at (then env), ids ``0, 1, ...``.

    Returns:
        The episodes and, for each, the env stream it came from.
    """
    tagged = []
    for stream in streams:
        for end, record in split_stream(stream):
            tagged.append((end, stream.env, record))
    tagged.sort(key=lambda item: (item[0], item[1]))
    episodes = [(i, data, state) for i, (_, _, (_, data, state)) in enumerate(tagged)]
    return episodes, [env for _, env, _ in tagged]


def schema_of(arrays: Mapping[str, np.ndarray]) -> list[ColumnSchema]:
    """Column schemas from ``(rows, ...)`` arrays: per-row shape and dtype."""
    return [
        ColumnSchema(name, "Column", tuple(array.shape[1:]), array.dtype)
        for name, array in arrays.items()
    ]


def peer_table(
    *,
    source: str,
    format: str,
    streams: list[EnvStream],
    spaces: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> StoredTable:
    """A :class:`StoredTable` of the streams' episodes (columns from the first stream)."""
    first = streams[0]
    columns = schema_of({**first.observations, **first.steps})
    episodes, envs = merge_streams(streams)
    info = dict(metadata or {})
    info["episode_envs"] = envs
    return StoredTable(
        source=source,
        format=format,
        columns=columns,
        episodes=episodes,
        length_key=ACTIONS_KEY,
        spaces=spaces,
        metadata=info,
    )


def read_file_bytes(path: str | os.PathLike[str], what: str) -> tuple[Path, bytes]:
    """The file's bytes.

    Raises:
        FormatError: If the file is missing, unreadable or empty.
    """
    resolved = Path(path)
    try:
        data = resolved.read_bytes()
    except FileNotFoundError:
        raise FormatError(f"{what} '{path}' does not exist") from None
    except OSError as error:
        raise FormatError(f"cannot read {what} '{path}' ({error})") from error
    if not data:
        raise FormatError(f"{what} '{path}' is empty (0 bytes); the file was not written")
    return resolved, data


def json_number(value: Any) -> Any:
    """A numpy scalar as a plain JSON number (non-finite floats as None)."""
    number = value.item() if isinstance(value, np.generic) else value
    if isinstance(number, float) and not math.isfinite(number):
        return None
    return number


__all__ = [
    "ACTIONS_KEY",
    "INTERRUPTED",
    "OBS_KEY",
    "REWARDS_KEY",
    "RUNNING",
    "TERMINAL",
    "EnvStream",
    "end_codes",
    "json_number",
    "merge_streams",
    "peer_table",
    "read_file_bytes",
    "rewards_column",
    "rows_flat",
    "schema_of",
    "split_stream",
]
