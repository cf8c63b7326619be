"""Large host arrays that start on a page boundary.

numpy takes large arrays from ``malloc``, which hands them out 16 bytes past a page boundary;
the kernel copies file bytes into an array that starts on a boundary faster. Each call takes
fresh memory (past the sizes ``malloc`` recycles), so its pages are faulted in on first use:
for long-lived rows and one-off buffers, not for arrays made on every sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PAGE_BYTES = 4096
"""The alignment :func:`aligned_empty` gives by default (a page on the platforms emote runs on)."""


def aligned_empty(
    shape: tuple[int, ...] | int, dtype: Any, alignment: int = PAGE_BYTES
) -> np.ndarray:
    """An uninitialised C-contiguous array whose first byte sits on a multiple of ``alignment``.

    It is a view of a slightly larger ``uint8`` buffer (``alignment`` bytes more), which it keeps
    alive as its ``base``. Object and zero-size dtypes, which cannot view bytes, come from
    :func:`numpy.empty` as they are.

    Raises:
        ValueError: ``alignment`` is not a positive power of two.
    """
    if alignment < 1 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two; got {alignment}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    if dtype.hasobject or not dtype.itemsize:
        return np.empty(shape, dtype=dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(size + alignment, dtype=np.uint8)
    start = -buffer.ctypes.data % alignment
    return buffer[start : start + size].view(dtype).reshape(shape)


__all__ = ["PAGE_BYTES", "aligned_empty"]
