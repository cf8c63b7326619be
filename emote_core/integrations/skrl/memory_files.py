"""Saving and loading a :class:`~emote_core.integrations.skrl.memory.SkrlMemory` as skrl's files.

The files are what skrl's ``Memory.save`` writes (``.pt``, ``.npz``, ``.csv``, under
``<directory>/memories/``), so skrl and ``emote memory convert`` read them. Loading replaces the
memory's content, rebuilding its episodes from the rows in ring order; a ``.csv`` is read with
this memory's ``num_envs`` and its tensors' dtypes.
"""

from __future__ import annotations

import csv
import datetime
import io
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from emote_core.errors import ConfigurationError, FormatError
from emote_core.integrations.skrl.memory_streams import TensorSpec


class SkrlLikeMemory(Protocol):
    """What saving and loading use of a :class:`~emote_core.integrations.skrl.memory.SkrlMemory`."""

    memory_size: int
    num_envs: int
    export: bool
    specs: dict[str, TensorSpec]

    def __len__(self) -> int: ...
    def get_tensor_names(self) -> list[str]: ...
    def get_tensor_by_name(self, name: str) -> torch.Tensor: ...
    def clear(self) -> None: ...
    def create_tensor(
        self, name: str, *, size: Any, dtype: torch.dtype | None = ..., keep_dimensions: bool = ...
    ) -> bool: ...
    def add_samples(self, **tensors: torch.Tensor | None) -> None: ...


EXPORT_FORMATS = ("pt", "npz", "csv")
"""The file kinds :func:`save_memory` writes and :func:`load_memory` reads."""


def _path(memory: SkrlLikeMemory, directory: str, format: str) -> Path:
    stamp = datetime.datetime.now().strftime("%y-%m-%d_%H-%M-%S-%f")
    folder = Path(directory) / "memories"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{stamp}_memory_{hex(id(memory))}.{format}"


def save_memory(memory: SkrlLikeMemory, directory: str, format: str) -> str:
    """Writes ``memory`` as a skrl export; see the module doc.

    Raises:
        ConfigurationError: ``format`` is not ``pt``, ``npz`` or ``csv``.
    """
    if format not in EXPORT_FORMATS:
        raise ConfigurationError(f"format must be one of {list(EXPORT_FORMATS)}; got {format!r}")
    tensors = {name: memory.get_tensor_by_name(name) for name in memory.get_tensor_names()}
    path = _path(memory, directory, format)
    if format == "pt":
        torch.save(tensors, path)
    elif format == "npz":
        np.savez(path, **{name: t.cpu().numpy() for name, t in tensors.items()})
    else:
        rows = len(memory)
        flat = {
            n: t.reshape(memory.memory_size * memory.num_envs, -1)[:rows].cpu()
            for n, t in tensors.items()
        }
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow([f"{n}.{i}" for n, t in flat.items() for i in range(t.shape[1])])
            for row in range(rows):
                writer.writerow([v for t in flat.values() for v in t[row].tolist()])
    return str(path)


def _read_csv(memory: SkrlLikeMemory, path: Path) -> dict[str, np.ndarray]:
    """The ``.csv`` columns as ``(rows, size)`` arrays of the tensors' dtypes."""
    with path.open(newline="") as file:
        reader = csv.reader(io.StringIO(file.read()))
        try:
            header = next(reader)
        except StopIteration:
            raise FormatError(
                f"skrl memory '{path}' is empty; a .csv export has a header"
            ) from None
        lines = list(reader)
    names = [field.rsplit(".", 1)[0] for field in header]
    unknown = sorted(set(names) - set(memory.specs))
    if unknown:
        raise FormatError(
            f"skrl memory '{path}' has tensors {unknown} this memory did not create; a .csv "
            "records no dtypes, so create every tensor (the agent's init() does) before load"
        )
    columns: dict[str, np.ndarray] = {}
    for name in dict.fromkeys(names):
        where = [i for i, n in enumerate(names) if n == name]
        dtype = torch.empty(0, dtype=memory.specs[name].dtype).numpy().dtype
        cells = [[line[i] for i in where] for line in lines]
        if dtype == np.bool_:
            columns[name] = np.array([[c == "True" for c in cell] for cell in cells], dtype=bool)
        else:
            columns[name] = np.array(cells, dtype=np.float64).astype(dtype).reshape(len(lines), -1)
    return columns


def _read_blocks(memory: SkrlLikeMemory, path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".pt":
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        return {name: t.numpy() for name, t in loaded.items()}
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    raise FormatError(f"'{path}' is not a skrl memory export; load reads .pt, .npz or .csv")


def _written(blocks: dict[str, np.ndarray]) -> int:
    """Ring rows before the trailing block skrl never wrote (floats NaN, the rest zero)."""
    rows = len(next(iter(blocks.values())))
    blank = np.ones(rows, dtype=bool)
    for array in blocks.values():
        flat = array.reshape(rows, -1)
        blank &= (np.isnan(flat) if array.dtype.kind == "f" else flat == 0).all(axis=1)
    written = np.flatnonzero(~blank)
    return int(written[-1]) + 1 if len(written) else 0


def load_memory(memory: SkrlLikeMemory, path: str | os.PathLike[str]) -> None:
    """Replaces ``memory``'s content with the rows of a skrl export; see the module doc.

    Raises:
        FormatError: The file is missing, of another kind, or its tensors do not fit.
    """
    resolved = Path(path)
    if not resolved.is_file():
        raise FormatError(f"skrl memory '{resolved}' does not exist")
    if resolved.suffix == ".csv":
        columns = _read_csv(memory, resolved)
        rows = len(next(iter(columns.values()))) if columns else 0
        steps, partial = divmod(rows, memory.num_envs)
        blocks = {
            n: a[: steps * memory.num_envs].reshape(steps, memory.num_envs, -1)
            for n, a in columns.items()
        }
        tail = {n: a[steps * memory.num_envs :] for n, a in columns.items()} if partial else {}
    else:
        blocks = {
            n: a if a.ndim > 2 else a[..., None] for n, a in _read_blocks(memory, resolved).items()
        }
        tail = {}
        for name, array in blocks.items():
            if array.shape[1] != memory.num_envs:
                raise FormatError(
                    f"skrl memory '{resolved}': tensor '{name}' is {array.shape}, for "
                    f"{array.shape[1]} envs; this memory has num_envs={memory.num_envs}"
                )
        steps = _written(blocks) if blocks else 0
    memory.clear()
    for name, array in blocks.items():
        if name not in memory.specs:  # skrl's load also takes tensors it did not create
            dtype = torch.from_numpy(array[:0]).dtype
            memory.create_tensor(
                name, size=list(array.shape[2:]), dtype=dtype, keep_dimensions=True
            )
    export, memory.export = memory.export, False  # loading is not collecting: no re-export
    try:
        for step in range(steps):
            memory.add_samples(
                **{n: torch.from_numpy(np.ascontiguousarray(a[step])) for n, a in blocks.items()}
            )
        if tail:
            memory.add_samples(**{n: torch.from_numpy(a) for n, a in tail.items()})
    finally:
        memory.export = export


__all__ = ["EXPORT_FORMATS", "load_memory", "save_memory"]
