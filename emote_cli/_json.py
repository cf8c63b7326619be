"""JSON on stdout: the one document of a ``--json`` command, JSON Lines records, error documents.

Under ``--json`` a command writes exactly one JSON document on stdout, also when it fails, so
that a ``| jq`` reading it never takes silence for success. :func:`emit_json` inside
``handle_errors(json_output=True)`` therefore holds the document until the command ends:

- it ends well: the document is written as given;
- it fails (an error, an interrupt, a threshold not met): the document is written with
  ``"error"`` (the message of the one ``error: ...`` line on stderr) and ``"exit_code"`` added,
  or, when the command had not produced one, ``{"error": ..., "exit_code": ...}`` alone.

Usage errors that Typer raises before a command body runs are written by the root app's group
(:mod:`emote_cli.app`) with :func:`write_json_error`.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from typing import Any

__all__ = [
    "JSON_FLAG",
    "emit_json",
    "emit_json_line",
    "held_json_document",
    "json_requested",
    "record_error",
    "write_json_error",
]

JSON_FLAG = "--json"


def _to_json_compatible(value: Any) -> Any:
    """Convert ``value`` into plain JSON types.

    Mappings become objects with string keys, sequences and sets become arrays, enums their
    value, paths strings, array-likes (numpy arrays and scalars, torch tensors) their ``tolist()``,
    and non-finite floats ``null`` (JSON has no NaN or infinity).
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Enum):
        return _to_json_compatible(value.value)
    if isinstance(value, Mapping):
        return {_json_key(key): _to_json_compatible(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_to_json_compatible(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _to_json_compatible(tolist())
    raise TypeError(f"cannot write a {type(value).__name__} as JSON: {value!r}")


def _json_key(key: Any) -> str:
    """An object key as ``json`` writes it (``null``, ``true``, ``1``); enums and paths too."""
    if isinstance(key, Enum):
        key = key.value
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, os.PathLike):
        return os.fspath(key)
    return str(key)


def _write_document(document: Any) -> None:
    text = json.dumps(document, ensure_ascii=False, indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class _HeldDocument:
    """The document and error of one ``--json`` command, written once when it ends."""

    def __init__(self) -> None:
        self.document: Any = None
        self.has_document = False
        self.error: str | None = None

    def hold(self, document: Any) -> None:
        if self.has_document:
            raise RuntimeError(
                "a --json command writes exactly one JSON document; this one already emitted one"
            )
        self.document, self.has_document = document, True

    def write(self, exit_code: int) -> None:
        if exit_code == 0:
            if self.has_document:
                _write_document(self.document)
            return
        error = {
            "error": self.error or f"exited with status {exit_code}",
            "exit_code": exit_code,
        }
        if not self.has_document:
            document: Any = error
        elif isinstance(self.document, dict):
            document = {**self.document, **error}
        else:
            document = {**error, "result": self.document}
        _write_document(document)


_held: ContextVar[_HeldDocument | None] = ContextVar("emote_held_json_document", default=None)


@contextmanager
def held_json_document(json_output: bool) -> Iterator[_HeldDocument | None]:
    """Holds what :func:`emit_json` is given inside the block (``None`` without ``json_output``).

    The caller writes it with ``held.write(exit_code)`` once it knows how the command ended.
    """
    held = _HeldDocument() if json_output else None
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)


def record_error(message: str) -> None:
    """Remembers ``message`` (one line) as the ``"error"`` of the held document, if any."""
    held = _held.get()
    if held is not None:
        held.error = message


def emit_json(document: Any) -> None:
    """Write ``document`` to stdout as exactly one JSON document followed by a newline.

    The document is indented for people; non-ASCII text is written as is. Non-finite floats
    become ``null``. Inside ``handle_errors(json_output=True)`` it is written when the command
    ends, with ``"error"`` and ``"exit_code"`` added if the command fails.

    Args:
        document: A JSON-compatible value (see :func:`_to_json_compatible` for what is converted).

    Raises:
        TypeError: If a value cannot be represented in JSON.
        RuntimeError: If the command already emitted its document.
    """
    converted = _to_json_compatible(document)
    held = _held.get()
    if held is not None:
        held.hold(converted)
    else:
        _write_document(converted)


def emit_json_line(record: Any) -> None:
    """Write ``record`` to stdout as one compact JSON Lines record and flush it.

    Long commands stream progress this way under ``--json``; each call is one line.

    Args:
        record: A JSON-compatible value.

    Raises:
        TypeError: If a value cannot be represented in JSON.
    """
    text = json.dumps(
        _to_json_compatible(record),
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def write_json_error(message: str, exit_code: int) -> None:
    """Write ``{"error": message, "exit_code": exit_code}`` to stdout now.

    For failures outside any command body (usage errors found while parsing the command line).
    """
    _write_document({"error": message, "exit_code": int(exit_code)})


def json_requested(args: Sequence[str]) -> bool:
    """Whether a command line asks for ``--json`` (before a ``--`` that ends the options)."""
    options = list(args)
    if "--" in options:
        options = options[: options.index("--")]
    return JSON_FLAG in options
