"""Columns: what a memory table stores per step, per episode, or derives at sampling time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import ConfigurationError

if TYPE_CHECKING:
    from emote_core.memory.mappers import Mapper


def _normalise(column: Any) -> None:
    if not column.name or not isinstance(column.name, str):
        raise ConfigurationError(f"a column needs a non-empty string name; got {column.name!r}")
    object.__setattr__(column, "shape", tuple(int(s) for s in column.shape))
    object.__setattr__(column, "dtype", np.dtype(column.dtype))


@dataclass(frozen=True)
class Column:
    """A value stored at every step of an episode (observations, actions, rewards).

    An episode of ``N`` transitions gives each column ``N`` rows (actions, rewards) or ``N + 1``
    rows (observations, which include the final one); the table learns which from the first
    episode and holds every later episode to it.

    Attributes:
        name: The key of the column in added sequences and sampled batches.
        shape: The shape of one step's value.
        dtype: The numpy dtype values are stored as.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any] | type = np.float32

    def __post_init__(self) -> None:
        _normalise(self)


@dataclass(frozen=True)
class TagColumn:
    """One value per episode (a goal, a task id); sampled once per window.

    Attributes:
        name: The key of the column in added sequences and sampled batches.
        shape: The shape of the episode's value.
        dtype: The numpy dtype the value is stored as.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any] | type = np.float32

    def __post_init__(self) -> None:
        _normalise(self)


@dataclass(frozen=True)
class VirtualColumn:
    """A column derived when sampling, from a target column or the episode's structure.

    Next observations, n-step bootstrap observations, dones and masks are virtual: they cost no
    memory.

    Attributes:
        name: The key of the column in sampled batches.
        shape: The shape of one derived value.
        dtype: The dtype of the derived values.
        target_name: The stored column the mapper reads (ignored by synthetic mappers).
        mapper: How values are derived (see :mod:`emote_core.memory.mappers`).
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any] | type
    target_name: str
    mapper: Mapper = field(compare=False)

    def __post_init__(self) -> None:
        _normalise(self)


AnyColumn = Column | TagColumn | VirtualColumn

__all__ = ["AnyColumn", "Column", "TagColumn", "VirtualColumn"]
