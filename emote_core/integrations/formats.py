"""Every memory format emote reads or writes, as one registry: detect, read, inspect, convert.

Each format is one :class:`MemoryFormat` entry (name -> detector, reader, writer). ``emote memory
inspect`` and ``emote memory convert`` work only through this registry:

- :func:`detect_format` names the format of a path, URL or dataset id from its content (never by
  unpickling anything): Zarr stores by their ``zarr.json``, zips by their members, pickles by the
  globals they name, peer files by the peers' own detector.
- :func:`read_source` reads any source into a :class:`StoredTable` and checks its episodes.
- Converting a source into a target lives in :mod:`emote_core.stores.convert`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import FormatError
from emote_core.stores.agents import AGENTS, record_agents, shard_agents
from emote_core.stores.provenance import Provenance
from emote_core.stores.stored import ENVIRONMENT, StoredTable
from emote_core.stores.summary import REWARD_COLUMNS
from emote_core.stores.zarr_store.tables import BATCH_BYTES

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
"""Called with (episodes written, episodes in all) while a target is written."""


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
        from emote_core.stores.peers import detect_peer_format

        return detect_peer_format(self.path)

    @cached_property
    def is_minari(self) -> bool:
        """A Minari dataset directory (holding ``data/metadata.json``), or its ``data/``."""
        return self.is_dir and any(
            (folder / "metadata.json").is_file() for folder in (self.path / "data", self.path)
        )


@dataclass(frozen=True)
class WriteOptions:
    """What a writer gets besides the episodes and the destination.

    Attributes:
        source: Where the episodes came from (``{"format", "sha256", "path"}``), recorded where
            the target has room.
        force: Replace an existing destination (writers that place it themselves: datasets).
        progress: Called with (episodes written, episodes in all) between batches.
        provenance: Who writes, recorded where the target has room (emote-memory stores).
    """

    source: dict[str, Any]
    force: bool = False
    progress: Progress | None = None
    provenance: Provenance | None = None


@dataclass(frozen=True)
class ReadOptions:
    """What a reader gets besides the location.

    Attributes:
        trust_pickle: Unpickle without restrictions (runs the file's code).
        skip_damaged: Leave out episodes that fail their checks instead of refusing the source
            (formats that can check their episodes: emote-memory stores).
    """

    trust_pickle: bool = False
    skip_damaged: bool = False


Reader = Callable[[str, ReadOptions], StoredTable]
"""``(location, options) -> StoredTable``."""
Writer = Callable[[StoredTable, str, WriteOptions], object]
"""``(stored, destination, options)``: writes exactly ``destination``."""


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
    found = importlib.import_module(f"emote_core.stores.{module}")
    return getattr(found, function)(*args, **kwargs)


def _read_zip(location: str, kind: str, trust_pickle: bool) -> StoredTable:
    from emote_core.stores.upstream import _open_zip, detect_version
    from emote_core.stores.upstream.legacy_zip import read_legacy_zip
    from emote_core.stores.upstream.v1 import VERSION, read_v1
    from emote_core.stores.upstream.versions import TableSerializationVersion

    source = f"memory file '{location}'"
    with _open_zip(Path(location)) as archive:
        if kind == "emote-legacy":
            return read_legacy_zip(archive, source=source, trust_pickle=trust_pickle)
        if VERSION in archive.namelist():
            version = detect_version(archive, source=source)
            if version != TableSerializationVersion.V1:
                raise FormatError(f"{source} is a {version.name} zip, not V1; drop --from")
        return read_v1(archive, source=source)


def _read_zarr(location: str, options: ReadOptions) -> StoredTable:
    from emote_core.stores.zarr_store import MemoryStore

    store = MemoryStore(location)
    stored = store.read(skip_damaged=options.skip_damaged)
    environment = _recorded_environment(store)
    if environment is not None:
        stored.metadata[ENVIRONMENT] = environment
    agents = _recorded_agents(store)
    if agents is not None:
        stored.metadata[AGENTS] = agents
    return stored


def _recorded_agents(store: Any) -> dict[str, Any] | None:
    """The agents and groups of a store collected on a multi-agent env, when every shard records
    the same (episode ids name their agent by that record, so a copy that keeps the ids keeps
    the agents); ``None`` for single-agent stores, with a warning where the shards differ."""
    import json

    records = {
        json.dumps(shard_agents(dict(shard.group.attrs)), sort_keys=True) for shard in store.shards
    }
    if len(records) > 1:
        log.warning(
            "store '%s' has shards of different agents (or multi-agent and single-agent ones); "
            "the copy keeps no agent or group of its episodes",
            store.url,
        )
        return None
    return json.loads(records.pop()) if records else None


def _recorded_environment(store: Any) -> dict[str, Any] | None:
    """The one environment a store records (its env id, the settings its sessions' recipes
    made it with), or ``None`` where it records none, or several ids or settings."""
    import json
    import tomllib

    from emote_core.stores.provenance import recorded_env_ids, shard_sessions

    shards = [dict(shard.group.attrs) for shard in store.shards]
    ids = recorded_env_ids(store.attributes, shards)
    if len(ids) != 1:
        return None
    settings: dict[str, dict[str, Any]] = {}
    for attributes in shards:
        for _, record in shard_sessions(attributes, where=f"store '{store.url}'"):
            if record.recipe_toml is None or record.env_id not in (None, ids[0]):
                continue
            try:
                env = tomllib.loads(record.recipe_toml).get("env")
            except tomllib.TOMLDecodeError:
                continue
            if not isinstance(env, dict):
                continue
            kwargs = env.get("kwargs") if isinstance(env.get("kwargs"), dict) else {}
            steps = env.get("max_episode_steps")
            steps = steps if isinstance(steps, int) else None
            made = {"kwargs": kwargs, "max_episode_steps": steps}
            settings[json.dumps(made, sort_keys=True, default=str)] = made
    if len(settings) > 1:
        log.warning("store '%s' was collected with different env settings", store.url)
        return None
    made = next(iter(settings.values()), {"kwargs": {}, "max_episode_steps": None})
    return {"id": ids[0], **made}


def _write_zarr(stored: StoredTable, destination: str, options: WriteOptions) -> None:
    from emote_core.stores.zarr_store import ShardWriter, create_store, store_columns
    from emote_core.stores.zarr_store.tables import batches

    key = length_key(stored)
    first = stored.episodes[0] if stored.episodes else None
    observation_like = [c.name for c in stored.columns if c.name.startswith("obs")]
    columns = store_columns(stored.columns, first, key, observation_like)
    create_store(
        destination,
        columns=columns,
        length_key=key,
        spaces=stored.spaces,
        source=options.source,
        overwrite=True,
        virtual=[c for c in stored.columns if not c.stored],
    )
    written = 0
    with ShardWriter(destination, provenance=options.provenance) as writer:
        if stored.metadata.get(AGENTS) is not None:  # read from a multi-agent emote store
            record_agents(writer.group, stored.metadata[AGENTS])
        for batch in batches(stored.episodes, BATCH_BYTES):
            writer.append(batch)
            written += len(batch)
            if options.progress is not None and written < len(stored.episodes):
                options.progress(written, len(stored.episodes))


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
        _read_zarr,
        _write_zarr,
        version=1,
        target="directory",
    )
)
register(
    MemoryFormat(
        "emote-v1",
        "upstream emote V1 memory zip (version, configuration.json, <col>.npy)",
        _has_member("version"),
        lambda location, options: _read_zip(location, "emote-v1", options.trust_pickle),
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
        lambda location, options: _read_zip(location, "emote-legacy", options.trust_pickle),
        None,
        version=0,
    )
)
for _name, _description in (
    ("sb3-replay-buffer", "Stable-Baselines3 save_replay_buffer pickle"),
    ("skrl-memory", "skrl / rofunc Memory.save export (.pt, .npz, .csv)"),
    ("tmrl-dataset", "tmrl data.pkl dataset"),
):
    register(
        MemoryFormat(
            _name,
            _description,
            lambda probe, name=_name: probe.peer_format == name,
            lambda location, options, name=_name: _call(
                "peers", "read_peer_file", location, name, trust_pickle=options.trust_pickle
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
                "peers", "write_skrl_memory", stored, destination, format=kind
            ),
        )
    )
register(
    MemoryFormat(
        "minari",
        "Minari dataset (a dataset id or directory; needs the optional 'minari' package)",
        lambda probe: probe.is_minari,
        lambda location, options: _call("peers.minari_io", "read_minari", location),
        lambda stored, destination, options: _call(
            "peers.minari_io", "write_minari", stored, destination, force=options.force
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


def _lookup(name: str, role: str) -> MemoryFormat:
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
        from emote_core.stores.peers.minari_io import dataset_id_problem

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
    reader = _lookup(name, "source").read
    if reader is None:  # pragma: no cover - _lookup returns only formats with a reader
        raise FormatError(f"'{name}' cannot be read")
    stored = reader(text, ReadOptions(trust_pickle=trust_pickle, skip_damaged=skip_damaged))
    check_episodes(stored)
    return name, stored


def length_key(stored: StoredTable) -> str:
    """The column that counts a source's transitions: its own, or the first action/reward one.

    Raises:
        FormatError: If the source records none and has no column named like actions or rewards.
    """
    if stored.length_key is not None:
        return stored.length_key
    names = [c.name for c in stored.columns if c.stored]
    for candidate in ("actions", "action", *REWARD_COLUMNS):
        if candidate in names:
            return candidate
    raise FormatError(
        f"{stored.source} records no length key and has no actions or rewards column "
        f"(columns: {names}); it cannot be split into transitions"
    )


def check_episodes(stored: StoredTable) -> None:
    """Checks that every episode holds every stored column with consistent lengths.

    A per-step column holds ``N`` or ``N + 1`` rows for an episode of ``N`` transitions (the
    same choice in every episode); a tag column one value.

    Raises:
        FormatError: Naming the source, the episode and the column that disagree.
    """
    if not stored.episodes:
        return
    key = length_key(stored)
    extra: dict[str, int] = {}
    for identity, data, _ in stored.episodes:
        if key not in data:
            raise FormatError(f"{stored.source}: episode {identity} has no '{key}' column")
        length = len(data[key])
        for column in stored.columns:
            if not column.stored:
                continue
            value = data.get(column.name)
            if value is None:
                raise FormatError(
                    f"{stored.source}: episode {identity} has no '{column.name}' column"
                )
            if column.kind == "TagColumn":
                continue
            rows = len(value) - length
            expected = extra.setdefault(column.name, rows if rows in (0, 1) else 1)
            if rows != expected:
                raise FormatError(
                    f"{stored.source}: column lengths disagree in episode {identity}: "
                    f"'{column.name}' has {len(value)} rows for {length} transitions of '{key}' "
                    f"(expected {length + expected}); the file is damaged"
                )


def check_finite(stored: StoredTable) -> None:
    """Refuses NaN and infinities in a source's float columns (observations, actions, rewards).

    Training on them makes every loss NaN, so a conversion keeps them only when asked.

    Raises:
        FormatError: Naming the first column that holds any, how many values in how many
            episodes, and the first episode and row.
    """
    for column in stored.columns:
        if not column.stored or column.dtype.kind not in "fc":
            continue
        count = episodes = 0
        first: tuple[int, int] | None = None
        for identity, data, _ in stored.episodes:
            values = np.asarray(data[column.name])
            bad = ~np.isfinite(values)
            found = int(bad.sum())
            if not found:
                continue
            count, episodes = count + found, episodes + 1
            if first is None:
                rows = bad.reshape(len(values), -1).any(axis=1) if values.ndim else bad[None]
                first = identity, int(np.flatnonzero(rows)[0])
        if first is not None:
            raise FormatError(
                f"{stored.source}: column '{column.name}' holds {count:,} non-finite values "
                f"(NaN or inf) in {episodes:,} episode(s), the first in episode {first[0]} at row "
                f"{first[1]}; training on them turns losses into NaN — repair the source, or "
                "pass allow_nonfinite=True (--allow-nonfinite) to keep them"
            )


__all__ = [
    "BATCH_BYTES",
    "FORMATS",
    "MemoryFormat",
    "Probe",
    "ReadOptions",
    "check_episodes",
    "check_finite",
    "detect_format",
    "length_key",
    "read_source",
    "register",
    "source_formats",
    "target_formats",
]
