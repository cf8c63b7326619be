"""Raw (uncompressed) chunks: which columns the writer stores without a compressor.

The writer compresses a column only where it pays: data that Blosc shrinks by less than
:data:`RAW_RATIO` (random floats, noisy sensors) is stored raw, with no decode to read it. The
choice is made once per column of a shard, from the first batch appended to it, and lives only
in the column's own zarr metadata (its codec list), so any zarr-python reads these stores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

COMPRESSOR_SETTINGS: dict[str, Any] = {"cname": "lz4", "clevel": 5, "shuffle": "shuffle"}
"""Blosc settings of compressed columns: lz4 inside Blosc with byte shuffling."""

RAW_RATIO = 0.9
"""A column whose first batch Blosc shrinks to more than this share of its bytes is stored raw
(``benchmarks/codec_bench.py`` weighs the disk Blosc saves against the load time it costs)."""

TRIAL_BYTES = 64 << 10
"""The least data a column's first batch needs to decide from; with less it keeps Blosc."""


def compressor() -> Any:
    """The zarr codec of compressed columns (:data:`COMPRESSOR_SETTINGS`)."""
    from zarr.codecs import BloscCodec

    return BloscCodec(**COMPRESSOR_SETTINGS)


def compressed_ratio(sample: np.ndarray) -> float:
    """Blosc's (:data:`COMPRESSOR_SETTINGS`) compressed size of ``sample`` over its raw size."""
    from numcodecs import Blosc

    shuffle = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE}[
        COMPRESSOR_SETTINGS["shuffle"]
    ]
    codec = Blosc(
        cname=COMPRESSOR_SETTINGS["cname"], clevel=COMPRESSOR_SETTINGS["clevel"], shuffle=shuffle
    )
    data = np.ascontiguousarray(sample)  # Blosc's typesize: the item size, as zarr gives it
    return len(codec.encode(data)) / max(1, data.nbytes)


def stores_raw(first_rows: np.ndarray, chunk_rows: int) -> bool:
    """Whether a column whose first appended rows are ``first_rows`` is stored raw: Blosc
    shrinks its first chunk's worth of rows (at least :data:`TRIAL_BYTES` of them) to more
    than :data:`RAW_RATIO` of their size. Deterministic: the same rows, the same answer."""
    sample = first_rows[:chunk_rows]
    if sample.nbytes < TRIAL_BYTES:
        return False
    return compressed_ratio(sample) > RAW_RATIO


def with_codecs(array: Any, *, raw: bool) -> Any:
    """Rewrites the metadata of the empty ``array`` with its serializer alone (``raw``) or
    followed by :func:`compressor`, and returns the array opened again. One write of its
    ``zarr.json``, never a delete: a reader sees the old or the new metadata of an array that
    holds no rows either way.

    Raises:
        ValueError: The array holds rows.
    """
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.metadata import ArrayV3Metadata
    from zarr.core.sync import sync

    if array.shape[0]:
        raise ValueError(f"{array.path} holds rows; only an empty array changes its codecs")
    document = array.metadata.to_dict()
    codecs = list(document["codecs"][:1])  # the array-to-bytes codec ("bytes") alone
    if not raw:  # then Blosc, with the item size zarr gives it
        codecs.append(type(compressor())(typesize=array.dtype.itemsize, **COMPRESSOR_SETTINGS))
    document["codecs"] = [c if isinstance(c, dict) else c.to_dict() for c in codecs]
    metadata = ArrayV3Metadata.from_dict(document)
    buffers = metadata.to_buffer_dict(default_buffer_prototype())
    sync((array.store_path / "zarr.json").set(buffers["zarr.json"]))
    import zarr

    return zarr.open_array(store=array.store, path=array.path, mode="r+", zarr_format=3)


__all__ = [
    "COMPRESSOR_SETTINGS",
    "RAW_RATIO",
    "TRIAL_BYTES",
    "compressed_ratio",
    "compressor",
    "stores_raw",
    "with_codecs",
]
