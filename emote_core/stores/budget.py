"""How much one file may make a reader allocate: one budget, charged before each allocation.

Every reader of a file from elsewhere (pickles, zips, ``.pt``, HDF5) makes an
:class:`AllocationBudget` for it and charges it with what the file *declares* (the uncompressed
sizes of the zip members it will read, all before reading any; a tensor's shape and dtype, an
HDF5 dataset's shape, a pickle's bytearray length, the expanded size of nested lists) before
allocating it. A file may make its reader allocate at most :data:`SIZE_RATIO` times its own size
plus :data:`SIZE_FLOOR`, and never more than :data:`MEMORY_SHARE` of the memory available when
reading starts; a charge beyond that raises a one-line :class:`~emote_core.errors.FormatError`
naming the file, the member and the size it declares, before anything was allocated for it.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import FormatError

SIZE_RATIO = 64
"""A file may expand to this many times its size: recorded RL data (observations, actions,
rewards, flags) compresses far less than this; only crafted or damaged files declare more."""
SIZE_FLOOR = 256 << 20
"""...plus this many bytes, so small files (a column of zeros compresses very well) read."""
MEMORY_SHARE = 0.5
"""The share of the available memory one file may take (readers copy what they read once)."""
SCALAR_BYTES = 8
"""What one number or object in a nested list costs once it is an array element."""


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def file_bytes(path: str | os.PathLike[str]) -> int:
    """The size of a file, or the total size of the files under a directory (0 if missing)."""
    resolved = Path(path)
    try:
        if resolved.is_dir():
            return sum(f.stat().st_size for f in resolved.rglob("*") if f.is_file())
        return resolved.stat().st_size
    except OSError:
        return 0


class AllocationBudget:
    """The bytes reading one file may allocate, charged with declared sizes before allocating.

    Args:
        source: The file, as messages name it (``"tmrl dataset 'a/data.pkl'"``).
        size: The file's size in bytes (the sum of its files' sizes for a directory).
        limit: The budget in bytes; by default ``min(SIZE_RATIO * size + SIZE_FLOOR,
            MEMORY_SHARE * available memory)``.
    """

    def __init__(self, source: str, size: int, *, limit: int | None = None) -> None:
        self.source = source
        self.size = int(size)
        self.charged = 0
        by_size = SIZE_RATIO * self.size + SIZE_FLOOR
        if limit is not None:
            self.limit, self.memory_bound = int(limit), False
            return
        by_memory = int(_available_memory() * MEMORY_SHARE)
        self.limit, self.memory_bound = min(by_size, by_memory), by_memory < by_size

    @classmethod
    def for_path(cls, path: str | os.PathLike[str], source: str) -> AllocationBudget:
        """The budget of a file (or directory) on disk."""
        return cls(source, file_bytes(path))

    @classmethod
    def for_zip(cls, archive: zipfile.ZipFile, source: str) -> AllocationBudget:
        """The budget of an open zip archive: that of its file's size."""
        if archive.filename is not None and Path(archive.filename).is_file():
            return cls.for_path(archive.filename, source)
        position = archive.fp.tell()  # an archive opened from a stream
        size = archive.fp.seek(0, os.SEEK_END)
        archive.fp.seek(position)
        return cls(source, size)

    def charge_zip(self, archive: zipfile.ZipFile, names: Iterable[str]) -> None:
        """Charges the declared uncompressed sizes of the members ``names``, all before any is
        read (a name the archive lacks is left to the reader's own error).

        Raises:
            FormatError: If the members together exceed the budget.
        """
        for name in names:
            try:
                info = archive.getinfo(name)
            except KeyError:
                continue
            self.charge(f"member '{name}'", info.file_size, f"{info.compress_size:,} compressed")

    def charge(self, member: str, nbytes: int, what: str = "") -> None:
        """Records that reading ``member`` will allocate ``nbytes``; call before allocating.

        Args:
            member: What is being read: a zip member, a tensor, a dataset, a pickled object.
            nbytes: The bytes it declares.
            what: How it declares them (``"shape (100000, 1, 8000) of float32"``), for messages.

        Raises:
            FormatError: If the file's charges would exceed the budget.
        """
        nbytes = int(nbytes)
        if nbytes < 0:
            raise FormatError(f"{self.source}: {member} declares a negative size ({nbytes})")
        if self.charged + nbytes <= self.limit:
            self.charged += nbytes
            return
        detail = f" ({what})" if what else ""
        if self.memory_bound:
            rule = f"{MEMORY_SHARE:.0%} of the memory available"
            fix = "free memory or read it on a machine with more"
        else:
            rule = f"{SIZE_RATIO}x its {self.size:,} bytes plus {SIZE_FLOOR >> 20} MiB"
            fix = (
                "it is damaged or built to exhaust memory; recorded experience does not expand "
                "this much, so it was not read"
            )
        before = f" (with {self.charged:,} declared before it)" if self.charged else ""
        raise FormatError(
            f"{self.source}: {member} declares {nbytes:,} bytes{detail}, beyond what this file "
            f"may make emote allocate{before}: {self.limit:,} bytes, {rule} — {fix}"
        )

    def charge_nested(self, member: str, value: Any) -> int:
        """Charges what ``np.asarray(value)`` of nested lists and tuples would allocate.

        Lists that appear many times (one pickled list referenced from many places) count
        every time they appear, as the array repeats them; each is walked once.

        Returns:
            The bytes charged.

        Raises:
            FormatError: If the lists refer to themselves or exceed the budget.
        """
        elements, nbytes = nested_size(value, member=member, source=self.source)
        self.charge(member, nbytes, f"{elements:,} values once expanded into an array")
        return nbytes

    def charge_array(self, member: str, shape: Any, dtype: Any) -> None:
        """Charges an array of ``shape`` and ``dtype`` about to be allocated.

        Raises:
            FormatError: If the shape is not a tuple of sizes, or the budget is exceeded.
        """
        sizes = tuple(shape) if isinstance(shape, tuple | list) else (shape,)
        if not all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in sizes):
            raise FormatError(f"{self.source}: {member} declares shape {shape!r}; expected sizes")
        if any(s < 0 for s in sizes):
            raise FormatError(f"{self.source}: {member} declares shape {sizes}; sizes are >= 0")
        dtype = np.dtype(dtype)
        elements = 1
        for s in sizes:
            elements *= int(s)
        self.charge(member, elements * dtype.itemsize, f"shape {sizes} of {dtype}")


def nested_size(value: Any, *, member: str = "a value", source: str = "") -> tuple[int, int]:
    """Elements and bytes of ``np.asarray(value)``: arrays by their size, other leaves 8 bytes.

    Raises:
        FormatError: If the lists refer to themselves (no array holds them).
    """
    sizes: dict[int, tuple[int, int]] = {}
    walking: set[int] = set()

    def walk(item: Any) -> tuple[int, int]:
        if isinstance(item, np.ndarray):
            return item.size, item.size * max(item.itemsize, 1)
        if not isinstance(item, list | tuple):
            return 1, SCALAR_BYTES
        key = id(item)
        if key in sizes:
            return sizes[key]
        if key in walking:
            raise FormatError(f"{source}: {member} holds a list that contains itself")
        walking.add(key)
        elements = nbytes = 0
        for child in item:
            count, size = walk(child)
            elements, nbytes = elements + count, nbytes + size
        walking.discard(key)
        sizes[key] = (elements, nbytes)
        return elements, nbytes

    try:
        return walk(value)
    except RecursionError:
        raise FormatError(f"{source}: {member} is nested too deeply to be an array") from None


__all__ = [
    "MEMORY_SHARE",
    "SCALAR_BYTES",
    "SIZE_FLOOR",
    "SIZE_RATIO",
    "AllocationBudget",
    "file_bytes",
    "nested_size",
]
