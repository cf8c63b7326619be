"""Minari datasets as a source and a target of emote's memory formats (optional extra).

A Minari dataset is a directory ``<root>/<dataset id>/data/`` holding ``metadata.json`` (spaces,
environment spec, counts) and the episodes in HDF5 or Arrow files. An episode of ``N`` steps has
``N + 1`` observations and ``N`` actions, rewards, terminations and truncations: emote's layout.

Reading gives a ``Box`` observation the column ``obs`` and a ``Dict`` of ``Box`` observations one
column per key; actions become ``actions`` (a ``Box`` as it is, a ``Discrete`` choice as int64 of
shape ``(1,)``) and rewards ``rewards`` (float32 of shape ``(1,)``, as emote's tables hold them).
An episode whose last step terminated is TERMINAL; otherwise (truncated, or cut without a flag) it
is INTERRUPTED.

Writing stores the observation columns (one as a ``Box``, several as a ``Dict``), the actions and
the rewards without JPEG re-encoding, and records emote's schema, spaces, episode ids and tag
values in the dataset's metadata (:data:`EMOTE_RECORD_KEY`, per-episode ``emote_id`` and
``emote_tag.<i>``), so reading the dataset back gives the same table; Minari ignores those keys.

``minari`` is imported inside the functions only; it comes with ``pip install "emote[minari]"``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Collection, Iterable, Iterator
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError, EmoteError, FormatError, StorageError
from emote_core.memory.formats.stored import COLUMN_KINDS, ColumnSchema, EpisodeRecord, StoredTable
from emote_core.spaces import BoxSpace, DiscreteSpace, MDPSpace
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)

FORMAT = "minari"
"""The :attr:`StoredTable.format` of what :func:`read_minari` returns."""

INSTALL_HINT = 'pip install "emote[minari]"'
METADATA_FILE = "metadata.json"
NAMESPACE_FILE = "namespace_metadata.json"
EMOTE_RECORD_KEY = "emote_table"
"""The key of emote's record in a written dataset's ``metadata.json``."""
OBSERVATION_KEY, ACTIONS_KEY, REWARDS_KEY = "obs", "actions", "rewards"
"""The columns of datasets emote did not write: a Box observation, the actions, the rewards."""

_EPISODE_ID = "emote_id"
_TAG_PREFIX = "emote_tag."
_DATA_FORMATS = ("hdf5", "arrow", "parquet")
_BACKENDS = {"hdf5": "h5py", "arrow": "pyarrow", "parquet": "pyarrow"}
_DATASET_ID = re.compile(r"(?P<namespace>[-\w]+(?:/[-\w]+)*/)?(?P<name>[-\w]+?)-v(?P<version>\d+)")
_ID_RULE = (
    "Minari dataset ids look like '(namespace/)name-v<version>', e.g. 'cartpole/random-v0': "
    "letters, digits, '_' and '-', '/' between non-empty namespace parts, a '-v<integer>' suffix"
)


class MinariRecordVersion(IntEnum):
    """The layout of the record emote keeps in the Minari datasets it writes."""

    V1 = 1
    """``metadata.json`` key ``emote_table``: ``version``, ``columns`` (``[name, kind, {shape,
    dtype, target_name, mapper}]``), ``observation_keys``, ``actions_key``, ``rewards_key``,
    ``tag_keys``, ``length_key``, ``maxlen``, ``spaces``, ``format`` and ``metadata`` of the
    written table; per episode, ``emote_id`` and ``emote_tag.<i>`` (the i-th tag's value)."""

    LATEST = V1


def _import_minari() -> Any:
    try:
        import minari
    except ImportError as error:
        raise FormatError(
            f"Minari datasets need the optional package 'minari', which cannot be imported "
            f"({error}); install it with {INSTALL_HINT}"
        ) from error
    return minari


def dataset_id_problem(dataset_id: str) -> str | None:
    """Why ``dataset_id`` is not a Minari dataset id, or ``None`` when it is one."""
    match = _DATASET_ID.fullmatch(dataset_id) if isinstance(dataset_id, str) else None
    if match is None:
        return f"'{dataset_id}' is not a valid Minari dataset id; {_ID_RULE}"
    namespace = match.group("namespace")
    if namespace is not None and len(namespace) < 3:  # Minari wants namespaces of 2+ characters
        return f"'{dataset_id}' has a one-character namespace, which Minari rejects; {_ID_RULE}"
    return None


def datasets_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where local Minari datasets live: ``root``, else ``$MINARI_DATASETS_PATH``, else
    ``~/.minari/datasets`` (Minari's own rule)."""
    if root is not None:
        return Path(root)
    configured = os.environ.get("MINARI_DATASETS_PATH")
    return Path(configured) if configured else Path.home() / ".minari" / "datasets"


def _locate(dataset: str | os.PathLike[str], root: str | os.PathLike[str] | None) -> Path:
    """The ``data`` directory of a dataset given by directory or by id."""
    candidate = Path(dataset)
    if isinstance(dataset, os.PathLike) or candidate.is_dir():
        for data in (candidate / "data", candidate):
            if (data / METADATA_FILE).is_file():
                return data
        if isinstance(dataset, os.PathLike) or dataset_id_problem(str(dataset)) is not None:
            raise FormatError(
                f"'{dataset}' is not a Minari dataset: it has no data/{METADATA_FILE} — pass a "
                "dataset directory or a dataset id"
            )
    problem = dataset_id_problem(str(dataset))
    if problem is not None:
        raise FormatError(f"'{dataset}' is neither a Minari dataset directory nor an id: {problem}")
    base = datasets_root(root)
    data = base / str(dataset) / "data"
    if not (data / METADATA_FILE).is_file():
        raise FormatError(
            f"Minari dataset '{dataset}' is not under {base} (no {data / METADATA_FILE}); create "
            f"or download it (minari download {dataset}), or point root= / MINARI_DATASETS_PATH "
            "at where it lives"
        )
    return data


@contextlib.contextmanager
def _minari_errors(source: str, data_format: str | None, error_type: type[EmoteError]) -> Iterator:
    """Turns what Minari and its backends raise into one-line emote errors."""
    try:
        yield
    except EmoteError:
        raise
    except ImportError as error:
        backend = _BACKENDS.get(data_format or "", "its storage backend")
        raise FormatError(
            f"{source} is stored as {data_format!r}, which needs {backend} ({error}); install it "
            f'with {INSTALL_HINT} (HDF5) or pip install "minari[arrow]" (Arrow)'
        ) from error
    except (ValueError, KeyError, TypeError, IndexError, AssertionError, OSError) as error:
        verb = "cannot be read" if error_type is FormatError else "cannot be written"
        raise error_type(f"{source} {verb}: {type(error).__name__}: {error}") from error


# Reading.


def read_minari(
    dataset_id_or_path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> StoredTable:
    """Reads a local Minari dataset as emote episodes.

    Args:
        dataset_id_or_path: A dataset id (``"cartpole/random-v0"``), looked up under ``root``; or
            a dataset directory (the one holding ``data/``, or ``data/`` itself).
        root: Where datasets live; ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets`` if unset.
            Nothing is ever downloaded.

    Returns:
        Format ``"minari"``; episodes in dataset order, identified by their Minari episode ids
        (or the ids emote wrote); spaces as :meth:`MDPSpace.to_json` writes them; metadata with
        ``dataset_id``, ``env_id``, ``total_steps``, ``total_episodes`` and the authorship.

    Raises:
        FormatError: If minari (or the dataset's backend) is not installed, the dataset is
            missing or damaged, or its spaces are not Box / flat Dict-of-Box observations with
            Box or Discrete actions.
    """
    minari = _import_minari()
    data_path = _locate(dataset_id_or_path, root)
    source = f"Minari dataset '{data_path.parent}'"
    raw = _raw_metadata(data_path, source)
    data_format = raw.get("data_format")
    with _minari_errors(source, data_format, FormatError):
        dataset = minari.MinariDataset(data_path)
        layout = read_layout(dataset.observation_space, dataset.action_space, source=source)
        indices = [int(i) for i in dataset.episode_indices]
        record = _parse_record(raw.get(EMOTE_RECORD_KEY), source)
        extras = None
        if record is not None:
            extras = _episode_extras(dataset.storage.get_episode_metadata(indices), record, source)
            if extras is None:
                record = None
        episodes: list[EpisodeRecord] = []
        for position, episode in enumerate(dataset.iterate_episodes(indices)):
            arrays, end_state = _episode_arrays(episode, layout.observation_keys, source)
            if record is None or extras is None:
                episodes.append((int(episode.id), layout.to_emote(arrays), end_state))
            else:
                identity, tags = extras[position]
                episodes.append((identity, _to_record(arrays, tags, record, source), end_state))
        env_id = dataset.env_spec.id if dataset.env_spec is not None else None
    steps = sum(len(data[ACTIONS_KEY if record is None else record["actions_key"]])
                for _, data, _ in episodes)  # fmt: skip
    metadata = dict(record["metadata"]) if record is not None else {}
    metadata.update(
        dataset_id=raw.get("dataset_id"), env_id=env_id, total_steps=steps,
        total_episodes=len(episodes), data_format=data_format,
        minari_version=raw.get("minari_version"),
    )  # fmt: skip
    for key in ("algorithm_name", "author", "author_email", "code_permalink", "description"):
        if key in raw:
            metadata[key] = raw[key]
    if record is None:
        return StoredTable(
            source=source, format=FORMAT, columns=layout.columns, episodes=episodes,
            length_key=REWARDS_KEY, spaces=layout.spaces, metadata=metadata,
        )  # fmt: skip
    return StoredTable(
        source=source, format=FORMAT, columns=record["columns"], episodes=episodes,
        length_key=record["length_key"], maxlen=record["maxlen"], spaces=record["spaces"],
        metadata=metadata,
    )  # fmt: skip


def _raw_metadata(data_path: Path, source: str) -> dict[str, Any]:
    try:
        raw = json.loads((data_path / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise FormatError(f"{source} has an unreadable {METADATA_FILE} ({error})") from error
    if not isinstance(raw, dict):
        raise FormatError(f"{source}: {METADATA_FILE} holds a {type(raw).__name__}, not an object")
    return raw


def _episode_arrays(
    episode: Any, observation_keys: list[str] | None, source: str
) -> tuple[dict[str, np.ndarray], EpisodeState]:
    """One Minari episode as raw arrays under Minari's names, checked for emote's layout."""
    steps = len(episode.rewards)
    where = f"{source}, episode {episode.id}"
    if steps == 0:
        raise FormatError(f"{where} has no steps; emote episodes hold at least one transition")
    observations = episode.observations
    if observation_keys is None:
        arrays = {OBSERVATION_KEY: np.asarray(observations)}
    else:
        arrays = {key: np.asarray(observations[key]) for key in observation_keys}
    arrays[ACTIONS_KEY] = np.asarray(episode.actions)
    arrays[REWARDS_KEY] = np.asarray(episode.rewards)
    terminations = np.asarray(episode.terminations, dtype=bool).reshape(-1)
    truncations = np.asarray(episode.truncations, dtype=bool).reshape(-1)
    for name, array in arrays.items():
        rows = steps if name in (ACTIONS_KEY, REWARDS_KEY) else steps + 1
        if array.ndim == 0 or len(array) != rows:
            raise FormatError(
                f"{where}: '{name}' has {0 if array.ndim == 0 else len(array)} rows for {steps} "
                f"steps; Minari episodes hold N + 1 observations and N of everything else"
            )
    if len(terminations) != steps or len(truncations) != steps:
        raise FormatError(
            f"{where} has {len(terminations)} terminations and {len(truncations)} truncations "
            f"for {steps} steps; they must match"
        )
    terminal = bool(terminations[-1])
    return arrays, EpisodeState.TERMINAL if terminal else EpisodeState.INTERRUPTED


def _parse_record(raw: Any, source: str) -> dict[str, Any] | None:
    """emote's record in a dataset it wrote, checked; ``None`` for other datasets."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("version"), int):
        log.warning("%s has a malformed '%s' record; reading it as plain Minari", source,
                    EMOTE_RECORD_KEY)  # fmt: skip
        return None
    if raw["version"] > MinariRecordVersion.LATEST:
        log.warning("%s was written by a newer emote (record version %s, this emote reads up to "
                    "%d); reading it as plain Minari", source, raw["version"],
                    MinariRecordVersion.LATEST)  # fmt: skip
        return None
    try:
        columns = [_column_from_json(entry) for entry in raw["columns"]]
        names = {column.name: column for column in columns}
        record = {
            "columns": columns,
            "observation_keys": [str(k) for k in raw["observation_keys"]],
            "actions_key": str(raw["actions_key"]),
            "rewards_key": str(raw["rewards_key"]),
            "tag_keys": [str(k) for k in raw["tag_keys"]],
            "length_key": raw.get("length_key"),
            "maxlen": raw.get("maxlen"),
            "spaces": raw.get("spaces"),
            "metadata": dict(raw.get("metadata") or {}),
        }
        mapped = [*record["observation_keys"], record["actions_key"], record["rewards_key"]]
        if any(names.get(k) is None or names[k].kind != "Column" for k in mapped) or any(
            names.get(k) is None or names[k].kind != "TagColumn" for k in record["tag_keys"]
        ):
            raise ValueError("columns and mapped keys disagree")
    except (KeyError, TypeError, ValueError) as error:
        raise FormatError(
            f"{source} has a damaged '{EMOTE_RECORD_KEY}' record ({error}); remove the key from "
            f"{METADATA_FILE} to read the dataset as plain Minari"
        ) from error
    return record


def _column_from_json(entry: Any) -> ColumnSchema:
    name, kind, config = entry
    if not isinstance(name, str) or kind not in COLUMN_KINDS or not isinstance(config, dict):
        raise ValueError(f"column entry {str(entry)[:80]} is not [name, kind, {{shape, dtype}}]")
    dtype = np.dtype(config["dtype"])
    if dtype.hasobject:
        raise ValueError(f"column '{name}' has an object dtype")
    shape = tuple(int(s) for s in config["shape"])
    mapper = config.get("mapper")
    return ColumnSchema(name, kind, shape, dtype, config.get("target_name"),
                        mapper if isinstance(mapper, dict) else None)  # fmt: skip


def _column_to_json(column: ColumnSchema) -> list[Any]:
    config: dict[str, Any] = {"shape": list(column.shape), "dtype": column.dtype.str}
    if column.kind == "VirtualColumn":
        config.update(target_name=column.target_name, mapper=column.mapper)
    return [column.name, column.kind, config]


def _episode_extras(
    metadatas: Iterable[dict[str, Any]], record: dict[str, Any], source: str
) -> list[tuple[int, dict[str, Any]]] | None:
    """Each episode's emote id and tag values, or ``None`` if some episode lacks them."""
    extras = []
    tag_count = len(record["tag_keys"])
    for metadata in metadatas:
        keys = [_EPISODE_ID, *(f"{_TAG_PREFIX}{i}" for i in range(tag_count))]
        if any(key not in metadata for key in keys):
            log.warning("%s has episodes without emote's ids or tags (added by another tool?); "
                        "reading it as plain Minari", source)  # fmt: skip
            return None
        tags = {name: metadata[f"{_TAG_PREFIX}{i}"] for i, name in enumerate(record["tag_keys"])}
        extras.append((int(metadata[_EPISODE_ID]), tags))
    return extras


def _to_record(
    arrays: dict[str, np.ndarray], tags: dict[str, Any], record: dict[str, Any], source: str
) -> dict[str, np.ndarray]:
    """Raw Minari arrays renamed and shaped back into the columns emote wrote."""
    keys = record["observation_keys"]
    renamed = {record["actions_key"]: arrays[ACTIONS_KEY], record["rewards_key"]: arrays[REWARDS_KEY]}
    if OBSERVATION_KEY in arrays and len(keys) == 1 and keys[0] not in arrays:
        renamed[keys[0]] = arrays[OBSERVATION_KEY]
    else:
        renamed.update({key: arrays[key] for key in keys})
    renamed.update(tags)
    columns = {column.name: column for column in record["columns"]}
    data = {}
    for name, value in renamed.items():
        column = columns[name]
        array = np.asarray(value)
        rows = () if column.kind == "TagColumn" else (len(array),)
        if array.size != int(np.prod((*rows, *column.shape))):
            raise FormatError(
                f"{source}: '{name}' holds {array.shape} values; emote's record says each step "
                f"is {column.describe()} — the dataset was changed after emote wrote it"
            )
        data[name] = array.reshape(*rows, *column.shape).astype(column.dtype, copy=False)
    return data


# Writing.


def write_minari(
    stored: StoredTable,
    dataset_id: str,
    *,
    root: str | os.PathLike[str] | None = None,
    env_id: str | None = None,
    algorithm_name: str = "emote",
    author: str | Collection[str] | None = None,
    author_email: str | Collection[str] | None = None,
    code_permalink: str | None = None,
    description: str | None = None,
    data_format: str = "hdf5",
    actions_key: str = ACTIONS_KEY,
    rewards_key: str = REWARDS_KEY,
    drop_columns: Collection[str] = (),
    force: bool = False,
) -> Path:
    """Writes ``stored``'s episodes as a local Minari dataset that ``minari.load_dataset`` opens.

    Observations are the spaces' state keys (or, without spaces, every per-step column other
    than the actions and rewards); one key is stored as a ``Box``, several as a ``Dict``. A
    :class:`~emote_core.spaces.DiscreteSpace` action becomes ``Discrete(n)``. TERMINAL episodes
    end with a termination, INTERRUPTED ones with a truncation. The dataset is built under a
    hidden temporary name and renamed into place when complete.

    Args:
        stored: What a reader returned (or a table's content).
        dataset_id: ``(namespace/)name-v<version>``, e.g. ``"cartpole/expert-v0"``.
        root: Where datasets live; ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets`` if unset.
        env_id: A registered gymnasium id to record as the dataset's environment.
        algorithm_name: What collected the data.
        author: The author(s).
        author_email: Their e-mail address(es).
        code_permalink: A link to the code that made the data.
        description: A description of the dataset.
        data_format: Minari's storage: ``"hdf5"`` (default), ``"arrow"`` or ``"parquet"``.
        actions_key: The column holding the actions.
        rewards_key: The column holding the rewards (one value per step).
        drop_columns: Columns to leave out (per-step columns Minari has no place for).
        force: Replace an existing Minari dataset with this id.

    Returns:
        The dataset's directory (``<root>/<dataset_id>``).

    Raises:
        ConfigurationError: If the id, data format, environment id or authors are invalid.
        FormatError: If minari is not installed, or the table cannot be expressed in Minari's
            layout (no actions, extra per-step columns, unsupported dtypes, broken episodes).
        StorageError: If the dataset exists (without ``force``) or cannot be written.
    """
    minari = _import_minari()
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    if "jpeg_encoding" not in inspect.signature(MinariStorage.new).parameters:
        raise FormatError(
            f"minari {minari.__version__} re-encodes image observations as JPEG (lossy); emote "
            f"writes Minari datasets with minari >= 0.5.4 — upgrade: {INSTALL_HINT}"
        )
    problem = dataset_id_problem(dataset_id)
    if problem is not None:
        raise ConfigurationError(problem)
    if data_format not in _DATA_FORMATS:
        raise ConfigurationError(
            f"Minari data format {data_format!r} is unknown; use one of {list(_DATA_FORMATS)}"
        )
    base = datasets_root(root)
    target = base / dataset_id
    _check_target(target, dataset_id, force)
    plan = plan_write(stored, actions_key, rewards_key, drop_columns)
    metadata = _dataset_metadata(stored, plan, dataset_id, algorithm_name, author, author_email,
                                 code_permalink, description, minari.__version__)  # fmt: skip
    env_spec = _env_spec(env_id)
    buffers, extras = [], []
    for episode in stored.episodes:
        buffer, extra = plan.episode(episode)
        buffers.append(EpisodeBuffer(**buffer))
        extras.append(extra)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".emote-tmp",
                                    dir=target.parent))  # fmt: skip
    source = f"Minari dataset '{dataset_id}' at {target}"
    try:
        with _minari_errors(source, data_format, StorageError):
            storage = MinariStorage.new(
                staging / "data", observation_space=plan.observation_space,
                action_space=plan.action_space, env_spec=env_spec, data_format=data_format,
                jpeg_encoding=False,
            )  # fmt: skip
            storage.update_metadata(metadata)
            storage.update_episodes(buffers)
            if extras:
                storage.update_episode_metadata(extras, range(len(extras)))
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _mark_namespaces(base, dataset_id)
    log.info("wrote %d episodes to %s", len(buffers), source)
    return target


def _check_target(target: Path, dataset_id: str, force: bool) -> None:
    if not (target.exists() or target.is_symlink()):
        return
    if not force:
        raise StorageError(
            f"Minari dataset '{dataset_id}' already exists at {target}; pass force=True "
            "(--force) to replace it, or choose another id or version"
        )
    if not (target / "data" / METADATA_FILE).is_file():
        raise StorageError(
            f"{target} exists and is not a Minari dataset; emote does not replace it even with "
            "force — remove it yourself or choose another id"
        )


def _swap_into_place(staging: Path, target: Path) -> None:
    if not target.exists():
        staging.rename(target)
        return
    retired = target.with_name(f".{target.name}.emote-old-{uuid.uuid4().hex[:8]}")
    target.rename(retired)
    try:
        staging.rename(target)
    except BaseException:
        retired.rename(target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _mark_namespaces(base: Path, dataset_id: str) -> None:
    """Gives each namespace directory of the id the metadata file Minari lists namespaces by."""
    parts = dataset_id.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        marker = base.joinpath(*parts[:depth], NAMESPACE_FILE)
        if not marker.exists():
            marker.write_text("{}", encoding="utf-8")


def _env_spec(env_id: str | None) -> Any:
    if env_id is None:
        return None
    import gymnasium

    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error as error:
        raise ConfigurationError(
            f"env_id '{env_id}' is not a registered gymnasium environment ({error}); import the "
            "package that registers it, or leave env_id out"
        ) from error


def _names(value: str | Collection[str] | None, what: str) -> list[str] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(name, str) for name in names):
        raise ConfigurationError(f"{what} must be a string or strings; got {value!r}")
    return names


def _dataset_metadata(
    stored: StoredTable, plan: WritePlan, dataset_id: str, algorithm_name: str,
    author: str | Collection[str] | None, author_email: str | Collection[str] | None,
    code_permalink: str | None, description: str | None, minari_version: str,
) -> dict[str, Any]:  # fmt: skip
    record = {
        "version": int(MinariRecordVersion.LATEST),
        "columns": [_column_to_json(column) for column in plan.columns],
        "observation_keys": plan.observation_keys,
        "actions_key": plan.actions_key,
        "rewards_key": plan.rewards_key,
        "tag_keys": plan.tag_keys,
        "length_key": stored.length_key,
        "maxlen": stored.maxlen,
        "spaces": stored.spaces,
        "format": stored.format,
        "metadata": stored.metadata,
    }
    try:  # Minari writes metadata.json with plain json: make numpy values plain first.
        record = json.loads(json.dumps(record, default=_plain))
    except (TypeError, ValueError) as error:
        raise FormatError(
            f"{stored.source}: its metadata or spaces are not JSON-compatible ({error})"
        ) from error
    metadata: dict[str, Any] = {
        "dataset_id": dataset_id,
        "algorithm_name": str(algorithm_name),
        "minari_version": minari_version,
        EMOTE_RECORD_KEY: record,
    }
    for key, value in (("author", author), ("author_email", author_email)):
        names = _names(value, key)
        if names is not None:
            metadata[key] = set(names)
    for key, text in (("code_permalink", code_permalink), ("description", description)):
        if text is not None:
            metadata[key] = str(text)
    return metadata


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


__all__ = [
    "EMOTE_RECORD_KEY",
    "FORMAT",
    "INSTALL_HINT",
    "MinariRecordVersion",
    "dataset_id_problem",
    "datasets_root",
    "read_minari",
    "write_minari",
]
