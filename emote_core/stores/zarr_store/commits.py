"""A shard's commit record, read alone: what a store's readers trust, and what followers poll.

Reading a commit record costs one small metadata read per shard (the shard's ``zarr.json``), so
a follower can ask every shard what it committed without touching the episode tables or columns.
"""

from __future__ import annotations

from typing import Any

from emote_core.errors import FormatError
from emote_core.stores.zarr_store.groups import child_names, keys_under
from emote_core.stores.zarr_store.layout import SHARDS


def shard_commit(root: Any, url: str, name: str) -> tuple[Any, dict[str, Any]] | None:
    """A shard's group and its commit record, as the shard's metadata holds it now.

    Args:
        root: The store's root group (opened for reading).
        url: The store's location, for messages.
        name: The shard's name.

    Returns:
        ``(group, commit)``, or ``None`` for a shard being created (no commit record yet, or a
        folder holding no data yet): empty to readers, not an error.

    Raises:
        FormatError: If the shard's metadata is missing while it holds data, unparseable, or
            its commit record is malformed.
    """
    path = f"{SHARDS}/{name}"
    where = f"store '{url}' shard '{name}'"
    try:
        group = root[path]  # one metadata read: what a follower pays per shard and look
    except KeyError:
        if not keys_under(root, f"{path}/"):
            return None  # a writer is creating it (or died doing so): empty
        raise FormatError(
            f"{where}: {path}/zarr.json is missing; its episodes are unreadable"
        ) from None
    except ValueError as error:  # unparseable JSON
        raise FormatError(f"{where}: {path}/zarr.json is unreadable ({error})") from error
    commit = dict(group.attrs).get("commit")
    if commit is None:
        return None  # created, not yet committed to: empty, still growing
    if not isinstance(commit, dict) or "episodes" not in commit or "rows" not in commit:
        raise FormatError(f"{where}: the commit record in {path}/zarr.json is malformed")
    return group, commit


Committed = dict[str, tuple[Any, dict[str, Any]]]
"""Shard name -> ``(group, commit record)``."""


def commit_records(root: Any, url: str) -> tuple[Committed, dict[str, str]]:
    """Every shard's group and commit record (shards without one left out).

    Returns:
        ``(committed, damaged)``: shard name -> ``(group, commit)``, and shard name -> why it
        cannot be read.
    """
    committed: Committed = {}
    damaged: dict[str, str] = {}
    for name in child_names(root, SHARDS):
        try:
            found = shard_commit(root, url, name)
        except FormatError as error:
            damaged[name] = str(error)
            continue
        if found is not None:
            committed[name] = found
    return committed, damaged


__all__ = ["Committed", "commit_records", "shard_commit"]
