"""Which agent and group each episode of a multi-agent store belongs to.

A shard collected on a PettingZoo env keeps, in its ``agents`` attribute, the env's agent names
(``possible_agents`` order) and its groups of agents that share a policy. An episode's id encodes
its agent: ``id % len(agents)`` is the agent's index (the rule of
``emote_core.env.multi_agent.ParallelEnvWrapper``'s agent ids), so no column is added and every
reader that keeps episode ids keeps the agents. Shards without the attribute are single-agent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from emote_core.errors import FormatError

AGENTS = "agents"
"""Shard attribute: ``{"agents": [names], "groups": [{"name", "agents"}]}`` (absent: one agent)."""


def record_agents(group: Any, record: Mapping[str, Any]) -> None:
    """Writes ``record`` into a shard's Zarr ``group`` attributes (its writer's group)."""
    group.attrs.update({AGENTS: dict(record)})


def shard_agents(attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    """A shard's agents record from its attributes (``None``: not a multi-agent shard).

    Raises:
        FormatError: If the record is there but malformed.
    """
    record = attributes.get(AGENTS)
    if record is None:
        return None
    try:
        names = [str(n) for n in record["agents"]]
        groups = [
            {"name": str(g["name"]), "agents": [str(a) for a in g["agents"]]}
            for g in record["groups"]
        ]
    except (KeyError, TypeError) as error:
        raise FormatError(
            f"a shard's '{AGENTS}' attribute is malformed ({error!r}); expected "
            '{"agents": [names], "groups": [{"name", "agents"}]} — the store is damaged'
        ) from error
    if not names:
        raise FormatError(f"a shard's '{AGENTS}' attribute names no agents — the store is damaged")
    return {"agents": names, "groups": groups}


def episode_agent(identity: int, record: Mapping[str, Any]) -> tuple[str, str]:
    """``(agent name, group name)`` of the episode with id ``identity`` in a shard of ``record``."""
    names = record["agents"]
    name = names[int(identity) % len(names)]
    group = next((g["name"] for g in record["groups"] if name in g["agents"]), "")
    return name, group


def group_counts(identities: Iterable[int], record: Mapping[str, Any]) -> dict[str, int]:
    """Episodes per group among ``identities``, in the record's group order."""
    counted = Counter(episode_agent(i, record)[1] for i in identities)
    return {g["name"]: counted.get(g["name"], 0) for g in record["groups"]}


def store_agents(store: Any) -> dict[str, Any] | None:
    """Per shard of an open ``MemoryStore`` collected on a multi-agent env: its agents and groups,
    each group with the count of its committed episodes (``None``: no such shard).

    Raises:
        FormatError: If a shard's record is malformed.
    """
    shards = {}
    for shard in store.shards:
        record = shard_agents(dict(shard.group.attrs))
        if record is None:
            continue
        counts = group_counts(shard.table["id"].tolist(), record)
        groups = [{**g, "episodes": counts[g["name"]]} for g in record["groups"]]
        shards[shard.name] = {"agents": record["agents"], "groups": groups}
    return shards or None


__all__ = [
    "AGENTS",
    "episode_agent",
    "group_counts",
    "record_agents",
    "shard_agents",
    "store_agents",
]
