"""SkrlMemory: skrl's memory interface over an emote episode table.

:class:`SkrlMemory` answers the calls skrl's agents make of a ``skrl.memories.torch.Memory``
(named tensors, one row per env per step, sampling by flat ring index), but keeps the rows as
whole episodes in an :class:`~emote_core.memory.table.ArrayMemoryTable`: each env's rows are
staged until its episode ends, then added with their end state. Unlike skrl's ``RandomMemory``,
the table ejects whole episodes (it holds up to twice the ring), an episode reaching
``memory_size`` rows is cut (INTERRUPTED), ``get_tensor_by_name`` returns a copy, and sampling
uses its own seeded generator.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from emote_core.errors import ConfigurationError
from emote_core.integrations.skrl.memory_files import EXPORT_FORMATS, load_memory, save_memory
from emote_core.integrations.skrl.memory_reads import SkrlMemoryReads
from emote_core.integrations.skrl.memory_streams import (
    OpenEpisodes,
    TensorSpec,
    occupied_size,
    register_with_skrl,
)
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)

TERMINAL_FLAGS = ("terminated", "dones")
"""Tensors whose true value ends an episode TERMINAL (``dones``: skrl before 1.0)."""

INTERRUPTED_FLAGS = ("truncated",)
"""Tensors whose true value ends an episode INTERRUPTED (a time limit)."""

TABLE_FACTOR = 2
"""The table's ``maxlen`` in ring sizes: room for every episode the ring still points at."""


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as skrl resolves it: one torch cannot use (no CUDA, a bad name or index) is
    logged as a warning and replaced, as is ``None``, by CUDA if available, else the CPU."""
    available = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device is None:
        return available
    try:
        chosen = torch.device(device)
        torch.zeros(1, device=chosen)
    except (RuntimeError, AssertionError, ValueError) as error:
        log.warning("SkrlMemory cannot use device %r (%s); using %s", device, error, available)
        return available
    return chosen


class SkrlMemory(SkrlMemoryReads):
    """A skrl ``RandomMemory`` whose transitions live in an emote episode table.

    Args:
        memory_size: Rows per env in skrl's ring (``(memory_size, num_envs)`` slots).
        num_envs: Parallel envs.
        device: Where tensors live and samples are returned (``None``, or one torch cannot use:
            CUDA if available, else the CPU, with a warning as skrl gives).
        export: Save the memory (``export_format``) each time the ring fills, as skrl does.
        export_format: ``"pt"``, ``"npz"`` or ``"csv"``.
        export_directory: Where exports go (a ``memories/`` folder inside it).
        replacement: Sample with replacement (the batch size is always met) or without (a batch
            is at most the rows held), as ``RandomMemory``.
        seed: Seed of the sampling generator.

    Raises:
        ConfigurationError: A size is not positive or the export format is unknown.
    """

    def __init__(
        self,
        *,
        memory_size: int,
        num_envs: int = 1,
        device: str | torch.device | None = None,
        export: bool = False,
        export_format: str = "pt",
        export_directory: str = "",
        replacement: bool = False,
        seed: int | None = None,
    ) -> None:
        if memory_size < 1 or num_envs < 1:
            raise ConfigurationError(
                f"memory_size and num_envs must be at least 1; got {memory_size} and {num_envs}"
            )
        if export_format not in EXPORT_FORMATS:
            raise ConfigurationError(
                f"export_format must be one of {list(EXPORT_FORMATS)}; got {export_format!r}"
            )
        register_with_skrl(type(self))
        self.memory_size = memory_size
        self.num_envs = num_envs
        self.device = resolve_device(device)
        self.export = export
        self.export_format = export_format
        self.export_directory = export_directory
        self.replacement = replacement
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self.filled = False
        self.memory_index = 0
        self.env_index = 0
        self.sampling_indexes: torch.Tensor | None = None
        self.all_sequence_indexes = np.concatenate(
            [np.arange(i, memory_size * num_envs + i, num_envs) for i in range(num_envs)]
        )
        self.specs: dict[str, TensorSpec] = {}
        self.table: ArrayMemoryTable | None = None
        self.inferred_cuts = 0
        self._open: OpenEpisodes | None = None
        self._slot_ids = np.full((memory_size, num_envs), -1, dtype=np.int64)
        self._slot_offsets = np.zeros((memory_size, num_envs), dtype=np.int64)
        self._holes = 0  # slots below len(self) whose episode the table ejected
        self._loose: dict[str, torch.Tensor] = {}  # set_tensor_by_name values of empty slots
        self._committed: OrderedDict[int, tuple[int, np.ndarray]] = OrderedDict()
        self._next_id = 0

    # skrl's bookkeeping.

    def get_tensor_names(self) -> list[str]:
        """The tensors' names, sorted."""
        return sorted(self.specs)

    def get_sampling_indexes(self) -> torch.Tensor | None:
        """The flat indexes of the last :meth:`sample`."""
        return self.sampling_indexes

    def share_memory(self) -> None:
        """Refused: the episode table cannot be shared between processes.

        Raises:
            ConfigurationError: Always; skrl's ParallelTrainer calls this.
        """
        raise ConfigurationError(
            "SkrlMemory keeps its episodes in one process's emote table and cannot be shared "
            "between processes (skrl's ParallelTrainer); use SequentialTrainer, or skrl's "
            "RandomMemory for parallel training"
        )

    def reset(self) -> None:
        """Empties skrl's ring view (``len() == 0``); episodes already added stay in the table."""
        self.filled = False
        self.memory_index = 0
        self.env_index = 0
        self._slot_ids.fill(-1)
        self._holes = 0

    def clear(self) -> None:
        """Forgets everything added: the ring, the open episodes and the table (rebuilt, with
        any tensors created since, at the next :meth:`add_samples`)."""
        self.reset()
        self.table = None
        self._open = None
        self._loose.clear()
        self._committed.clear()
        self.inferred_cuts = 0

    def create_tensor(
        self,
        name: str,
        *,
        size: Any,
        dtype: torch.dtype | None = None,
        keep_dimensions: bool = False,
    ) -> bool:
        """Declares a tensor of rows ``size`` (an int, a shape or a gymnasium space).

        Returns:
            ``True`` if created; ``False`` for ``size=None`` or an identical existing tensor.

        Raises:
            ValueError: The name exists with another size or dtype (skrl raises this too), or
                ``keep_dimensions`` is given a non-sequence.
            ConfigurationError: Rows were added already (the table's columns are fixed then).
        """
        if size is None:
            return False
        if keep_dimensions:
            if not isinstance(size, list | tuple):
                raise ValueError(
                    f"keep_dimensions=True needs a sequence of ints as size; got {size!r}"
                )
            shape = tuple(int(s) for s in size)
        else:
            shape = (occupied_size(size),)
        dtype = dtype or torch.get_default_dtype()
        existing = self.specs.get(name)
        if existing is not None:
            if existing.shape[-1] != shape[-1]:
                raise ValueError(
                    f"tensor '{name}' exists with size {existing.shape[-1]}; got {shape[-1]}"
                )
            if existing.dtype != dtype:
                raise ValueError(f"tensor '{name}' exists with dtype {existing.dtype}; got {dtype}")
            return False
        if self.table is not None:
            raise ConfigurationError(
                f"tensor '{name}' was created after rows were added; create every tensor "
                "before the first add_samples (skrl agents do so in init())"
            )
        self.specs[name] = TensorSpec(shape, dtype)
        return True

    # Building the table.

    def pairs(self) -> list[str]:
        """Tensors ``X`` stored with a ``next_X`` (observations, states): kept as ``N + 1`` rows."""
        return [n for n in self.specs if f"next_{n}" in self.specs and not n.startswith("next_")]

    def _length_key(self) -> str:
        if "rewards" in self.specs:
            return "rewards"
        paired = set(self.pairs())
        return next(n for n in self.specs if n not in paired and not n.startswith("next_"))

    def _build(self) -> None:
        if not self.specs:
            raise ConfigurationError(
                "SkrlMemory has no tensors; create them (create_tensor, or the agent's init()) "
                "before adding samples"
            )
        pairs = self.pairs()
        nexts = {f"next_{n}" for n in pairs}
        columns: list[Column | VirtualColumn] = []
        for name, spec in self.specs.items():
            dtype = torch.empty(0, dtype=spec.dtype).numpy().dtype
            if name in nexts:
                target = name[len("next_") :]
                mapper = NextElementMapper()
                columns.append(VirtualColumn(name, spec.shape, dtype, target, mapper))
            else:
                columns.append(Column(name, spec.shape, dtype))
        self.table = ArrayMemoryTable(
            columns=columns,
            maxlen=TABLE_FACTOR * self.memory_size * self.num_envs,
            sampler=UniformSampleStrategy(),
            ejector=FifoEjectionStrategy(),
            length_key=self._length_key(),
            device=self.device,
        )
        self._open = OpenEpisodes(self.specs, self.num_envs, self.memory_size, self.device)

    # Adding.

    def add_samples(self, **tensors: torch.Tensor | None) -> None:
        """Adds rows as skrl does: ``(num_envs, size)`` for every env, ``(k, size)`` for the
        next ``k`` envs, ``(k, size)`` as ``k`` steps of a single env, or ``(size,)`` for one.

        Raises:
            ValueError: No tensors, or a shape skrl does not accept either.
        """
        if not tensors:
            raise ValueError(
                "add_samples got no tensors; pass them as keyword arguments named after the "
                "memory's tensors"
            )
        if self.table is None:
            self._build()
        given = {n: t for n, t in tensors.items() if n in self.specs and t is not None}
        first = tensors.get("observations")
        first = first if first is not None else next(iter(tensors.values()))
        dim, count = first.ndim, first.shape[0]
        if dim == 2 and count == self.num_envs:
            self._add_block(np.arange(self.num_envs), given)
            self.memory_index += 1
        elif dim == 2 and count < self.num_envs:
            self._add_block(np.arange(self.env_index, self.env_index + count), given)
            self.env_index += count
        elif dim == 2 and self.num_envs == 1:
            for step in range(count):
                self._add_block(
                    np.zeros(1, dtype=np.int64), {n: t[step : step + 1] for n, t in given.items()}
                )
                self.memory_index += 1
                self._wrap()
        elif dim == 1:
            rows = {n: t.reshape(1, *t.shape) for n, t in given.items()}
            self._add_block(np.array([self.env_index]), rows)
            self.env_index += 1
        else:
            raise ValueError(
                f"add_samples expects (envs, size) with envs <= {self.num_envs} (or any count "
                f"of steps when num_envs is 1); got shape {tuple(first.shape)}"
            )
        if self.env_index >= self.num_envs:
            self.env_index = 0
            self.memory_index += 1
        self._wrap()

    def _wrap(self) -> None:
        if self.memory_index >= self.memory_size:
            self.memory_index = 0
            self.filled = True
            if self.export:
                self.save(self.export_directory, format=self.export_format)

    def _add_block(self, envs: np.ndarray, rows: dict[str, torch.Tensor]) -> None:
        """One row for each env of ``envs`` at ring row ``memory_index``."""
        assert self._open is not None
        rows = {n: t.to(self.device) for n, t in rows.items()}
        continues = self._open.continues(envs, rows, self.pairs())
        for env in envs[(self._open.lengths[envs] > 0) & ~continues]:
            self.inferred_cuts += 1
            self._commit(int(env), EpisodeState.INTERRUPTED)
        for env in envs[self._open.lengths[envs] >= self.memory_size]:
            self._commit(int(env), EpisodeState.INTERRUPTED)
        position = self.memory_index
        # A slot below len() that reads -1 lost its episode to ejection: it is a hole no more.
        written = position * self.num_envs + envs < len(self)
        self._holes -= int(((self._slot_ids[position, envs] < 0) & written).sum())
        identities, offsets, self._next_id = self._open.append(envs, rows, position, self._next_id)
        self._slot_ids[position, envs] = identities
        self._slot_offsets[position, envs] = offsets
        if self._loose:
            self._forget_loose(position * self.num_envs + envs)
        terminal = self._flags(rows, TERMINAL_FLAGS, len(envs))
        interrupted = self._flags(rows, INTERRUPTED_FLAGS, len(envs))
        for env, ends_terminal, ends_interrupted in zip(envs, terminal, interrupted, strict=True):
            if ends_terminal or ends_interrupted:
                state = EpisodeState.TERMINAL if ends_terminal else EpisodeState.INTERRUPTED
                self._commit(int(env), state)

    @staticmethod
    def _flags(rows: dict[str, torch.Tensor], names: Sequence[str], count: int) -> np.ndarray:
        result = np.zeros(count, dtype=bool)
        for name in names:
            if name in rows:
                result |= rows[name].reshape(count, -1).bool().any(dim=1).cpu().numpy()
        return result

    def _commit(self, env: int, end_state: EpisodeState) -> None:
        """Adds env ``env``'s open episode to the table; forgets the slots of ejected ones."""
        assert self._open is not None and self.table is not None
        identity, rows, positions = self._open.take(env)
        if len(positions) == 0:
            return
        sequence: dict[str, np.ndarray] = {}
        for name in self.specs:
            if name.startswith("next_") and name[len("next_") :] in self.specs:
                continue
            values = rows[name]
            if f"next_{name}" in self.specs:
                values = torch.cat([values, rows[f"next_{name}"][-1:]])
            sequence[name] = values.cpu().numpy()
        self.table.add_sequence(identity, sequence, end_state=end_state)
        self._committed[identity] = (env, positions)
        while len(self._committed) > self.table.episode_count:
            ejected, (ejected_env, ejected_positions) = self._committed.popitem(last=False)
            held = self._slot_ids[ejected_positions, ejected_env] == ejected
            self._slot_ids[ejected_positions[held], ejected_env] = -1
            self._holes += int(held.sum())

    def flush(self) -> None:
        """Adds every open episode to the table as INTERRUPTED (before exporting the table).

        Rows added later for those envs start new episodes.
        """
        if self._open is None:
            return
        for env in np.flatnonzero(self._open.lengths > 0):
            self._commit(int(env), EpisodeState.INTERRUPTED)

    # Files.

    def save(self, directory: str = "", *, format: str = "pt") -> str:
        """Writes every tensor as skrl's ``Memory.save`` does; see :mod:`.memory_files`.

        Returns:
            The written file's path.
        """
        return save_memory(self, directory or self.export_directory, format)

    def load(self, path: str) -> None:
        """Replaces the content with a ``.pt``/``.npz``/``.csv`` skrl export's rows, re-added in
        ring order so episodes are rebuilt; see :mod:`.memory_files`."""
        load_memory(self, path)


__all__ = ["EXPORT_FORMATS", "INTERRUPTED_FLAGS", "TERMINAL_FLAGS", "SkrlMemory"]
