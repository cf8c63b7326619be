"""Minari datasets as a source and a target of emote's memory formats (the ``minari`` extra).

Reading gives a ``Box`` observation the column ``obs`` (a ``Dict`` of ``Box`` one column per
key), ``actions`` (``Discrete`` as int64 ``(1,)``) and ``rewards`` (float32 ``(1,)``); an episode
whose last step terminated is TERMINAL, any other INTERRUPTED. Writing records emote's schema,
spaces and episode ids (:class:`MinariRecordVersion`), so reading back gives the same table.
``minari`` is imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from emote_core import install_command
from emote_core.errors import ConfigurationError, EmoteError, FormatError, StorageError
from emote_core.integrations.minari.layout import (
    ACTIONS_KEY,
    METADATA,
    RECORD_KEY,
    REWARDS_KEY,
    MinariLayout,
    foreign_layout,
    plan_write,
)
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.provenance import REFERENCE_RETURNS, ReferenceReturns
from emote_core.stores.stored import ENVIRONMENT, EpisodeRecord, StoredTable

log = logging.getLogger(__name__)

FORMAT = "minari"
"""The :attr:`StoredTable.format` of what :func:`read_minari` returns."""
INSTALL_HINT = install_command("minari")
"""The pip command that adds the ``minari`` extra to this emote (a clone or the package index)."""

_EPISODE_ID = "emote_id"
_DATA_FORMATS = {"hdf5": "h5py", "arrow": "pyarrow", "parquet": "pyarrow"}
_DATASET_ID = re.compile(r"(?P<namespace>[-\w]+(?:/[-\w]+)*/)?[-\w]+?-v\d+")
_ID_RULE = (
    "Minari ids look like '(namespace/)name-v<version>', e.g. 'cartpole/random-v0': letters, "
    "digits, '_' and '-', '/' between non-empty namespace parts, and a '-v<integer>' suffix"
)


def _import_minari() -> Any:
    try:
        import minari
    except ImportError as error:
        raise FormatError(
            f"Minari datasets need the optional package 'minari', which cannot be imported "
            f"({error}); install it with {INSTALL_HINT}"
        ) from error
    return minari


def dataset_id_problem(dataset_id: Any) -> str | None:
    """Why ``dataset_id`` is not a valid Minari dataset id, or ``None`` if it is one."""
    match = _DATASET_ID.fullmatch(dataset_id) if isinstance(dataset_id, str) else None
    if match is None:
        return f"'{dataset_id}' is not a valid Minari dataset id; {_ID_RULE}"
    if match.group("namespace") is not None and len(match.group("namespace")) < 3:
        return f"'{dataset_id}' has a one-character namespace, which Minari rejects; {_ID_RULE}"
    return None


def datasets_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where local datasets live: ``root``, else ``$MINARI_DATASETS_PATH``, else
    ``~/.minari/datasets`` (Minari's own rule), made absolute: Minari's HDF5 backend joins a
    relative folder to itself."""
    if root is None:
        root = os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets"
    return Path(root).expanduser().absolute()


@contextlib.contextmanager
def _minari_errors(source: str, data_format: Any, error_type: type[EmoteError]) -> Iterator[None]:
    """Turns what Minari and its storage backends raise into one-line emote errors."""
    try:
        yield
    except EmoteError:
        raise
    except ImportError as error:
        raise FormatError(
            f"{source} is stored as {data_format!r}, which needs "
            f"{_DATA_FORMATS.get(data_format, 'a storage backend')} ({error}); install it with "
            f'{INSTALL_HINT} (HDF5) or pip install "minari[arrow]" (Arrow)'
        ) from error
    except (ValueError, KeyError, TypeError, IndexError, AssertionError, OSError) as error:
        verb = "cannot be read" if error_type is FormatError else "cannot be written"
        raise error_type(f"{source} {verb}: {type(error).__name__}: {error}") from error


def is_minari_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Minari dataset directory (or its ``data`` directory)."""
    path = Path(path)
    return (path / "data" / METADATA).is_file() or (
        path.name == "data" and (path / METADATA).is_file()
    )


def _locate(dataset: str | os.PathLike[str], root: str | os.PathLike[str] | None) -> Path:
    """The ``data`` directory of a dataset given by directory or by id."""
    candidate = Path(dataset)
    if isinstance(dataset, os.PathLike) or candidate.is_dir():
        if is_minari_dataset(candidate):
            return candidate if candidate.name == "data" else candidate / "data"
        if isinstance(dataset, os.PathLike) or dataset_id_problem(dataset) is not None:
            raise FormatError(
                f"'{dataset}' is not a Minari dataset: it has no data/{METADATA} — pass a "
                "dataset directory or a dataset id"
            )
    problem = dataset_id_problem(dataset)
    if problem is not None:
        raise FormatError(f"'{dataset}' is neither a Minari dataset directory nor an id: {problem}")
    base = datasets_root(root)
    data = base / str(dataset) / "data"
    if not (data / METADATA).is_file():
        raise FormatError(
            f"Minari dataset '{dataset}' is not under {base} (no {data / METADATA}); create or "
            f"download it (minari download {dataset}), or point root= / MINARI_DATASETS_PATH at "
            "where it lives"
        )
    return data


# Reading.


def read_minari(
    dataset_id_or_path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> StoredTable:
    """Reads a local Minari dataset as emote episodes; nothing is downloaded.

    Args:
        dataset_id_or_path: A dataset id (``"cartpole/random-v0"``) looked up under ``root``, or
            a dataset directory (the one holding ``data/``, or ``data/`` itself).
        root: Where datasets live; ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets`` if unset.

    Returns:
        Format ``"minari"``; episodes in dataset order with Minari's episode ids (or the ids
        emote wrote); spaces as :meth:`MDPSpace.to_json` writes them; metadata with
        ``dataset_id``, ``env_id``, ``total_steps``, ``total_episodes`` and the authorship.

    Raises:
        FormatError: If minari (or the dataset's backend) is not installed, the dataset is
            missing or damaged, its HDF5 datasets declare more than its size and the free
            memory allow (checked before reading), or it holds other than Box or flat
            Dict-of-Box observations and Box or Discrete actions.
    """
    minari = _import_minari()
    data_path = _locate(dataset_id_or_path, root)
    source = f"Minari dataset '{data_path.parent}'"
    try:
        raw = json.loads((data_path / METADATA).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise FormatError(f"{source} has an unreadable {METADATA} ({error})") from error
    if not isinstance(raw, dict):
        raise FormatError(f"{source}: {METADATA} holds a {type(raw).__name__}, not an object")
    written_by_emote = raw.get(RECORD_KEY) is not None
    with _minari_errors(source, raw.get("data_format"), FormatError):
        _charge_hdf5(data_path, AllocationBudget.for_path(data_path, source))
        dataset = minari.MinariDataset(data_path)
        if written_by_emote:
            layout = MinariLayout.from_record(raw[RECORD_KEY], dataset, source)
        else:
            layout = foreign_layout(dataset.observation_space, dataset.action_space, source)
        indices = [int(index) for index in dataset.episode_indices]
        ids = indices
        if written_by_emote:
            metas = dataset.storage.get_episode_metadata(indices)
            ids = [int(meta.get(_EPISODE_ID, i)) for meta, i in zip(metas, indices, strict=True)]
        episodes: list[EpisodeRecord] = []
        for identity, episode in zip(ids, dataset.iterate_episodes(indices), strict=True):
            episodes.append((identity, *layout.read_episode(episode, source)))
        spec = dataset.env_spec
        env_id = spec.id if spec is not None else None
    metadata = dict(layout.metadata)
    if spec is not None:
        metadata[ENVIRONMENT] = {
            "id": spec.id,
            "kwargs": dict(spec.kwargs),
            "max_episode_steps": spec.max_episode_steps,
        }
    metadata.update(
        dataset_id=raw.get("dataset_id"),
        env_id=env_id,
        total_episodes=len(episodes),
        total_steps=sum(len(data[layout.actions_key]) for _, data, _ in episodes),
        data_format=raw.get("data_format"),
        minari_version=raw.get("minari_version"),
    )
    for key in ("algorithm_name", "author", "author_email", "code_permalink", "description"):
        if key in raw:
            metadata[key] = raw[key]
    references = _reference_returns(raw, source)
    if references is not None:
        metadata[REFERENCE_RETURNS] = references
    return StoredTable(
        source=source,
        format=FORMAT,
        columns=layout.columns,
        episodes=episodes,
        length_key=layout.length_key,
        maxlen=layout.maxlen,
        spaces=layout.spaces,
        metadata=metadata,
    )


def _reference_returns(raw: dict[str, Any], source: str) -> dict[str, Any] | None:
    """The dataset's ``ref_min_score`` / ``ref_max_score`` as a store's reference returns
    (``None`` without both; unusable ones are left out with a warning)."""
    low, high = raw.get("ref_min_score"), raw.get("ref_max_score")
    if low is None or high is None:
        return None
    episodes = raw.get("num_episodes_average_score")
    over = f", means over {episodes} episodes" if isinstance(episodes, int) else ""
    try:
        references = ReferenceReturns(
            random=low, expert=high,
            source=f"ref_min_score and ref_max_score of Minari dataset "
            f"'{raw.get('dataset_id')}'{over}",
        )  # fmt: skip
    except ConfigurationError as error:
        log.warning("%s: its reference scores are left out (%s)", source, error)
        return None
    return references.to_attrs()


def _charge_hdf5(data_path: Path, budget: AllocationBudget) -> None:
    """Charges every HDF5 dataset's declared shape and dtype before Minari reads any of them."""
    files = sorted(data_path.glob("*.hdf5"))
    if not files:
        return
    import h5py

    for file in files:
        with h5py.File(file, "r") as handle:

            def charge(name: str, item: Any, file: Path = file) -> None:
                if isinstance(item, h5py.Dataset):
                    member = f"HDF5 dataset '{name}' in {file.name}"
                    budget.charge_array(member, tuple(item.shape), item.dtype)

            handle.visititems(charge)


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

    Observations (the state keys, or the columns one row longer than the actions) become a
    ``Box`` or a ``Dict``; TERMINAL episodes end with a termination, INTERRUPTED ones with a
    truncation; values keep their dtypes. The dataset appears under its name only when complete.

    Args:
        stored: What a reader returned (or a table's content).
        dataset_id: ``(namespace/)name-v<version>``, e.g. ``"cartpole/expert-v0"``.
        root: Where datasets live; ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets`` if unset.
        env_id: A registered gymnasium id to record as the dataset's environment; by default
            the one ``stored`` was recorded on, so ``recover_environment()`` rebuilds it.
        algorithm_name: What collected the data.
        author: The author(s).
        author_email: Their e-mail address(es).
        code_permalink: A link to the code that made the data.
        description: What the dataset holds.
        data_format: Minari's storage: ``"hdf5"`` (default), ``"arrow"`` or ``"parquet"``.
        actions_key: The column holding the actions.
        rewards_key: The column holding the rewards (one value per step).
        drop_columns: Columns to leave out (tags and per-step columns Minari has no place for).
        force: Replace an existing Minari dataset with this id.

    Returns:
        The dataset's directory, ``<root>/<dataset_id>``.

    Raises:
        ConfigurationError: If the id, data format, environment id, authors or dropped columns
            are invalid.
        FormatError: If minari is not installed, or the table does not fit Minari's layout.
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
    layout, observation_space, action_space = plan_write(
        stored, actions_key, rewards_key, drop_columns
    )
    metadata: dict[str, Any] = {
        "dataset_id": dataset_id,
        "algorithm_name": str(algorithm_name),
        "minari_version": minari.__version__,
        RECORD_KEY: layout.record(stored.source),
    }
    for key, names in (("author", author), ("author_email", author_email)):
        if names is not None:
            names = [names] if isinstance(names, str) else list(names)
            if not all(isinstance(name, str) for name in names):
                raise ConfigurationError(f"{key} must be a string or strings; got {names!r}")
            metadata[key] = set(names)
    for key, text in (("code_permalink", code_permalink), ("description", description)):
        if text is not None:
            metadata[key] = str(text)
    env_spec = _env_spec(env_id, stored.metadata.get(ENVIRONMENT), stored.source)
    buffers = [
        EpisodeBuffer(**layout.buffer(episode, stored.source)) for episode in stored.episodes
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    source = f"Minari dataset '{dataset_id}' at {target}"
    try:
        with _minari_errors(source, data_format, StorageError):
            storage = MinariStorage.new(
                staging / "data",
                observation_space=observation_space,
                action_space=action_space,
                env_spec=env_spec,
                data_format=data_format,
                jpeg_encoding=False,
            )
            storage.update_metadata(metadata)
            storage.update_episodes(buffers)
            if buffers:
                ids = [{_EPISODE_ID: int(identity)} for identity, _, _ in stored.episodes]
                storage.update_episode_metadata(ids, range(len(ids)))
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    parts = dataset_id.split("/")[:-1]  # Minari lists namespaces by their metadata files
    for depth in range(1, len(parts) + 1):
        marker = base.joinpath(*parts[:depth], "namespace_metadata.json")
        if not marker.exists():
            marker.write_text("{}", encoding="utf-8")
    log.info("wrote %d episodes to %s", len(buffers), source)
    return target


def _check_target(target: Path, dataset_id: str, force: bool) -> None:
    if not (target.exists() or target.is_symlink()):
        return
    if not force:
        raise StorageError(
            f"Minari dataset '{dataset_id}' already exists at {target}; pass `force=True` "
            "to replace it, or choose another id or version"
        )
    if not (target / "data" / METADATA).is_file():
        raise StorageError(
            f"{target} exists and is not a Minari dataset; emote does not replace it even with "
            "force — remove it yourself or choose another id"
        )


def _swap_into_place(staging: Path, target: Path) -> None:
    if not target.exists():
        staging.rename(target)
        return
    retired = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    target.rename(retired)
    try:
        staging.rename(target)
    except BaseException:
        retired.rename(target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _env_spec(env_id: str | None, recorded: Any = None, source: str = "") -> Any:
    """The spec of ``env_id``, else of the environment the source records (``{"id", "kwargs",
    "max_episode_steps"}``, with its settings), else ``None``."""
    import gymnasium

    if env_id is None:
        if not isinstance(recorded, dict) or not isinstance(recorded.get("id"), str):
            return None
        if ":" in recorded["id"]:  # made from a user's module, which stores never import
            log.warning(
                "%s was recorded on '%s', an env made from a user's module, which converting "
                "never imports; the dataset records no environment — pass env_id after "
                "importing the module that registers one",
                source,
                recorded["id"],
            )
            return None
        try:
            spec = gymnasium.spec(recorded["id"])
        except gymnasium.error.Error as error:
            log.warning(
                "%s was recorded on '%s', which is not registered here (%s); the dataset records "
                "no environment — pass env_id after importing the package that registers it",
                source,
                recorded["id"],
                error,
            )
            return None
        kwargs = recorded.get("kwargs") if isinstance(recorded.get("kwargs"), dict) else {}
        steps = recorded.get("max_episode_steps")
        return dataclasses.replace(
            spec,
            kwargs={**spec.kwargs, **kwargs},
            max_episode_steps=steps if isinstance(steps, int) else spec.max_episode_steps,
        )
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error as error:
        raise ConfigurationError(
            f"env_id '{env_id}' is not a registered gymnasium environment ({error}); import the "
            "package that registers it, or leave env_id out"
        ) from error


__all__ = [
    "FORMAT",
    "INSTALL_HINT",
    "dataset_id_problem",
    "datasets_root",
    "is_minari_dataset",
    "read_minari",
    "write_minari",
]
