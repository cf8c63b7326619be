"""What ``emote memory inspect`` reports about an emote-memory store; it never changes it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.stores.agents import store_agents
from emote_core.stores.provenance import ENV_ID, FIRST_EPISODE, shard_sessions
from emote_core.stores.summary import return_distribution

if TYPE_CHECKING:
    from emote_core.stores.zarr_store import MemoryStore


def store_report(location: str, *, returns: bool = False) -> dict[str, Any]:
    """The report of a store, read from its episode tables only (the return distribution too).

    Args:
        location: A store's path or URL.
        returns: Add ``returns``, the distribution of episode returns.

    Returns:
        :meth:`MemoryStore.info` with ``location``, ``provenance`` (:func:`store_provenance`) and
        ``agents`` (:func:`~emote_core.stores.agents.store_agents`).

    Raises:
        FormatError: If the store or a shard's provenance is malformed.
    """
    from emote_core.stores.zarr_store import MemoryStore

    store = MemoryStore(location)
    report = store.info()
    report["location"] = report.pop("store", location)
    report["provenance"] = store_provenance(store)
    report["agents"] = store_agents(store)
    if returns:
        tables = [shard.table for shard in store.shards]
        report["returns"] = return_distribution(
            np.concatenate([t["return"] for t in tables] or [np.zeros(0)]),
            np.concatenate([t["end_state"] for t in tables] or [np.zeros(0)]),
        )
    return report


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


__all__ = ["store_provenance", "store_report"]
