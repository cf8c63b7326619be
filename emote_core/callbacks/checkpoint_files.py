"""Checkpoint files: their layout version, where a run keeps them, and loading them safely.

A checkpoint is ``<run_dir>/<storage_subdirectory>/checkpoint_<bp_step>.tar`` (the subdirectory is
``checkpoints`` unless a :class:`~emote_core.callbacks.checkpointing.Checkpointer` was given
another), written with ``torch.save`` and holding only tensors, numbers, strings, lists and dicts so
it loads with ``torch.load(weights_only=True)``. The callbacks that write and read them are in
:mod:`emote_core.callbacks.checkpointing`.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import zipfile
from enum import IntEnum
from pathlib import Path
from typing import Any

import torch

from emote_core.errors import CheckpointError, FormatError
from emote_core.utils.files import open_regular_file

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "emote-checkpoint"
CHECKPOINT_DIRECTORY = "checkpoints"
BEST_CHECKPOINT_NAME = "best.tar"
"""The checkpoint of a run's best evaluation, in ``checkpoints/``."""
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)\.tar$")
_CHECKPOINT_RULE = "a checkpoint is a file that emote's training wrote with torch.save"


class CheckpointVersion(IntEnum):
    """Versions of the checkpoint layout."""

    V1 = 1
    """``{format, format_version, emote_version, bp_step, bp_samples, rng, callbacks}`` with
    ``callbacks`` mapping each callback's name to its ``state_dict()``. Numbered checkpoints
    written by a ``Checkpointer`` also hold ``checkpoint_index`` (an int: which of its run's
    checkpoints this is, counting from the ``Checkpointer``'s ``checkpoint_index``); earlier ones
    and ``best.tar`` do not, and readers treat the key as optional."""
    LATEST = V1


def list_checkpoints(
    run_dir: str | os.PathLike[str], storage_subdirectory: str = CHECKPOINT_DIRECTORY
) -> list[tuple[int, Path]]:
    """The checkpoints of a run directory as ``(bp_step, path)``, oldest first.

    Args:
        run_dir: The run directory.
        storage_subdirectory: The folder of the run directory that holds them.
    """
    directory = Path(run_dir) / storage_subdirectory
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def is_torch_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file ``torch.save`` could have written, judged without loading it:
    a zip archive holding a ``data.pkl`` (torch's format), or a pickle (its legacy format). A
    named pipe or a device is not (and is never read)."""
    try:
        descriptor, _ = open_regular_file(path, rule=_CHECKPOINT_RULE)
        with open(descriptor, "rb") as stream:  # closes the descriptor
            head = stream.read(4)
            if head.startswith(b"PK\x03\x04"):
                stream.seek(0)
                with zipfile.ZipFile(stream) as archive:
                    names = archive.namelist()
                return any(name.rpartition("/")[2] == "data.pkl" for name in names)
    except (OSError, FormatError, zipfile.BadZipFile):
        return False
    return head[:1] == b"\x80"  # the PROTO opcode every pickle of protocol 2 or above starts with


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Loads a checkpoint file safely (``weights_only``) onto the CPU and checks its format.

    Raises:
        CheckpointError: If the file is missing, not a regular file (a named pipe is never
            opened to wait for a writer), not a checkpoint, or from a newer emote.
    """
    path = Path(path)
    try:
        descriptor, _ = open_regular_file(path, rule=_CHECKPOINT_RULE)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{path}' does not exist") from None
    except FormatError as error:
        raise CheckpointError(str(error)) from None
    except OSError as error:
        raise CheckpointError(
            f"checkpoint '{path}' cannot be read: {error.strerror or error}"
        ) from None
    try:
        with open(descriptor, "rb") as file:  # closes the descriptor
            data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"'{path}' is not a readable emote checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no detail'})"
        ) from error
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"'{path}' is not an emote checkpoint (no '{CHECKPOINT_FORMAT}' tag)")
    version = data.get("format_version")
    if not isinstance(version, int) or version > CheckpointVersion.LATEST:
        raise CheckpointError(
            f"checkpoint '{path}' has format_version {version!r}; this emote reads up to "
            f"{int(CheckpointVersion.LATEST)} — upgrade emote"
        )
    return data


def load_latest_checkpoint(
    run_dir: str | os.PathLike[str], storage_subdirectory: str = CHECKPOINT_DIRECTORY
) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint of a run that loads, and its content.

    A checkpoint that does not load (truncated by a full disk, damaged) is skipped with a
    warning naming it and why; the one before it is tried.

    Raises:
        CheckpointError: If the run has no checkpoints, or none of them loads.
    """
    available = list_checkpoints(run_dir, storage_subdirectory)
    if not available:
        raise CheckpointError(f"run directory '{run_dir}' holds no checkpoints")
    skipped = []
    for _, path in reversed(available):
        try:
            data = load_checkpoint(path)
        except CheckpointError as error:
            log.warning("skipping checkpoint '%s': %s", path, error)
            skipped.append(path.name)
            continue
        if skipped:
            log.warning("using checkpoint '%s' (newer ones do not load: %s)", path, skipped)
        return path, data
    raise CheckpointError(
        f"none of the {len(available)} checkpoints in '{run_dir}' loads ({', '.join(skipped)})"
    )


def is_loadable_checkpoint(path: Path) -> bool:
    """Whether :func:`load_checkpoint` accepts the file."""
    try:
        load_checkpoint(path)
    except CheckpointError:
        return False
    return True


def recorded_checkpoint_index(path: str | os.PathLike[str]) -> int | None:
    """The ``checkpoint_index`` a checkpoint records, or ``None`` (none recorded, or unreadable).

    The file is memory-mapped, so its tensors are not read: asking every checkpoint of a run is
    cheap. A named pipe or a device has none (and is never opened).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # any unreadable file simply has no index
        log.debug("no checkpoint index from '%s': %s", path, error)
        return None
    index = data.get("checkpoint_index") if isinstance(data, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else None
