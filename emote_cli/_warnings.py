"""Python warnings from libraries (gymnasium, zarr, torch, ...) as one ``warning: ...`` line.

Left alone, a warning reaches the terminal as ``/path/to/file.py:123: Category: message`` plus the
source line that raised it, sometimes with terminal colour codes (gymnasium's). During a command
they go through logging instead, as one line in the style of ``error: ...``, once per message,
naming the category and the package that raised it (and the file and line with ``--debug``).
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import PurePath
from typing import TextIO

__all__ = ["route_warnings"]

log = logging.getLogger("py.warnings")
"""The logger the standard library's ``logging.captureWarnings`` uses for warnings too."""

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LIBRARY_PREFIX = re.compile(r"^(?:WARN|WARNING|Warning):\s*")  # gymnasium's "WARN: ..."
_SITE_DIRECTORIES = {"site-packages", "dist-packages"}

_seen: set[tuple[str, str]] = set()
_with_location = False


def route_warnings(*, debug: bool = False) -> None:
    """Show every Python warning of this process as one log line (``warning: ...``), each
    message once from this call on (every command calls it when it starts).

    Args:
        debug: The value of ``--debug``: add where the warning was raised.
    """
    global _with_location
    _with_location = debug
    _seen.clear()
    warnings.showwarning = _show_warning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    text = _one_line(str(message))
    key = (category.__name__, text)
    if key in _seen:  # libraries that force "always" would repeat a warning every step
        return
    _seen.add(key)
    where = f" at {filename}:{lineno}" if _with_location else ""
    log.warning("%s (%s from %s%s)", text, category.__name__, _package(filename), where)


def _one_line(text: str) -> str:
    text = _ANSI_ESCAPE.sub("", text)
    text = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return _LIBRARY_PREFIX.sub("", text) or "(no message)"


def _package(filename: str) -> str:
    """The top-level package a file belongs to, as far as its path tells."""
    parts = PurePath(filename).parts
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] in _SITE_DIRECTORIES:
            return parts[index + 1].removesuffix(".py")
    for part in parts:
        if part in ("emote_core", "emote_cli"):
            return part
    return PurePath(filename).name
