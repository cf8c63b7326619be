"""Every memory format emote reads or writes, as one registry: detect, read, inspect, convert.

Each format is one :class:`MemoryFormat` entry (name -> detector, reader, writer).
:func:`detect_format` names the format of a path, URL or dataset id from its content (never by
unpickling anything); :func:`read_source` reads any source into a :class:`StoredTable` and checks
its episodes. Converting lives in :mod:`emote_core.integrations.convert`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from emote_core.errors import FormatError
from emote_core.stores.sources import (
    Reader,
    ReadOptions,
    Writer,
    check_episodes,
    length_key,
    read_store,
    write_store,
)
from emote_core.stores.stored import StoredTable


class Probe:
    """What detectors look at: the location and, each found once and only when asked, its first
    bytes, its zip members and the peers' verdict on it (which parses, never runs, a pickle).

    Args:
        location: A path, an fsspec URL or a dataset id.
    """

    def __init__(self, location: str) -> None:
        self.location = location
        self.path = Path(location)

    @cached_property
    def is_url(self) -> bool:
        return "://" in self.location

    @cached_property
    def exists(self) -> bool:
        return not self.is_url and self.path.exists()

    @cached_property
    def is_dir(self) -> bool:
        return self.exists and self.path.is_dir()

    @cached_property
    def head(self) -> bytes:
        if not self.exists or self.is_dir:
            return b""
        with self.path.open("rb") as file:
            return file.read(16)

    @cached_property
    def zip_members(self) -> set[str] | None:
        if not self.head.startswith(b"PK"):
            return None
        try:
            with zipfile.ZipFile(self.path) as archive:
                return set(archive.namelist())
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
            raise FormatError(
                f"'{self.location}' is not a readable zip archive ({error}); it is truncated or "
                "damaged"
            ) from error

    @property
    def is_pickle(self) -> bool:
        return self.head.startswith(b"\x80")

    @cached_property
    def peer_format(self) -> str | None:
        """The peer format (SB3, skrl, tmrl) of a file, or of a tmrl dataset folder, judged
        without unpickling it."""
        if not self.exists:
            return None
        from emote_core.integrations.detect import detect_peer_format

        return detect_peer_format(self.path)

    @cached_property
    def is_minari(self) -> bool:
        """A Minari dataset directory (holding ``data/metadata.json``), or its ``data/``."""
        return self.is_dir and any(
            (folder / "metadata.json").is_file() for folder in (self.path / "data", self.path)
        )


@dataclass(frozen=True)
class MemoryFormat:
    """One format in the registry.

    Attributes:
        name: What ``--from`` / ``--to`` call it.
        description: One line for help texts and reports.
        detect: Whether a probed location holds this format (``None``: never auto-detected).
        read: The reader (``None``: not a source).
        write: The writer (``None``: not a target).
        version: The format version reports show, when the format has one.
        target: What a destination is: ``"file"``, ``"directory"`` or ``"dataset"`` (an id).
    """

    name: str
    description: str
    detect: Callable[[Probe], bool] | None
    read: Reader | None
    write: Writer | None
    version: int | None = None
    target: str = "file"


def _call(module: str, function: str, *args: Any, **kwargs: Any) -> Any:
    """Calls a function of a module of this package, imported only now (torch stays unloaded)."""
    found = importlib.import_module(f"emote_core.integrations.{module}")
    return getattr(found, function)(*args, **kwargs)


def _is_zarr(probe: Probe) -> bool:
    if probe.is_url:
        return True
    return probe.is_dir and any((probe.path / name).is_file() for name in ("zarr.json", ".zgroup"))


def _has_member(name: str) -> Callable[[Probe], bool]:
    return lambda probe: probe.zip_members is not None and name in probe.zip_members


FORMATS: dict[str, MemoryFormat] = {}
"""Every format by name, in detection order (the first whose detector claims a source wins)."""


def register(memory_format: MemoryFormat) -> None:
    """Adds (or replaces) a format in :data:`FORMATS`."""
    FORMATS[memory_format.name] = memory_format


register(
    MemoryFormat(
        "zarr",
        "emote memory store (Zarr v3 directory or fsspec URL)",
        _is_zarr,
        read_store,
        write_store,
        version=1,
        target="directory",
    )
)
register(
    MemoryFormat(
        "emote-v1",
        "upstream emote V1 memory zip (version, configuration.json, <col>.npy)",
        _has_member("version"),
        lambda location, options: _call(
            "upstream", "read_memory_zip", location, "emote-v1", trust_pickle=options.trust_pickle
        ),
        lambda stored, destination, options: _call(
            "upstream.v1",
            "write_v1_stored",
            dataclasses.replace(stored, length_key=length_key(stored)),
            destination,
            source=options.source,
        ),
        version=1,
    )
)
register(
    MemoryFormat(
        "emote-legacy",
        "upstream emote Legacy memory zip (data.pickle, pickled <col>.npy)",
        _has_member("data.pickle"),
        lambda location, options: _call(
            "upstream",
            "read_memory_zip",
            location,
            "emote-legacy",
            trust_pickle=options.trust_pickle,
        ),
        None,
        version=0,
    )
)
for _name, _description, _module, _reader in (
    (
        "sb3-replay-buffer",
        "Stable-Baselines3 save_replay_buffer pickle",
        "sb3.replay_buffer",
        "read_sb3_replay_buffer",
    ),
    (
        "skrl-memory",
        "skrl / rofunc Memory.save export (.pt, .npz, .csv)",
        "skrl.reader",
        "read_skrl_memory",
    ),
    ("tmrl-dataset", "tmrl data.pkl dataset", "tmrl.dataset", "read_tmrl_dataset"),
):
    register(
        MemoryFormat(
            _name,
            _description,
            lambda probe, name=_name: probe.peer_format == name,
            lambda location, options, module=_module, reader=_reader: _call(
                module, reader, location, trust_pickle=options.trust_pickle
            ),
            None,
        )
    )
register(
    MemoryFormat(
        "legacy-pickle",
        "legacy emote .pickle dump (obs, next_obs, actions, rewards, dones)",
        None,  # the fallback for pickles no other format claims
        lambda location, options: _call(
            "upstream.legacy_pickle",
            "read_legacy_pickle",
            location,
            trust_pickle=options.trust_pickle,
        ),
        None,
    )
)
for _kind in ("npz", "pt", "csv"):
    register(
        MemoryFormat(
            _kind,
            f"skrl Memory.save export as .{_kind} (one env stream; skrl's Memory.load reads it)",
            None,
            None,
            lambda stored, destination, options, kind=_kind: _call(
                "skrl.writer", "write_skrl_memory", stored, destination, format=kind
            ),
        )
    )
register(
    MemoryFormat(
        "minari",
        "Minari dataset (a dataset id or directory; needs the optional 'minari' package)",
        lambda probe: probe.is_minari,
        lambda location, options: _call("minari.datasets", "read_minari", location),
        lambda stored, destination, options: _call(
            "minari.datasets", "write_minari", stored, destination, force=options.force
        ),
        target="dataset",
    )
)


def source_formats() -> list[str]:
    """Names of the formats that can be read."""
    return [name for name, f in FORMATS.items() if f.read is not None]


def target_formats() -> list[str]:
    """Names of the formats that can be written."""
    return [name for name, f in FORMATS.items() if f.write is not None]


def lookup_format(name: str, role: str) -> MemoryFormat:
    """The format ``name`` as a ``"source"`` or a ``"target"``.

    Raises:
        FormatError: If no format of that name can be read (or written).
    """
    names = source_formats() if role == "source" else target_formats()
    if name not in names:
        raise FormatError(f"'{name}' is not a {role} format emote knows; use one of {names}")
    return FORMATS[name]


# Detecting, reading and inspecting.


def detect_format(location: str | os.PathLike[str]) -> str:
    """The format of a source, from its content.

    Args:
        location: A file, a directory, an fsspec URL or a dataset id.

    Returns:
        A key of :data:`FORMATS`.

    Raises:
        FormatError: If nothing is there, the file is empty or damaged, or no format claims it.
    """
    text = os.fspath(location)
    probe = Probe(text)
    if not probe.is_url and not probe.exists:
        from emote_core.integrations.minari.datasets import dataset_id_problem

        if dataset_id_problem(text) is None:
            return "minari"
        raise FormatError(f"'{text}' does not exist; expected a memory file, store or dataset id")
    if not probe.is_url and not probe.is_dir and probe.path.stat().st_size == 0:
        raise FormatError(f"'{text}' is empty; it holds no memory")
    for memory_format in FORMATS.values():
        if memory_format.detect is not None and memory_format.detect(probe):
            return memory_format.name
    if probe.is_pickle:
        return "legacy-pickle"
    hint = f"name its format if it has one emote reads ({', '.join(source_formats())})"
    if probe.is_dir:
        raise FormatError(
            f"'{text}' is a directory but not an emote memory store (it has no zarr.json), a "
            f"Minari dataset, nor a tmrl dataset folder (a data.pkl of tmrl's lists); {hint}"
        )
    if probe.zip_members is not None:
        members = sorted(probe.zip_members)[:8]
        raise FormatError(f"'{text}' is a zip of no memory format emote knows ({members}); {hint}")
    raise FormatError(
        f"'{text}' is not in a memory format emote knows (it starts with {probe.head[:8]!r}); "
        f"{hint}"
    )


def read_source(
    location: str | os.PathLike[str],
    *,
    source_format: str | None = None,
    trust_pickle: bool = False,
    skip_damaged: bool = False,
) -> tuple[str, StoredTable]:
    """Reads any source emote knows into a :class:`StoredTable` and checks its episodes.

    Args:
        location: The source.
        source_format: Read it as this format instead of detecting it.
        trust_pickle: Unpickle without restrictions (runs the file's code).
        skip_damaged: Leave out damaged episodes of a store instead of refusing it.

    Returns:
        The format it was read as, and what it holds.

    Raises:
        FormatError: If the source is missing, damaged, of an unsupported version, or its
            episodes are inconsistent (column lengths that disagree).
        UnsafePickleError: If a pickle names a global outside the allowlist; nothing ran.
    """
    text = os.fspath(location)
    name = source_format or detect_format(text)
    reader = lookup_format(name, "source").read
    if reader is None:  # pragma: no cover - lookup_format returns only formats with a reader
        raise FormatError(f"'{name}' cannot be read")
    stored = reader(text, ReadOptions(trust_pickle=trust_pickle, skip_damaged=skip_damaged))
    check_episodes(stored)
    return name, stored


__all__ = [
    "FORMATS",
    "MemoryFormat",
    "Probe",
    "detect_format",
    "lookup_format",
    "read_source",
    "register",
    "source_formats",
    "target_formats",
]
