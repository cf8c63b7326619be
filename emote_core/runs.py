"""Run directories: where a training run keeps its recipe, checkpoints, logs and results.

::

    <run_dir>/
      recipe.toml        the resolved recipe (loads back with `emote train <run_dir>/recipe.toml`)
      run.json           the exact command, the seed used, package versions, start times
      checkpoints/       checkpoint_<bp_step>.tar
      tensorboard/       event files
      exports/           ONNX exports
      memory_export/     live episodes (an emote-memory store), when the recipe stores them
      eval.json          the last evaluation

A run directory is never overwritten: a second run into it needs ``resume`` (continue from its
latest checkpoint) or ``force`` (delete it and start over).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from emote_core import DISTRIBUTION
from emote_core.callbacks.checkpointing import list_checkpoints
from emote_core.errors import ConfigurationError
from emote_core.recipes.loading import recipe_to_toml
from emote_core.recipes.schema import Recipe

RUNS_DIRECTORY = "runs"
RUN_FORMAT = "emote-run"
"""The ``format`` entry of every ``run.json`` emote writes."""
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
        """Live episodes, when the recipe stores them (``memory.store_episodes``)."""
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

    def write_eval(self, report: dict[str, Any]) -> None:
        """Writes ``eval.json`` atomically."""
        temporary = self.eval_file.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, self.eval_file)


def default_run_path(recipe_name: str) -> Path:
    """``runs/<recipe>-<UTC timestamp>``: a new directory for every run."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path(RUNS_DIRECTORY) / f"{recipe_name}-{stamp}"


def latest_run_path(recipe_name: str) -> Path | None:
    """The newest ``runs/<recipe>-*`` directory, for ``--resume`` without ``--run-dir``."""
    root = Path(RUNS_DIRECTORY)
    runs = sorted(p for p in root.glob(f"{recipe_name}-*") if p.is_dir()) if root.is_dir() else []
    return runs[-1] if runs else None


def prepare_run(
    path: Path,
    *,
    recipe: Recipe,
    command: list[str],
    resume: bool = False,
    force: bool = False,
) -> RunDirectory:
    """Creates (or reopens, for ``resume``) a run directory and records how the run started.

    Raises:
        ConfigurationError: For ``resume`` without a run holding checkpoints there, or an existing
            run directory without ``resume`` or ``force``.
    """
    run = RunDirectory(Path(path))
    exists = run.path.exists() and any(run.path.iterdir())
    if resume and force:
        raise ConfigurationError("--resume and --force contradict each other; pass one of them")
    if resume:
        if not exists or not run.has_checkpoints():
            raise ConfigurationError(
                f"--resume: '{run.path}' holds no run with checkpoints to continue from"
            )
    elif exists:
        if not force:
            raise ConfigurationError(
                f"run directory '{run.path}' already exists; pass --resume to continue it, "
                "--force to delete it and start over, or choose another --run-dir"
            )
        check_replaceable_run(run.path)
        shutil.rmtree(run.path)
    for directory in (run.path, run.checkpoints, run.tensorboard, run.exports):
        directory.mkdir(parents=True, exist_ok=True)
    run.recipe_file.write_text(recipe_to_toml(recipe), encoding="utf-8")
    record = _read_json(run.run_file) if resume else {}
    record.setdefault("starts", []).append(
        {
            "command": command,
            "seed": recipe.seed,
            "resume": resume,
            "time": datetime.now(UTC).isoformat(),
            "unix_time": time.time(),
        }
    )
    record["format"] = RUN_FORMAT
    record["seed"] = recipe.seed
    record["python"] = platform.python_version()
    record["executable"] = sys.executable
    record["packages"] = {name: _version(dist) for name, dist in _PACKAGES.items()}
    run.run_file.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return run


def is_run(path: Path) -> bool:
    """Whether ``path`` is an emote run directory: its ``run.json`` is emote's (tagged
    ``format = "emote-run"``, or, as runs before the tag wrote it, with ``starts`` and the
    ``packages`` emote records)."""
    record = _read_json(path / "run.json")
    if record.get("format") == RUN_FORMAT:
        return True
    packages = record.get("packages")
    return (
        isinstance(record.get("starts"), list)
        and isinstance(packages, dict)
        and ("emote" in packages)
    )


def check_replaceable_run(path: Path) -> None:
    """``--force`` deletes a run and nothing else.

    Raises:
        ConfigurationError: If ``path`` is a link, the working directory or one of its parents,
            not an emote run, or a directory that holds other runs — nothing is touched.
    """
    if path.is_symlink():
        raise ConfigurationError(f"--force: '{path}' is a symbolic link; it replaces no links")
    resolved, here = path.resolve(), Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        raise ConfigurationError(
            f"--force: '{path}' is the working directory or holds it; it replaces only a run "
            "directory — choose another --run-dir"
        )
    if not is_run(path):
        raise ConfigurationError(
            f"--force: '{path}' is not an emote run (no run.json of emote's in it); it replaces "
            "only a run directory, never other files — choose another --run-dir"
        )
    nested = [p for p in path.rglob("run.json") if p.parent != path and is_run(p.parent)]
    if nested:
        raise ConfigurationError(
            f"--force: '{path}' holds other runs ({nested[0].parent}); it replaces one run at a "
            "time — choose another --run-dir"
        )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


__all__ = [
    "RUNS_DIRECTORY",
    "RUN_FORMAT",
    "RunDirectory",
    "check_replaceable_run",
    "default_run_path",
    "is_run",
    "latest_run_path",
    "prepare_run",
]
