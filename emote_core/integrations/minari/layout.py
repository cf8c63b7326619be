"""How Minari datasets map onto emote columns and spaces (used by :mod:`.datasets`).

Minari's observations, actions and rewards become emote columns: a ``Box`` observation ``obs``,
a flat ``Dict`` observation one column per key, ``actions`` (``Discrete`` as int64 ``(1,)``) and
``rewards`` (float32 ``(1,)``). Datasets emote writes carry a record (:class:`MinariRecordVersion`)
of the table's own column names, dtypes and spaces, so they read back exactly.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError, FormatError
from emote_core.spaces import BoxSpace, DiscreteSpace, MDPSpace
from emote_core.stores.stored import COLUMN_KINDS, ColumnSchema, EpisodeRecord, StoredTable
from emote_core.typing import EpisodeState

RECORD_KEY = "emote_table"
"""The ``metadata.json`` key of emote's record in the datasets it writes."""
OBSERVATION_KEY, ACTIONS_KEY, REWARDS_KEY = "obs", "actions", "rewards"
"""The column names of datasets emote did not write."""
METADATA = "metadata.json"


class MinariRecordVersion(IntEnum):
    """The layout of the record emote keeps in the Minari datasets it writes."""

    V1 = 1
    """``metadata.json`` key ``emote_table`` = ``{version, columns: [[name, kind, {shape, dtype,
    target_name, mapper}]], observation_keys, actions_key, rewards_key, length_key, maxlen,
    spaces, metadata}``; each episode's metadata holds its ``emote_id``."""

    LATEST = V1


@dataclass
class MinariLayout:
    """Which emote columns a Minari dataset's observations, actions and rewards are."""

    observation_keys: list[str]
    columns: list[ColumnSchema]
    dict_observation: bool = False
    discrete_actions: bool = False
    actions_key: str = ACTIONS_KEY
    rewards_key: str = REWARDS_KEY
    length_key: str | None = REWARDS_KEY
    maxlen: int | None = None
    spaces: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def schema(self, name: str) -> ColumnSchema:
        return next(column for column in self.columns if column.name == name)

    def read_episode(self, episode: Any, source: str) -> tuple[dict[str, np.ndarray], EpisodeState]:
        """One Minari episode as emote columns, checked against emote's episode layout."""
        steps = len(episode.rewards)
        where = f"{source}, episode {episode.id}"
        if steps == 0:
            raise FormatError(f"{where} has no steps; emote episodes hold at least one transition")
        observations = episode.observations
        if self.dict_observation:
            raw = {key: observations[key] for key in self.observation_keys}
        else:
            raw = {self.observation_keys[0]: observations}
        raw[self.actions_key], raw[self.rewards_key] = episode.actions, episode.rewards
        data = {}
        for name, value in raw.items():
            column, array = self.schema(name), np.asarray(value)
            rows = steps + 1 if name in self.observation_keys else steps
            if array.ndim == 0 or len(array) != rows or array.size != rows * _size(column):
                raise FormatError(
                    f"{where}: '{name}' holds an array of shape {array.shape}; expected {rows} "
                    f"rows of {column.describe()} (N + 1 observations, N actions and rewards)"
                )
            data[name] = array.reshape(rows, *column.shape).astype(column.dtype, copy=False)
        terminations = np.asarray(episode.terminations, dtype=bool).reshape(-1)
        truncations = np.asarray(episode.truncations, dtype=bool).reshape(-1)
        if len(terminations) != steps or len(truncations) != steps:
            raise FormatError(
                f"{where} has {len(terminations)} terminations and {len(truncations)} "
                f"truncations for {steps} steps; they must match"
            )
        # The last step decides; an episode cut without any flag is an interrupted tail.
        terminal = bool(terminations[-1])
        return data, EpisodeState.TERMINAL if terminal else EpisodeState.INTERRUPTED

    def buffer(self, episode: EpisodeRecord, source: str) -> dict[str, Any]:
        """The fields of Minari's ``EpisodeBuffer`` for one emote episode."""
        identity, data, end_state = episode
        where = f"{source}, episode {identity}"

        def rows(name: str, count: int | None) -> np.ndarray:
            column, array = self.schema(name), np.asarray(data.get(name))
            expected = (len(array) if count is None and array.ndim else count, *column.shape)
            if name not in data or array.shape != expected:
                held = "nothing" if name not in data else f"shape {array.shape}"
                raise FormatError(f"{where}: column '{name}' holds {held}; expected {expected}")
            return array.astype(column.dtype, copy=False)

        actions = rows(self.actions_key, None)
        steps = len(actions)
        if steps == 0:
            raise FormatError(f"{where} has no transitions; Minari episodes need at least one")
        if end_state not in (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED):
            raise FormatError(
                f"{where} ends {EpisodeState(end_state).name}; only TERMINAL or INTERRUPTED "
                "episodes can be written"
            )
        observations = {key: rows(key, steps + 1) for key in self.observation_keys}
        terminations, truncations = np.zeros(steps, bool), np.zeros(steps, bool)
        (terminations if end_state == EpisodeState.TERMINAL else truncations)[-1] = True
        return {
            "observations": (
                observations if self.dict_observation else observations[self.observation_keys[0]]
            ),
            "actions": actions.reshape(steps) if self.discrete_actions else actions,
            "rewards": rows(self.rewards_key, steps).reshape(steps),
            "terminations": terminations,
            "truncations": truncations,
        }

    def record(self, source: str) -> dict[str, Any]:
        """This layout as the JSON record emote keeps in the datasets it writes."""
        record = {
            "version": int(MinariRecordVersion.LATEST),
            "columns": [_column_to_json(column) for column in self.columns],
            "observation_keys": self.observation_keys,
            "actions_key": self.actions_key,
            "rewards_key": self.rewards_key,
            "length_key": self.length_key,
            "maxlen": self.maxlen,
            "spaces": self.spaces,
            "metadata": self.metadata,
        }
        try:  # Minari writes metadata.json with plain json: make numpy values plain first.
            return json.loads(json.dumps(record, default=_plain))
        except (TypeError, ValueError) as error:
            raise FormatError(
                f"{source} has metadata or spaces that are not JSON ({error})"
            ) from error

    @classmethod
    def from_record(cls, raw: Any, dataset: Any, source: str) -> MinariLayout:
        """The layout emote recorded, checked against the dataset's spaces."""
        from gymnasium import spaces as gym_spaces

        version = raw.get("version") if isinstance(raw, dict) else None
        if isinstance(version, int) and version > MinariRecordVersion.LATEST:
            raise FormatError(
                f"{source} was written by a newer emote (record version {version}; this emote "
                f"reads up to {int(MinariRecordVersion.LATEST)}) — upgrade emote"
            )
        try:
            columns = [_column_from_json(entry) for entry in raw["columns"]]
            layout = cls(
                [str(key) for key in raw["observation_keys"]],
                columns,
                dict_observation=isinstance(dataset.observation_space, gym_spaces.Dict),
                discrete_actions=isinstance(dataset.action_space, gym_spaces.Discrete),
                actions_key=str(raw["actions_key"]),
                rewards_key=str(raw["rewards_key"]),
                length_key=raw.get("length_key"),
                maxlen=raw.get("maxlen"),
                spaces=raw.get("spaces"),
                metadata=dict(raw.get("metadata") or {}),
            )
            mapped = [*layout.observation_keys, layout.actions_key, layout.rewards_key]
            if any(layout.schema(name).kind != "Column" for name in mapped):
                raise ValueError("observations, actions and rewards must be per-step columns")
            minari_keys = (
                sorted(dataset.observation_space.spaces) if layout.dict_observation else [None]
            )
            if len(minari_keys) != len(layout.observation_keys) or (
                layout.dict_observation and minari_keys != sorted(layout.observation_keys)
            ):
                raise ValueError(f"observation keys {layout.observation_keys} are not the data's")
        except (AttributeError, KeyError, TypeError, ValueError, StopIteration) as error:
            raise FormatError(
                f"{source} has a damaged '{RECORD_KEY}' record ({error!r}); delete that key "
                f"from data/{METADATA} to read the dataset as plain Minari"
            ) from error
        return layout


def _size(column: ColumnSchema) -> int:
    return int(np.prod(column.shape, dtype=np.int64))


def _column_to_json(column: ColumnSchema) -> list[Any]:
    config: dict[str, Any] = {"shape": list(column.shape), "dtype": column.dtype.str}
    if column.kind == "VirtualColumn":
        config.update(target_name=column.target_name, mapper=column.mapper)
    return [column.name, column.kind, config]


def _column_from_json(entry: Any) -> ColumnSchema:
    name, kind, config = entry
    if not isinstance(name, str) or kind not in COLUMN_KINDS or not isinstance(config, dict):
        raise ValueError(f"column entry {str(entry)[:80]} is not [name, kind, {{shape, dtype}}]")
    dtype = np.dtype(config["dtype"])
    if dtype.hasobject:
        raise ValueError(f"column '{name}' has an object dtype")
    mapper = config.get("mapper")
    return ColumnSchema(
        name,
        kind,
        tuple(int(s) for s in config["shape"]),
        dtype,
        config.get("target_name"),
        mapper if isinstance(mapper, dict) else None,
    )


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def foreign_layout(observation_space: Any, action_space: Any, source: str) -> MinariLayout:
    """Columns and spaces of a dataset emote did not write."""
    from gymnasium import spaces as gym_spaces

    rule = (
        "emote reads Box observations or Dict observations of Box entries (no nesting) — "
        "flatten the observation when collecting (gymnasium.wrappers.FlattenObservation)"
    )
    entries = observation_space.spaces if isinstance(observation_space, gym_spaces.Dict) else {}
    for key, entry in entries.items():
        if not isinstance(entry, gym_spaces.Box):
            raise FormatError(f"{source} has a {type(entry).__name__} observation '{key}'; {rule}")
        if key in (ACTIONS_KEY, REWARDS_KEY):
            raise FormatError(
                f"{source} has an observation named '{key}', which clashes with emote's "
                f"'{key}' column; rename the observation entry"
            )
    if not entries and not isinstance(observation_space, gym_spaces.Box):
        raise FormatError(f"{source} has {type(observation_space).__name__} observations; {rule}")
    if not isinstance(action_space, gym_spaces.Box | gym_spaces.Discrete):
        raise FormatError(
            f"{source} has {type(action_space).__name__} actions; emote reads Box or Discrete "
            "actions"
        )
    try:
        spaces = MDPSpace.from_gymnasium(observation_space, action_space)
    except ConfigurationError as error:
        raise FormatError(f"{source}: {error}") from error
    keys = list(entries) if entries else [OBSERVATION_KEY]
    columns = [
        ColumnSchema(k, "Column", spaces.state[k].shape, spaces.state[k].dtype) for k in keys
    ]
    discrete = isinstance(spaces.actions, DiscreteSpace)
    columns += [
        ColumnSchema(
            ACTIONS_KEY,
            "Column",
            spaces.actions.shape,
            np.dtype(np.int64) if discrete else spaces.actions.dtype,
        ),
        ColumnSchema(REWARDS_KEY, "Column", (1,), np.dtype(np.float32)),
    ]
    return MinariLayout(
        keys,
        columns,
        dict_observation=bool(entries),
        discrete_actions=discrete,
        spaces=spaces.to_json(),
    )


def plan_write(
    stored: StoredTable, actions_key: str, rewards_key: str, drop_columns: Collection[str]
) -> tuple[MinariLayout, Any, Any]:
    """The layout to write ``stored`` in, and Minari's observation and action spaces."""
    from gymnasium import spaces as gym_spaces

    source = stored.source
    columns = {column.name: column for column in stored.columns}
    dropped = set(drop_columns)
    if dropped - columns.keys():
        raise ConfigurationError(
            f"drop_columns names {sorted(dropped - columns.keys())}, which {source} does not "
            f"have; its columns are {sorted(columns)}"
        )
    for key, what in ((actions_key, "actions"), (rewards_key, "rewards")):
        if key in dropped or key not in columns or columns[key].kind != "Column":
            raise FormatError(
                f"{source} has no per-step column '{key}' for the {what} (its columns: "
                f"{sorted(columns)}); name it with {what}_key="
            )
    if _size(columns[rewards_key]) != 1:
        raise FormatError(
            f"{source}: rewards column '{rewards_key}' is a {columns[rewards_key].describe()}; "
            "Minari stores one reward per step — sum or select the reward terms first"
        )
    try:
        spaces = MDPSpace.from_json(stored.spaces) if stored.spaces is not None else None
    except ConfigurationError as error:
        raise FormatError(f"{source} has spaces emote cannot read: {error}") from error
    mapped = {actions_key, rewards_key}
    if spaces is not None:
        keys = spaces.state.keys()
        missing = [
            k for k in keys if k in dropped or k not in columns or columns[k].kind != "Column"
        ]
        if missing:
            raise FormatError(f"{source}: observations {missing} of its spaces are not columns")
    else:  # observations are the per-step columns with one row more than the actions
        first = stored.episodes[0][1] if stored.episodes else {}
        steps = len(first.get(actions_key, ()))
        keys = [
            c.name
            for c in stored.columns
            if c.kind == "Column"
            and c.name not in mapped | dropped
            and (not first or len(first.get(c.name, ())) == steps + 1)
        ]
    if not keys:
        raise FormatError(
            f"{source} has no observation column besides '{actions_key}' and "
            f"'{rewards_key}'; Minari datasets need observations"
        )
    extra = [
        c.name
        for c in stored.columns
        if c.kind != "VirtualColumn" and c.name not in {*keys, *mapped, *dropped}
    ]
    if extra:
        raise FormatError(
            f"{source} has columns {extra} that a Minari dataset has no place for (it holds "
            f"observations, actions and rewards per step); pass drop_columns={extra!r} to leave "
            "them out"
        )
    boxes = {k: gym_box(spaces.state[k] if spaces else None, columns[k], source) for k in keys}
    discrete = spaces is not None and isinstance(spaces.actions, DiscreteSpace)
    actions = columns[actions_key]
    if discrete and (actions.dtype.kind not in "iu" or _size(actions) != 1):
        raise FormatError(
            f"{source}: discrete actions need one integer per step; column "
            f"'{actions_key}' is a {actions.describe()}"
        )
    action_space = (
        gym_spaces.Discrete(spaces.actions.n)  # type: ignore[union-attr, attr-defined]
        if discrete
        else gym_box(spaces.actions if spaces else None, actions, source)
    )
    layout = MinariLayout(
        list(keys),
        [c for c in stored.columns if c.name not in dropped],
        dict_observation=len(keys) > 1,
        discrete_actions=discrete,
        actions_key=actions_key,
        rewards_key=rewards_key,
        length_key=stored.length_key,
        maxlen=stored.maxlen,
        spaces=stored.spaces,
        metadata=stored.metadata,
    )
    observation_space = next(iter(boxes.values())) if len(boxes) == 1 else gym_spaces.Dict(boxes)
    return layout, observation_space, action_space


def gym_box(space: BoxSpace | None, column: ColumnSchema, source: str) -> Any:
    """A gymnasium Box for ``column``: its dtype and shape, the space's finite bounds."""
    from gymnasium import spaces as gym_spaces

    dtype, shape = column.dtype, column.shape
    if space is not None and tuple(space.shape) != shape:
        raise FormatError(
            f"{source}: column '{column.name}' has shape {shape}, its space "
            f"{tuple(space.shape)}; they must agree"
        )
    if dtype.kind not in "fiub":
        raise FormatError(
            f"{source}: column '{column.name}' has dtype {dtype}; Minari datasets hold bool, "
            "integer and float arrays"
        )
    if dtype.kind == "f":
        lowest, highest = -np.inf, np.inf
    elif dtype.kind == "b":
        lowest, highest = 0, 1
    else:
        lowest, highest = np.iinfo(dtype).min, np.iinfo(dtype).max
    low, high = np.full(shape, lowest, dtype=dtype), np.full(shape, highest, dtype=dtype)
    for bound, given in (
        (low, space.low if space else None),
        (high, space.high if space else None),
    ):
        if given is not None:
            finite = np.isfinite(given)
            bound[finite] = given[finite]
    return gym_spaces.Box(low=low, high=high, shape=shape, dtype=dtype)


__all__ = [
    "ACTIONS_KEY",
    "OBSERVATION_KEY",
    "RECORD_KEY",
    "REWARDS_KEY",
    "MinariLayout",
    "MinariRecordVersion",
    "foreign_layout",
    "plan_write",
]
