"""A table's schema: its columns, and the checks every added episode must pass."""

from __future__ import annotations

import warnings
from collections.abc import Container, Mapping, Sequence
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError, DuplicateEpisodeError, SchemaError
from emote_core.memory.columns import AnyColumn, Column, TagColumn, VirtualColumn
from emote_core.typing import EpisodeState


class TableSchema:
    """The columns of a table and how episodes must look to be added.

    Args:
        columns: The table's columns.
        length_key: The stored per-step column whose length is an episode's transition count.

    Attributes:
        extra_rows: Per stored column, 0 when it holds N values per episode of N transitions and
            1 when it holds N + 1 (observations); learned from the first episode.

    Raises:
        ConfigurationError: If names clash, ``length_key`` is not stored per step, or a virtual
            column's target is missing.
    """

    def __init__(self, columns: Sequence[AnyColumn], length_key: str) -> None:
        names = [c.name for c in columns]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ConfigurationError(f"column names must be unique; {duplicated} repeat")
        self.columns: dict[str, AnyColumn] = {c.name: c for c in columns}
        self.stored = [c for c in columns if isinstance(c, Column)]
        self.tags = [c for c in columns if isinstance(c, TagColumn)]
        self.virtual = [c for c in columns if isinstance(c, VirtualColumn)]
        stored_names = {c.name for c in self.stored}
        if length_key not in stored_names:
            raise ConfigurationError(
                f"length_key '{length_key}' must name a stored per-step column; stored columns: "
                f"{sorted(stored_names)}"
            )
        for column in self.virtual:
            if column.mapper.needs_target and column.target_name not in stored_names:
                raise ConfigurationError(
                    f"virtual column '{column.name}' reads '{column.target_name}', which is not a "
                    f"stored per-step column; stored columns: {sorted(stored_names)}"
                )
        self.length_key = length_key
        self.extra_rows: dict[str, int] = {}

    def check_identity(self, identity: Any, held: Container[int]) -> int:
        """Returns ``identity`` as an int after checking it is a new int64.

        Raises:
            SchemaError: If it is not an integer or does not fit in int64.
            DuplicateEpisodeError: If it is in ``held``.
        """
        if isinstance(identity, bool) or not isinstance(identity, int | np.integer):
            raise SchemaError(f"an episode identity must be an integer; got {identity!r}")
        identity = int(identity)
        if not -(2**63) <= identity < 2**63:
            raise SchemaError(f"episode identity {identity} does not fit in int64")
        if identity in held:
            raise DuplicateEpisodeError(
                f"episode {identity} is already in the table; identities must be unique among "
                "held episodes"
            )
        return identity

    def validate(
        self, identity: int, sequence: Mapping[str, Any], maxlen: int, end_state: EpisodeState
    ) -> tuple[dict[str, Any], int]:
        """Checks an episode against the schema without changing anything but learned extents.

        Returns:
            The column arrays converted to the columns' dtypes, and the transition count.

        Raises:
            SchemaError: Naming the column and what is wrong with it.
        """
        if end_state not in (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED):
            raise SchemaError(
                f"episode {identity} ends {EpisodeState(end_state).name}; an added episode must "
                "end TERMINAL or INTERRUPTED"
            )
        expected = {c.name for c in self.stored} | {c.name for c in self.tags}
        missing = sorted(expected - set(sequence))
        unknown = sorted(set(sequence) - expected)
        if missing or unknown:
            raise SchemaError(
                f"episode {identity} does not match the table's columns: "
                + (f"missing {missing}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown {unknown}" if unknown else "")
                + f"; stored columns are {sorted(expected)}"
            )
        length = len(np.asarray(sequence[self.length_key]))
        if length < 1:
            raise SchemaError(
                f"episode {identity} has no transitions ('{self.length_key}' is empty)"
            )
        if length > maxlen:
            raise SchemaError(
                f"episode {identity} has {length} transitions, more than the table's maxlen "
                f"{maxlen}; raise maxlen or split the episode"
            )
        values: dict[str, Any] = {}
        extra_rows: dict[str, int] = {}
        for column in self.stored:
            array = _conform(identity, column, sequence[column.name], per_step=True)
            extra = len(array) - length
            known = self.extra_rows.get(column.name)
            if extra not in (0, 1) or (known is not None and extra != known):
                allowed = [length + known] if known is not None else [length, length + 1]
                raise SchemaError(
                    f"column '{column.name}' of episode {identity} has {len(array)} rows; with "
                    f"{length} transitions it must have {' or '.join(map(str, allowed))}"
                )
            extra_rows[column.name] = extra
            values[column.name] = array
        for column in self.virtual:
            needed = column.mapper.target_extra_rows
            if column.mapper.needs_target and extra_rows[column.target_name] < needed:
                raise SchemaError(
                    f"virtual column '{column.name}' reads the row after each transition of "
                    f"'{column.target_name}', so that column needs {length + needed} rows for "
                    f"{length} transitions; episode {identity} gives {length}"
                )
        for column in self.tags:
            values[column.name] = _conform(identity, column, sequence[column.name], False)
        self.extra_rows.update(extra_rows)
        return values, length


def _conform(identity: int, column: Column | TagColumn, value: Any, per_step: bool) -> Any:
    """``value`` as an array of the column's shape and dtype, or a SchemaError saying why not."""
    tensor = hasattr(value, "detach") and hasattr(value, "cpu")  # a torch tensor, without torch
    array = value.detach().cpu().numpy() if tensor else np.asarray(value)
    expected = column.shape
    got = array.shape[1:] if per_step else array.shape
    if got != expected:
        if per_step and array.ndim == 1 and expected == (1,):
            array = array.reshape(-1, 1)  # rewards given flat for a (1,) column
        elif not per_step and array.size == int(np.prod(expected)):
            array = array.reshape(expected)
        elif not per_step and array.shape[1:] == expected and len(array) > 0:
            array = _one_tag_value(identity, column, array)
        else:
            what = "per-step shape" if per_step else "shape"
            raise SchemaError(
                f"column '{column.name}' of episode {identity} has {what} {got}; the column's "
                f"shape is {expected}"
            )
    if np.can_cast(array.dtype, column.dtype, casting="same_kind"):
        return array.astype(column.dtype, copy=False)
    return _exact_cast(identity, column, array)


def _one_tag_value(identity: int, column: TagColumn, array: np.ndarray) -> np.ndarray:
    """The one value of a tag given once per step (as upstream's tags were), when all agree."""
    differ = np.flatnonzero(np.any((array != array[0]).reshape(len(array), -1), axis=1))
    if len(differ):
        raise SchemaError(
            f"tag column '{column.name}' of episode {identity} got per-step values that differ "
            f"(step 0: {array[0].tolist()!r}, step {differ[0]}: "
            f"{array[differ[0]].tolist()!r}); a tag holds one value per episode: give one, or "
            "store per-step values in a Column"
        )
    return array[0]


def _exact_cast(identity: int, column: Column | TagColumn, array: np.ndarray) -> np.ndarray:
    """``array`` in the column's dtype of another kind (floats into an int column), when every
    value converts exactly, as upstream cast them; a SchemaError when one would change."""
    try:
        with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's ComplexWarning: the check below decides
            converted = array.astype(column.dtype)
            changed = converted.astype(array.dtype) != array
    except (TypeError, ValueError):
        changed = None
    if changed is None or np.any(changed):
        where = "" if changed is None else f" (first: {array[changed].flat[0].item()!r})"
        raise SchemaError(
            f"column '{column.name}' of episode {identity} has {array.dtype} values that change "
            f"when stored as the column's {column.dtype}{where}; give values that {column.dtype} "
            "holds exactly, or declare the column with their dtype"
        )
    return converted


__all__ = ["TableSchema"]
