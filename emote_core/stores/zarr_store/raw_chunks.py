"""Raw (uncompressed) chunks: which columns the writer stores without a compressor, and reading
such a column's rows straight from its chunk files into an array.

The writer compresses a column only where it pays: data that Blosc shrinks by less than
:data:`RAW_RATIO` (random floats, noisy sensors) is stored raw. The choice is made once per
column of a shard, from the first batch appended to it, and lives only in the column's own zarr
metadata (its codec list), so any zarr-python reads these stores. The bulk loader reads raw
columns from their files itself: decoded through zarr (zarrs too), a load takes more than twice
``np.load``'s time.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from emote_core.utils.files import open_regular_file

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


def raw_files(array: Any) -> Path | None:
    """The directory holding a zarr array's chunks where they can be read straight from files
    (local, the ``bytes`` codec alone in native order, one chunk across the trailing axes);
    ``None`` otherwise (read it through zarr)."""
    from zarr.codecs import BytesCodec
    from zarr.core.chunk_grids import RegularChunkGrid
    from zarr.storage import LocalStore

    if not hasattr(os, "preadv"):  # Windows: read through zarr
        return None
    store, metadata = getattr(array, "store", None), getattr(array, "metadata", None)
    if not isinstance(store, LocalStore) or getattr(metadata, "zarr_format", None) != 3:
        return None
    codecs = metadata.codecs
    if (
        len(codecs) != 1
        or not isinstance(codecs[0], BytesCodec)
        or getattr(codecs[0].endian, "value", sys.byteorder) != sys.byteorder
        or not isinstance(metadata.chunk_grid, RegularChunkGrid)
        or tuple(metadata.chunk_grid.chunk_shape[1:]) != tuple(array.shape[1:])
        or metadata.storage_transformers
    ):
        return None
    return Path(store.root) / array.path


STORE_FILES_ONLY = "an emote memory store holds only files and folders"


class RawChunkError(Exception):
    """A raw chunk file whose size is not a whole chunk's: damage, for zarr to name."""


class RawColumnReader:
    """Reads rows of a raw column (chunks under ``directory``, see :func:`raw_files`) from its
    chunk files straight into arrays: one ``preadv`` per chunk, no decode and no intermediate
    buffer. A missing chunk (zarr leaves out chunks of fill values) reads as the fill value.

    Use as a context manager: it keeps the chunk files it opened until it closes.
    """

    def __init__(self, array: Any, directory: Path) -> None:
        self._array = array
        self._directory = os.path.join(directory, "")  # a string: ~5 us less per file opened
        self._chunk_rows = int(array.metadata.chunk_grid.chunk_shape[0])
        self._row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
        self._trailing = (0,) * (len(array.shape) - 1)
        self._files: dict[int, int | None] = {}
        self._advised: dict[int, int] = {}  # per chunk, the row read ahead up to

    def __enter__(self) -> RawColumnReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the chunk files."""
        files, self._files = self._files, {}
        for descriptor in files.values():
            if descriptor is not None:
                os.close(descriptor)

    def _chunks(self, low: int, high: int) -> range:
        return range(low // self._chunk_rows, -(-high // self._chunk_rows))

    def _key(self, chunk: int) -> str:
        return str(self._array.metadata.encode_chunk_key((chunk, *self._trailing)))

    def _open(self, chunk: int) -> int | None:
        """The chunk's open file (``None``: no file, the chunk holds fill values), checked to
        hold one whole chunk.

        Raises:
            RawChunkError: The file is not one chunk's size.
            FormatError: It is not a file (a named pipe, a device): not read, nor read by zarr.
        """
        if chunk not in self._files:
            try:
                descriptor, info = open_regular_file(
                    self._directory + self._key(chunk), rule=STORE_FILES_ONLY
                )
            except FileNotFoundError:
                descriptor, info = None, None
            self._files[chunk] = descriptor
            size = info.st_size if info is not None else 0
            if descriptor is not None and size != self._chunk_rows * self._row_bytes:
                raise RawChunkError(
                    f"{self._array.path}/{self._key(chunk)} holds {size} bytes, not one raw "
                    f"chunk's {self._chunk_rows * self._row_bytes}"
                )
        return self._files[chunk]

    def open(self, low: int, high: int) -> None:
        """Opens the chunk files of rows ``low:high`` and checks their sizes.

        Raises:
            RawChunkError: A chunk file is not one chunk's size.
        """
        for chunk in self._chunks(low, high):
            self._open(chunk)

    def to_read_ahead(self, low: int, high: int) -> list[tuple[int, int, int]]:
        """The bytes of rows ``low:high`` in the open chunk files, less those handed out
        before, as ``(descriptor, offset, size)`` for
        :func:`~emote_core.utils.page_cache.read_ahead`, in row order (calls going up the rows,
        as the loader's parts do). Only rows that are read are read ahead, however large a
        chunk its metadata claims."""
        rows, size = self._chunk_rows, self._row_bytes
        found = []
        for chunk in self._chunks(low, high):
            descriptor = self._files.get(chunk)
            first = max(low, chunk * rows, self._advised.get(chunk, 0))
            stop = min(high, (chunk + 1) * rows)
            if descriptor is None or first >= stop:
                continue
            self._advised[chunk] = stop
            found.append((descriptor, (first - chunk * rows) * size, (stop - first) * size))
        return found

    def read_segments(
        self, sources: np.ndarray, counts: np.ndarray, out: np.ndarray, destinations: np.ndarray
    ) -> None:
        """Rows ``sources[j]:sources[j] + counts[j]`` into ``out[destinations[j]:...]`` for each
        ``j``: several episodes' rows scattered to their places with one ``preadv`` per chunk
        (the file's bytes, one buffer per episode), no copy in between.

        Raises:
            ValueError: ``out`` is not a C-contiguous array of the column's dtype.
            RawChunkError: A chunk file is not one chunk's size.
        """
        (calls,) = self.plan(sources, counts, destinations, [len(sources)])
        self.read_planned(calls, out)

    def plan(
        self,
        sources: np.ndarray,
        counts: np.ndarray,
        destinations: np.ndarray,
        ends: list[int],
    ) -> list[list[ReadCall]]:
        """The reads of :meth:`read_segments`, worked out once for several parts: part ``k``
        reads segments ``ends[k - 1]:ends[k]`` (``ends[-1]`` the number of segments).

        Returns:
            Per part, its ``preadv`` calls for :meth:`read_planned`.
        """
        rows, size = self._chunk_rows, self._row_bytes
        sources, counts = np.asarray(sources, np.int64), np.asarray(counts, np.int64)
        destinations = np.asarray(destinations, np.int64)
        part = np.searchsorted(np.asarray(ends), np.arange(len(sources)), side="right")
        sources, counts, destinations, part = _merged(sources, counts, destinations, part)
        plans: list[list[ReadCall]] = [[] for _ in ends]
        if not len(sources):
            return plans
        # Pieces: the segments cut at chunk boundaries (each piece inside one chunk).
        firsts = sources // rows
        spans = (sources + counts - 1) // rows - firsts + 1
        segment = np.repeat(np.arange(len(sources)), spans)
        within = np.arange(len(segment)) - np.repeat(np.cumsum(spans) - spans, spans)
        chunks = firsts[segment] + within  # a segment's k-th piece is in its k-th chunk
        starts = np.maximum(sources[segment], chunks * rows)
        stops = np.minimum(sources[segment] + counts[segment], (chunks + 1) * rows)
        at = destinations[segment] + starts - sources[segment]
        parts = part[segment]
        # Calls: pieces of a part back to back in one chunk's file, at most IOV_MAX each.
        breaks = (
            (chunks[1:] != chunks[:-1]) | (starts[1:] != stops[:-1]) | (parts[1:] != parts[:-1])
        )
        bounds = [0, *(np.flatnonzero(breaks) + 1).tolist(), len(chunks)]
        lows, highs = (at * size).tolist(), ((at + stops - starts) * size).tolist()
        offsets = ((starts - chunks * rows) * size).tolist()
        chunk_list, part_list = chunks.tolist(), parts.tolist()
        for a, b in itertools.pairwise(bounds):
            for c in range(a, b, IOV_MAX):
                d = min(b, c + IOV_MAX)
                call = ReadCall(chunk_list[c], offsets[c], lows[c:d], highs[c:d])
                plans[part_list[c]].append(call)
        return plans

    def read_planned(self, calls: list[ReadCall], out: np.ndarray) -> None:
        """Makes the ``calls`` (:meth:`plan`) into ``out``, the array they were planned for.

        Raises:
            ValueError: ``out`` is not a C-contiguous array of the column's dtype.
            RawChunkError: A chunk file is not one chunk's size.
        """
        if (
            out.dtype != self._array.dtype
            or not out.flags.c_contiguous
            or out[:1].nbytes != min(len(out), 1) * self._row_bytes
        ):
            raise ValueError(f"raw rows need a C-contiguous {self._array.dtype} array of its rows")
        flat = memoryview(out.reshape(-1).view(np.uint8))
        if calls and (
            min(min(c.lows) for c in calls) < 0 or max(max(c.highs) for c in calls) > flat.nbytes
        ):
            raise ValueError(f"raw rows planned outside the {len(out)} rows to read into")
        for call in calls:
            self._read_pieces(call, flat, out)

    def _read_pieces(self, call: ReadCall, flat: memoryview, out: np.ndarray) -> None:
        """One call: its chunk's bytes from its offset on into its pieces of ``out``
        (``flat``, its bytes)."""
        chunk, offset, lows, highs = call
        descriptor = self._open(chunk)
        if descriptor is None:  # no file: the chunk holds the fill value
            size = self._row_bytes
            for low, high in zip(lows, highs, strict=True):
                out[low // size : high // size] = self._array.metadata.fill_value
            return
        buffers = [flat[low:high] for low, high in zip(lows, highs, strict=True)]
        done = os.preadv(descriptor, buffers, offset)
        if done == sum(highs) - sum(lows):
            return
        for buffer in buffers:  # a short read (rare on local files): the rest one by one
            if done < len(buffer):
                _read_exactly(descriptor, buffer[done:], offset + done)
            offset, done = offset + len(buffer), max(0, done - len(buffer))


class ReadCall(NamedTuple):
    """One ``preadv``: chunk ``chunk`` from byte ``offset`` on, into the destination's bytes
    ``lows[k]:highs[k]`` for each ``k`` (back to back in the file)."""

    chunk: int
    offset: int
    lows: list[int]
    highs: list[int]


IOV_MAX = 1024
"""Buffers per ``preadv`` call (Linux's limit)."""


def _merged(
    sources: np.ndarray, counts: np.ndarray, destinations: np.ndarray, parts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The segments (and their parts), empty ones left out and each merged with the next of
    its part where that one continues it both in the file and in the destination."""
    keep = counts > 0
    sources, counts, destinations, parts = (x[keep] for x in (sources, counts, destinations, parts))
    if not len(sources):
        return sources, counts, destinations, parts
    joins = (
        (sources[1:] == sources[:-1] + counts[:-1])
        & (destinations[1:] == destinations[:-1] + counts[:-1])
        & (parts[1:] == parts[:-1])
    )
    heads = np.flatnonzero(np.concatenate([[True], ~joins]))
    return sources[heads], np.add.reduceat(counts, heads), destinations[heads], parts[heads]


def _read_exactly(descriptor: int, target: memoryview, offset: int) -> None:
    """Fills ``target`` from the file at ``offset`` (reads may come back short)."""
    done = 0
    while done < len(target):
        count = os.preadv(descriptor, [target[done:]], offset + done)
        if count <= 0:
            raise RawChunkError(f"a raw chunk ended {len(target) - done} bytes early")
        done += count


__all__ = [
    "COMPRESSOR_SETTINGS",
    "IOV_MAX",
    "RAW_RATIO",
    "TRIAL_BYTES",
    "RawChunkError",
    "RawColumnReader",
    "ReadCall",
    "compressed_ratio",
    "compressor",
    "raw_files",
    "stores_raw",
    "with_codecs",
]
