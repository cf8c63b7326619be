"""Run directories: creating, resuming and replacing the folder a training run keeps its recipe,
``run.json``, checkpoints, logs, exports and ``eval.json`` in.

A run directory is never overwritten: a second run into it needs ``resume`` or ``force``, and
``force`` deletes only the files the run recorded writing (``run.json``'s ``written``). The
files are read in :mod:`emote_core.runs.record`; the layout and what ``force`` may remove of it
are in :mod:`emote_core.runs.ownership`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from emote_core import DISTRIBUTION
from emote_core.callbacks.checkpointing import list_checkpoints
from emote_core.errors import ConfigurationError
from emote_core.recipes.loading import recipe_from_dict, recipe_to_dict, recipe_to_toml
from emote_core.recipes.schema import Recipe
from emote_core.runs.ownership import (
    GROUP_STORES,
    LAYOUT_FOLDERS,
    LAYOUT_NAMES,
    check_replaceable_run,
    remove_entry,
)
from emote_core.runs.record import (
    RESUMABLE_SETTINGS,
    RUN_FILE_LIMIT,
    RUN_FORMAT,
    damaged,
    is_run,
    read_json_object,
    read_run_file,
    read_run_record,
)

RUNS_DIRECTORY = "runs"
# ``run.json``'s package names -> the distribution each version is read from ("emote" is
# installed as emote-toolkit; the key stays "emote", which is_run recognises older runs by).
_PACKAGES = {"emote": DISTRIBUTION} | {
    name: name for name in ("torch", "numpy", "gymnasium", "zarr", "onnx", "onnxruntime", "typer")
}


@dataclass(frozen=True)
class RunDirectory:
    """The paths of one run directory."""

    path: Path

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def exports(self) -> Path:
        return self.path / "exports"

    @property
    def memory_export(self) -> Path:
        """Live episodes, unless the recipe sets ``memory.store_episodes = false``."""
        return self.path / "memory_export"

    @property
    def recipe_file(self) -> Path:
        return self.path / "recipe.toml"

    @property
    def run_file(self) -> Path:
        return self.path / "run.json"

    @property
    def eval_file(self) -> Path:
        return self.path / "eval.json"

    def has_checkpoints(self) -> bool:
        return bool(list_checkpoints(self.path))

    def latest_checkpoint(self) -> Path | None:
        found = list_checkpoints(self.path)
        return found[-1][1] if found else None

    def read_eval(self) -> dict[str, Any]:
        """``eval.json`` as written by :meth:`write_eval` (``{}`` when there is none yet)."""
        return read_json_object(self.eval_file)

    def write_eval(self, report: dict[str, Any]) -> dict[str, Any]:
        """Appends ``report`` to ``eval.json`` atomically: it becomes the top level, and the
        last entry of ``history`` (see the module docstring).

        An ``eval.json`` from before histories (a report without ``history``) becomes the
        first entry. ``report`` gets a ``time`` (UTC, ISO 8601) when it has none.

        Returns:
            What was written.
        """
        entry = {key: value for key, value in report.items() if key != "history"}
        entry.setdefault("time", datetime.now(UTC).isoformat())
        previous = self.read_eval()
        history = previous.get("history")
        if not isinstance(history, list):
            history = [previous] if previous else []
        written = entry | {"history": [*history, entry]}
        _write_atomically(self.eval_file, json.dumps(written, indent=2) + "\n")
        return written


_RUN_STAMP = re.compile(r"\d{8}-\d{6}$")
"""The UTC timestamp that ends a default run directory's name."""


def default_run_path(recipe_name: str, env_id: str | None = None) -> Path:
    """``runs/<recipe>-<UTC timestamp>``: a new directory for every run; a recipe run on another
    environment than its own names it too (``runs/<recipe>-<env id>-<UTC timestamp>``, the id
    with every character but letters, digits, ``.``, ``_`` and ``-`` made ``_``)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if env_id:
        env = re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("._-")
        recipe_name = f"{recipe_name}-{env}" if env else recipe_name
    return Path(RUNS_DIRECTORY) / f"{recipe_name}-{stamp}"


def latest_run_path(recipe_name: str) -> Path | None:
    """The newest ``runs/<recipe>-*`` directory by the timestamp that ends its name (those
    without one count as oldest), for ``--resume`` without ``--run-dir``."""
    root = Path(RUNS_DIRECTORY)
    runs = [p for p in root.glob(f"{recipe_name}-*") if p.is_dir()] if root.is_dir() else []

    def newest_last(path: Path) -> tuple[str, str]:
        stamp = _RUN_STAMP.search(path.name)
        return (stamp.group(0) if stamp else "", path.name)

    return max(runs, key=newest_last) if runs else None


def check_resumable_run(path: Path) -> RunDirectory:
    """The run at ``path``, when it is an emote run with checkpoints to continue from.

    Raises:
        ConfigurationError: If it is not.
    """
    run = RunDirectory(Path(path))
    if not run.path.is_dir() or not is_run(run.path) or not run.has_checkpoints():
        raise ConfigurationError(
            f"`resume=True`: '{run.path}' holds no run with checkpoints to continue from"
        )
    return run


def run_recipe(run: RunDirectory) -> Recipe:
    """The recipe a run trains with now: its ``recipe.toml`` (never rewritten) with the changes
    that resumes recorded in ``run.json`` applied in order, its env's modules looked for where
    ``run.json``'s ``env`` record found them (``env_search_paths``).

    Raises:
        ConfigurationError: If the recipe is missing or does not load, or a module file the env
            record names moved or vanished (a changed one is a logged warning).
    """
    if not run.recipe_file.exists():  # a pipe or folder there: the read says "not a file"
        raise ConfigurationError(f"run '{run.path}' has no recipe.toml to continue with")
    raw = read_run_file(run.recipe_file)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as error:
        raise ConfigurationError(f"'{run.recipe_file}' is not valid TOML: {error}") from error
    data.setdefault("name", run.path.name)
    record = read_run_record(run.run_file)
    for start in record.get("starts", []):
        for key, (_, new) in (start.get("changes") or {}).items():
            _set_key(data, key, new, where=run.run_file)
    recipe = recipe_from_dict(data, source=str(run.recipe_file))
    env = record.get("env")
    if env is not None:
        from emote_core.env.making import EnvSource

        recipe.env_search_paths = EnvSource.from_record(env).search_paths
    return recipe


def resume_changes(current: Recipe, requested: Recipe, *, run_path: Path) -> dict[str, list[Any]]:
    """The settings ``requested`` changes against the run's ``current`` recipe, as
    ``{key: [old, new]}``.

    Raises:
        ConfigurationError: If it names another recipe or changes a key outside
            :data:`RESUMABLE_SETTINGS`, naming the keys and their values.
    """
    if requested.name != current.name:
        raise ConfigurationError(
            f"`resume=True`: run '{run_path}' trains recipe '{current.name}', not "
            f"'{requested.name}'; resume it with its own recipe (omit RECIPE) or start a new run"
        )
    before, after = _flatten(recipe_to_dict(current)), _flatten(recipe_to_dict(requested))
    changes = {
        key: [before.get(key), after.get(key)]
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }
    frozen = {k: v for k, v in changes.items() if not k.startswith(RESUMABLE_SETTINGS)}
    if frozen:
        shown = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in frozen.items())
        raise ConfigurationError(
            f"`resume=True`: {shown} would change what the checkpoints of '{run_path}' hold; a "
            "resumed run may change only bp_steps, log, checkpoint and export intervals, [eval] "
            "and [logging] — start a new run for the rest"
        )
    return changes


def run_steps(run: RunDirectory) -> int | None:
    """The total of updates the run's latest start asked for with ``--steps`` (``None``: the
    recipe's ``bp_steps``), which a resume without ``--steps`` keeps."""
    for start in reversed(read_run_record(run.run_file).get("starts", [])):
        if "steps" in start:
            return start["steps"]
    return None


def check_resume_inputs(
    run: RunDirectory, *, memory: list[str] | None, live: bool | None
) -> tuple[list[str], bool]:
    """The ``--memory`` stores and the mode of a resumed run. The stores are those it began with
    (its checkpoints count their episodes), which a resume may repeat but not change. ``live``
    ``None`` takes the mode of the run's latest start; a live run may go on from its memory
    alone (``False``), a run without live collection cannot start collecting.

    Raises:
        ConfigurationError: If they differ from the run's first start.
    """
    starts = read_run_record(run.run_file).get("starts") or [{}]
    first = starts[0]
    began_with = first.get("memory")
    if began_with is not None and memory and list(memory) != list(began_with):
        raise ConfigurationError(
            f"`resume=True`: run '{run.path}' trains from `memory` {began_with}, not "
            f"{list(memory)}; its checkpoints count the episodes of those stores — omit `memory` "
            "to reuse them"
        )
    if live is None:
        live = starts[-1].get("live", True)
    if first.get("live") is False and live:  # its checkpoints hold no collector to continue
        raise ConfigurationError(
            f"`resume=True` `live=True`: run '{run.path}' trains from stored memory only, so its "
            "checkpoints hold no collector to go on with; omit `live=True`, or start a new run"
        )
    return list(began_with if began_with is not None else memory or []), live


def run_follows(run: RunDirectory) -> bool:
    """Whether the run began following its ``--memory`` stores (``emote train --follow``): its
    checkpoints then pin what it read of them, and a resume follows on."""
    first = (read_run_record(run.run_file).get("starts") or [{}])[0]
    return bool(first.get("follow", False))


def prepare_run(
    path: Path,
    *,
    recipe: Recipe,
    command: list[str],
    resume: bool = False,
    force: bool = False,
    changes: dict[str, list[Any]] | None = None,
    memory: list[str] | None = None,
    live: bool = True,
    steps: int | None = None,
    follow: bool = False,
    inputs: list[str | Path] | None = None,
    env: dict[str, Any] | None = None,
) -> RunDirectory:
    """Creates (or reopens, for ``resume``) a run directory and records how the run started.

    A new run writes its resolved ``recipe.toml``; a resumed one leaves it as it is and records
    its ``changes`` (see :func:`resume_changes`) as a new entry of ``run.json``'s ``starts``.
    ``force`` first deletes the files an earlier run there wrote (:func:`check_replaceable_run`);
    ``inputs`` are the files the command reads (``memory`` counts too), which it never deletes.
    ``env`` is how the env was made (:func:`emote_core.env.making.env_record`), recorded by a new
    run as ``run.json``'s ``env``; a resumed run keeps the one it began with.

    Raises:
        ConfigurationError: For ``resume`` without a run holding checkpoints there, or an existing
            run directory without ``resume`` or ``force``, or one ``force`` may not clear.
        FormatError: If a run file there is not a readable file (see :func:`read_run_record`).
    """
    run = RunDirectory(Path(path))
    if run.path.exists() and not run.path.is_dir():
        raise ConfigurationError(
            f"run directory '{run.path}' is a file, not a folder; choose another `path`"
        )
    exists = run.path.exists() and any(run.path.iterdir())
    if resume and force:
        raise ConfigurationError(
            "`resume=True` and `force=True` contradict each other; pass one of them"
        )
    claimed: set[str] = set()
    if resume:
        check_resumable_run(run.path)
    elif exists:
        if not force:
            raise ConfigurationError(
                f"run directory '{run.path}' already exists; pass `resume=True` to continue it, "
                "`force=True` to delete it and start over, or choose another `path`"
            )
        doomed = check_replaceable_run(run.path, inputs=[*(inputs or []), *(memory or [])])
        claimed = set(read_run_record(run.run_file).get("written", [])) & set(LAYOUT_NAMES)
        for entry in doomed:
            remove_entry(entry)
        for name in LAYOUT_FOLDERS:  # emptied by the above: emote made them
            folder = run.path / name
            if name in claimed and folder.is_dir() and not folder.is_symlink():
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
    recipe_text = None if resume else recipe_to_toml(recipe)  # fails before anything is made
    fresh = not run.path.exists()
    if fresh:  # claimed atomically: what fails below removes only a directory this call made
        try:
            run.path.mkdir(parents=True)
        except FileExistsError:
            raise ConfigurationError(
                f"run directory '{run.path}' was created by another command just now; choose "
                "another `path`"
            ) from None
    if resume:  # what the run claimed, its groups' stores included
        claimed = {
            name
            for name in read_run_record(run.run_file).get("written", [])
            if name in LAYOUT_NAMES or GROUP_STORES.fullmatch(name)
        }
    # The names emote's layout may write that nobody holds yet are this run's from now on.
    claimed |= {name for name in LAYOUT_NAMES if not os.path.lexists(run.path / name)}
    try:
        _write_run_files(
            run, recipe, recipe_text, command, resume, changes, memory, live, steps, follow,
            written=sorted(claimed), env=env,
        )  # fmt: skip
    except BaseException:
        if fresh:
            shutil.rmtree(run.path, ignore_errors=True)
        raise
    return run


def _write_run_files(
    run: RunDirectory,
    recipe: Recipe,
    recipe_text: str | None,
    command: list[str],
    resume: bool,
    changes: dict[str, list[Any]] | None,
    memory: list[str] | None,
    live: bool,
    steps: int | None,
    follow: bool = False,
    written: list[str] | None = None,
    env: dict[str, Any] | None = None,
) -> None:
    for directory in (run.path, run.checkpoints, run.tensorboard, run.exports):
        directory.mkdir(parents=True, exist_ok=True)
    if recipe_text is not None:
        _write_atomically(run.recipe_file, recipe_text)
    record = read_run_record(run.run_file) if resume else {}
    start: dict[str, Any] = {
        "command": command,
        "seed": recipe.seed,
        "resume": resume,
        "time": datetime.now(UTC).isoformat(),
        "unix_time": time.time(),
        "memory": [str(m) for m in memory or []],
        "directory": os.getcwd(),  # where relative `memory` paths start
        "live": live,
        "steps": steps,
    }
    if follow:
        start["follow"] = True
    if resume:
        start["changes"] = changes or {}
    record.setdefault("starts", []).append(start)
    if env is not None and not resume:
        record["env"] = env
    record["format"] = RUN_FORMAT
    record["written"] = list(written or [])
    record["seed"] = recipe.seed
    record["python"] = platform.python_version()
    record["executable"] = sys.executable
    record["packages"] = {name: _version(dist) for name, dist in _PACKAGES.items()}
    _write_atomically(run.run_file, json.dumps(record, indent=2) + "\n")


def claim_entries(run: RunDirectory, names: Sequence[str]) -> None:
    """Adds ``names`` (top-level entries a run writes beyond the fixed layout, such as a group's
    ``memory_export.<group>`` store) to ``run.json``'s ``written``, so ``--force`` may remove
    them later. A name already claimed stays; a name that exists unclaimed is someone else's.

    Raises:
        ConfigurationError: If an unclaimed name is already taken in the run directory.
    """
    record = read_run_record(run.run_file)
    written = list(record.get("written", []))
    for name in names:
        if name in written:
            continue
        if os.path.lexists(run.path / name):
            raise ConfigurationError(
                f"'{run.path / name}' is not among the files '{run.run_file}' records as "
                "emote's, and this run would write into it; move it away or choose another "
                "`path`"
            )
        written.append(name)
    if written != record.get("written"):
        record["written"] = written
        _write_atomically(run.run_file, json.dumps(record, indent=2) + "\n")


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _set_key(data: dict[str, Any], key: str, value: Any, *, where: Path) -> None:
    *sections, leaf = key.split(".")
    for section in sections:
        data = data.setdefault(section, {})
        if not isinstance(data, dict):
            raise damaged(where, f"its change of '{key}' names no recipe table")
    if value is None:
        data.pop(leaf, None)
    else:
        data[leaf] = value


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


__all__ = [
    "LAYOUT_NAMES",
    "RESUMABLE_SETTINGS",
    "RUNS_DIRECTORY",
    "RUN_FILE_LIMIT",
    "RUN_FORMAT",
    "RunDirectory",
    "check_replaceable_run",
    "check_resumable_run",
    "check_resume_inputs",
    "claim_entries",
    "default_run_path",
    "is_run",
    "latest_run_path",
    "prepare_run",
    "read_run_record",
    "resume_changes",
    "run_follows",
    "run_recipe",
    "run_steps",
]
