"""skrl's ``.csv`` memory layout, read and written in chunks of rows.

The header names every tensor component (``name.0``, ``name.1``, ...); each further line is one
row of the flattened ``(memory_size * num_envs, size)`` view, values as Python prints them:
``True``/``False``, integers, and floats as ``repr`` (the shortest text that reads back to the
same double, so float32 and float64 values survive exactly). Shapes and dtypes are not recorded:
a tensor reads back flat, as bool when every value is ``True``/``False``, int64 when every value
is an integer, float32 when every other number is a float32, else float64.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections.abc import Iterable

import numpy as np

from emote_core.errors import FormatError
from emote_core.integrations.streams import rows_flat

CHUNK_ROWS = 65_536
"""Rows converted at a time, so memory stays near the size of the arrays themselves."""

_HEADER_FIELD = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.(?P<index>\d+)$")
_INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
_BOOLS = ("True", "False")


def _groups(header: list[str], source: str) -> dict[str, list[int]]:
    """Tensor name -> the header columns of its components, in order."""
    groups: dict[str, list[int]] = {}
    for column, field in enumerate(header):
        match = _HEADER_FIELD.match(field.strip())
        if match is None:
            raise FormatError(
                f"{source}: header field {field!r} is not of the form 'name.index'; this is not "
                "a skrl memory .csv"
            )
        components = groups.setdefault(match["name"], [])
        if int(match["index"]) != len(components):
            raise FormatError(
                f"{source}: header field {field!r} is out of order; skrl writes name.0, name.1, ..."
            )
        components.append(column)
    return groups


class _Tensor:
    """One tensor's parsed chunks; its kind is set by the first value and widened if needed."""

    def __init__(self, name: str, source: str) -> None:
        self.name, self.source = name, source
        self.kind: str | None = None
        self.chunks: list[np.ndarray] = []

    def add(self, cells: list[tuple[str, ...]]) -> None:
        """Adds one chunk: ``cells`` holds one tuple of strings per component."""
        if self.kind is None:
            first = cells[0][0].strip()
            self.kind = "bool" if first in _BOOLS else "int" if _INTEGER.match(first) else "float"
        if self.kind == "bool":
            text = np.array(cells, dtype=str).T
            if not np.isin(np.char.strip(text), _BOOLS).all():
                raise FormatError(
                    f"{self.source}: tensor '{self.name}' mixes True/False with numbers"
                )
            self.chunks.append(np.char.strip(text) == "True")
            return
        if self.kind == "int":
            try:
                self.chunks.append(np.array(cells, dtype=np.int64).T)
                return
            except (ValueError, OverflowError):  # a non-integer further down: all floats then
                self.kind = "float"
                self.chunks = [chunk.astype(np.float64) for chunk in self.chunks]
        try:
            self.chunks.append(np.array(cells, dtype=np.float64).T)
        except ValueError as error:
            raise FormatError(
                f"{self.source}: tensor '{self.name}' holds a non-number ({error})"
            ) from error

    def array(self, size: int) -> np.ndarray:
        if not self.chunks:
            return np.zeros((0, size), dtype=np.float32)
        values = np.concatenate(self.chunks)
        if self.kind != "float":
            return values
        narrow = values.astype(np.float32)
        exact = (narrow.astype(np.float64) == values) | np.isnan(values)
        return narrow if bool(exact.all()) else values


def read_csv_tensors(data: bytes, source: str) -> dict[str, np.ndarray]:
    """A skrl ``.csv`` export's tensors, each ``(rows, size)``.

    Raises:
        FormatError: If the text is not UTF-8, the header is not skrl's, a line has the wrong
            number of values (a truncated file), or a value is not a number.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FormatError(f"{source} is neither a zip nor UTF-8 text ({error})") from error
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        raise FormatError(f"{source} has no header line; a skrl memory .csv starts with one")
    groups = _groups(header, source)
    tensors = {name: _Tensor(name, source) for name in groups}
    line = 1
    while True:
        rows = [row for row in itertools.islice(reader, CHUNK_ROWS) if row]
        if not rows:
            break
        for row in rows:
            line += 1
            if len(row) != len(header):
                raise FormatError(
                    f"{source}: a line near line {line} has {len(row)} values, the header "
                    f"{len(header)} (a truncated or damaged file)"
                )
        columns = list(zip(*rows, strict=True))
        for name, indices in groups.items():
            tensors[name].add([columns[i] for i in indices])
    return {name: tensor.array(len(groups[name])) for name, tensor in tensors.items()}


def write_csv_tensors(tensors: dict[str, np.ndarray], file: io.TextIOBase) -> None:
    """Writes ``(rows, ...)`` tensors in skrl's ``.csv`` layout, in the dict's order."""
    writer = csv.writer(file)
    flat = [rows_flat(array) for array in tensors.values()]
    writer.writerow(
        [
            f"{name}.{i}"
            for name, array in zip(tensors, flat, strict=True)
            for i in range(array.shape[1])
        ]
    )
    rows = len(flat[0]) if flat else 0
    for start in range(0, rows, CHUNK_ROWS):
        # tolist() gives Python bools, ints and floats; csv writes them with str(), which for
        # floats is repr(): the shortest text that reads back to the same value.
        parts = [array[start : start + CHUNK_ROWS].tolist() for array in flat]
        writer.writerows(_joined(parts))


def _joined(parts: list[list[list[object]]]) -> Iterable[list[object]]:
    for pieces in zip(*parts, strict=True):
        yield [value for piece in pieces for value in piece]


__all__ = ["CHUNK_ROWS", "read_csv_tensors", "write_csv_tensors"]
