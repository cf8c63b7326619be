"""Frame-stacked observations for formats that hold whole observations.

An emote-memory store keeps a frame-stacked observation entry as one frame per step
(``frame_<key>``, see :mod:`emote_core.memory.frame_stacks`) and rebuilds the stacks when a table
samples them. Other formats (upstream zips, SB3, skrl, tmrl, Minari, npz/pt/csv) have no such
column: a conversion to them writes the stacks the agent saw, under the entry's own name.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from emote_core.memory.frame_stacks import stack_frames
from emote_core.stores.stored import ColumnSchema, StoredTable

log = logging.getLogger(__name__)

_STACK = "FrameStackMapper"
_LAST_STACK = "LastFrameStackMapper"


def with_whole_stacks(stored: StoredTable) -> StoredTable:
    """``stored`` with every frame-stacked entry as whole stacks (itself when it has none).

    The entry becomes a stored column of stacks; the column of single frames goes; the virtual
    columns that read it (the next observation) read the stacks instead, one step ahead (or
    after each window, for n-step bootstraps); the spaces lose their ``frames``.
    """
    stacks = {
        column.target_name: column
        for column in stored.columns
        if not column.stored
        and (column.mapper or {}).get("type") == _STACK
        and (column.mapper or {}).get("ahead", 0) == 0
        and column.target_name is not None
    }
    if not stacks:
        return stored
    columns: list[ColumnSchema] = []
    for column in stored.columns:
        if column.name in stacks:
            continue  # the single frames
        stack = stacks.get(column.target_name or "")
        if stack is None:
            columns.append(column)
        elif column is stack:
            columns.append(ColumnSchema(column.name, "Column", column.shape, column.dtype))
        else:
            columns.append(_reading_stacks(column, stack.name))
    counts = {frames: int(stack.mapper["frames"]) for frames, stack in stacks.items()}  # type: ignore[index]
    episodes = []
    for identity, data, end_state in stored.episodes:
        data = dict(data)
        for frames, stack in stacks.items():
            data[stack.name] = stack_frames(data.pop(frames), counts[frames])
        episodes.append((identity, data, end_state))
    log.info(
        "writing whole frame stacks for %s (the target format has no single-frame columns)",
        ", ".join(f"'{stack.name}'" for stack in stacks.values()),
    )
    return dataclasses.replace(
        stored, columns=columns, episodes=episodes, spaces=_without_frames(stored.spaces)
    )


def _reading_stacks(column: ColumnSchema, stacked: str) -> ColumnSchema:
    """A virtual column of stacks ahead (next observations) as one that reads the stacks."""
    mapper = column.mapper or {}
    if mapper.get("type") == _LAST_STACK:
        description: dict[str, Any] = {"type": "OnlyLastMapper"}
    else:
        description = {"type": "NextElementMapper", "n": max(int(mapper.get("ahead", 1)), 1)}
    return dataclasses.replace(column, target_name=stacked, mapper=description)


def _without_frames(spaces: dict[str, Any] | None) -> dict[str, Any] | None:
    if not spaces or not isinstance(spaces.get("state"), dict):
        return spaces
    state = dict(spaces["state"])
    entries = state.get("spaces")
    if isinstance(entries, dict):
        state["spaces"] = {
            key: {k: v for k, v in entry.items() if k != "frames"} if isinstance(entry, dict)
            else entry
            for key, entry in entries.items()
        }  # fmt: skip
    return {**spaces, "state": state}


__all__ = ["with_whole_stacks"]
