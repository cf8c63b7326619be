"""Fixtures for the peer-format tests: the real files in data/ and what their envs recorded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from emote_core.typing import EpisodeState

DATA = Path(__file__).parent / "data"


@dataclass
class Expected:
    """One episode as the env produced it (or the part of it a file kept)."""

    env: int
    end_row: int
    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    state: EpisodeState

    @property
    def length(self) -> int:
        return len(self.actions)


def _env_columns(record: np.lib.npyio.NpzFile, env: int) -> tuple[dict, dict]:
    prefix = f"env{env}_obs"
    keys = [k for k in record.files if k == prefix or k.startswith(prefix + "_")]
    obs = {("obs" if k == prefix else k[len(prefix) + 1 :]): record[k] for k in keys}
    after = {
        name: record[f"env{env}_next_obs" + k[len(prefix) :]]
        for name, k in zip(obs, keys, strict=True)
    }
    return obs, after


def expected_episodes(name: str, *, kept: int | None = None, envs: int = 1) -> list[Expected]:
    """The recorded episodes of the last ``kept`` transitions of each env, ordered like readers.

    Episodes end where the env said terminated (TERMINAL) or truncated (INTERRUPTED); the
    transitions after the last end form an unfinished INTERRUPTED episode.
    """
    record = np.load(DATA / f"{name}.record.npz")
    episodes = []
    for env in range(envs):
        obs, after = _env_columns(record, env)
        rows = len(record[f"env{env}_rewards"])
        first = rows - (rows if kept is None else kept)
        terminated = record[f"env{env}_terminated"].astype(bool)
        truncated = record[f"env{env}_truncated"].astype(bool)
        ends = [r for r in range(first, rows) if terminated[r] or truncated[r]]
        if not ends or ends[-1] != rows - 1:
            ends.append(rows - 1)
        start = first
        for end in ends:
            state = EpisodeState.TERMINAL if terminated[end] else EpisodeState.INTERRUPTED
            episodes.append(
                Expected(
                    env=env,
                    end_row=end - first,
                    obs={
                        k: np.concatenate([v[start : end + 1], after[k][end : end + 1]])
                        for k, v in obs.items()
                    },
                    actions=record[f"env{env}_actions"][start : end + 1],
                    rewards=record[f"env{env}_rewards"][start : end + 1].astype(np.float32),
                    state=state,
                )
            )
            start = end + 1
    episodes.sort(key=lambda e: (e.end_row, e.env))
    return episodes


@pytest.fixture
def recorded() -> Callable[..., list[Expected]]:
    """``recorded(name, kept=..., envs=...)``: the episodes the env produced, see above."""
    return expected_episodes


@pytest.fixture
def data_file() -> Callable[[str], Path]:
    """The path of a file in data/, failing clearly if it is missing."""

    def find(name: str) -> Path:
        path = DATA / name
        assert path.is_file(), f"test data {path} is missing; see data/README.md"
        return path

    return find
