"""The open episodes of a skrl-interface memory: per env, the rows since its last episode end.

:class:`OpenEpisodes` stages each env's rows on the memory's device until its episode ends
(``terminated``/``dones``: TERMINAL; ``truncated`` or an unflagged reset: INTERRUPTED). Also
:func:`occupied_size` (a tensor's row size, as skrl counts it) and :func:`register_with_skrl`
(the only place that imports skrl, lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from emote_core.errors import ConfigurationError

_FIRST_ROWS = 256

_registered = False


def register_with_skrl(cls: type) -> None:
    """Makes ``isinstance(memory, skrl.memories.torch.Memory)`` true, when skrl is installed."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from skrl.memories.torch import Memory
    except ImportError:  # emote works without skrl; there is then nothing to register with
        return
    Memory.register(cls)


def occupied_size(size: Any) -> int:
    """The elements a row of ``size`` occupies, as skrl counts them: an int, a shape, or a
    gymnasium space (Discrete: 1, MultiDiscrete: its count, Dict/Tuple: the sum)."""
    if isinstance(size, bool):
        raise ConfigurationError(f"a tensor size must be an int, a shape or a space; got {size!r}")
    if isinstance(size, int | float):
        return int(size)
    if isinstance(size, list | tuple):
        return int(np.prod(size))
    import gymnasium

    spaces = gymnasium.spaces
    if isinstance(size, spaces.Discrete):
        return 1
    if isinstance(size, spaces.MultiDiscrete):
        return int(size.nvec.shape[0])
    if isinstance(size, spaces.Tuple):
        return sum(occupied_size(s) for s in size)
    if isinstance(size, spaces.Dict):
        return sum(occupied_size(s) for s in size.values())
    if isinstance(size, spaces.Space):
        return int(spaces.flatdim(size))
    raise ConfigurationError(f"a tensor size must be an int, a shape or a space; got {size!r}")


@dataclass(frozen=True)
class TensorSpec:
    """One skrl tensor: the shape of a row and its torch dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def fill_value(self) -> float:
        """What skrl fills a new tensor with: NaN for floats, zero otherwise."""
        return float("nan") if self.dtype.is_floating_point else 0


class OpenEpisodes:
    """Per env, the staged rows of the episode in progress and their ring positions.

    Args:
        specs: Name -> spec of every tensor the memory holds.
        num_envs: The env streams.
        max_rows: The most rows an open episode keeps (the memory's ``memory_size``).
        device: Where the rows are staged.
    """

    def __init__(
        self, specs: dict[str, TensorSpec], num_envs: int, max_rows: int, device: torch.device
    ) -> None:
        self.specs = dict(specs)
        self.num_envs = num_envs
        self.max_rows = max_rows
        self.device = device
        self.capacity = min(max_rows, _FIRST_ROWS)
        self.rows = {name: self._blank(spec, self.capacity) for name, spec in self.specs.items()}
        self.positions = np.zeros((num_envs, self.capacity), dtype=np.int64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.identities = np.full(num_envs, -1, dtype=np.int64)

    def _blank(self, spec: TensorSpec, capacity: int) -> torch.Tensor:
        shape = (self.num_envs, capacity, *spec.shape)
        return torch.full(shape, spec.fill_value(), dtype=spec.dtype, device=self.device)

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity = min(capacity * 2, self.max_rows)
        for name, spec in self.specs.items():
            grown = self._blank(spec, capacity)
            grown[:, : self.capacity] = self.rows[name]
            self.rows[name] = grown
        positions = np.zeros((self.num_envs, capacity), dtype=np.int64)
        positions[:, : self.capacity] = self.positions
        self.positions = positions
        self.capacity = capacity

    def continues(
        self, envs: np.ndarray, rows: dict[str, torch.Tensor], pairs: list[str]
    ) -> np.ndarray:
        """Per env of ``envs``: whether the incoming rows continue its open episode.

        A row continues an episode when each paired observation equals the open episode's last
        next observation (NaN equal to NaN). Envs without an open episode do not continue.
        """
        lengths = self.lengths[envs]
        open_ = lengths > 0
        result = open_.copy()
        if not pairs or not open_.any():
            return result
        chosen = torch.as_tensor(envs[open_], device=self.device)
        last = torch.as_tensor(lengths[open_] - 1, device=self.device)
        for name in pairs:
            if name not in rows:
                continue
            before = self.rows[f"next_{name}"][chosen, last].reshape(len(chosen), -1)
            now = rows[name][torch.as_tensor(np.flatnonzero(open_), device=self.device)]
            now = now.to(before.dtype).reshape(len(chosen), -1)
            same = before == now
            if before.is_floating_point():
                same |= before.isnan() & now.isnan()
            result[open_] &= same.all(dim=1).cpu().numpy()
        return result

    def append(
        self, envs: np.ndarray, rows: dict[str, torch.Tensor], position: np.ndarray, first_id: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Appends one row to each env's open episode; starts episodes where none is open.

        Args:
            envs: The envs, one per row of each tensor in ``rows``.
            rows: Name -> ``(len(envs), *shape)``; names not given get skrl's fill value.
            position: The ring row (``memory_index``) each row is written at, per env.
            first_id: The identity of the first episode started here.

        Returns:
            The rows' episode identities and offsets, and the next unused identity.
        """
        starting = self.lengths[envs] == 0
        started = int(starting.sum())
        self.identities[envs[starting]] = np.arange(first_id, first_id + started)
        offsets = self.lengths[envs].copy()
        needed = int(offsets.max()) + 1
        if needed > self.capacity:
            self._grow(needed)
        index_envs = torch.as_tensor(envs, device=self.device)
        index_rows = torch.as_tensor(offsets, device=self.device)
        for name, spec in self.specs.items():
            value = rows.get(name)
            target = self.rows[name]
            if value is None:
                target[index_envs, index_rows] = spec.fill_value()
            else:
                value = value.to(device=self.device, dtype=spec.dtype)
                target[index_envs, index_rows] = value.reshape(len(envs), *spec.shape)
        self.positions[envs, offsets] = position
        self.lengths[envs] += 1
        return self.identities[envs].copy(), offsets, first_id + started

    def take(self, env: int) -> tuple[int, dict[str, torch.Tensor], np.ndarray]:
        """Removes env ``env``'s open episode: its identity, rows (name -> ``(N, *shape)``) and
        ring positions."""
        length = int(self.lengths[env])
        rows = {name: staged[env, :length].clone() for name, staged in self.rows.items()}
        identity = int(self.identities[env])
        positions = self.positions[env, :length].copy()
        self.lengths[env] = 0
        self.identities[env] = -1
        return identity, rows, positions

    def gather(self, name: str, envs: np.ndarray, offsets: np.ndarray) -> torch.Tensor:
        """Rows ``offsets`` of the open episodes of ``envs``."""
        index_envs = torch.as_tensor(envs, device=self.device)
        index_rows = torch.as_tensor(offsets, device=self.device)
        return self.rows[name][index_envs, index_rows]

    def write(self, name: str, envs: np.ndarray, offsets: np.ndarray, values: torch.Tensor) -> None:
        """Overwrites rows ``offsets`` of the open episodes of ``envs``."""
        index_envs = torch.as_tensor(envs, device=self.device)
        index_rows = torch.as_tensor(offsets, device=self.device)
        self.rows[name][index_envs, index_rows] = values.to(self.rows[name].dtype)

    def is_open(self, envs: np.ndarray, identities: np.ndarray) -> np.ndarray:
        """Per row: whether its episode is its env's open one."""
        return (self.identities[envs] == identities) & (identities >= 0)


__all__ = ["OpenEpisodes", "TensorSpec", "occupied_size", "register_with_skrl"]
