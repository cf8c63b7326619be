"""Following stores: a table that takes the episodes collectors commit while it trains.

A :class:`StoreFollower` reads each store's commit records (one small metadata read per shard)
and appends the episodes committed since its last look, of every shard, new shards included, to
a replay table: never an uncommitted row, never an episode twice. What it has read is pinned per
shard; the order in which episodes entered the table is kept as runs of shard positions
(``segments``) so that a checkpoint can rebuild exactly the table it saw, ejections included.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.stored import EpisodeRecord, fit_episodes, replace_content
from emote_core.stores.zarr_store.commits import commit_records, shard_commit
from emote_core.stores.zarr_store.groups import PARTIAL_SUFFIX, open_group
from emote_core.stores.zarr_store.layout import EPISODES, StoreColumn, check_format
from emote_core.stores.zarr_store.tail import EpisodeRun, read_episode_run

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

WAIT_LOG_SECONDS = 10.0
"""Seconds between the lines that say a follower is still waiting."""


@dataclass
class IngestReport:
    """What one look at the stores appended to the table.

    Attributes:
        episodes: Episodes appended.
        transitions: Their transitions.
        ages: Seconds from each appended episode's commit to its ingest.
        skipped: Damaged episodes left out (``skip_damaged`` only).
        seconds: Time the look took (commit records and new episodes read, table appended).
    """

    episodes: int = 0
    transitions: int = 0
    ages: np.ndarray = field(default_factory=lambda: np.zeros(0))
    skipped: int = 0
    seconds: float = 0.0


class StoreFollower:
    """Appends the newly committed episodes of one or more stores to a table.

    Args:
        table: The replay table.
        urls: The stores (local paths or fsspec URLs), read in this order at every look.
        skip_damaged: Leave damaged episodes and unreadable shards out (logged) instead of
            refusing them.
        clock: Wall-clock time in seconds (commit times are unix times).

    Raises:
        FormatError: When a store is not an emote-memory store (first look).
    """

    def __init__(
        self,
        table: ArrayMemoryTable,
        urls: Sequence[str | os.PathLike[str]],
        *,
        skip_damaged: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table = table
        self.urls = [os.fspath(url) for url in urls]
        self.skip_damaged = skip_damaged
        self.clock = clock
        self.read: list[dict[str, int]] = [{} for _ in self.urls]
        """Per store, episodes read per shard: everything below is in the table or was left
        out on purpose (older than the table could hold, or damaged), never read again."""
        self.segments: list[dict[str, Any]] = []
        """The table's followed episodes in the order they entered it: ``{source, shard,
        start, stop, first_id, count}``, ids ``first_id ..`` given to the intact ones."""
        self.ingested_episodes = 0
        self.ingested_transitions = 0
        self.skipped_episodes = 0
        self.episode_listeners: list[Callable[[Mapping[str, np.ndarray]], None]] = []
        """Called with each newly followed episode's columns as it enters the table (not for
        the episodes :meth:`restore` reads back)."""
        self._next_id = 0
        self._roots: list[Any] = [None] * len(self.urls)
        self._columns: list[list[StoreColumn]] = [[] for _ in self.urls]
        self._warned: set[tuple[int, str]] = set()

    # Reading the stores.

    def _root(self, source: int) -> Any:
        if self._roots[source] is None:
            url = self.urls[source]
            root = open_group(url, "r")
            attributes = dict(root.attrs)
            check_format(attributes, url)
            self._columns[source] = [
                StoreColumn.from_json(c, url) for c in attributes.get("columns", [])
            ]
            self._roots[source] = root
        return self._roots[source]

    def _commits(self, source: int) -> dict[str, tuple[Any, dict[str, Any]]]:
        """The shards' groups and commit records; damaged shards refused or (skip) logged."""
        url = self.urls[source]
        committed, damaged = commit_records(self._root(source), url, self._columns[source])
        for name, why in damaged.items():
            if not self.skip_damaged:
                raise FormatError(
                    f"{why} — run `emote memory verify`, or pass `skip_damaged=True` to follow the "
                    "other shards"
                )
            if (source, name) not in self._warned:
                self._warned.add((source, name))
                log.warning("%s: skipped while it stays unreadable", why)
        return committed

    def _run(
        self,
        source: int,
        name: str,
        group: Any,
        commit: dict[str, Any],
        start: int,
        stop: int | None = None,
    ) -> EpisodeRun:
        return read_episode_run(
            self.urls[source], group, commit, self._columns[source], shard=name, start=start,
            stop=stop, skip_damaged=self.skip_damaged,
        )  # fmt: skip

    def fill(self) -> IngestReport:
        """The first look: the newest committed episodes that fit in the table.

        Episodes older than those are pinned as read (the table could not hold them).
        """
        started = time.perf_counter()
        plans: list[tuple[int, str, Any, dict[str, Any], int]] = []
        for source in range(len(self.urls)):
            for name, (group, commit) in sorted(self._commits(source).items()):
                plans.append((source, name, group, commit, 0))
        starts = self._newest_that_fit(plans)
        runs = [
            (source, self._run(source, name, group, commit, start))
            for (source, name, group, commit, _), start in zip(plans, starts, strict=True)
        ]
        return self._ingest(runs, started)

    def _newest_that_fit(self, plans: list[tuple[int, str, Any, dict[str, Any], int]]) -> list[int]:
        """Per shard, the first episode to read so that the newest episodes of all shards (by
        commit time) fill at most the table's ``maxlen``."""
        keys: list[tuple[float, int, int, int]] = []  # (time, plan, position, length)
        for p, (source, name, group, commit, _) in enumerate(plans):
            count = int(commit["episodes"])
            if count == 0:
                continue
            where = f"store '{self.urls[source]}' shard '{name}'"
            try:
                times = group[f"{EPISODES}/written_at"][:count]
                lengths = group[f"{EPISODES}/length"][:count]
            except Exception as error:  # missing or undecodable episode table
                raise FormatError(f"{where}: its episode table is unreadable ({error})") from error
            pairs = enumerate(zip(times.tolist(), lengths.tolist(), strict=True))
            keys += [(float(t), p, k, int(n)) for k, (t, n) in pairs]
        keys.sort()
        starts = [int(plan[3]["episodes"]) for plan in plans]
        total = 0
        for _, p, k, length in reversed(keys):
            if total + length > self.table.maxlen:
                break
            total += length
            starts[p] = min(starts[p], k)
        return starts

    def poll(self) -> IngestReport:
        """Appends what every shard committed since the last look (cheap when nothing is new:
        only the commit records are read).

        Raises:
            FormatError: If a shard now counts fewer episodes than were read from it, or (unless
                ``skip_damaged``) a shard or a new episode is damaged.
        """
        started = time.perf_counter()
        runs = []
        for source, url in enumerate(self.urls):
            for name, (group, commit) in sorted(self._commits(source).items()):
                held = self.read[source].get(name, 0)
                count = int(commit["episodes"])
                if count < held:
                    raise FormatError(
                        f"store '{url}' shard '{name}' now holds {count} committed episodes, "
                        f"fewer than the {held} read from it — episodes were lost; run `emote "
                        "memory verify`"
                    )
                if count > held:
                    runs.append((source, self._run(source, name, group, commit, held)))
        return self._ingest(runs, started)

    # Appending to the table.

    def _ingest(self, runs: list[tuple[int, EpisodeRun]], started: float) -> IngestReport:
        report = IngestReport()
        records: list[EpisodeRecord] = []
        segments = []
        next_id = max(self._next_id, self._held_maximum() + 1)
        for source, run in runs:
            count = len(run.episodes)
            segments.append(
                {"source": source, "shard": run.shard, "start": run.start, "stop": run.stop,
                 "first_id": next_id, "count": count}
            )  # fmt: skip
            records += [(next_id + j, data, end) for j, (_, data, end) in enumerate(run.episodes)]
            next_id += count
            report.skipped += len(run.skipped)
        fitted = fit_episodes(self.table, records, source=", ".join(self.urls))
        for identity, data, end_state in fitted:
            self.table.add_sequence(identity, data, end_state=end_state)
            for listener in self.episode_listeners:
                listener(data)
        now = self.clock()  # sampleable from now on
        for source, run in runs:
            self.read[source][run.shard] = run.stop
        self.segments += [s for s in segments if s["count"]]
        self._next_id = next_id
        report.episodes = len(records)
        report.transitions = int(sum(run.transitions for _, run in runs))
        report.ages = (
            now - np.concatenate([run.written_at for _, run in runs]) if runs else np.zeros(0)
        )
        report.seconds = time.perf_counter() - started
        self.ingested_episodes += report.episodes
        self.ingested_transitions += report.transitions
        self.skipped_episodes += report.skipped
        return report

    def _held_maximum(self) -> int:
        index = self.table.index
        held = index.ids[index.live]
        return int(held.max()) if len(held) else -1

    # Checkpoints.

    def state(self) -> dict[str, Any]:
        """What a checkpoint records: the pins, and the runs of episodes the table still holds
        (with which of their ids it holds) in the order they entered it."""
        index = self.table.index
        held = np.sort(index.ids[index.live])
        kept, ranges = [], []
        for segment in self.segments:
            low, high = segment["first_id"], segment["first_id"] + segment["count"]
            inside = held[(held >= low) & (held < high)]
            if len(inside):
                kept.append(dict(segment))
                ranges += _ranges(inside)
        self.segments = kept  # those the table no longer holds never come back
        return {
            "read": [dict(pins) for pins in self.read],
            "segments": kept,
            "held": ranges,
            "next_id": self._next_id,
            "ingested": [
                self.ingested_episodes, self.ingested_transitions, self.skipped_episodes
            ],
        }  # fmt: skip

    def restore(self, state: dict[str, Any], extra: Sequence[EpisodeRecord] = ()) -> None:
        """Rebuilds the table a checkpoint saw: the followed episodes it held, in the order they
        entered it, then ``extra`` (episodes of other origin, renumbered after them).

        Raises:
            FormatError: If a store holds fewer episodes than recorded, or damaged ones.
        """
        held = set()
        for low, high in state["held"]:
            held.update(range(int(low), int(high) + 1))
        spans: dict[tuple[int, str], list[int]] = {}
        for segment in state["segments"]:  # one read per shard, not per segment
            span = spans.setdefault((int(segment["source"]), str(segment["shard"])), [2**62, 0])
            span[0] = min(span[0], int(segment["start"]))
            span[1] = max(span[1], int(segment["stop"]))
        found = {key: self._read_back(*key, *span) for key, span in spans.items()}
        episodes: list[EpisodeRecord] = []
        for segment in state["segments"]:
            at = found[(int(segment["source"]), str(segment["shard"]))]
            positions = range(int(segment["start"]), int(segment["stop"]))
            chosen = [at[p] for p in positions if p in at][: int(segment["count"])]
            first = int(segment["first_id"])
            for j, (_, data, end) in enumerate(chosen):
                if first + j in held:
                    episodes.append((first + j, data, end))
        next_id = int(state["next_id"])
        episodes += [(next_id + j, data, end) for j, (_, data, end) in enumerate(extra)]
        fitted = fit_episodes(self.table, episodes, source=", ".join(self.urls))
        replace_content(self.table, fitted, source=", ".join(self.urls))
        self.read = [{str(k): int(v) for k, v in pins.items()} for pins in state["read"]]
        self.segments = [dict(s) for s in state["segments"]]
        self._next_id = next_id + len(extra)
        self.ingested_episodes, self.ingested_transitions, self.skipped_episodes = (
            int(v) for v in state.get("ingested", (0, 0, 0))
        )

    def _read_back(self, source: int, name: str, start: int, stop: int) -> dict[int, EpisodeRecord]:
        """Episodes ``start:stop`` of a shard that a checkpoint read, by position (the damaged
        ones, left out then, are left out again)."""
        url = self.urls[source]
        found = shard_commit(self._root(source), url, name, self._columns[source])
        committed = 0 if found is None else int(found[1]["episodes"])
        if found is None or committed < stop:
            raise FormatError(
                f"store '{url}' shard '{name}' holds {committed} committed episodes, fewer than "
                f"the {stop} the checkpoint read — episodes were lost; run `emote memory verify`"
            )
        run = self._run(source, name, *found, start, stop)
        skipped = set(run.skipped)
        positions = [p for p in range(start, stop) if p not in skipped]
        return dict(zip(positions, run.episodes, strict=True))


def _ranges(ids: np.ndarray) -> list[list[int]]:
    """Sorted ids as inclusive ``[low, high]`` runs of consecutive values."""
    breaks = np.flatnonzero(np.diff(ids) != 1)
    lows = np.concatenate([[0], breaks + 1])
    highs = np.concatenate([breaks, [len(ids) - 1]])
    return [[int(ids[a]), int(ids[b])] for a, b in zip(lows, highs, strict=True)]


def follow_target(url: str | os.PathLike[str]) -> bool:
    """Whether an emote-memory store is at ``url`` now (``False``: nothing there yet).

    Raises:
        FormatError: If something is there that is not an emote-memory store (a file, a folder
            holding other things, another Zarr group), or a store of a newer emote.
    """
    location = os.fspath(url)
    local = "://" not in location or location.startswith("file://")
    path = Path(location.removeprefix("file://"))
    if local and not path.exists():
        return False
    if (
        local
        and path.is_dir()
        and all(entry.name.endswith(PARTIAL_SUFFIX) for entry in path.iterdir())
    ):  # made ahead of the collectors, or a collector is writing its zarr.json right now
        return False
    if local and not (path / "zarr.json").is_file():
        raise FormatError(
            f"`follow=True`: '{location}' is not an emote memory store (no zarr.json there); give "
            "the store that collectors write (emote collect --out STORE)"
        )
    try:
        root = open_group(location, "r")
    except FormatError:
        if local:
            raise
        return False  # nothing at the URL yet
    check_format(dict(root.attrs), location)
    return True


def wait_for_stores(
    urls: Sequence[str | os.PathLike[str]],
    *,
    stop: threading.Event | None = None,
    poll_seconds: float = 0.5,
) -> bool:
    """Waits until an emote-memory store is at every url, saying so every few seconds.

    A learner may start before its collectors; it waits for them rather than fail. Ctrl-C
    interrupts the wait (``KeyboardInterrupt``), as does ``stop``.

    Returns:
        Whether every store is there (``False`` when ``stop`` was set).

    Raises:
        FormatError: If something that is not an emote-memory store is at a url.
    """
    started = time.monotonic()
    said = -WAIT_LOG_SECONDS
    while True:
        missing = [os.fspath(url) for url in urls if not follow_target(url)]
        if not missing:
            return True
        waited = time.monotonic() - started
        if waited - said >= WAIT_LOG_SECONDS:
            log.warning(
                "waiting for %s to appear (%.0f s so far): start the collectors, e.g. `emote "
                "collect RECIPE --out %s`; Ctrl-C stops", ", ".join(missing), waited, missing[0],
            )  # fmt: skip
            said = waited
        if stop is not None:
            if stop.wait(poll_seconds):
                return False
        else:
            time.sleep(poll_seconds)


__all__ = [
    "IngestReport",
    "StoreFollower",
    "follow_target",
    "wait_for_stores",
]
