"""A shard's commit record, read alone: what a store's readers trust, and what followers poll.

Reading a commit record costs one small metadata read per shard (the shard's ``zarr.json``), so
a follower can ask every shard what it committed without touching the episode tables or columns.
Every reader and writer checks a record through :func:`commit_problems` (its types and whether
its counts agree with each other) and :func:`table_problems` (whether they agree with the
episode table), so a record that ``verify`` calls damaged is damaged to all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.zarr_store.groups import child_names, keys_under
from emote_core.stores.zarr_store.layout import (
    SHARDS,
    TABLE_CHECKSUM,
    RowKind,
    StoreColumn,
    table_checksums,
)


def _count(value: Any) -> bool:
    """Whether ``value`` is a whole number of at least 0 (a JSON integer, not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def commit_problems(commit: Any, columns: Sequence[StoreColumn]) -> list[str]:
    """What is wrong with a commit record on its own: a count that is not a whole number of at
    least 0, a stored column without a row count, or row counts that disagree with the episodes
    and transitions it commits (observation columns hold one row more per episode).

    Returns:
        One phrase per problem (empty when the record is sound).
    """
    if not isinstance(commit, dict):
        return [f"it is {type(commit).__name__} {_shown(commit)}, not a JSON object"]
    problems = []
    for key in ("episodes", "rows"):
        if key not in commit:
            problems.append(f"'{key}' is missing")
    for key in ("sequence", "episodes", "transitions"):
        if key in commit and not _count(commit[key]):
            problems.append(f"'{key}' is {_shown(commit[key])}, not a whole number >= 0")
    rows = commit.get("rows", {})
    if not isinstance(rows, dict):
        return [*problems, f"'rows' is {_shown(rows)}, not an object of row counts per column"]
    for column in columns:
        if column.name not in rows and "rows" in commit:
            problems.append(f"'rows' has no count for column '{column.name}'")
        elif column.name in rows and not _count(rows[column.name]):
            problems.append(
                f"'rows.{column.name}' is {_shown(rows[column.name])}, not a whole number >= 0"
            )
    if problems:
        return problems
    episodes = commit["episodes"]
    transitions = commit.get("transitions")
    for column in columns:
        committed = rows[column.name]
        if column.rows == RowKind.EPISODE:
            expected = episodes
        elif transitions is None:  # records of earlier emotes may lack it: the first column's
            transitions = committed - column.extra_rows * episodes
            continue
        else:
            expected = transitions + column.extra_rows * episodes
        if committed != expected:
            problems.append(
                f"'rows.{column.name}' is {committed}, but {episodes} episodes of "
                f"{transitions if transitions is not None else '?'} transitions need {expected}"
            )
    return problems


def table_problems(commit: dict[str, Any], table: dict[str, np.ndarray]) -> list[str]:
    """What a sound commit record and its shard's episode table disagree on: the transitions
    it commits against where the table's last committed episode ends.

    Args:
        commit: A record :func:`commit_problems` found sound.
        table: The episode table's rows up to the last the record commits (all of them, or a
            run of them ending there).

    Returns:
        One phrase per problem; none where the last row fails its own table checksum (that
        episode is damaged, and the readers name it as such).
    """
    transitions = commit.get("transitions")
    if transitions is None:
        return []
    if len(table["length"]) == 0:
        end = 0
    else:
        if TABLE_CHECKSUM in table and len(table[TABLE_CHECKSUM]):
            last = np.array([len(table["length"]) - 1])
            if table_checksums(table, last)[0] != table[TABLE_CHECKSUM][-1]:
                return []
        end = int(table["offset"][-1, 0]) + int(table["length"][-1])
    if end != transitions:
        return [
            f"'transitions' is {transitions}, but the last committed episode in the episode "
            f"table ends at transition {end}"
        ]
    return []


def malformed(where: str, path: str, problems: list[str]) -> FormatError:
    """The one-line error of a damaged commit record, naming the shard and its file."""
    return FormatError(
        f"{where}: the commit record in {path}/zarr.json is damaged ({'; '.join(problems)})"
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def shard_commit(
    root: Any, url: str, name: str, columns: Sequence[StoreColumn]
) -> tuple[Any, dict[str, Any]] | None:
    """A shard's group and its commit record, as the shard's metadata holds it now.

    Args:
        root: The store's root group (opened for reading).
        url: The store's location, for messages.
        name: The shard's name.
        columns: The store's stored columns (each needs a row count in the record).

    Returns:
        ``(group, commit)``, or ``None`` for a shard being created (no commit record yet, or a
        folder holding no data yet): empty to readers, not an error.

    Raises:
        FormatError: If the shard's metadata is missing while it holds data, unparseable, or
            its commit record is malformed (:func:`commit_problems`).
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
    problems = commit_problems(commit, columns)
    if problems:
        raise malformed(where, path, problems)
    return group, commit


Committed = dict[str, tuple[Any, dict[str, Any]]]
"""Shard name -> ``(group, commit record)``."""


def commit_records(
    root: Any, url: str, columns: Sequence[StoreColumn]
) -> tuple[Committed, dict[str, str]]:
    """Every shard's group and commit record (shards without one left out).

    Returns:
        ``(committed, damaged)``: shard name -> ``(group, commit)``, and shard name -> why it
        cannot be read.
    """
    committed: Committed = {}
    damaged: dict[str, str] = {}
    for name in child_names(root, SHARDS):
        try:
            found = shard_commit(root, url, name, columns)
        except FormatError as error:
            damaged[name] = str(error)
            continue
        if found is not None:
            committed[name] = found
    return committed, damaged


__all__ = [
    "Committed",
    "commit_problems",
    "commit_records",
    "malformed",
    "shard_commit",
    "table_problems",
]
