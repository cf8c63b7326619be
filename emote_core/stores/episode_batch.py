"""EpisodeBatch: many finished episodes held joined, column by column, ready for one append.

An :class:`EpisodeBatch` holds each column's rows episode after episode, with the episodes'
identities, lengths and end states beside them, so a collector of short episodes pays per batch,
not per episode. :meth:`~emote_core.stores.zarr_store.writer.ShardWriter.append_batch` writes it
whole; :meth:`EpisodeBatch.episodes` gives ``(identity, sequence, end_state)`` records as views
of the joined rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from emote_core.typing import EpisodeState


@dataclass(frozen=True)
class EpisodeBatch:
    """Whole episodes, each column's rows joined in episode order.

    Attributes:
        identities: Each episode's identity, ``int64``.
        lengths: Each episode's transitions, ``int64``.
        end_states: Each episode's :class:`~emote_core.typing.EpisodeState`, ``int8``.
        columns: Column name -> its rows: ``lengths[k] + extra_rows[name]`` rows for episode
            ``k``, episode after episode.
        extra_rows: Column name -> rows an episode has beyond its transitions (1 for an
            observation, which also holds the final one; 0 for actions and rewards).
    """

    identities: np.ndarray
    lengths: np.ndarray
    end_states: np.ndarray
    columns: Mapping[str, np.ndarray]
    extra_rows: Mapping[str, int]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        """The bytes of the columns' rows."""
        return sum(rows.nbytes for rows in self.columns.values())

    @property
    def transitions(self) -> int:
        return int(self.lengths.sum())

    def row_ends(self, name: str) -> np.ndarray:
        """Where each episode's rows of column ``name`` end (its start is the one before)."""
        return np.cumsum(self.lengths + self.extra_rows[name])

    def returns(self, reward: str) -> np.ndarray:
        """Each episode's sum of column ``reward`` (one row per transition), in float64 (0 for
        an empty episode)."""
        return segment_sums(self.columns[reward].reshape(-1), self.lengths)

    def episodes(self) -> Iterator[tuple[int, dict[str, np.ndarray], EpisodeState]]:
        """Each episode as ``(identity, {column: rows}, end_state)``, its rows views of the
        joined ones."""
        ends = {name: self.row_ends(name).tolist() for name in self.columns}
        starts = dict.fromkeys(self.columns, 0)
        for k, identity in enumerate(self.identities.tolist()):
            sequence = {}
            for name, rows in self.columns.items():
                stop = ends[name][k]
                sequence[name] = rows[starts[name] : stop]
                starts[name] = stop
            yield identity, sequence, EpisodeState(int(self.end_states[k]))

    @classmethod
    def join(cls, batches: Sequence[EpisodeBatch]) -> EpisodeBatch:
        """One batch of ``batches``' episodes in turn (they must have the same columns)."""
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        return cls(
            identities=np.concatenate([b.identities for b in batches]),
            lengths=np.concatenate([b.lengths for b in batches]),
            end_states=np.concatenate([b.end_states for b in batches]),
            columns={
                name: np.concatenate([b.columns[name] for b in batches]) for name in first.columns
            },
            extra_rows=dict(first.extra_rows),
        )

    @classmethod
    def of(
        cls, episodes: Sequence[tuple[int, Mapping[str, Any], Any]], extra_rows: Mapping[str, int]
    ) -> EpisodeBatch:
        """The batch of per-episode records ``(identity, sequence, end_state)``, whose sequences
        all have the columns of ``extra_rows``; the lengths are taken from a column without
        extra rows."""
        names = list(extra_rows)
        steps = next(name for name in names if extra_rows[name] == 0)
        return cls(
            identities=np.array([e[0] for e in episodes], dtype=np.int64),
            lengths=np.array([len(e[1][steps]) for e in episodes], dtype=np.int64),
            end_states=np.array([int(e[2]) for e in episodes], dtype=np.int8),
            columns={
                name: np.concatenate([np.asarray(e[1][name]) for e in episodes]) for name in names
            },
            extra_rows=dict(extra_rows),
        )


def segment_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The float64 sum of each run of ``lengths`` values (0 for an empty run)."""
    sums = np.zeros(len(lengths), dtype=np.float64)
    filled = lengths > 0
    if filled.any():
        starts = (np.cumsum(lengths) - lengths)[filled]
        sums[filled] = np.add.reduceat(values, starts, dtype=np.float64)
    return sums


__all__ = ["EpisodeBatch", "segment_sums"]
