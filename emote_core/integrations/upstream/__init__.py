"""Upstream emote's memory files: V1 and Legacy zips (read and written; Legacy deprecated, as
upstream) and ``.pickle`` dumps (read).

:func:`store_table` and :func:`restore_table` do what upstream's ``table.store(path)`` and
``table.restore(path)`` did. Every pickle is read through :mod:`emote_core.stores.safe_pickle`;
restoring is all or nothing (a failure leaves the table as it was).
"""

from __future__ import annotations

import logging
import os
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emote_core.errors import FormatError
from emote_core.integrations.upstream.legacy_pickle import (
    read_legacy_pickle,
    read_legacy_pickle_episodes,
    restore_legacy_pickle,
)
from emote_core.integrations.upstream.legacy_zip import (
    DATA_PICKLE,
    read_legacy_zip,
    write_legacy_zip,
)
from emote_core.integrations.upstream.v1 import VERSION, read_v1, write_v1
from emote_core.integrations.upstream.versions import (
    WRITABLE_VERSIONS,
    TableSerializationVersion,
    parse_version,
)
from emote_core.stores.stored import (
    ColumnSchema,
    EpisodeRecord,
    StoredTable,
    read_member,
    restore_stored,
)

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".pickle", ".pkl")


def store_table(
    table: ArrayMemoryTable,
    path: str | os.PathLike[str],
    version: TableSerializationVersion | int = TableSerializationVersion.LATEST,
) -> None:
    """Writes ``table`` to ``path`` (exactly that name) as an upstream emote memory zip.

    Args:
        table: The table to store.
        path: The file to write; replaced atomically if it exists.
        version: The layout: :attr:`TableSerializationVersion.V1` (the latest), or ``LEGACY``
            (pickles; deprecated, as upstream, and it records no end states).

    Warns:
        DeprecationWarning: When writing ``LEGACY``.

    Raises:
        FormatError: If ``version`` is unknown, or the table holds what ``LEGACY`` cannot name.
        StorageError: If the file cannot be written.
    """
    chosen = parse_version(version, source="the requested store version")
    if chosen not in WRITABLE_VERSIONS:
        raise FormatError(
            f"table format {chosen.name} is read-only in emote; store with "
            f"TableSerializationVersion.V1 (the latest), which upstream emote reads too"
        )
    if chosen == TableSerializationVersion.LEGACY:
        write_legacy_zip(table, path)
    else:
        write_v1(table, path)


def _resolve(path: str | os.PathLike[str]) -> Path:
    resolved = Path(path)
    if not resolved.exists():
        # Upstream emote appends ".zip" to the names it is given; accept those names too.
        with_zip = resolved.with_name(resolved.name + ".zip")
        if with_zip.is_file():
            return with_zip
        raise FormatError(f"memory file '{path}' does not exist")
    if not resolved.is_file():
        raise FormatError(f"memory file '{path}' is not a file")
    return resolved


def _kind(path: Path) -> str:
    try:
        with path.open("rb") as file:
            head = file.read(4)
    except OSError as error:
        raise FormatError(f"cannot read memory file '{path}' ({error})") from error
    if not head:
        raise FormatError(
            f"memory file '{path}' is empty; expected an emote memory zip (V1 or Legacy) or a "
            "legacy .pickle dump"
        )
    if head.startswith(b"PK"):
        return "zip"
    if path.suffix in PICKLE_SUFFIXES or head.startswith(b"\x80"):
        return "pickle"
    raise FormatError(
        f"memory file '{path}' is neither a zip archive nor a pickle; expected an emote memory "
        "zip (V1 or Legacy) or a legacy .pickle dump"
    )


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise FormatError(
            f"memory file '{path}' is not a readable zip archive ({error}); it is truncated or "
            "damaged"
        ) from error


def detect_version(
    archive: zipfile.ZipFile, *, source: str, override: Any = None
) -> TableSerializationVersion:
    """The layout of an open memory zip: ``override`` if given, else from its members.

    Raises:
        FormatError: If the ``version`` member names an unknown version, or the zip has neither
            a ``version`` nor a ``data.pickle`` member.
    """
    if override is not None:
        return parse_version(override, source="the override version")
    names = set(archive.namelist())
    if VERSION in names:
        return parse_version(read_member(archive, VERSION, source=source), source=source)
    if DATA_PICKLE in names:
        return TableSerializationVersion.LEGACY
    raise FormatError(
        f"{source} is a zip but not an emote memory: it has neither a '{VERSION}' nor a "
        f"'{DATA_PICKLE}' member (members: {sorted(names)[:10]})"
    )


def _read_zip(
    path: Path, override: Any, table: ArrayMemoryTable | None, trust: bool
) -> StoredTable:
    source = f"memory file '{path}'"
    with _open_zip(path) as archive:
        version = detect_version(archive, source=source, override=override)
        if version == TableSerializationVersion.LEGACY:
            warnings.warn(
                f"{source} is a Legacy memory export (pickles), deprecated as in upstream emote; "
                "store it again with TableSerializationVersion.V1",
                DeprecationWarning,
                stacklevel=3,  # the caller of restore_table / read_table_file
            )
            return read_legacy_zip(archive, source=source, table=table, trust_pickle=trust)
        return read_v1(archive, source=source, table=table)


def read_memory_zip(location: str, kind: str, *, trust_pickle: bool = False) -> StoredTable:
    """Reads an upstream memory zip as ``kind`` (``"emote-v1"`` or ``"emote-legacy"``).

    Raises:
        FormatError: If the zip is damaged, or is read as V1 but its ``version`` names another.
        UnsafePickleError: If a Legacy zip's pickle names a global outside the allowlist.
    """
    source = f"memory file '{location}'"
    with _open_zip(Path(location)) as archive:
        if kind == "emote-legacy":
            return read_legacy_zip(archive, source=source, trust_pickle=trust_pickle)
        if VERSION in archive.namelist():
            version = detect_version(archive, source=source)
            if version != TableSerializationVersion.V1:
                raise FormatError(
                    f"{source} is a {version.name} zip, not V1; leave source_format unset so "
                    "its version is detected"
                )
        return read_v1(archive, source=source)


def read_table_file(
    path: str | os.PathLike[str], override_version: Any = None, *, trust_pickle: bool = False
) -> StoredTable:
    """Reads any memory file emote knows, without a table: schemas, episodes, strategy state.

    Args:
        path: A V1 or Legacy zip, or a legacy ``.pickle`` dump.
        override_version: Read a zip as this :class:`TableSerializationVersion` instead of
            detecting it.
        trust_pickle: Unpickle without restrictions (runs the file's code).

    Raises:
        FormatError: If the file is missing, empty, damaged or of an unknown version.
        UnsafePickleError: If a pickle names a global outside the allowlist.
    """
    resolved = _resolve(path)
    if _kind(resolved) == "pickle":
        return read_legacy_pickle(resolved, trust_pickle=trust_pickle)
    return _read_zip(resolved, override_version, None, trust_pickle)


def restore_table(
    table: ArrayMemoryTable,
    path: str | os.PathLike[str],
    override_version: TableSerializationVersion | int | None = None,
    *,
    trust_pickle: bool = False,
) -> None:
    """Replaces ``table``'s content with a stored table; on any error the table is unchanged.

    Zips are V1 or Legacy by their members (``version`` / ``data.pickle``) unless
    ``override_version`` says which; files ending in ``.pickle``/``.pkl`` or starting with a
    pickle's protocol byte are legacy dumps. ``path`` without its ``.zip`` suffix (upstream's
    naming) is accepted too.

    Args:
        table: The table to fill; its columns must match the file's stored columns.
        path: The file.
        override_version: The zip layout to assume instead of detecting it.
        trust_pickle: Unpickle without restrictions (runs the file's code): only for files
            whose origin the user vouches for.

    Raises:
        FormatError: If the file is missing, empty, truncated, not a memory file, of an
            unsupported version, or its columns differ from the table's.
        UnsafePickleError: If a pickle names a global outside the allowlist; nothing ran.
    """
    resolved = _resolve(path)
    if _kind(resolved) == "pickle":
        restore_legacy_pickle(table, resolved, trust_pickle=trust_pickle)
        return
    restore_stored(table, _read_zip(resolved, override_version, table, trust_pickle))


__all__ = [
    "ColumnSchema",
    "EpisodeRecord",
    "StoredTable",
    "TableSerializationVersion",
    "detect_version",
    "read_legacy_pickle_episodes",
    "read_memory_zip",
    "read_table_file",
    "restore_table",
    "store_table",
]
