"""Reading a run of a shard's committed episodes, and nothing else: what a follower appends.

:class:`~emote_core.stores.zarr_store.reader.MemoryStore` reads every committed row of a shard;
a follower that already holds the first ``start`` episodes reads only the episode-table rows of
the new ones and the column rows they span, checks them like the reader does, and never looks
past the commit record it was given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.stored import EpisodeRecord
from emote_core.stores.zarr_store.checks import EpisodeChecks
from emote_core.stores.zarr_store.commits import malformed, table_problems
from emote_core.stores.zarr_store.layout import (
    COLUMNS,
    EPISODE_FIELDS,
    EPISODES,
    SHARDS,
    TABLE_CHECKSUM,
    RowKind,
    StoreColumn,
)
from emote_core.stores.zarr_store.reader import read_fields, read_rows
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)


@dataclass
class EpisodeRun:
    """Episodes ``start:stop`` of one shard, as read.

    Attributes:
        shard: The shard's name.
        start: The first episode's position in the shard.
        stop: One past the last episode's position (the commit's episode count when read).
        episodes: The intact episodes, in shard order, with the ids the shard stores.
        written_at: Unix time of the commit that added each of ``episodes``.
        lengths: Transitions of each of ``episodes``.
        skipped: Positions of damaged episodes left out (``skip_damaged`` only).
    """

    shard: str
    start: int
    stop: int
    episodes: list[EpisodeRecord] = field(default_factory=list)
    written_at: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    skipped: list[int] = field(default_factory=list)

    @property
    def transitions(self) -> int:
        """Transitions in the intact episodes."""
        return int(self.lengths.sum())


def read_episode_run(
    url: str,
    group: Any,
    commit: dict[str, Any],
    columns: list[StoreColumn],
    *,
    shard: str,
    start: int,
    stop: int | None = None,
    skip_damaged: bool = False,
) -> EpisodeRun:
    """Reads episodes ``start:stop`` of a shard, trusting only its commit record.

    Args:
        url: The store, for messages.
        group: The shard's group.
        commit: The shard's commit record (read with the group): nothing past it is read.
        columns: The store's stored columns, in its order.
        shard: The shard's name.
        start: The first episode to read.
        stop: One past the last (the commit's count when ``None``).
        skip_damaged: Leave damaged episodes out (logged) instead of refusing the run.

    Raises:
        FormatError: If the shard's arrays hold fewer rows than the commit counts, cannot be
            read, or (unless ``skip_damaged``) an episode fails its checks, naming its ids.
    """
    committed = int(commit["episodes"])
    stop = committed if stop is None else stop
    if not 0 <= start <= stop <= committed:
        raise FormatError(
            f"store '{url}' shard '{shard}': episodes {start}:{stop} asked for, but the commit "
            f"counts {committed} — episodes were lost; run `emote memory verify`"
        )
    run = EpisodeRun(shard, start, stop)
    if start == stop:
        return run
    where = f"store '{url}' shard '{shard}'"
    table = _table_rows(group, where, start, stop)
    if stop == committed and (problems := table_problems(commit, table)):
        raise malformed(where, f"{SHARDS}/{shard}", problems)
    count = stop - start
    data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    bases: dict[str, int] = {}
    problems: list[str] = []
    for column in columns:
        first, last = _row_span(column, table, start, stop)
        limit = int(commit["rows"][column.name])
        if last > limit:
            raise FormatError(
                f"{where}: episodes {start}:{stop} reach row {last} of column '{column.name}' "
                f"but the commit counts {limit} rows; the store is damaged — run `emote memory "
                "verify`"
            )
        try:
            array = group[f"{COLUMNS}/{column.name}"]
        except Exception as error:  # missing or unparseable array metadata
            raise FormatError(
                f"{where}: {SHARDS}/{shard}/{COLUMNS}/{column.name}/zarr.json is unreadable "
                f"({type(error).__name__})"
            ) from error
        values, bad, found = read_rows(array, min(last, array.shape[0]), start=first)
        problems += found
        data[column.name] = (values, bad)
        if column.rows != RowKind.EPISODE:
            bases[column.name] = first
    indices = np.arange(count)
    damaged = EpisodeChecks(columns, table, data, indices, row_base=bases).all_damaged()
    if damaged.any():
        ids = [int(i) for i in table["id"][damaged][:10]]
        cause = f"; {problems[0]}" if problems else ""
        what = (
            f"{where}: {int(damaged.sum())} damaged episodes among the newly committed (checksum "
            f"mismatch or unreadable chunks), ids {ids}{cause}"
        )
        if not skip_damaged:
            raise FormatError(
                f"{what}; nothing is read from a damaged store — run `emote memory verify`, or "
                "pass `skip_damaged=True` to use the other episodes"
            )
        log.warning("%s: skipped", what)
        run.skipped = [start + int(k) for k in np.flatnonzero(damaged)]
    kept = indices[~damaged]
    run.episodes = [_episode(columns, table, data, bases, int(k)) for k in kept]
    run.written_at = table["written_at"][kept].astype(np.float64)
    run.lengths = table["length"][kept].astype(np.int64)
    return run


def _table_rows(group: Any, where: str, start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows ``start:stop`` of the shard's episode table (and its checksums, when it has them)."""
    names = [*EPISODE_FIELDS, TABLE_CHECKSUM]
    table = {}
    for name, found in zip(names, read_fields(group, names, start, stop), strict=True):
        if isinstance(found, np.ndarray):
            table[name] = found
        elif isinstance(found, int):
            raise FormatError(
                f"{where}: {EPISODES}/{name} has {found} rows but the commit counts {stop} episodes"
            )
        elif name == TABLE_CHECKSUM and isinstance(found, KeyError):
            continue  # shards written before it have none
        else:  # missing or undecodable metadata or chunks
            text = str(found).splitlines()[0] if str(found) else ""
            raise FormatError(
                f"{where}: {EPISODES}/{name} is unreadable ({type(found).__name__}: {text})"
            ) from found
    return table


def _row_span(
    column: StoreColumn, table: dict[str, np.ndarray], start: int, stop: int
) -> tuple[int, int]:
    """The column rows episodes ``start:stop`` occupy, ``(first, one past the last)``."""
    if column.rows == RowKind.EPISODE:
        return start, stop
    which = 1 if column.rows == RowKind.OBSERVATIONS else 0
    first = int(table["offset"][0, which])
    last = int(table["offset"][-1, which] + table["length"][-1]) + column.extra_rows
    return first, last


def _episode(
    columns: list[StoreColumn],
    table: dict[str, np.ndarray],
    data: dict[str, tuple[np.ndarray, np.ndarray]],
    bases: dict[str, int],
    k: int,
) -> EpisodeRecord:
    length = int(table["length"][k])
    episode = {}
    for column in columns:
        values = data[column.name][0]
        if column.rows == RowKind.EPISODE:
            episode[column.name] = values[k]
            continue
        which = 1 if column.rows == RowKind.OBSERVATIONS else 0
        first = int(table["offset"][k, which]) - bases[column.name]
        episode[column.name] = values[first : first + length + column.extra_rows]
    return int(table["id"][k]), episode, EpisodeState(int(table["end_state"][k]))


__all__ = ["EpisodeRun", "read_episode_run"]
