"""What a run writes at its top level (the layout), and what ``force`` may therefore remove:
only the entries ``run.json``'s ``written`` claims, inside them only names emote's layout
produces, never the directory itself, an unclaimed file, or an input of the command."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from emote_core.errors import ConfigurationError, FormatError
from emote_core.runs.record import is_run, read_run_record
from emote_core.stores.zarr_store.layout import FORMAT_NAME as STORE_FORMAT
from emote_core.utils.files import read_regular_file

LAYOUT_FILES = ("recipe.toml", "run.json", "eval.json")
LAYOUT_FOLDERS = {  # what emote writes inside each folder of the layout, by name
    "checkpoints": re.compile(
        r"checkpoint_\d+\.tar|best\.tar|checkpoint_\d+\.tar\.damaged-\d+"
        r"|\.(checkpoint_\d+|best)\..+\.tmp"
    ),
    "tensorboard": re.compile(r"events\.out\.tfevents\..+"),
    "exports": re.compile(
        r"(policy|savedmodel)_\d+\.onnx|latest\.onnx"
        r"|\.[0-9a-f]{32}\.tmp\.onnx|\.latest\.onnx\.[0-9a-f]{32}\.tmp"
    ),
    "wandb": re.compile(
        r"(offline-)?run-\d{8}_\d{6}-[0-9a-z]+|latest-run|debug(-internal|-cli\..+)?\.log"
    ),
}
LAYOUT_STORES = ("memory_export",)
GROUP_STORES = re.compile(r"memory_export\.[^/\\]+")
"""The memory export of a run of several agent groups: a store per group,
``memory_export.<group>``, each claimed by its name in ``written`` when the run makes it
(:func:`emote_core.runs.claim_entries`)."""
LAYOUT_NAMES = (*LAYOUT_FILES, *LAYOUT_FOLDERS, *LAYOUT_STORES)
"""The names a run may write at its top level; ``run.json``'s ``written`` lists those it claimed."""


def check_replaceable_run(path: Path, *, inputs: list[str | Path] | None = None) -> list[Path]:
    """What ``--force`` deletes of the run at ``path``: the entries its ``run.json`` lists as
    ``written`` that emote's layout names (see the module docstring). Nothing is deleted here.

    Raises:
        ConfigurationError: If ``path`` is a link, the working directory or one of its parents,
            not an emote run, a directory that holds other runs, or holds one of ``inputs``
            (local paths the command reads); if its record lists nothing it wrote, or an entry
            of emote's layout there is not the run's (the new run would write into it).
    """
    if path.is_symlink():
        raise ConfigurationError(f"`force=True`: '{path}' is a symbolic link; it replaces no links")
    resolved, here = path.resolve(), Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        raise ConfigurationError(
            f"`force=True`: '{path}' is the working directory or holds it; it replaces only a run "
            "directory — choose another `path`"
        )
    for given in inputs or []:
        if "://" in str(given):
            continue  # a URL: never inside a local run directory
        inside = Path(given).resolve()
        if inside == resolved or resolved in inside.parents:
            raise ConfigurationError(
                f"`force=True`: the input '{given}' lies inside run directory '{path}', which "
                "`force=True` would clear; move it out of the run directory or choose another "
                "`path`"
            )
    if not is_run(path):
        raise ConfigurationError(
            f"`force=True`: '{path}' is not an emote run (no run.json of emote's in it); it "
            "replaces only a run directory, never other files — choose another `path`"
        )
    nested = [p for p in path.rglob("run.json") if p.parent != path and is_run(p.parent)]
    if nested:
        raise ConfigurationError(
            f"`force=True`: '{path}' holds other runs ({nested[0].parent}); it replaces one run "
            "at a time — choose another `path`"
        )
    written = read_run_record(path / "run.json").get("written")
    if not written:
        raise ConfigurationError(
            f"`force=True`: '{path / 'run.json'}' lists no files that emote wrote there (an older "
            "emote's run, or not emote's), so nothing in it can be proven emote's; delete what "
            "you no longer need yourself, or choose another `path`"
        )
    return _owned_entries(path, set(written))


def _owned_entries(path: Path, written: set[str]) -> list[Path]:
    """The entries of the run at ``path`` that ``--force`` deletes (see
    :func:`check_replaceable_run`)."""
    doomed: list[Path] = []
    for name in LAYOUT_NAMES:
        entry = path / name
        if not os.path.lexists(entry):
            continue
        if name not in written:
            raise ConfigurationError(
                f"`force=True`: '{entry}' is not among the files '{path / 'run.json'}' records as "
                "emote's, and a new run would write into it; move it away or choose another "
                "`path`"
            )
        if entry.is_symlink():
            doomed.append(entry)  # the link alone goes, never what it points to
        elif name in LAYOUT_FILES:
            if not entry.is_file():
                raise ConfigurationError(
                    f"`force=True`: '{entry}' is not a file, so emote did not write it; move it "
                    "away or choose another `path`"
                )
            doomed.append(entry)
            temporary = entry.with_name(f".{name}.tmp")
            if temporary.is_file() and not temporary.is_symlink():
                doomed.append(temporary)
        elif name in LAYOUT_STORES:
            if not entry.is_dir() or (any(entry.iterdir()) and not _is_store(entry)):
                raise ConfigurationError(
                    f"`force=True`: '{entry}' is not an emote-memory store, so emote did not write "
                    "it; move it away or choose another `path`"
                )
            doomed.append(entry)
        else:
            if not entry.is_dir():
                raise ConfigurationError(
                    f"`force=True`: '{entry}' is not a folder, so emote did not write it; move it "
                    "away or choose another `path`"
                )
            pattern = LAYOUT_FOLDERS[name]
            doomed.extend(
                item
                for item in sorted(entry.iterdir())
                if pattern.fullmatch(item.name)
                and (item.is_symlink() or item.is_file() or name == "wandb")
            )
    for entry in sorted(path.iterdir()):
        if not GROUP_STORES.fullmatch(entry.name) or entry.name not in written:
            continue  # not a store the run claimed: left alone, as every other name is
        if not entry.is_symlink() and (
            not entry.is_dir() or (any(entry.iterdir()) and not _is_store(entry))
        ):
            raise ConfigurationError(
                f"`force=True`: '{entry}' is not an emote-memory store, so emote did not write it; "
                "move it away or choose another `path`"
            )
        doomed.append(entry)
    return doomed


def _is_store(folder: Path) -> bool:
    """Whether ``folder`` is an emote-memory store (its root ``zarr.json`` says so)."""
    try:
        document = json.loads(read_regular_file(folder / "zarr.json", limit=2**20, rule=""))
    except (OSError, ValueError, RecursionError, FormatError):
        return False
    attributes = document.get("attributes") if isinstance(document, dict) else None
    return isinstance(attributes, dict) and attributes.get("format") == STORE_FORMAT


def remove_entry(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)


__all__ = [
    "GROUP_STORES",
    "LAYOUT_FILES",
    "LAYOUT_FOLDERS",
    "LAYOUT_NAMES",
    "LAYOUT_STORES",
    "check_replaceable_run",
    "remove_entry",
]
