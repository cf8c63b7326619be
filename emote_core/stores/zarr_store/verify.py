"""Proving a store intact: commit consistency, readable chunks and per-episode checksums.

Verification only reads; it never changes the store.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emote_core.stores.zarr_store.acceleration import open_array
from emote_core.stores.zarr_store.checks import EpisodeChecks
from emote_core.stores.zarr_store.groups import leftover_temporaries
from emote_core.stores.zarr_store.layout import COLUMNS, SHARDS, TABLE_CHECKSUM, RowKind
from emote_core.stores.zarr_store.reader import (
    MemoryStore,
    ShardView,
    chunk_key,
    episode_rows,
    read_rows,
)


@dataclass
class VerifyReport:
    """What ``verify`` found.

    Attributes:
        url: The store.
        episodes: Committed episodes checked.
        transitions: Their transitions.
        bytes_checked: Bytes of column data read and checksummed.
        seconds: Time taken.
        problems: One line per problem found (empty when intact).
        damaged_episodes: ``{"shard", "index", "id"}`` of episodes whose data is wrong.
        notes: Things worth knowing that are not damage (a torn tail awaiting repair).
    """

    url: str
    episodes: int = 0
    transitions: int = 0
    bytes_checked: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    damaged_episodes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.url,
            "ok": self.ok,
            "episodes": self.episodes,
            "transitions": self.transitions,
            "bytes_checked": self.bytes_checked,
            "seconds": self.seconds,
            "mb_per_second": self.bytes_checked / 1e6 / self.seconds if self.seconds else None,
            "problems": self.problems,
            "damaged_episodes": self.damaged_episodes,
            "notes": self.notes,
        }


def verify_store(url: str | os.PathLike[str]) -> VerifyReport:
    """Checks every committed episode of every shard.

    Raises:
        FormatError: If ``url`` is not a readable emote-memory store at all.
    """
    started = time.perf_counter()
    store = MemoryStore(url)
    report = VerifyReport(url=store.url)
    report.problems += list(store.damaged_shards.values())
    for path in leftover_temporaries(store.url):
        report.notes.append(
            f"{os.path.relpath(path, store.url)}: a temporary file that a write cut off left "
            "(never data; the next writer removes it)"
        )
    for shard in store.shards:
        _verify_shard(store, shard, report)
    report.seconds = time.perf_counter() - started
    return report


def _verify_shard(store: MemoryStore, shard: ShardView, report: VerifyReport) -> None:
    table = shard.table
    count = shard.episodes
    lengths = table["length"].astype(np.int64)
    where = f"shard '{shard.name}'"
    steps = np.cumsum(lengths) - lengths
    expected_offsets = np.stack([steps, steps + np.arange(count)], axis=1) if count else None
    if count and not np.array_equal(table["offset"], expected_offsets):
        report.problems.append(f"{where}: episode offsets are not contiguous")
    if np.any(lengths < 1):
        report.problems.append(f"{where}: episodes with no transitions")
    total = int(lengths.sum())  # the commit record agrees (the reader checked it)
    report.episodes += count
    report.transitions += total
    if count == 0:
        return  # nothing committed yet (its arrays may not exist)
    read: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for column in store.columns:
        rows = {
            RowKind.TRANSITIONS: total,
            RowKind.OBSERVATIONS: total + count,
            RowKind.EPISODE: count,
        }[column.rows]
        try:
            array = open_array(shard.group, f"{COLUMNS}/{column.name}")
        except Exception as error:  # missing or unreadable array metadata
            report.problems.append(
                f"{where}: {SHARDS}/{shard.name}/{COLUMNS}/{column.name}/zarr.json is unreadable "
                f"({type(error).__name__})"
            )
            read[column.name] = (np.zeros((0,)), np.zeros(0, dtype=bool))
            continue
        if array.shape[0] < rows:
            report.problems.append(
                f"{where}: column '{column.name}' has {array.shape[0]} rows, fewer than the "
                f"{rows} committed"
            )
        elif array.shape[0] > rows:
            report.notes.append(
                f"{where}: column '{column.name}' has {array.shape[0] - rows} uncommitted rows "
                "(a torn tail; readers ignore it and the next writer cuts it)"
            )
        values, bad, problems = read_rows(array, min(rows, array.shape[0]))
        report.problems += [f"{where}: {problem}" for problem in problems]
        report.bytes_checked += values.nbytes
        read[column.name] = (values, bad)
    if TABLE_CHECKSUM not in table:
        report.notes.append(
            f"{where}: its episode table has no checksums (written by an earlier emote); ids, "
            "end states and returns are unchecked until a writer appends to it"
        )
    damaged = EpisodeChecks(store.columns, table, read, np.arange(count)).all_damaged()
    for k in np.flatnonzero(damaged):
        report.damaged_episodes.append(
            {"shard": shard.name, "index": int(k), "id": int(table["id"][k])}
        )
    if damaged.any():
        ids = [int(table["id"][k]) for k in np.flatnonzero(damaged)[:10]]
        missing = _missing_chunks(store, shard, np.flatnonzero(damaged))
        report.problems.append(
            f"{where}: {int(damaged.sum())} damaged episodes (checksum mismatch or unreadable "
            f"chunks), ids {ids}{' ...' if damaged.sum() > 10 else ''}"
            + (f"; chunk files missing: {', '.join(missing[:3])}" if missing else "")
            + (f" (and {len(missing) - 3} more)" if len(missing) > 3 else "")
        )


def _missing_chunks(store: MemoryStore, shard: ShardView, indices: np.ndarray) -> list[str]:
    """The chunk files, holding rows of episodes ``indices``, that are not in the store (a lost
    object reads as fill values; Zarr also leaves chunks of fill values unwritten, so a missing
    chunk is named only where the episodes it holds fail their checksums)."""
    from zarr.core.sync import sync

    missing = []
    for column in store.columns:
        try:
            array = shard.group[f"{COLUMNS}/{column.name}"]
        except Exception:  # reported as unreadable metadata already
            continue
        starts, stops = episode_rows(column.rows, shard.table, indices)
        step = int(array.chunks[0])
        chunks = sorted(
            {c for a, b in zip(starts.tolist(), stops.tolist(), strict=True)
             for c in range(a // step, (b - 1) // step + 1) if b > a}
        )  # fmt: skip
        for chunk in chunks:
            key = chunk_key(array, chunk * step)
            if not sync(store.root.store.exists(key)):
                missing.append(key)
    return missing


__all__ = ["VerifyReport", "verify_store"]
