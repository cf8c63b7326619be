"""Frame-stacked observations stored one frame per step.

An agent that sees the last ``k`` frames (emote's ``FrameStack``) gets each frame ``k`` times,
once in each of the ``k`` stacks that hold it. A table whose observation entry says so
(``BoxSpace(frames=k)``) stores only each step's newest frame, in a column ``frame_<key>``, and
rebuilds the stack (``<key>``) and the next observation's stack (``next_<key>``) when it is
sampled (:class:`~emote_core.memory.mappers.FrameStackMapper`): the bytes per transition stay those
of one frame, in RAM and in stores. The column holds each frame channels first (``(C, H, W)`` for
an ``(H, W, C)`` frame), so that a sampled stack is a view of its gathered frames.

Stacks are rebuilt as the wrapper builds them: the frames of steps ``p - k + 1 .. p`` joined along
the last axis, oldest first, with the episode's first frame standing in for the steps before it.
An episode whose stacks do not follow that rule could not be rebuilt and is refused when added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from emote_core.errors import SchemaError
from emote_core.memory.columns import AnyColumn, Column, VirtualColumn
from emote_core.memory.mappers import FrameStackMapper, LastFrameStackMapper
from emote_core.spaces import BoxSpace, MDPSpace

FRAME_PREFIX = "frame_"
"""Prefix of the stored column (``frame_<key>``) that holds each frame of a frame-stacked
observation entry once; the entry itself and its next observation are virtual."""


def frame_stacks(spaces: MDPSpace) -> dict[str, int]:
    """The observation entries of ``spaces`` that stack frames, with their frame counts."""
    return {key: space.frames for key, space in spaces.state.spaces.items() if space.frames > 1}


def frame_stack_columns(
    key: str, space: BoxSpace, *, next_name: str, per_window: bool
) -> list[AnyColumn]:
    """The columns of a stacked observation entry: its frames stored once (``frame_<key>``),
    the entry and its next observation rebuilt from them when sampling.

    Args:
        key: The observation entry.
        space: Its space (``space.frames`` > 1).
        next_name: The next observation's column.
        per_window: Whether the next observation is the one after each window (n-step tables)
            rather than after each step.
    """
    frames, stored = space.frames, FRAME_PREFIX + key
    *leading, channels = space.frame_shape
    after = LastFrameStackMapper(frames) if per_window else FrameStackMapper(frames, 1)
    return [
        Column(stored, (channels, *leading), space.dtype),  # channels first
        VirtualColumn(key, space.shape, space.dtype, stored, FrameStackMapper(frames)),
        VirtualColumn(next_name, space.shape, space.dtype, stored, after),
    ]


def unstack_frames(
    sequence: Mapping[str, Any], stacks: Mapping[str, int], spaces: MDPSpace
) -> dict[str, Any]:
    """An episode's stacked observation entries as the frames a table stores.

    Args:
        sequence: The episode's columns, stacked entries under their observation keys. An entry
            whose ``frame_<key>`` column is there already (an episode read from a store) is
            passed through.
        stacks: Frames per stacked entry (:func:`frame_stacks`).
        spaces: The table's spaces.

    Returns:
        The sequence with ``frame_<key>`` (each step's newest frame, channels first) in place
        of ``<key>``.

    Raises:
        SchemaError: If a stack is not shaped as its space says, or does not follow from the
            frames before it (the message names the entry and the step).
    """
    values = dict(sequence)
    for key, frames in stacks.items():
        if key not in values or FRAME_PREFIX + key in values:
            continue
        space = spaces.state[key]
        stacked = np.asarray(values.pop(key))
        if stacked.ndim != len(space.shape) + 1 or stacked.shape[1:] != space.shape:
            raise SchemaError(
                f"observation '{key}' stacks {frames} frames of shape {space.frame_shape} into "
                f"{space.shape}; the episode's values have shape {stacked.shape[1:]} per step"
            )
        split = stacked.reshape(*stacked.shape[:-1], frames, space.frame_shape[-1])
        step = _first_inconsistent_step(split)
        if step is not None:
            rule = (
                f"one frame repeated {frames} times, as a stack right after a reset"
                if step == 0
                else "the stack before it shifted by one frame"
            )
            raise SchemaError(
                f"observation '{key}' at step {step} of the episode is not {rule}, so it cannot "
                "be stored as single frames; stack frames with emote's FrameStack, or declare "
                "the entry without frames"
            )
        values[FRAME_PREFIX + key] = np.ascontiguousarray(np.moveaxis(split[..., -1, :], -1, 1))
    return values


def stack_frames(frames: np.ndarray, count: int) -> np.ndarray:
    """The stacks an agent saw, from the frames a table stores (the inverse of
    :func:`unstack_frames`): for formats that hold whole observations.

    Args:
        frames: One episode's frames as stored, ``(N + 1, C, ...)``.
        count: Frames per stack.

    Returns:
        ``(N + 1, ..., count * C)``: at each step the frames of the ``count`` steps up to it,
        oldest first along the last axis, the first frame standing in before the episode.
    """
    steps = np.arange(len(frames), dtype=np.int64)
    rows = np.maximum(steps[:, None] + np.arange(1 - count, 1, dtype=np.int64)[None, :], 0)
    gathered = frames[rows.reshape(-1)]  # (steps * count, C, ...)
    joined = gathered.reshape(len(frames), count * frames.shape[1], *frames.shape[2:])
    return np.ascontiguousarray(np.moveaxis(joined, 1, -1))


def _first_inconsistent_step(split: np.ndarray) -> int | None:
    """The first step whose stack (``split``: steps x ... x frames x width) is not the one
    before it shifted by one frame, or, at step 0, not one frame repeated; ``None`` if none."""
    if not np.array_equal(split[0, ..., :-1, :], split[0, ..., 1:, :]):
        return 0
    if len(split) < 2:
        return None
    older, newer = split[1:, ..., :-1, :], split[:-1, ..., 1:, :]
    if np.array_equal(older, newer):
        return None
    differs = (older != newer).reshape(len(older), -1).any(axis=1)
    return int(np.flatnonzero(differs)[0]) + 1


__all__ = [
    "FRAME_PREFIX",
    "frame_stack_columns",
    "frame_stacks",
    "stack_frames",
    "unstack_frames",
]
