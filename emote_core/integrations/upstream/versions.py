"""Versions of upstream emote's memory-table zip, which emote reads and (for V1) writes."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from emote_core.errors import FormatError


class TableSerializationVersion(IntEnum):
    """The layout of a memory-table zip. Readers detect it; writers record it.

    A zip with a ``version`` member is in the version it names; one with ``data.pickle`` and no
    ``version`` member is :attr:`LEGACY`.
    """

    LEGACY = 0
    """Upstream emote-rl 23's zip: ``data.pickle`` (pickled strategies, columns and episode
    lengths naming ``emote.memory.*`` classes) and one ``<col>.npy`` per stored column holding a
    pickled dict of episode id -> array. Deprecated (pickles), as upstream: reading and writing
    it warn with a ``DeprecationWarning``. Read through the restricted unpickler; it records no
    end states, so every episode is read as TERMINAL."""

    Legacy = 0
    """Upstream's spelling of :attr:`LEGACY` (the same member)."""

    V1 = 1
    """A zip of ``version`` ("1"), ``configuration.json`` (strategies' types and state, length
    key, maxlen, episode ids in insertion order, column schemas, stored column names, and emote's
    ``end_states``, which upstream readers ignore) and, per stored column, ``<col>.npy`` (all
    episodes concatenated along axis 0) and ``<col>.ranges.npy`` (int64 rows of id, start,
    length). No pickles. Files without ``end_states`` are read as all-TERMINAL."""

    LATEST = V1
    """What :func:`~emote_core.integrations.upstream.store_table` writes unless told otherwise."""


WRITABLE_VERSIONS = (TableSerializationVersion.V1, TableSerializationVersion.LEGACY)
"""The versions emote writes."""


def parse_version(value: Any, *, source: str) -> TableSerializationVersion:
    """Reads a version given as the enum, an int, or the text of a zip's ``version`` member.

    Args:
        value: The version.
        source: What the version came from, for the error message.

    Raises:
        FormatError: If ``value`` is not a version this emote knows.
    """
    if isinstance(value, TableSerializationVersion):
        return value
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", errors="replace")
    text = str(value).strip()
    try:
        number = int(text)
    except ValueError:
        number = None
    known = sorted(v.value for v in TableSerializationVersion)
    if isinstance(value, bool) or number is None or number not in known:
        raise FormatError(
            f"{source} has table format version {text[:40]!r}; this emote reads versions "
            f"{known} — upgrade emote, or pass a known version"
        )
    return TableSerializationVersion(number)


__all__ = ["WRITABLE_VERSIONS", "TableSerializationVersion", "parse_version"]
