"""Sources read into a :class:`StoredTable`: the emote-memory store's reader and writer of
them, and the checks every source's episodes pass before they are written anywhere.

The registry of every format (peers and upstream emote included) is
:mod:`emote_core.integrations.formats`, which builds on this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.agents import AGENTS, record_agents, shard_agents
from emote_core.stores.provenance import (
    REFERENCE_RETURNS,
    Provenance,
    reference_returns,
    set_reference_returns,
)
from emote_core.stores.stored import ENVIRONMENT, StoredTable
from emote_core.stores.summary import REWARD_COLUMNS
from emote_core.stores.zarr_store.tables import BATCH_BYTES

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
"""Called with (episodes written, episodes in all) while a target is written."""


@dataclass(frozen=True)
class WriteOptions:
    """What a writer gets besides the episodes and the destination.

    Attributes:
        source: Where the episodes came from (``{"format", "sha256", "path"}``), recorded where
            the target has room.
        force: Replace an existing destination (writers that place it themselves: datasets).
        progress: Called with (episodes written, episodes in all) between batches.
        provenance: Who writes, recorded where the target has room (emote-memory stores).
    """

    source: dict[str, Any]
    force: bool = False
    progress: Progress | None = None
    provenance: Provenance | None = None


@dataclass(frozen=True)
class ReadOptions:
    """What a reader gets besides the location.

    Attributes:
        trust_pickle: Unpickle without restrictions (runs the file's code).
        skip_damaged: Leave out episodes that fail their checks instead of refusing the source
            (formats that can check their episodes: emote-memory stores).
    """

    trust_pickle: bool = False
    skip_damaged: bool = False


Reader = Callable[[str, ReadOptions], StoredTable]
"""``(location, options) -> StoredTable``."""
Writer = Callable[[StoredTable, str, WriteOptions], object]
"""``(stored, destination, options)``: writes exactly ``destination``."""


def read_store(location: str, options: ReadOptions) -> StoredTable:
    """Reads an emote-memory store whole, with the environment, agents and reference returns it
    records.

    Raises:
        FormatError: If the store is damaged (unless ``options.skip_damaged``).
    """
    from emote_core.stores.zarr_store import MemoryStore

    store = MemoryStore(location)
    stored = store.read(skip_damaged=options.skip_damaged)
    environment = _recorded_environment(store)
    if environment is not None:
        stored.metadata[ENVIRONMENT] = environment
    agents = _recorded_agents(store)
    if agents is not None:
        stored.metadata[AGENTS] = agents
    references = reference_returns(store)
    if references is not None:
        stored.metadata[REFERENCE_RETURNS] = references.to_attrs()
    return stored


def _recorded_agents(store: Any) -> dict[str, Any] | None:
    """The agents and groups of a store collected on a multi-agent env, when every shard records
    the same (episode ids name their agent by that record, so a copy that keeps the ids keeps
    the agents); ``None`` for single-agent stores, with a warning where the shards differ."""
    import json

    records = {
        json.dumps(shard_agents(dict(shard.group.attrs)), sort_keys=True) for shard in store.shards
    }
    if len(records) > 1:
        log.warning(
            "store '%s' has shards of different agents (or multi-agent and single-agent ones); "
            "the copy keeps no agent or group of its episodes",
            store.url,
        )
        return None
    return json.loads(records.pop()) if records else None


def _recorded_environment(store: Any) -> dict[str, Any] | None:
    """The one environment a store records (its env id, the settings its sessions' recipes
    made it with), or ``None`` where it records none, or several ids or settings."""
    import json
    import tomllib

    from emote_core.stores.provenance import recorded_env_ids, shard_sessions

    shards = [dict(shard.group.attrs) for shard in store.shards]
    ids = recorded_env_ids(store.attributes, shards)
    if len(ids) != 1:
        return None
    settings: dict[str, dict[str, Any]] = {}
    for attributes in shards:
        for _, record in shard_sessions(attributes, where=f"store '{store.url}'"):
            if record.recipe_toml is None or record.env_id not in (None, ids[0]):
                continue
            try:
                env = tomllib.loads(record.recipe_toml).get("env")
            except tomllib.TOMLDecodeError:
                continue
            if not isinstance(env, dict):
                continue
            kwargs = env.get("kwargs") if isinstance(env.get("kwargs"), dict) else {}
            steps = env.get("max_episode_steps")
            steps = steps if isinstance(steps, int) else None
            made = {"kwargs": kwargs, "max_episode_steps": steps}
            settings[json.dumps(made, sort_keys=True, default=str)] = made
    if len(settings) > 1:
        log.warning("store '%s' was collected with different env settings", store.url)
        return None
    made = next(iter(settings.values()), {"kwargs": {}, "max_episode_steps": None})
    return {"id": ids[0], **made}


def write_store(stored: StoredTable, destination: str, options: WriteOptions) -> None:
    """Writes ``stored`` as a new emote-memory store at ``destination`` (replacing one there),
    with the reference returns its metadata holds."""
    from emote_core.stores.zarr_store import ShardWriter, create_store, store_columns
    from emote_core.stores.zarr_store.tables import batches

    key = length_key(stored)
    first = stored.episodes[0] if stored.episodes else None
    observation_like = [c.name for c in stored.columns if c.name.startswith("obs")]
    columns = store_columns(stored.columns, first, key, observation_like)
    create_store(
        destination,
        columns=columns,
        length_key=key,
        spaces=stored.spaces,
        source=options.source,
        overwrite=True,
        virtual=[c for c in stored.columns if not c.stored],
    )
    references = stored.metadata.get(REFERENCE_RETURNS)
    if references is not None:  # a store's, or a dataset's reference scores
        set_reference_returns(destination, **references)
    written = 0
    with ShardWriter(destination, provenance=options.provenance) as writer:
        if stored.metadata.get(AGENTS) is not None:  # read from a multi-agent emote store
            record_agents(writer.group, stored.metadata[AGENTS])
        for batch in batches(stored.episodes, BATCH_BYTES):
            writer.append(batch)
            written += len(batch)
            if options.progress is not None and written < len(stored.episodes):
                options.progress(written, len(stored.episodes))


def length_key(stored: StoredTable) -> str:
    """The column that counts a source's transitions: its own, or the first action/reward one.

    Raises:
        FormatError: If the source records none and has no column named like actions or rewards.
    """
    if stored.length_key is not None:
        return stored.length_key
    names = [c.name for c in stored.columns if c.stored]
    for candidate in ("actions", "action", *REWARD_COLUMNS):
        if candidate in names:
            return candidate
    raise FormatError(
        f"{stored.source} records no length key and has no actions or rewards column "
        f"(columns: {names}); it cannot be split into transitions"
    )


def check_episodes(stored: StoredTable) -> None:
    """Checks that every episode holds every stored column with consistent lengths.

    A per-step column holds ``N`` or ``N + 1`` rows for an episode of ``N`` transitions (the
    same choice in every episode); a tag column one value.

    Raises:
        FormatError: Naming the source, the episode and the column that disagree.
    """
    if not stored.episodes:
        return
    key = length_key(stored)
    extra: dict[str, int] = {}
    for identity, data, _ in stored.episodes:
        if key not in data:
            raise FormatError(f"{stored.source}: episode {identity} has no '{key}' column")
        length = len(data[key])
        for column in stored.columns:
            if not column.stored:
                continue
            value = data.get(column.name)
            if value is None:
                raise FormatError(
                    f"{stored.source}: episode {identity} has no '{column.name}' column"
                )
            if column.kind == "TagColumn":
                continue
            rows = len(value) - length
            expected = extra.setdefault(column.name, rows if rows in (0, 1) else 1)
            if rows != expected:
                raise FormatError(
                    f"{stored.source}: column lengths disagree in episode {identity}: "
                    f"'{column.name}' has {len(value)} rows for {length} transitions of '{key}' "
                    f"(expected {length + expected}); the file is damaged"
                )


def check_finite(stored: StoredTable) -> None:
    """Refuses NaN and infinities in a source's float columns (observations, actions, rewards).

    Training on them makes every loss NaN, so a conversion keeps them only when asked.

    Raises:
        FormatError: Naming the first column that holds any, how many values in how many
            episodes, and the first episode and row.
    """
    for column in stored.columns:
        if not column.stored or column.dtype.kind not in "fc":
            continue
        count = episodes = 0
        first: tuple[int, int] | None = None
        for identity, data, _ in stored.episodes:
            values = np.asarray(data[column.name])
            bad = ~np.isfinite(values)
            found = int(bad.sum())
            if not found:
                continue
            count, episodes = count + found, episodes + 1
            if first is None:
                rows = bad.reshape(len(values), -1).any(axis=1) if values.ndim else bad[None]
                first = identity, int(np.flatnonzero(rows)[0])
        if first is not None:
            raise FormatError(
                f"{stored.source}: column '{column.name}' holds {count:,} non-finite "
                f"value{'s' * (count != 1)} (NaN or inf) in {episodes:,} "
                f"episode{'s' * (episodes != 1)}, the first in episode {first[0]} at row "
                f"{first[1]}; training on them turns losses into NaN — repair the source, or "
                "pass `allow_nonfinite=True` to keep them"
            )


__all__ = [
    "BATCH_BYTES",
    "Progress",
    "ReadOptions",
    "Reader",
    "WriteOptions",
    "Writer",
    "check_episodes",
    "check_finite",
    "length_key",
    "read_store",
    "write_store",
]
