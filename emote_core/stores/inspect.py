"""What ``emote memory inspect`` reports about an emote-memory store; it never changes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.stores.agents import store_agents
from emote_core.stores.provenance import ENV_ID, FIRST_EPISODE, reference_returns, shard_sessions
from emote_core.stores.summary import (
    ActionCoverage,
    action_column,
    action_space,
    return_distribution,
)

if TYPE_CHECKING:
    from emote_core.stores.zarr_store import MemoryStore


BLOCK_BYTES = 16 * 2**20
"""The most bytes of a column that action coverage reads at once."""


def store_report(location: str, *, actions: bool = False) -> dict[str, Any]:
    """The report of a store, read from its episode tables only (the return distribution too),
    unless ``actions`` asks for its actions column.

    Args:
        location: A store's path or URL.
        actions: Add ``actions``, the coverage of its actions (:func:`store_action_coverage`).

    Returns:
        :meth:`MemoryStore.info` with ``location``, ``provenance`` (:func:`store_provenance`),
        ``agents`` (:func:`~emote_core.stores.agents.store_agents`), ``returns`` (the
        distribution of episode returns, :func:`~emote_core.stores.summary.return_distribution`)
        and ``reference_returns`` (``{random, expert, source}`` or ``None``).

    Raises:
        FormatError: If the store, a shard's provenance or its reference returns are malformed.
    """
    from emote_core.stores.zarr_store import MemoryStore

    store = MemoryStore(location)
    report = store.info()
    report["location"] = report.pop("store", location)
    report["provenance"] = store_provenance(store)
    report["agents"] = store_agents(store)
    tables = [shard.table for shard in store.shards]
    report["returns"] = return_distribution(
        np.concatenate([t["return"] for t in tables] or [np.zeros(0)]),
        np.concatenate([t["end_state"] for t in tables] or [np.zeros(0)]),
    )
    references = reference_returns(store)
    report["reference_returns"] = references.to_attrs() if references is not None else None
    if actions:
        report["actions"] = store_action_coverage(store)
    return report


def store_action_coverage(store: MemoryStore) -> dict[str, Any] | None:
    """The coverage of a store's actions over its readable shards (``None`` without an actions
    column), read block by block of at most :data:`BLOCK_BYTES`.

    Returns:
        :meth:`ActionCoverage.report` with ``column`` and ``unreadable_rows`` (rows of damaged
        chunks, left out) and ``problems`` (one line each).
    """
    from emote_core.stores.zarr_store.acceleration import open_array
    from emote_core.stores.zarr_store.layout import COLUMNS, RowKind
    from emote_core.stores.zarr_store.reader import read_rows

    steps = [c.name for c in store.columns if c.rows == RowKind.TRANSITIONS]
    name = action_column(steps)
    if name is None:
        return None
    coverage = ActionCoverage(action_space(store.spaces))
    unreadable, problems = 0, []
    for shard in store.shards:
        if shard.episodes == 0:
            continue
        array = open_array(shard.group, f"{COLUMNS}/{name}")
        rows = min(int(shard.commit["rows"][name]), int(array.shape[0]))
        row_bytes = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize)
        chunk = int(array.chunks[0])
        block = max(chunk, BLOCK_BYTES // row_bytes // chunk * chunk)
        for start in range(0, rows, block):
            values, bad, found = read_rows(array, min(rows, start + block), start=start)
            coverage.add(values[~bad])
            unreadable += int(bad.sum())
            problems += found
    return {"column": name, **coverage.report(), "unreadable_rows": unreadable,
            "problems": problems}  # fmt: skip


def store_provenance(store: MemoryStore) -> dict[str, Any]:
    """Who made a store: ``{"env_id", "shards": {shard: [session, ...]}}``.

    ``env_id`` is the root's (``None``: unknown); each session is its provenance record with
    ``first_episode`` and ``episodes`` (how many of the shard's committed episodes it wrote).
    Shards written before provenance was recorded have no sessions.

    Raises:
        FormatError: If a shard's provenance attribute is malformed.
    """
    shards: dict[str, list[dict[str, Any]]] = {}
    for shard in store.shards:
        where = f"store '{store.url}' shard '{shard.name}'"
        sessions = shard_sessions(dict(shard.group.attrs), where=where)
        ends = [first for first, _ in sessions[1:]] + [shard.episodes] * bool(sessions)
        shards[shard.name] = [
            {**record.to_attrs(), FIRST_EPISODE: first, "episodes": max(0, end - first)}
            for (first, record), end in zip(sessions, ends, strict=True)
        ]
    return {"env_id": store.attributes.get(ENV_ID), "shards": shards}


__all__ = ["BLOCK_BYTES", "store_action_coverage", "store_provenance", "store_report"]
