"""Opening and reading files that a user's folders may hold: regular files only, size-capped.

A named pipe put where emote expects a file would block ``open`` until a writer comes (hence
``O_NONBLOCK``), and a device such as ``/dev/zero`` never ends; both are refused after ``fstat``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from emote_core.errors import FormatError


def open_regular_file(path: str | Path, *, rule: str) -> tuple[int, os.stat_result]:
    """The file at ``path`` opened for reading, and its ``fstat``, refusing what is not a file.

    ``rule`` ends the refusal's message (what the place holds, or what to do).

    Raises:
        FileNotFoundError: Nothing is there.
        FormatError: It is not a regular file (its descriptor is closed again).
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise FormatError(f"'{path}' is not a file (mode {stat.filemode(info.st_mode)}); {rule}")
    return descriptor, info


def read_regular_file(path: str | Path, *, limit: int, rule: str) -> bytes:
    """The bytes of the regular file at ``path``, refused when it holds more than ``limit``
    bytes (checked before reading, and again while reading a file that grows).

    Raises:
        FileNotFoundError: Nothing is there.
        FormatError: It is not a regular file, or it is larger than ``limit``.
    """
    descriptor, info = open_regular_file(path, rule=rule)
    with open(descriptor, "rb") as file:  # closes the descriptor
        size = info.st_size
        data = b"" if size > limit else file.read(limit + 1)
    size = max(size, len(data))
    if size > limit:
        raise FormatError(
            f"'{path}' holds {size} bytes, more than the {limit} emote reads from such a file; "
            f"{rule}"
        )
    return data


__all__ = ["open_regular_file", "read_regular_file"]
