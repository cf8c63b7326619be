"""What `emote memory inspect` reports about any memory source, computed one way for all."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.spaces import BoxSpace, DiscreteSpace
from emote_core.stores.locations import filesystem, is_url
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.typing import EpisodeState

REWARD_COLUMNS = ("rewards", "reward", "rew")
"""Column names whose per-episode sum is an episode's return, first match wins."""
ACTION_COLUMNS = ("actions", "action", "act")
"""Column names holding the actions taken, first match wins."""


def reward_column(names: Sequence[str] | set[str]) -> str | None:
    """The column holding rewards among ``names`` (``None`` when there is none)."""
    return next((name for name in REWARD_COLUMNS if name in names), None)


def action_column(names: Sequence[str] | set[str]) -> str | None:
    """The column holding actions among ``names`` (``None`` when there is none)."""
    return next((name for name in ACTION_COLUMNS if name in names), None)


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


def episode_ends(end_states: np.ndarray) -> dict[str, int]:
    """``{terminal, truncated}``: episodes that ended TERMINAL (the task ended) and INTERRUPTED
    (cut by a time limit or from outside), as gymnasium names them."""
    ends = np.asarray(end_states)
    return {
        "terminal": int(np.sum(ends == int(EpisodeState.TERMINAL))),
        "truncated": int(np.sum(ends == int(EpisodeState.INTERRUPTED))),
    }


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
        "episode_ends": episode_ends(end_states),
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
        end_states: {TERMINAL, INTERRUPTED}, episode_ends: {terminal, truncated}, nonfinite}``:
        statistics of the finite returns (``None`` without any); ``edges`` has one more entry
        than ``counts``; ``nonfinite`` counts the returns left out (NaN or infinite).
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
    found["episode_ends"] = episode_ends(ends)
    found["nonfinite"] = int(len(values) - len(finite))
    return found


COVERAGE_BINS = 10
"""Equal-width bins per action dimension between its bounds, for Box action coverage."""


class ActionCoverage:
    """What actions a memory holds, gathered block by block in bounded memory.

    Discrete actions: the count and share of each action and the actions never taken. Box
    actions: per dimension min, max, mean and std, and which of :data:`COVERAGE_BINS`
    equal-width bins between the dimension's bounds hold any action (none for an unbounded
    dimension). Rows holding a NaN or an infinity are counted apart and left out of the rest.

    Args:
        space: The memory's action space (``None``: unknown, a Box without bounds).
        bins: Bins per bounded Box dimension.
    """

    def __init__(self, space: BoxSpace | None, *, bins: int = COVERAGE_BINS) -> None:
        self.space = space
        self.bins = bins
        self.discrete = isinstance(space, DiscreteSpace)
        self.rows = 0
        self.nonfinite = 0
        self.counts: np.ndarray | None = None  # per action, or per dimension and bin
        self.outside: np.ndarray | None = None
        self.mean: np.ndarray | None = None
        self.m2: np.ndarray | None = None
        self.low: np.ndarray | None = None
        self.high: np.ndarray | None = None

    def add(self, actions: np.ndarray) -> None:
        """Takes in a block of actions, one row per transition."""
        values = np.asarray(actions)
        flat = values.reshape(len(values), -1).astype(np.float64, copy=False)
        finite = np.isfinite(flat).all(axis=1)
        self.nonfinite += int(len(flat) - finite.sum())
        flat = flat[finite]
        if not len(flat):
            return
        if self.discrete:
            self._add_discrete(flat)
        else:
            self._add_box(flat)
        self.rows += len(flat)

    def _add_discrete(self, flat: np.ndarray) -> None:
        n = int(self.space.n)  # type: ignore[union-attr]
        chosen = flat[:, 0].astype(np.int64)
        inside = (chosen >= 0) & (chosen < n) & (chosen == flat[:, 0])
        if self.counts is None:
            self.counts, self.outside = np.zeros(n, np.int64), np.zeros(1, np.int64)
        self.counts += np.bincount(chosen[inside], minlength=n)
        self.outside += int(len(chosen) - inside.sum())  # type: ignore[operator]

    def _add_box(self, flat: np.ndarray) -> None:
        dims = flat.shape[1]
        if self.mean is None:
            self.mean, self.m2 = np.zeros(dims), np.zeros(dims)
            self.low, self.high = flat.min(axis=0), flat.max(axis=0)
            self.counts, self.outside = np.zeros((dims, self.bins), np.int64), np.zeros(dims, int)
        # Chan et al.'s merge of running means and squared deviations, block by block.
        count, mean = len(flat), flat.mean(axis=0)
        m2 = ((flat - mean) ** 2).sum(axis=0)
        total = self.rows + count
        delta = mean - self.mean
        self.m2 += m2 + delta**2 * self.rows * count / total  # type: ignore[operator]
        self.mean += delta * count / total  # type: ignore[operator]
        self.low = np.minimum(self.low, flat.min(axis=0))  # type: ignore[arg-type]
        self.high = np.maximum(self.high, flat.max(axis=0))  # type: ignore[arg-type]
        low, high = self._bounds(dims)
        bounded = np.isfinite(low) & np.isfinite(high) & (high > low)
        if not bounded.any():
            return
        width = np.where(bounded, high - low, 1.0)
        position = (flat - np.where(bounded, low, 0.0)) / width
        inside = (position >= 0) & (position <= 1) & bounded
        self.outside += ((~inside) & bounded).sum(axis=0)  # type: ignore[operator]
        index = np.minimum((position * self.bins).astype(np.int64), self.bins - 1)
        keys = (np.arange(dims) * self.bins + np.where(inside, index, 0))[inside]
        binned = np.bincount(keys, minlength=dims * self.bins).reshape(dims, self.bins)
        self.counts += binned  # type: ignore[operator]

    def _bounds(self, dims: int) -> tuple[np.ndarray, np.ndarray]:
        space = self.space
        unbounded = np.full(dims, np.nan)
        if space is None or int(np.prod(space.shape)) != dims:
            return unbounded, unbounded
        low = unbounded if space.low is None else np.asarray(space.low, np.float64).reshape(-1)
        high = unbounded if space.high is None else np.asarray(space.high, np.float64).reshape(-1)
        return low, high

    def report(self) -> dict[str, Any]:
        """The coverage as JSON data.

        Returns:
            ``{kind, transitions, nonfinite}`` and, for ``"discrete"``: ``n``, ``counts``,
            ``shares`` (per action), ``never_taken`` (the actions) and ``outside`` (values that
            are no action); for ``"box"``: ``bins`` and ``dimensions``, one
            ``{min, max, mean, std, low, high, bin_counts, bins_visited, coverage, outside}``
            each (``coverage``, the share of bins visited, and the bin entries are ``None``
            for a dimension without two finite bounds).
        """
        found: dict[str, Any] = {
            "kind": "discrete" if self.discrete else "box",
            "transitions": self.rows,
            "nonfinite": self.nonfinite,
        }
        if self.discrete:
            n = int(self.space.n)  # type: ignore[union-attr]
            counts = self.counts if self.counts is not None else np.zeros(n, np.int64)
            shares = counts / max(1, self.rows)
            outside = int(self.outside[0]) if self.outside is not None else 0
            return found | {
                "n": n,
                "counts": counts.tolist(),
                "shares": shares.tolist(),
                "never_taken": np.flatnonzero(counts == 0).tolist(),
                "outside": outside,
            }
        found["bins"] = self.bins
        if self.mean is None:
            found["dimensions"] = []
            return found
        dims = len(self.mean)
        low, high = self._bounds(dims)
        std = np.sqrt(self.m2 / self.rows)  # type: ignore[operator]
        dimensions = []
        for d in range(dims):
            bounded = bool(np.isfinite(low[d]) and np.isfinite(high[d]) and high[d] > low[d])
            counts = self.counts[d] if bounded else None  # type: ignore[index]
            visited = int((counts > 0).sum()) if counts is not None else None
            dimensions.append({
                "min": float(self.low[d]), "max": float(self.high[d]),  # type: ignore[index]
                "mean": float(self.mean[d]), "std": float(std[d]),
                "low": float(low[d]) if np.isfinite(low[d]) else None,
                "high": float(high[d]) if np.isfinite(high[d]) else None,
                "bin_counts": counts.tolist() if counts is not None else None,
                "bins_visited": visited,
                "coverage": visited / self.bins if visited is not None else None,
                "outside": int(self.outside[d]) if bounded else None,  # type: ignore[index]
            })  # fmt: skip
        found["dimensions"] = dimensions
        return found


def stored_action_coverage(stored: StoredTable) -> dict[str, Any] | None:
    """The :class:`ActionCoverage` report of a source read into memory (``None`` without an
    actions column), with ``column``."""
    name = action_column([c.name for c in stored.columns if c.stored])
    if name is None:
        return None
    coverage = ActionCoverage(action_space(stored.spaces))
    if stored.episodes:
        coverage.add(np.concatenate([np.asarray(data[name]) for _, data, _ in stored.episodes]))
    return {"column": name, **coverage.report()}


def action_space(spaces: dict[str, Any] | None) -> BoxSpace | None:
    """The action space of recorded spaces (``None`` when unrecorded or unreadable)."""
    from emote_core.errors import ConfigurationError
    from emote_core.spaces import MDPSpace

    if not spaces:
        return None
    try:
        return MDPSpace.from_json(spaces).actions
    except (ConfigurationError, AttributeError, KeyError, TypeError, ValueError):
        return None


def columns_summary(columns: Sequence[ColumnSchema]) -> dict[str, dict[str, Any]]:
    """Column name -> ``{dtype, shape, kind}``."""
    return {
        c.name: {"dtype": str(c.dtype), "shape": list(c.shape), "kind": c.kind} for c in columns
    }


def summarize_stored(stored: StoredTable, length_key: str | None = None) -> dict[str, Any]:
    """The inspect report of a source read into memory (zips, pickles, peer files), with the
    distribution of its episode returns as ``returns``."""
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
        "returns": return_distribution(returns, ends),
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
    "ACTION_COLUMNS",
    "COVERAGE_BINS",
    "RETURN_BINS",
    "REWARD_COLUMNS",
    "ActionCoverage",
    "action_column",
    "action_space",
    "bytes_on_disk",
    "columns_summary",
    "episode_ends",
    "episode_returns",
    "episode_summary",
    "return_distribution",
    "reward_column",
    "statistics",
    "stored_action_coverage",
    "summarize_stored",
]
