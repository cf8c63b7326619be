"""Arrays of local stores read straight from their files, without zarr's event loop.

zarr-python reads every array through an asyncio loop on another thread. Opening a shard's
episode table that way (eight small arrays: metadata, then chunks) took 12-16 ms on a busy
2-core machine, most of it spent waiting on the loop, where reading the same files here takes
about 2 ms; opening a loaded store's three columns took another ~4 ms.

Only the layouts emote's writer makes are read here: zarr format 3, a regular chunk grid with
one chunk across the trailing axes, the ``bytes`` codec in native byte order alone or followed
by Blosc, no storage transformers. For anything else :func:`open_local` answers ``None``, and a
chunk that does not decode to exactly one chunk's bytes raises :class:`LocalReadError`: the
caller then reads through zarr, which reads the array or names the damage in its own words.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from emote_core.utils.files import open_regular_file


class LocalReadError(Exception):
    """A chunk that does not decode to one whole chunk: for zarr to read or name."""


def open_file(path: str | Path) -> tuple[int, os.stat_result]:
    """The file at ``path`` opened for reading, and its ``fstat``, refusing what is not a file:
    opening a named pipe put in a store would wait for a writer forever (hence ``O_NONBLOCK``),
    and a device may never end.

    Raises:
        FileNotFoundError: Nothing is there.
        FormatError: It is not a file (closed again).
    """
    return open_regular_file(path, rule="an emote memory store holds only files and folders")


def read_file(path: Path) -> bytes:
    """The bytes of the file at ``path`` (:func:`open_file`'s refusals).

    Raises:
        FileNotFoundError: Nothing is there.
        FormatError: It is not a file.
    """
    descriptor, _ = open_file(path)
    with open(descriptor, "rb") as file:  # closes the descriptor
        return file.read()


@dataclass(frozen=True)
class LocalArray:
    """A local array in one of the layouts this module reads (see :func:`open_local`).

    It answers ``path``, ``shape``, ``dtype`` and ``metadata`` as a zarr array does.
    """

    path: str
    """The array's path inside its store, as zarr's ``Array.path``."""
    directory: Path
    """The folder holding its ``zarr.json`` and chunks."""
    metadata: Any
    """Its parsed metadata: a :class:`PlainMetadata` or zarr's ``ArrayV3Metadata``."""
    dtype: np.dtype
    compressed: bool
    """Whether its chunks are Blosc-compressed (else raw bytes)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.metadata.shape)

    @property
    def chunk_rows(self) -> int:
        return int(self.metadata.chunk_grid.chunk_shape[0])

    def chunk_path(self, chunk: int) -> Path:
        """The file of the chunk holding rows ``chunk * chunk_rows`` onwards."""
        key = self.metadata.encode_chunk_key((chunk, *(0,) * (len(self.shape) - 1)))
        return self.directory / str(key)

    def read(self, low: int, high: int) -> np.ndarray:
        """Rows ``low:high``; a chunk without a file reads as the fill value, as in zarr.

        Raises:
            LocalReadError: A chunk does not decode to one whole chunk.
            OSError: A chunk file cannot be read.
        """
        rows, trailing = self.chunk_rows, self.shape[1:]
        chunk_bytes = rows * self.dtype.itemsize * int(np.prod(trailing, dtype=np.int64))
        out = np.empty((high - low, *trailing), dtype=self.dtype)
        for chunk in range(low // rows, -(-high // rows)):
            first, stop = max(low, chunk * rows), min(high, (chunk + 1) * rows)
            try:
                data = read_file(self.chunk_path(chunk))
            except FileNotFoundError:
                out[first - low : stop - low] = self.metadata.fill_value
                continue
            if self.compressed:
                data = _decompress(data, chunk_bytes, self.chunk_path(chunk))
            if len(data) != chunk_bytes:
                raise LocalReadError(
                    f"{self.chunk_path(chunk)} holds {len(data)} bytes, not a chunk's {chunk_bytes}"
                )
            values = np.frombuffer(data, dtype=self.dtype).reshape(rows, *trailing)
            out[first - low : stop - low] = values[first - chunk * rows : stop - chunk * rows]
        return out


def open_local(group: Any, path: str) -> LocalArray | None:
    """``group[path]`` as a :class:`LocalArray`, or ``None`` where it is not one: not on the
    local file system, no readable metadata, or a layout this module does not read."""
    from zarr.storage import LocalStore

    store = getattr(group, "store", None)
    if not isinstance(store, LocalStore):
        return None
    inside = "/".join(part for part in (str(getattr(group, "path", "")), path) if part)
    directory = Path(store.root) / inside
    try:
        document = json.loads(read_file(directory / "zarr.json"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    if document.get("zarr_format") != 3 or document.get("node_type") != "array":
        return None
    known = plain_metadata(document)
    if known is not None:
        return LocalArray(inside, directory, *known)
    from zarr.core.metadata import ArrayV3Metadata

    try:
        metadata = ArrayV3Metadata.from_dict(document)
        dtype = np.dtype(metadata.dtype.to_native_dtype())
    except Exception:  # anything zarr's parser refuses: zarr names it
        return None
    compressed = direct_codecs(metadata)
    if compressed is None:
        return None
    return LocalArray(inside, directory, metadata, dtype, compressed)


class _Grid(NamedTuple):
    chunk_shape: tuple[int, ...]


@dataclass(frozen=True)
class PlainMetadata:
    """An array's metadata in exactly the form emote's writer leaves it (see
    :func:`plain_metadata`), parsed without zarr: it answers what readers ask of zarr's
    ``ArrayV3Metadata`` (``shape``, ``chunk_grid.chunk_shape``, ``fill_value``,
    ``encode_chunk_key``). Parsed here an array takes ~0.08 ms, through zarr's parser ~0.23 ms:
    ~1.7 ms of opening a shard."""

    shape: tuple[int, ...]
    chunk_grid: _Grid
    fill_value: Any

    def encode_chunk_key(self, coords: tuple[int, ...]) -> str:
        """The chunk's key under the array (the default encoding, ``/`` between parts)."""
        return "/".join(["c", *map(str, coords)])


def plain_metadata(document: dict[str, Any]) -> tuple[PlainMetadata, np.dtype, bool] | None:
    """``(metadata, dtype, compressed)`` of an array's ``zarr.json`` where it has exactly the
    form emote's writer gives its arrays: a numeric data type; one regular chunk grid with one
    chunk across the trailing axes; the default chunk keys; the ``bytes`` codec (in native
    order) alone or then Blosc; no storage transformers. ``None`` for anything else, which
    zarr's own parser then reads, or refuses in its own words."""
    if set(document) - {"dimension_names"} != _PLAIN_KEYS:
        return None
    shape, name = document["shape"], document["data_type"]
    if not _sizes(shape, 0) or not _among(name, _NUMERIC) or document["storage_transformers"] != []:
        return None
    dtype = np.dtype(name)
    grid = document["chunk_grid"]
    settings = grid.get("configuration") if isinstance(grid, dict) else None
    chunks = settings.get("chunk_shape") if isinstance(settings, dict) else None
    if (
        grid != {"name": "regular", "configuration": {"chunk_shape": chunks}}
        or not _sizes(chunks, 1)
        or len(chunks) != len(shape)
        or chunks[1:] != shape[1:]
        or document["chunk_key_encoding"]
        != {"name": "default", "configuration": {"separator": "/"}}
        or not isinstance(document["attributes"], dict)
        or document.get("dimension_names") is not None
    ):
        return None
    codecs = document["codecs"]
    plain = {"name": "bytes"} if dtype.itemsize == 1 else {
        "name": "bytes", "configuration": {"endian": sys.byteorder}}  # fmt: skip
    if not isinstance(codecs, list) or not 1 <= len(codecs) <= 2 or codecs[0] != plain:
        return None
    if len(codecs) == 2 and not _blosc(codecs[1]):
        return None
    fill = _fill_value(document["fill_value"], dtype)
    if fill is None:
        return None
    metadata = PlainMetadata(tuple(shape), _Grid(tuple(chunks)), fill)
    return metadata, dtype, len(codecs) == 2


_PLAIN_KEYS = {"shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "codecs",
               "attributes", "zarr_format", "node_type", "storage_transformers"}  # fmt: skip
_NUMERIC = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
            "float16", "float32", "float64"}  # fmt: skip
_BLOSC_NAMES = {"lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib"}
_SHUFFLES = {"noshuffle", "shuffle", "bitshuffle"}


def _sizes(values: Any, least: int) -> bool:
    """Whether ``values`` is a non-empty list of ints of at least ``least``."""
    return (
        isinstance(values, list)
        and bool(values)
        and all(type(v) is int and v >= least for v in values)
    )


def _among(value: Any, names: set[str]) -> bool:
    """Whether ``value`` is one of ``names`` (any JSON value: a list or object is none)."""
    return isinstance(value, str) and value in names


def _blosc(codec: Any) -> bool:
    """Whether ``codec`` is a Blosc codec as zarr writes one (every setting valid)."""
    if not isinstance(codec, dict) or set(codec) != {"name", "configuration"}:
        return False
    settings = codec["configuration"]
    return (
        codec["name"] == "blosc"
        and isinstance(settings, dict)
        and set(settings) == {"typesize", "cname", "clevel", "shuffle", "blocksize"}
        and type(settings["typesize"]) is int
        and settings["typesize"] >= 1
        and _among(settings["cname"], _BLOSC_NAMES)
        and type(settings["clevel"]) is int
        and 0 <= settings["clevel"] <= 9
        and _among(settings["shuffle"], _SHUFFLES)
        and type(settings["blocksize"]) is int
        and settings["blocksize"] >= 0
    )


def _fill_value(value: Any, dtype: np.dtype) -> Any:
    """The fill value as a scalar of ``dtype`` where zarr's JSON gives it plainly (a bool for
    bool; an int in range for integers; a number or ``NaN``/``Infinity``/``-Infinity`` for
    floats), else ``None``."""
    if dtype.kind == "b":
        return dtype.type(value) if type(value) is bool else None
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        fits = type(value) is int and limits.min <= value <= limits.max
        return dtype.type(value) if fits else None
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    if isinstance(value, str):
        return dtype.type(special[value]) if value in special else None
    largest = float(np.finfo(dtype).max)
    if type(value) in (int, float) and np.isfinite(value) and abs(value) <= largest:
        return dtype.type(value)
    return None


def read_rows_locally(
    group: Any, paths: list[str], start: int, stop: int
) -> list[np.ndarray] | None:
    """Rows ``start:stop`` of each array at ``paths`` under ``group``, straight from their
    files; ``None`` where any is not a :class:`LocalArray`, holds fewer rows or does not read:
    the caller then reads them all through zarr, which reads them or names what is wrong."""
    found = []
    for path in paths:
        array = open_local(group, path)
        if array is None or array.shape[0] < stop:
            return None
        try:
            found.append(array.read(start, stop))
        except (OSError, LocalReadError):
            return None
    return found


def direct_codecs(metadata: Any) -> bool | None:
    """Whether an array of ``metadata`` has Blosc-compressed (``True``) or raw (``False``)
    chunks in a layout read straight from files; ``None`` where it has another layout."""
    from zarr.codecs import BloscCodec, BytesCodec
    from zarr.core.chunk_grids import RegularChunkGrid

    if getattr(metadata, "zarr_format", None) != 3 or metadata.storage_transformers:
        return None
    grid = metadata.chunk_grid
    if not isinstance(grid, RegularChunkGrid) or len(metadata.shape) < 1:
        return None
    if tuple(grid.chunk_shape[1:]) != tuple(metadata.shape[1:]):
        return None
    codecs = metadata.codecs
    if not codecs or not isinstance(codecs[0], BytesCodec) or len(codecs) > 2:
        return None
    endian = codecs[0].endian
    if endian is not None and getattr(endian, "value", endian) != sys.byteorder:
        return None
    if len(codecs) == 2 and not isinstance(codecs[1], BloscCodec):
        return None
    return len(codecs) == 2


def whole_chunks(array: Any, low: int, high: int) -> bool:
    """Whether every chunk file holding rows ``low:high`` of a local zarr array decodes to one
    whole chunk by its size (a raw chunk's file size, a Blosc chunk's header): what zarr's own
    pipeline requires, and the zarrs pipeline does not check when it decodes part of a chunk.
    ``False`` for an array not on the local file system or of a layout not read here.
    """
    from zarr.storage import LocalStore

    store = getattr(array, "store", None)
    metadata = getattr(array, "metadata", None)
    compressed = direct_codecs(metadata) if isinstance(store, LocalStore) else None
    if compressed is None:
        return False
    rows = int(metadata.chunk_grid.chunk_shape[0])
    expected = rows * array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    directory = Path(store.root) / array.path
    for chunk in range(low // rows, -(-high // rows)):
        key = metadata.encode_chunk_key((chunk, *(0,) * (len(array.shape) - 1)))
        try:
            descriptor, info = open_file(directory / str(key))
        except FileNotFoundError:
            continue  # fill values: zarr leaves such chunks unwritten
        except Exception:  # not a file: zarr names it
            return False
        with open(descriptor, "rb") as file:
            header = file.read(16) if compressed else b""
        if compressed:
            if _blosc_sizes(header) != (expected, info.st_size):
                return False
        elif info.st_size != expected:
            return False
    return True


def _blosc_sizes(header: bytes) -> tuple[int, int] | None:
    """A Blosc chunk's decompressed and compressed sizes from its 16-byte header (version, codec
    version, flags, type size, then little-endian uint32 decompressed, block and compressed
    sizes); ``None`` when the header is cut short."""
    if len(header) < 16:
        return None
    size, _, stored = np.frombuffer(header, dtype="<u4", count=3, offset=4).tolist()
    return size, stored


def _decompress(data: bytes, expected: int, where: Path) -> bytes:
    """A Blosc chunk's bytes: its header's size checked against ``expected`` before any
    allocation (a damaged header may claim gigabytes)."""
    from numcodecs import blosc

    sizes = _blosc_sizes(data)
    if sizes is None:
        raise LocalReadError(f"{where} is too short for a Blosc chunk")
    size, stored = sizes
    if size != expected or stored != len(data):
        raise LocalReadError(f"{where} holds {size} bytes, not a chunk's {expected}")
    try:
        return bytes(blosc.decompress(data))
    except Exception as error:  # damaged: zarr names it
        raise LocalReadError(f"{where} does not decompress ({error})") from error


__all__ = [
    "LocalArray",
    "LocalReadError",
    "PlainMetadata",
    "direct_codecs",
    "open_local",
    "plain_metadata",
    "read_rows_locally",
    "whole_chunks",
]
