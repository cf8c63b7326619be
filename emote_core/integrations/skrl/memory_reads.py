"""The reads of :class:`~emote_core.integrations.skrl.memory.SkrlMemory`: skrl's sampling calls and
whole-tensor access, answered from the ring's slot map, the emote table and the open episodes.

A ring slot holds ``(episode identity, step)`` or ``-1`` (never written, or its episode was
ejected from the table); such slots read as skrl's fill (NaN for floats, zero otherwise), or as
the values :meth:`SkrlMemoryReads.set_tensor_by_name` last wrote there, as skrl's dense tensors
would hold them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from emote_core.errors import SamplingError
from emote_core.integrations.skrl.memory_streams import OpenEpisodes, TensorSpec

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable


class SkrlMemoryReads:
    """Sampling and tensor access for :class:`~emote_core.integrations.skrl.memory.SkrlMemory`."""

    memory_size: int
    num_envs: int
    device: torch.device
    replacement: bool
    generator: torch.Generator
    sampling_indexes: torch.Tensor | None
    all_sequence_indexes: np.ndarray
    specs: dict[str, TensorSpec]
    table: ArrayMemoryTable | None
    _open: OpenEpisodes | None
    _slot_ids: np.ndarray
    _slot_offsets: np.ndarray
    _holes: int
    _loose: dict[str, torch.Tensor]

    filled: bool
    memory_index: int
    env_index: int

    def __len__(self) -> int:
        """Valid rows, as skrl counts them."""
        if self.filled:
            return self.memory_size * self.num_envs
        return self.memory_index * self.num_envs + self.env_index

    def _rows(self, names: Sequence[str], flat: np.ndarray) -> list[torch.Tensor | None]:
        """The rows at flat ring indexes ``flat`` of each name (``None`` for unknown names);
        slots never written or whose episode was ejected read as what ``set_tensor_by_name``
        wrote there, else as skrl's fill (NaN or 0)."""
        flat = np.asarray(flat, dtype=np.int64).reshape(-1)
        positions, envs = np.divmod(flat, self.num_envs)
        identities = self._slot_ids[positions, envs]
        offsets = self._slot_offsets[positions, envs]
        valid = identities >= 0
        open_ = (
            self._open.is_open(envs, identities) & valid
            if self._open is not None
            else np.zeros(len(flat), dtype=bool)
        )
        held = valid & ~open_
        batch: dict[str, torch.Tensor] = {}
        if held.any():
            assert self.table is not None
            batch = self.table.sample_by_index(identities[held], offsets[held], 1)
        result: list[torch.Tensor | None] = []
        for name in names:
            spec = self.specs.get(name)
            if spec is None:
                result.append(None)
                continue
            loose = self._loose.get(name)
            if loose is not None:
                out = loose[torch.as_tensor(flat, device=self.device)]
            else:
                out = torch.full(
                    (len(flat), *spec.shape), spec.fill_value(),
                    dtype=spec.dtype, device=self.device,
                )  # fmt: skip
            if held.any():
                out[torch.as_tensor(np.flatnonzero(held), device=self.device)] = batch[name].to(
                    device=self.device, dtype=spec.dtype
                )
            if open_.any():
                assert self._open is not None
                rows = self._open.gather(name, envs[open_], offsets[open_])
                out[torch.as_tensor(np.flatnonzero(open_), device=self.device)] = rows
            result.append(out)
        return result

    def sample_by_index(
        self, names: Sequence[str], *, indexes: Any, mini_batches: int = 1
    ) -> list[list[torch.Tensor | None]]:
        """The rows at flat ``indexes`` of ``(memory_size * num_envs)``, per name, split into
        ``mini_batches`` as ``numpy.array_split`` splits the indexes."""
        if isinstance(indexes, torch.Tensor):
            indexes = indexes.cpu().numpy()
        indexes = np.asarray(indexes, dtype=np.int64).reshape(-1)
        rows = self._rows(names, indexes)
        if mini_batches <= 1:
            return [rows]
        sizes = [len(part) for part in np.array_split(indexes, mini_batches)]
        bounds = np.cumsum([0, *sizes])
        return [
            [None if r is None else r[bounds[i] : bounds[i + 1]] for r in rows]
            for i in range(mini_batches)
        ]

    def sample(
        self,
        names: Sequence[str],
        *,
        batch_size: int,
        mini_batches: int = 1,
        sequence_length: int = 1,
    ) -> list[list[torch.Tensor | None]]:
        """Random rows, as ``RandomMemory.sample``: without replacement unless asked (a batch
        is then at most the rows held); ``sequence_length`` consecutive rows of one env each.

        Raises:
            SamplingError: Nothing was added yet.
        """
        size = len(self)
        if size == 0:
            raise SamplingError("SkrlMemory is empty; add samples before sampling")
        starts = torch.arange(0, self.num_envs * sequence_length, self.num_envs)
        if sequence_length > 1:
            size -= int(starts[-1])
        candidates = None
        if self._holes and sequence_length == 1:
            candidates = torch.from_numpy(np.flatnonzero(self._slot_ids.reshape(-1)[:size] >= 0))
            size = len(candidates)
            if size == 0:
                raise SamplingError("every row of SkrlMemory was ejected; add samples first")
        if self.replacement:
            chosen = torch.randint(0, size, (batch_size,), generator=self.generator)
        else:
            chosen = torch.randperm(size, generator=self.generator)[:batch_size]
        indexes = chosen if candidates is None else candidates[chosen]
        if sequence_length > 1:
            indexes = (starts.repeat(len(indexes), 1) + indexes.view(-1, 1)).view(-1)
        self.sampling_indexes = indexes
        return self.sample_by_index(names, indexes=indexes, mini_batches=mini_batches)

    def sample_all(
        self, names: Sequence[str], *, mini_batches: int = 1, sequence_length: int = 1
    ) -> list[list[torch.Tensor | None]]:
        """Every ring row (``memory_size * num_envs``, unwritten ones as fill), in ring order or,
        for ``sequence_length > 1``, env by env; split as ``Memory.sample_all`` splits them."""
        total = self.memory_size * self.num_envs
        if sequence_length > 1:
            return self.sample_by_index(
                names, indexes=self.all_sequence_indexes, mini_batches=mini_batches
            )
        rows = self._rows(names, np.arange(total))
        if mini_batches <= 1:
            return [rows]
        size = total // mini_batches
        return [
            [None if r is None else r[size * i : size * (i + 1)] for r in rows]
            for i in range(mini_batches)
        ]

    def get_tensor_by_name(self, name: str) -> torch.Tensor:
        """A copy of tensor ``name`` as ``(memory_size, num_envs, *shape)``.

        Raises:
            KeyError: No such tensor.
        """
        spec = self.specs[name]
        (rows,) = self._rows([name], np.arange(self.memory_size * self.num_envs))
        assert rows is not None
        return rows.reshape(self.memory_size, self.num_envs, *spec.shape)

    def set_tensor_by_name(self, name: str, tensor: torch.Tensor) -> None:
        """Writes ``(memory_size, num_envs, *shape)`` values into the rows the ring points at.

        Slots not holding a row (never written, or their episode was ejected) keep the values as
        skrl's dense tensors do: they read back until :meth:`add_samples` writes the slot.

        Raises:
            KeyError: No such tensor.
            ValueError: ``tensor`` has another shape, or ``name`` is a derived ``next_X``.
        """
        spec = self.specs[name]
        expected = (self.memory_size, self.num_envs, *spec.shape)
        values = torch.as_tensor(tensor).detach()
        if tuple(values.shape) != expected:
            raise ValueError(f"tensor '{name}' is {expected}; got {tuple(values.shape)}")
        if name.startswith("next_") and name[len("next_") :] in self.specs:
            raise ValueError(
                f"'{name}' is derived from '{name[len('next_') :]}' (the next row of the episode); "
                f"set '{name[len('next_') :]}' instead"
            )
        flat = values.reshape(-1, *spec.shape)
        positions, envs = np.divmod(np.arange(len(flat)), self.num_envs)
        identities = self._slot_ids[positions, envs]
        offsets = self._slot_offsets[positions, envs]
        self._write_loose(name, np.flatnonzero(identities < 0), flat)
        if self.table is None or self._open is None:
            return
        open_ = self._open.is_open(envs, identities)
        if open_.any():
            chosen = torch.as_tensor(np.flatnonzero(open_), device=flat.device)
            self._open.write(name, envs[open_], offsets[open_], flat[chosen])
        host = flat.cpu().numpy()
        held = np.flatnonzero((identities >= 0) & ~open_)
        held = held[np.lexsort((offsets[held], identities[held]))]
        groups = np.flatnonzero(np.diff(identities[held])) + 1
        for rows in np.split(held, groups) if len(held) else []:
            identity = int(identities[rows[0]])
            if np.all(np.diff(offsets[rows]) == 1):  # one write per episode in the usual case
                self.table.write_steps(
                    identity, name, offset=int(offsets[rows[0]]), values=host[rows]
                )
                continue
            for row in rows:
                self.table.write_steps(
                    identity, name, offset=int(offsets[row]), values=host[row : row + 1]
                )

    def _write_loose(self, name: str, slots: np.ndarray, flat: torch.Tensor) -> None:
        """Keeps ``flat[slots]`` for flat ring ``slots`` that hold no row."""
        if len(slots) == 0:
            return
        spec = self.specs[name]
        loose = self._loose.get(name)
        if loose is None:
            loose = torch.full(
                (self.memory_size * self.num_envs, *spec.shape), spec.fill_value(),
                dtype=spec.dtype, device=self.device,
            )  # fmt: skip
            self._loose[name] = loose
        chosen = torch.as_tensor(slots, device=flat.device)
        loose[torch.as_tensor(slots, device=self.device)] = flat[chosen].to(
            device=self.device, dtype=spec.dtype
        )

    def _forget_loose(self, slots: np.ndarray) -> None:
        """Drops what ``set_tensor_by_name`` kept at flat ring ``slots`` (rows are added there)."""
        for name, loose in self._loose.items():
            loose[torch.as_tensor(slots, device=self.device)] = self.specs[name].fill_value()


__all__ = ["SkrlMemoryReads"]
