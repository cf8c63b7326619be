"""Publishing a file that other processes read while it is replaced: the run's policy bus.

A learner publishes its policy as ``RUN_DIR/exports/latest.onnx`` (:data:`LATEST_POLICY`);
collectors (``emote collect --follow-policy``) load it between episodes. The new file is written
under a hidden temporary name in the same directory, flushed to disk, then renamed over the old
one (``os.replace``, atomic on POSIX and Windows within one file system), and the directory
flushed: a reader opens the old file or the new one, whole, never a mix or a half.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LATEST_POLICY = "latest.onnx"
"""The published policy's file name in a run's ``exports/``."""


def replace_atomically(target: str | os.PathLike[str], write: Callable[[Path], T]) -> T:
    """Replaces ``target`` with what ``write`` writes, in one rename.

    Args:
        target: The file to replace (or create).
        write: Writes the new content to the path it is given (a hidden temporary beside
            ``target``).

    Returns:
        What ``write`` returned.

    Raises:
        Exception: Whatever ``write`` raises; ``target`` is then unchanged and no temporary
            file is left.
    """
    target = Path(target)
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        result = write(temporary)
        with temporary.open("rb") as file:
            os.fsync(file.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    _fsync_directory(target.parent)
    return result


def _fsync_directory(directory: Path) -> None:
    """Flushes a rename in ``directory`` to disk (where the platform allows opening folders)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


__all__ = ["LATEST_POLICY", "replace_atomically"]
