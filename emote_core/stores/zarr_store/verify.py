"""Proving a store intact: commit consistency, readable chunks and per-episode checksums.

Verification only reads; it never changes the store.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emote_core.stores.zarr_store.layout import COLUMNS, RowKind
from emote_core.stores.zarr_store.reader import MemoryStore, ShardView


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
    total = int(lengths.sum())
    if int(shard.commit.get("transitions", total)) != total:
        report.problems.append(
            f"{where}: commit counts {shard.commit.get('transitions')} transitions, episodes "
            f"add up to {total}"
        )
    report.episodes += count
    report.transitions += total
    if count == 0 and not any(int(n) for n in shard.commit["rows"].values()):
        return  # nothing committed yet (its arrays may not exist)
    checksums = np.zeros(count, dtype=np.uint32)
    unreadable = np.zeros(count, dtype=bool)
    for column in store.columns:
        rows = {
            RowKind.TRANSITIONS: total,
            RowKind.OBSERVATIONS: total + count,
            RowKind.EPISODE: count,
        }[column.rows]
        committed = int(shard.commit["rows"].get(column.name, -1))
        if committed != rows:
            report.problems.append(
                f"{where}: column '{column.name}' commits {committed} rows; episodes need {rows}"
            )
            continue
        array = shard.group[f"{COLUMNS}/{column.name}"]
        if array.shape[0] < rows:
            report.problems.append(
                f"{where}: column '{column.name}' has {array.shape[0]} rows, fewer than the "
                f"{rows} committed"
            )
            continue
        if array.shape[0] > rows:
            report.notes.append(
                f"{where}: column '{column.name}' has {array.shape[0] - rows} uncommitted rows "
                "(a torn tail; readers ignore it and the next writer cuts it)"
            )
        data, bad_rows = _read_column(array, rows, report, where, column.name)
        starts, stops = _episode_rows(column.rows, table, lengths)
        for k in range(count):
            if bad_rows[starts[k] : stops[k]].any():
                unreadable[k] = True
                continue
            checksums[k] = zlib.crc32(
                memoryview(np.ascontiguousarray(data[starts[k] : stops[k]])).cast("B"),
                int(checksums[k]),
            )
    damaged = unreadable | (checksums != table["checksum"])
    for k in np.flatnonzero(damaged):
        report.damaged_episodes.append(
            {"shard": shard.name, "index": int(k), "id": int(table["id"][k])}
        )
    if damaged.any():
        ids = [int(table["id"][k]) for k in np.flatnonzero(damaged)[:10]]
        report.problems.append(
            f"{where}: {int(damaged.sum())} damaged episodes (checksum mismatch or unreadable "
            f"chunks), ids {ids}{' ...' if damaged.sum() > 10 else ''}"
        )


def _episode_rows(
    rows: str, table: dict[str, np.ndarray], lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    if rows == RowKind.EPISODE:
        starts = np.arange(len(lengths))
        return starts, starts + 1
    if rows == RowKind.OBSERVATIONS:
        starts = table["offset"][:, 1] if len(lengths) else np.zeros(0, dtype=np.int64)
        return starts, starts + lengths + 1
    starts = table["offset"][:, 0] if len(lengths) else np.zeros(0, dtype=np.int64)
    return starts, starts + lengths


def _read_column(
    array: Any, rows: int, report: VerifyReport, where: str, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Reads a column chunk by chunk, so a damaged chunk is found and named, not fatal."""
    data = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    bad = np.zeros(rows, dtype=bool)
    step = int(array.chunks[0])
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        try:
            data[start:stop] = array[start:stop]
        except Exception as error:  # a damaged chunk: any codec or I/O error
            bad[start:stop] = True
            report.problems.append(
                f"{where}: column '{name}' rows {start}:{stop} unreadable "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
            )
    report.bytes_checked += data.nbytes
    return data, bad


__all__ = ["VerifyReport", "verify_store"]
