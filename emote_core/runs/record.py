"""Reading a run's own files: ``run.json``, ``eval.json`` and ``recipe.toml`` as regular files
of at most :data:`RUN_FILE_LIMIT` bytes, and ``run.json``'s entries checked for the types emote
writes, so a damaged or hostile file is one line naming the file and the entry."""

from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any

from emote_core.errors import FormatError
from emote_core.utils.files import read_regular_file

RUN_FORMAT = "emote-run"
"""The ``format`` entry of every ``run.json`` emote writes."""
RUN_FILE_LIMIT = 64 * 2**20
"""The most bytes emote reads from a run's ``run.json``, ``eval.json`` or ``recipe.toml``."""
RESUMABLE_SETTINGS = (
    "training.bp_steps",
    "training.log_interval",
    "training.checkpoint_interval",
    "training.export_interval",
    "training.publish_interval",
    "training.compile",
    "memory.follow_interval",
    "memory.follow_min_seconds",
    "eval.",
    "logging.",
)
"""Recipe keys (or ``section.`` prefixes) that ``--resume --set`` may change: how long the run
goes on, how it logs, checkpoints and evaluates, and how its updates run (``training.compile``).
Every other key shapes what the checkpoint holds (networks, optimisers, the environment, the
memory) and stays as the run began."""


def read_run_record(path: Path) -> dict[str, Any]:
    """A run's ``run.json`` (``{}`` when there is none), its entries checked for the types emote
    writes.

    Raises:
        FormatError: If it is not a file, is too large, is not a JSON object, or an entry emote
            reads has the wrong type, naming the file and the entry.
    """
    record = read_json_object(path)
    starts = record.get("starts", [])
    if not isinstance(starts, list) or not all(isinstance(s, dict) for s in starts):
        raise damaged(path, f"'starts' must be a list of objects, got {_shown(starts)}")
    for k, start in enumerate(starts):
        for key, (check, wanted) in _START_ENTRIES.items():
            if key in start and not check(start[key]):
                raise damaged(path, f"starts[{k}].{key} must be {wanted}, got {_shown(start[key])}")
        for key, change in (start.get("changes") or {}).items():
            if not key.startswith(RESUMABLE_SETTINGS) or not _is_pair(change):
                raise damaged(
                    path,
                    f"starts[{k}].changes holds {key!r}: {_shown(change)}, not a resumable "
                    "setting with [old, new]",
                )
    if record.get("env") is not None and not isinstance(record["env"], dict):
        raise damaged(path, f"'env' must be an object, got {_shown(record['env'])}")
    if "written" in record and not _is_strings(record["written"]):
        raise damaged(path, f"'written' must be a list of names, got {_shown(record['written'])}")
    return record


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2


def _is_count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)


_START_ENTRIES = {
    "command": (_is_strings, "a list of strings"),
    "memory": (_is_strings, "a list of store paths"),
    "directory": (lambda v: isinstance(v, str), "a path"),
    "live": (lambda v: isinstance(v, bool), "true or false"),
    "follow": (lambda v: isinstance(v, bool), "true or false"),
    "resume": (lambda v: isinstance(v, bool), "true or false"),
    "steps": (_is_count, "a positive count or null"),
    "changes": (lambda v: isinstance(v, dict), "an object"),
}


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


def damaged(path: Path, what: str) -> FormatError:
    return FormatError(
        f"'{path}' is damaged: {what}; restore it from a copy, or start a new run in another "
        "run directory"
    )


def read_run_file(path: Path) -> bytes:
    """The bytes of one of a run's files (:data:`RUN_FILE_LIMIT`; not a pipe or device)."""
    try:
        return read_regular_file(
            path, limit=RUN_FILE_LIMIT,
            rule="a run keeps it as a plain file that emote wrote; move it away or choose another "
            "run directory",
        )  # fmt: skip
    except FileNotFoundError:
        raise
    except OSError as error:
        raise FormatError(f"'{path}' cannot be read: {error.strerror or error}") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in one of a run's files (``{}`` when there is none).

    Raises:
        FormatError: If it is not a readable file of at most :data:`RUN_FILE_LIMIT` bytes
            holding a JSON object.
    """
    try:
        raw = read_run_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise damaged(path, "it nests deeper than emote reads") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError too
        raise damaged(path, f"it is not JSON text ({error})") from None
    if not isinstance(data, dict):
        raise damaged(path, f"it holds {_shown(data)}, not a JSON object")
    return data


def is_run(path: Path) -> bool:
    """Whether ``path`` is an emote run directory: its ``run.json`` is emote's (tagged
    ``format = "emote-run"``, or, as runs before the tag wrote it, with ``starts`` and the
    ``packages`` emote records)."""
    record = read_run_record(path / "run.json")
    if record.get("format") == RUN_FORMAT:
        return True
    packages = record.get("packages")
    return (
        isinstance(record.get("starts"), list)
        and isinstance(packages, dict)
        and ("emote" in packages)
    )


__all__ = [
    "RESUMABLE_SETTINGS",
    "RUN_FILE_LIMIT",
    "RUN_FORMAT",
    "damaged",
    "is_run",
    "read_json_object",
    "read_run_file",
    "read_run_record",
]
