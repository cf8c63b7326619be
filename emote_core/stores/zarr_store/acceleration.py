"""The zarrs codec pipeline for local stores, and the crc32 that checksums use.

zarrs (a default dependency) decodes local stores' columns; where it cannot be imported or does
not fit the installed zarr, stores read through zarr-python's default pipeline with the same
results. zlib-ng's crc32 (the ``fast`` extra) gives the same checksum values as zlib's, faster.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

ZARRS_PIPELINE = "zarrs.ZarrsCodecPipeline"
"""zarr's ``codec_pipeline.path`` of the zarrs package's (Rust) codec pipeline."""
ZARRS_SWITCH = "EMOTE_ZARRS"
"""Environment variable: ``0`` reads stores with zarr's default pipeline even where zarrs is
installed (to compare, or to work around a zarrs that does not fit the installed zarr)."""

try:  # zlib-ng computes the same CRC-32 as zlib, with SIMD
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # the optional package is missing: the standard library's
    from zlib import crc32 as _crc32

crc32 = _crc32
"""``crc32(data, value=0)``: the zlib CRC-32 of ``data`` continuing from ``value``."""
FAST_CRC32 = crc32.__module__ != "zlib"
"""Whether :data:`crc32` is zlib-ng's (else checksums are spread over threads)."""


def zarrs_installed() -> bool:
    """Whether the zarrs package is importable."""
    return importlib.util.find_spec("zarrs") is not None


def zarrs_enabled() -> bool:
    """Whether stores are read with the zarrs pipeline: installed and not switched off."""
    return os.environ.get(ZARRS_SWITCH, "1") != "0" and zarrs_installed()


def reads_with_zarrs(group: Any) -> bool:
    """Whether arrays of ``group`` are opened with the zarrs pipeline: it is enabled and the
    group is on the local file system (zarrs refuses most fsspec stores)."""
    from zarr.storage import LocalStore

    return zarrs_enabled() and isinstance(getattr(group, "store", None), LocalStore)


@contextmanager
def reading_config(group: Any) -> Iterator[bool]:
    """zarr settings for bulk reads of ``group``'s arrays: arrays opened inside decode with the
    zarrs pipeline where :func:`reads_with_zarrs` allows, chunks decoded on one thread per core
    (zarr's default pool is larger, and slower).

    Yields:
        Whether arrays opened inside use the zarrs pipeline.
    """
    import zarr

    settings: dict[str, Any] = {"threading.max_workers": os.cpu_count() or 1}
    fast = reads_with_zarrs(group)
    if fast:
        settings["codec_pipeline.path"] = ZARRS_PIPELINE
    with zarr.config.set(settings):
        yield fast


def open_array(group: Any, path: str) -> Any:
    """``group[path]`` opened for a bulk read (see :func:`reading_config`); zarr's default
    pipeline when zarrs cannot open it."""
    with reading_config(group) as fast:
        if not fast:
            return group[path]
        try:
            return group[path]
        except (ImportError, NotImplementedError, TypeError) as error:  # a zarrs that does
            # not fit the installed zarr, or a store it does not read: the default pipeline
            log.debug("zarrs cannot open %s (%s); reading it with zarr's pipeline", path, error)
    return group[path]


def uses_zarrs(array: Any) -> bool:
    """Whether ``array`` decodes through the zarrs pipeline."""
    pipeline = getattr(getattr(array, "_async_array", None), "codec_pipeline", None)
    return type(pipeline).__module__.split(".")[0] == "zarrs"


def with_default_pipeline(array: Any) -> Any:
    """``array`` opened again with zarr's default codec pipeline: what a read that failed under
    zarrs retries with, so that only what zarr itself cannot decode is called damage (and a
    zarrs that does not fit the installed zarr costs speed, never data)."""
    import zarr

    default = zarr.config.defaults[0]["codec_pipeline"]["path"]
    with zarr.config.set({"codec_pipeline.path": default}):
        return zarr.open_array(store=array.store, path=array.path, mode="r", zarr_format=3)


def read_into(array: Any, low: int, high: int, out: np.ndarray) -> np.ndarray:
    """Rows ``low:high`` of ``array`` decoded into ``out``, one decoding thread per core.

    Under zarrs, the chunks at either end that the rows take only part of are decoded by zarr's
    own pipeline: zarrs decodes part of a chunk without checking that the chunk holds one
    chunk's bytes, which zarr's pipeline refuses as damage.

    Raises:
        Exception: Whatever the codec pipeline raises for an unreadable chunk.
    """
    import zarr
    from zarr.core.buffer import default_buffer_prototype

    rows = int(array.chunks[0])
    head = min(high, -(-low // rows) * rows)  # the first chunk boundary from low on
    tail = max(head, high // rows * rows)  # the last one up to high
    parts = [(low, high, array)]
    if uses_zarrs(array) and (low < head or tail < high):
        default = with_default_pipeline(array)
        parts = [(low, head, default), (head, tail, array), (tail, high, default)]
    with zarr.config.set({"threading.max_workers": os.cpu_count() or 1}):
        for first, stop, source in parts:
            if first < stop:
                into = default_buffer_prototype().nd_buffer.from_numpy_array(
                    out[first - low : stop - low]
                )
                source.get_basic_selection(slice(first, stop), out=into)
    return out


__all__ = [
    "FAST_CRC32",
    "ZARRS_PIPELINE",
    "ZARRS_SWITCH",
    "crc32",
    "open_array",
    "read_into",
    "reading_config",
    "reads_with_zarrs",
    "uses_zarrs",
    "with_default_pipeline",
    "zarrs_enabled",
    "zarrs_installed",
]
