"""Ready-made memory tables for dict observations, built from an MDP space.

Both tables store one column per observation key plus ``actions`` and ``rewards``, derive next
observations, ``dones`` and ``masks`` at sampling time (they cost no memory), and return batches
in DESIGN.md's layout::

    {"observation": {key: T}, "next_observation": {key: T},
     "actions": T, "rewards": T, "dones": T, "masks": T}

with ``count * sequence_length`` rows per entry, except ``next_observation`` in
:class:`DictObsNStepMemoryTable`, which has one row per window. Episodes are added with
:meth:`~emote_core.memory.table.ArrayMemoryTable.add_sequence`: ``N + 1`` rows per observation key,
``N`` actions and ``N`` rewards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from emote_core.errors import ConfigurationError
from emote_core.memory.adaptors import (
    NEXT_OBSERVATION_KEY,
    OBSERVATION_KEY,
    Adaptor,
    DictObsAdaptor,
    TerminalAdaptor,
)
from emote_core.memory.columns import AnyColumn, Column, VirtualColumn
from emote_core.memory.frame_stacks import (
    FRAME_PREFIX,
    frame_stack_columns,
    frame_stacks,
    unstack_frames,
)
from emote_core.memory.mappers import (
    Mapper,
    NextElementMapper,
    OnlyLastMapper,
    SyntheticDones,
    SyntheticMasks,
)
from emote_core.memory.strategies import (
    EjectionStrategy,
    FifoEjectionStrategy,
    SampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import IMPORTANCE_WEIGHTS_KEY, ArrayMemoryTable
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace

NEXT_PREFIX = "next_"
"""Prefix of the virtual next-observation columns (``next_<key>``) before they are nested."""

TERMINAL_KEY = "terminal"
"""The per-observation terminal flag column of tables built with ``use_terminal=True``."""

ACTIONS_KEY = "actions"
REWARDS_KEY = "rewards"
DONES_KEY = "dones"
MASKS_KEY = "masks"

_FLAG_SHAPE = (1,)


def _check_spaces(spaces: Any, use_terminal: bool) -> list[str]:
    """Validates ``spaces`` for a dict-observation table and returns the observation keys."""
    if not isinstance(spaces, MDPSpace):
        raise ConfigurationError(
            f"dict-observation tables are built from an emote_core.spaces.MDPSpace; got "
            f"{type(spaces).__name__} — convert gymnasium spaces with MDPSpace.from_gymnasium"
        )
    if not isinstance(spaces.state, DictSpace) or not spaces.state.spaces:
        raise ConfigurationError(
            "a dict-observation table needs spaces.state to be a DictSpace with at least one key; "
            f"got {spaces.state!r}"
        )
    keys = spaces.state.keys()
    reserved = {
        ACTIONS_KEY, REWARDS_KEY, DONES_KEY, MASKS_KEY, OBSERVATION_KEY, NEXT_OBSERVATION_KEY,
        IMPORTANCE_WEIGHTS_KEY,
    }  # fmt: skip
    if use_terminal:
        reserved |= {TERMINAL_KEY, NEXT_PREFIX + TERMINAL_KEY}
    for key in keys:
        space = spaces.state[key]
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"observation keys must be non-empty strings; got {key!r}")
        if key in reserved:
            raise ConfigurationError(
                f"observation key '{key}' clashes with the table's own columns (reserved: "
                f"{sorted(reserved)}); rename the observation entry"
            )
        for prefix, what in ((NEXT_PREFIX, "next-observation"), (FRAME_PREFIX, "frame")):
            base = key[len(prefix) :]
            if key.startswith(prefix) and base in keys:
                if prefix == FRAME_PREFIX and spaces.state[base].frames == 1:
                    continue  # only stacked entries have a frame column
                raise ConfigurationError(
                    f"observation key '{key}' clashes with the {what} column of '{base}'; "
                    "rename one of the two observation entries"
                )
        if not isinstance(space, BoxSpace):
            raise ConfigurationError(
                f"observation '{key}' has space {space!r}; each observation entry must be a "
                "BoxSpace (nested dicts are not supported — flatten the observation)"
            )
        _check_dtype(f"observation '{key}'", space.dtype)
    actions = spaces.actions
    if not isinstance(actions, BoxSpace):
        raise ConfigurationError(
            f"spaces.actions must be a BoxSpace or DiscreteSpace; got {actions!r}"
        )
    _check_dtype("the action space", actions.dtype)
    rewards = spaces.rewards
    if rewards is not None:
        if not isinstance(rewards, BoxSpace) or int(np.prod(rewards.shape)) != 1:
            raise ConfigurationError(
                f"dict-observation tables store one reward per transition (shape (1,)); the "
                f"reward space is {rewards!r} — sum or select the reward terms before storing"
            )
        if rewards.dtype.kind not in "fiub":
            raise ConfigurationError(
                f"rewards must be numeric; the reward space has dtype {rewards.dtype}"
            )
    return keys


def _check_dtype(what: str, dtype: np.dtype[Any]) -> None:
    if np.dtype(dtype).kind not in "fiub":
        raise ConfigurationError(
            f"{what} has dtype {dtype}; memory tables store bool, integer and float arrays only"
        )


def _action_column(actions: BoxSpace) -> Column:
    if isinstance(actions, DiscreteSpace):
        # Discrete choices index Q-values with torch.gather, which wants int64.
        return Column(ACTIONS_KEY, actions.shape, np.int64)
    return Column(ACTIONS_KEY, actions.shape, actions.dtype)


def _flag_dtype(name: str, dtype: Any) -> np.dtype[Any]:
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved.kind not in "fiub":
        raise ConfigurationError(
            f"{name} must be a numpy bool, integer or float dtype; got {dtype!r} — for example "
            f"{name}=np.float32 (the default) or {name}=bool"
        )
    return resolved


def _build_columns(
    spaces: MDPSpace,
    keys: list[str],
    next_mapper: type[Mapper],
    flag_dtypes: tuple[np.dtype[Any], np.dtype[Any]],
) -> list[AnyColumn]:
    columns: list[AnyColumn] = []
    for key in keys:
        space = spaces.state[key]
        if space.frames > 1:
            columns += frame_stack_columns(
                key, space, next_name=NEXT_PREFIX + key, per_window=next_mapper.per_window
            )
            continue
        columns.append(Column(key, space.shape, space.dtype))
        columns.append(
            VirtualColumn(NEXT_PREFIX + key, space.shape, space.dtype, key, next_mapper())
        )
    columns += [
        _action_column(spaces.actions),
        Column(REWARDS_KEY, _FLAG_SHAPE, np.float32),
        VirtualColumn(DONES_KEY, _FLAG_SHAPE, flag_dtypes[0], REWARDS_KEY, SyntheticDones()),
        VirtualColumn(MASKS_KEY, _FLAG_SHAPE, flag_dtypes[1], REWARDS_KEY, SyntheticMasks()),
    ]
    return columns


def _terminal_columns() -> list[AnyColumn]:
    # The flag of the observation a transition leads to decides its mask, so it is read one row
    # ahead like a next observation — per step, also in n-step tables.
    return [
        Column(TERMINAL_KEY, _FLAG_SHAPE, np.float32),
        VirtualColumn(
            NEXT_PREFIX + TERMINAL_KEY, _FLAG_SHAPE, np.float32, TERMINAL_KEY, NextElementMapper()
        ),
    ]


def _build_adaptors(
    keys: list[str], use_terminal: bool, adaptors: Sequence[Adaptor], preprocessor: Adaptor | None
) -> list[Adaptor]:
    for adaptor in (*adaptors, preprocessor):
        if adaptor is not None and not callable(adaptor):
            raise ConfigurationError(
                f"adaptors and preprocessors must be callables (batch, count, sequence_length) "
                f"-> batch; got {adaptor!r}"
            )
    chain: list[Adaptor] = []
    if use_terminal:
        chain.append(
            TerminalAdaptor(
                value_key=NEXT_PREFIX + TERMINAL_KEY, target_key=MASKS_KEY, dones_key=DONES_KEY,
                drop_keys=(TERMINAL_KEY,),
            )
        )  # fmt: skip
    chain += list(adaptors)
    chain.append(DictObsAdaptor(keys, next_prefix=NEXT_PREFIX))
    if preprocessor is not None:
        chain.append(preprocessor)
    return chain


class DictMemoryTable(ArrayMemoryTable):
    """A table of given columns whose observation entries are sampled as dicts.

    upstream emote's ``DictTable``: the base of the dict-observation tables, for columns of your
    own. Sampled batches pass through the terminal adaptor, ``adaptors``, a
    :class:`~emote_core.memory.adaptors.DictObsAdaptor` that gathers ``obs_keys`` into
    ``observation`` / ``next_observation``, and ``preprocessor``, in that order.

    Args:
        columns: The stored and virtual columns (the list is not changed).
        obs_keys: The column names that are observation entries.
        maxlen: The most transitions held; whole episodes are ejected beyond it.
        use_terminal: Add a per-observation ``terminal`` flag column that decides masks
            (upstream's ``use_terminal_column``).
        length_key: The column whose length is an episode's transition count.
        sampler: Which windows to sample; a new :class:`UniformSampleStrategy` by default.
        ejector: Which episodes to eject; a new :class:`FifoEjectionStrategy` by default.
        device: Where the data lives and batches are returned.
        seed: Seed of the table's sampling generator.
        adaptors: Extra adaptors, run before observations are nested.
        preprocessor: An adaptor run last on the nested batch.

    Raises:
        ConfigurationError: If ``obs_keys`` is empty or names no column, or an adaptor is not
            callable.
    """

    def __init__(
        self,
        *,
        columns: Sequence[AnyColumn],
        obs_keys: Sequence[str],
        maxlen: int,
        use_terminal: bool = False,
        length_key: str = ACTIONS_KEY,
        sampler: SampleStrategy | None = None,
        ejector: EjectionStrategy | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        adaptors: Sequence[Adaptor] = (),
        preprocessor: Adaptor | None = None,
    ) -> None:
        keys = list(obs_keys)
        names = {column.name for column in columns}
        missing = [key for key in keys if key not in names]
        if not keys or missing:
            raise ConfigurationError(
                f"DictMemoryTable needs obs_keys naming its columns; got {keys} where the columns "
                f"are {sorted(names)}"
            )
        self.observation_keys = keys
        self.use_terminal = use_terminal
        super().__init__(
            columns=[*columns, *(_terminal_columns() if use_terminal else [])],
            maxlen=maxlen,
            sampler=sampler if sampler is not None else UniformSampleStrategy(),
            ejector=ejector if ejector is not None else FifoEjectionStrategy(),
            length_key=length_key,
            adaptors=_build_adaptors(keys, use_terminal, adaptors, preprocessor),
            device=device,
            seed=seed,
        )


class DictObsMemoryTable(DictMemoryTable):
    """A table for one-step TD learning on dict observations.

    Columns: one per observation key, ``actions`` (int64 ``(1,)`` for a
    :class:`~emote_core.spaces.DiscreteSpace`), ``rewards``, and, derived when sampling,
    ``next_<key>``, ``dones`` (1 at an episode's last transition) and ``masks`` (0 only there,
    for TERMINAL episodes). Sampled batches pass through the terminal adaptor, ``adaptors``, the
    :class:`~emote_core.memory.adaptors.DictObsAdaptor` that nests observations, and
    ``preprocessor``, in that order.

    Args:
        spaces: The MDP's spaces; ``spaces.state`` names the observation keys.
        maxlen: The most transitions held; whole episodes are ejected beyond it.
        use_terminal: Store a per-observation ``terminal`` flag that decides masks (see
            :class:`~emote_core.memory.adaptors.TerminalAdaptor`).
        sampler: Which windows to sample; a new :class:`UniformSampleStrategy` by default.
        ejector: Which episodes to eject; a new :class:`FifoEjectionStrategy` by default.
        device: Where the data lives and batches are returned.
        seed: Seed of the table's sampling generator.
        adaptors: Extra adaptors, run before observations are nested (reward scaling, casts).
        preprocessor: An adaptor run last on the nested batch, such as a
            :class:`~emote_core.memory.adaptors.SamplePreprocessor` augmentation.
        dones_dtype: The dtype of sampled ``dones``; float32 by default, where upstream's was
            ``bool`` (pass ``dones_dtype=bool`` for upstream's batches).
        masks_dtype: The dtype of sampled ``masks`` (float32, as upstream's default).

    Raises:
        ConfigurationError: If the spaces cannot be stored (see the message), or an adaptor is
            not callable.
    """

    next_mapper: type[Mapper] = NextElementMapper

    def __init__(
        self,
        *,
        spaces: MDPSpace,
        maxlen: int,
        use_terminal: bool = False,
        sampler: SampleStrategy | None = None,
        ejector: EjectionStrategy | None = None,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        adaptors: Sequence[Adaptor] = (),
        preprocessor: Adaptor | None = None,
        dones_dtype: Any = np.float32,
        masks_dtype: Any = np.float32,
    ) -> None:
        keys = _check_spaces(spaces, use_terminal)
        flag_dtypes = (
            _flag_dtype("dones_dtype", dones_dtype),
            _flag_dtype("masks_dtype", masks_dtype),
        )
        self.spaces = spaces
        self.frame_stacks = frame_stacks(spaces)
        """Frames per frame-stacked observation entry (stored once each, stacked when
        sampled)."""
        super().__init__(
            columns=_build_columns(spaces, keys, self.next_mapper, flag_dtypes),
            obs_keys=keys,
            maxlen=maxlen,
            use_terminal=use_terminal,
            length_key=REWARDS_KEY,
            sampler=sampler,
            ejector=ejector,
            device=device,
            seed=seed,
            adaptors=adaptors,
            preprocessor=preprocessor,
        )

    def stored_sequence(self, sequence: Mapping[str, Any]) -> Mapping[str, Any]:
        """The episode as the table stores it: frame-stacked observation entries, given as
        agents see them, become their single frames (see
        :func:`~emote_core.memory.frame_stacks.unstack_frames`)."""
        if not self.frame_stacks:
            return sequence
        return unstack_frames(sequence, self.frame_stacks, self.spaces)

    @property
    def stores_as_given(self) -> bool:
        return not self.frame_stacks


class DictObsNStepMemoryTable(DictObsMemoryTable):
    """A table for n-step TD learning on dict observations: one bootstrap observation per window.

    Like :class:`DictObsMemoryTable`, except that ``next_observation`` holds, per sampled window
    of ``L`` transitions, only the observation right after the window's last transition (``count``
    rows), the one an n-step target bootstraps from. ``dones`` and ``masks`` stay per step.

    Args:
        spaces: The MDP's spaces; ``spaces.state`` names the observation keys.
        maxlen: The most transitions held; whole episodes are ejected beyond it.
        use_terminal: Store a per-observation ``terminal`` flag that decides masks.
        sampler: Which windows to sample; a new :class:`UniformSampleStrategy` by default.
        ejector: Which episodes to eject; a new :class:`FifoEjectionStrategy` by default.
        device: Where the data lives and batches are returned.
        seed: Seed of the table's sampling generator.
        adaptors: Extra adaptors, run before observations are nested.
        preprocessor: An adaptor run last on the nested batch.
        dones_dtype: The dtype of sampled ``dones`` (float32; upstream's n-step table: bool).
        masks_dtype: The dtype of sampled ``masks`` (float32).

    Raises:
        ConfigurationError: If the spaces cannot be stored, or an adaptor is not callable.
    """

    next_mapper: type[Mapper] = OnlyLastMapper


__all__ = [
    "ACTIONS_KEY",
    "DONES_KEY",
    "MASKS_KEY",
    "NEXT_PREFIX",
    "REWARDS_KEY",
    "TERMINAL_KEY",
    "DictMemoryTable",
    "DictObsMemoryTable",
    "DictObsNStepMemoryTable",
]
