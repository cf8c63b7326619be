"""What `emote memory inspect` reports about any memory source, computed one way for all."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.stores.locations import filesystem, is_url
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.typing import EpisodeState

REWARD_COLUMNS = ("rewards", "reward", "rew")
"""Column names whose per-episode sum is an episode's return, first match wins."""


def reward_column(names: Sequence[str] | set[str]) -> str | None:
    """The column holding rewards among ``names`` (``None`` when there is none)."""
    return next((name for name in REWARD_COLUMNS if name in names), None)


def episode_returns(stored: StoredTable) -> np.ndarray:
    """Each episode's return (sum of its rewards); NaN when the source has no reward column."""
    reward = reward_column({c.name for c in stored.columns})
    if reward is None:
        return np.full(len(stored.episodes), np.nan)
    return np.array(
        [float(np.sum(data[reward], dtype=np.float64)) for _, data, _ in stored.episodes]
    )


def statistics(values: np.ndarray) -> dict[str, float | None]:
    """``{min, mean, max}`` of ``values`` (``None`` each when empty)."""
    if len(values) == 0:
        return {"min": None, "mean": None, "max": None}
    return {"min": float(values.min()), "mean": float(values.mean()), "max": float(values.max())}


def episode_summary(
    *, lengths: np.ndarray, returns: np.ndarray, end_states: np.ndarray
) -> dict[str, Any]:
    """Counts and statistics of a set of episodes."""
    return {
        "episodes": len(lengths),
        "transitions": int(np.sum(lengths, dtype=np.int64)),
        "episode_length": statistics(np.asarray(lengths, dtype=np.float64)),
        "episode_return": statistics(np.asarray(returns, dtype=np.float64)),
        "end_states": {
            state.name: int(np.sum(np.asarray(end_states) == int(state)))
            for state in (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)
        },
    }


RETURN_BINS = 10
"""Bins of the return histogram ``emote memory inspect --returns`` shows."""


def return_distribution(
    returns: np.ndarray, end_states: np.ndarray, *, bins: int = RETURN_BINS
) -> dict[str, Any]:
    """The distribution of episode returns: quantiles, mean and spread, a histogram, and how
    many episodes ended TERMINAL and INTERRUPTED (truncated).

    Args:
        returns: Each episode's return (NaN where the source holds no rewards).
        end_states: Each episode's :class:`EpisodeState`.
        bins: Bins of equal width from the smallest return to the largest.

    Returns:
        ``{episodes, min, p25, median, p75, max, mean, std, histogram: {edges, counts},
        end_states: {TERMINAL, INTERRUPTED}, nonfinite}``: statistics of the finite returns
        (``None`` without any); ``edges`` has one more entry than ``counts``; ``nonfinite``
        counts the returns left out (NaN or infinite).
    """
    values = np.asarray(returns, dtype=np.float64)
    finite = values[np.isfinite(values)]
    ends = np.asarray(end_states)
    found: dict[str, Any] = {"episodes": len(values)}
    names = ("min", "p25", "median", "p75", "max")
    if len(finite):
        quantiles = np.quantile(finite, [0.0, 0.25, 0.5, 0.75, 1.0])
        found |= {name: float(q) for name, q in zip(names, quantiles, strict=True)}
        found |= {"mean": float(finite.mean()), "std": float(finite.std())}
        counts, edges = np.histogram(finite, bins=bins)
        found["histogram"] = {"edges": edges.tolist(), "counts": counts.tolist()}
    else:
        found |= dict.fromkeys((*names, "mean", "std"))
        found["histogram"] = {"edges": [], "counts": []}
    found["end_states"] = {
        state.name: int(np.sum(ends == int(state)))
        for state in (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)
    }
    found["nonfinite"] = int(len(values) - len(finite))
    return found


def columns_summary(columns: Sequence[ColumnSchema]) -> dict[str, dict[str, Any]]:
    """Column name -> ``{dtype, shape, kind}``."""
    return {
        c.name: {"dtype": str(c.dtype), "shape": list(c.shape), "kind": c.kind} for c in columns
    }


def summarize_stored(stored: StoredTable, length_key: str | None = None) -> dict[str, Any]:
    """The inspect report of a source read into memory (zips, pickles, peer files)."""
    key = length_key or stored.length_key or "rewards"
    lengths = np.array([len(data[key]) for _, data, _ in stored.episodes], dtype=np.int64)
    returns = episode_returns(stored)
    ends = np.array([int(end) for _, _, end in stored.episodes], dtype=np.int64)
    return {
        "format": stored.format,
        "format_version": stored.metadata.get("format_version"),
        "columns": columns_summary(stored.columns),
        "spaces": stored.spaces,
        **episode_summary(lengths=lengths, returns=returns, end_states=ends),
    }


def bytes_on_disk(location: str | os.PathLike[str]) -> int | None:
    """Total size of the files at a path or fsspec URL (``None`` when it cannot be measured)."""
    text = os.fspath(location)
    if is_url(text):
        try:
            fs, path = filesystem(text)
            fs.invalidate_cache(path)  # sizes as they are now, not as first listed
            return int(fs.du(path, total=True))
        except Exception:  # a remote store may not support listing sizes; report unknown
            return None
    path = Path(text)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


__all__ = [
    "RETURN_BINS",
    "REWARD_COLUMNS",
    "bytes_on_disk",
    "columns_summary",
    "episode_returns",
    "episode_summary",
    "return_distribution",
    "reward_column",
    "statistics",
    "summarize_stored",
]
