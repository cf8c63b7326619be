"""Shared pieces of the Zarr store tests: a deterministic episode generator and a writer script."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from emote_core.stores.stored import ColumnSchema
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def make_episode(identity: int, length: int | None = None) -> tuple:
    """Episode ``identity``: its values derive from the id, so any reader can check them."""
    length = length if length is not None else 1 + identity % 17
    steps = np.arange(length + 1, dtype=np.float32)
    obs = np.stack([np.full(length + 1, identity, np.float32), steps, steps * 0.5], axis=1)
    actions = np.stack([steps[:length], -steps[:length]], axis=1)
    rewards = (steps[:length] + identity).reshape(-1, 1)
    end = EpisodeState.TERMINAL if identity % 3 else EpisodeState.INTERRUPTED
    return identity, {"obs": obs, "actions": actions, "rewards": rewards}, end


def assert_episode_is(record: tuple) -> None:
    """The episode is exactly what :func:`make_episode` made for the identity its observations
    carry (a store may hand a repeated id out as a fresh one)."""
    _, data, end = record
    identity = int(data["obs"][0, 0])
    expected = make_episode(identity, len(data["rewards"]))
    assert end == expected[2]
    for key in ("obs", "actions", "rewards"):
        np.testing.assert_array_equal(data[key], expected[1][key])


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (conftest modules cannot be imported directly)."""
    return SimpleNamespace(
        schemas=SCHEMAS, make=make_episode, check=assert_episode_is, conftest=Path(__file__)
    )
