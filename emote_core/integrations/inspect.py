"""What ``emote memory inspect`` reports about any memory source; it never changes the source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.stores.agents import store_agents
from emote_core.stores.provenance import ENV_ID, FIRST_EPISODE, shard_sessions
from emote_core.stores.sources import FORMATS, detect_format, length_key, read_source
from emote_core.stores.summary import (
    bytes_on_disk,
    episode_returns,
    return_distribution,
    summarize_stored,
)

if TYPE_CHECKING:
    from emote_core.stores.zarr_store import MemoryStore


def inspect_source(
    location: str | os.PathLike[str],
    *,
    source_format: str | None = None,
    trust_pickle: bool = False,
    returns: bool = False,
) -> dict[str, Any]:
    """The ``emote memory inspect`` report of any source; never changes it.

    A Zarr store's report reads only its episode tables (its return distribution too); other
    sources are read whole.

    Args:
        location: The source.
        source_format: Read it as this format instead of detecting it.
        trust_pickle: Unpickle without restrictions (runs the file's code).
        returns: Add ``returns``, the distribution of episode returns
            (:func:`~emote_core.stores.summary.return_distribution`).

    Returns:
        A JSON-compatible dict with at least ``format``, ``format_version``, ``location``,
        ``episodes``, ``transitions``, ``columns`` (name -> ``{dtype, shape, kind}``),
        ``episode_length`` and ``episode_return`` (``{min, mean, max}``), ``end_states``,
        ``spaces``, ``shards``, ``bytes_on_disk``, ``producer`` and ``provenance`` (stores:
        :func:`store_provenance`; other sources: ``None``); stores also ``agents``
        (:func:`~emote_core.stores.agents.store_agents`: the agents and groups of multi-agent
        shards, ``None`` for none).

    Raises:
        FormatError: As :func:`read_source`.
        UnsafePickleError: As :func:`read_source`.
    """
    text = os.fspath(location)
    name = source_format or detect_format(text)
    if name == "zarr":
        from emote_core.stores.zarr_store import MemoryStore

        store = MemoryStore(text)
        report = store.info()
        report["location"] = report.pop("store", text)
        report["provenance"] = store_provenance(store)
        report["agents"] = store_agents(store)
        if returns:
            tables = [shard.table for shard in store.shards]
            report["returns"] = return_distribution(
                np.concatenate([t["return"] for t in tables] or [np.zeros(0)]),
                np.concatenate([t["end_state"] for t in tables] or [np.zeros(0)]),
            )
        return report
    name, stored = read_source(text, source_format=name, trust_pickle=trust_pickle)
    key = length_key(stored)
    report = summarize_stored(stored, key)
    if returns:
        ends = np.array([int(end) for _, _, end in stored.episodes], dtype=np.int64)
        report["returns"] = return_distribution(episode_returns(stored), ends)
    if stored.episodes:
        from emote_core.stores.zarr_store import store_columns

        for column in store_columns(stored.columns, stored.episodes[0], key):
            report["columns"][column.name]["rows"] = column.rows
    return {
        **report,
        "format": name,
        "format_version": stored.metadata.get("format_version", FORMATS[name].version),
        "location": text,
        "length_key": key,
        "source": stored.metadata.get("source"),
        "producer": stored.metadata.get("producer"),
        "shards": None,
        "provenance": None,
        "bytes_on_disk": bytes_on_disk(text) if Path(text).exists() else None,
    }


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


__all__ = ["inspect_source", "store_provenance"]
