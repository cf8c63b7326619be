"""Opening emote-memory stores and listing what their groups hold, for readers and writers alike
(local paths and fsspec URLs; temporary files of interrupted writes are never data)."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from emote_core.errors import FormatError, StorageError
from emote_core.stores.locations import filesystem, is_url, storage_errors, storage_options
from emote_core.stores.zarr_store.layout import FORMAT_NAME, SHARDS

log = logging.getLogger(__name__)


def open_group(
    url: str | os.PathLike[str],
    mode: str,
    *,
    attributes: dict[str, Any] | None = None,
    check: bool = True,
) -> Any:
    """Opens the Zarr group at a local path or an fsspec URL (``memory://``, ``s3://``, ...).

    Args:
        url: Where.
        mode: Zarr's mode (``"r"``, ``"r+"``, ``"w-"``, ``"w"``).
        attributes: For a group created now: its attributes, written with its metadata in one
            write (a reader never sees the group without them).
        check: Before reading a local store (``"r"``, ``"r+"``), refuse one that holds
            anything but files and folders (:func:`check_entries`); ``False`` when the caller
            just did.

    Raises:
        FormatError: If there is no readable Zarr group there (for ``mode="r"``), or a local
            store holds a named pipe, a device or a socket.
        StorageError: If the URL's backend is not installed, or its object store cannot be
            reached (no credentials, no bucket, no answer).
    """
    import zarr
    from zarr.errors import NodeNotFoundError

    location = os.fspath(url)
    options = None
    if is_url(location):
        options = storage_options(location)
        _probe(location)
    elif check and mode in ("r", "r+"):
        check_entries(location)
    try:
        with storage_errors(location):
            return zarr.open_group(  # type: ignore[arg-type]
                location,
                mode=mode,
                attributes=attributes,
                storage_options=options,
                zarr_format=3,  # emote's stores are Zarr v3: no probing for v2 files
            )
    except FileExistsError as error:
        raise FormatError(
            f"'{location}' already holds data; choose another destination or allow overwriting"
        ) from error
    except (FileNotFoundError, NodeNotFoundError) as error:
        if mode in ("r", "r+"):
            raise FormatError(
                f"no emote memory store at '{location}'{_missing_root(location)}"
            ) from error
        raise StorageError(f"cannot create '{location}' ({error})") from error
    except (ValueError, KeyError, TypeError) as error:
        raise FormatError(
            f"'{location}' is not a readable Zarr store: its zarr.json is unreadable ({error})"
        ) from error


def check_entries(location: str) -> None:
    """Refuses a local store that holds anything but files and folders.

    Opening a named pipe (FIFO) for reading waits for a writer, forever; reading a device
    (``/dev/zero`` behind a link) never ends. A store made hostile that way would hang every
    reader, so each entry is looked at (links followed) before anything is read. A folder
    without a Zarr group's ``zarr.json`` is not walked: nothing of it is read as a store.

    Raises:
        FormatError: Naming the first entry that is neither a file nor a folder.
    """
    if not _root_metadata(location):
        return
    seen: set[tuple[int, int]] = set()
    folders = [location]
    while folders:
        try:
            entries = list(os.scandir(folders.pop()))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue  # gone meanwhile, or unreadable: zarr says so when it reads
        for entry in entries:
            try:
                if entry.is_file():
                    continue
                if entry.is_dir():
                    if entry.is_symlink():  # links may loop; folders themselves cannot
                        info = entry.stat()
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    folders.append(entry.path)
                    continue
                mode = os.stat(entry.path).st_mode
            except FileNotFoundError:
                continue  # gone meanwhile (a writer's temporary file), or a dangling link
            raise _not_a_file(location, entry.path, mode)


def _root_metadata(location: str) -> bool:
    """Whether a Zarr group's ``zarr.json`` is at the local ``location``.

    Raises:
        FormatError: If that ``zarr.json`` is not a file.
    """
    path = os.path.join(location, "zarr.json")
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISREG(mode):
        raise _not_a_file(location, path, mode)
    return True


def _not_a_file(location: str, path: str, mode: int) -> FormatError:
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISDIR, "a folder"))  # fmt: skip
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return FormatError(
        f"'{location}' is not a store to read: '{path}' is {kind}, not a file; an emote memory "
        "store holds only files and folders"
    )


def _probe(location: str) -> None:
    """One request to the object store before Zarr sends many at once: credentials, endpoint
    and bucket fail here as one error (not as many abandoned concurrent requests)."""
    fs, path = filesystem(location)
    with storage_errors(location):
        fs.exists(f"{path.rstrip('/')}/zarr.json")


def _missing_root(location: str) -> str:
    """`` (bucket 'b' does not exist)`` when a URL's first path part (its bucket) is missing."""
    if not is_url(location):
        return ""
    fs, path = filesystem(location)
    bucket = path.strip("/").split("/", 1)[0]
    try:
        with storage_errors(location):
            found = bool(bucket) and fs.exists(bucket)
    except OSError:
        return ""
    return "" if found else f" (bucket '{bucket}' does not exist)"


def is_store(url: str | os.PathLike[str]) -> bool:
    """Whether an emote-memory store's root metadata is at ``url`` (its shards unread).

    Raises:
        FormatError: If the local store there holds something other than files and folders
            (:func:`check_entries`): not "no store", which would have it written over.
    """
    location = os.fspath(url)
    local = not is_url(location)
    if local and not _root_metadata(location):
        return False
    try:
        attributes = dict(open_group(url, "r", check=False).attrs)
    except FormatError:
        return False
    if attributes.get("format") != FORMAT_NAME:
        return False
    if local:  # only emote's own stores are walked, not any Zarr group or folder
        check_entries(location)
    return True


def require_group(parent: Any, name: str) -> Any:
    """``parent[name]``, created if missing; two writers may race to create it."""
    from zarr.errors import ContainsGroupError

    try:
        return parent.require_group(name)
    except ContainsGroupError:  # created by another writer between zarr's check and its write
        return parent[name]


PARTIAL_SUFFIX = ".partial"
"""zarr's local store writes each file under a temporary ``<name>.<uuid>.partial`` name first; a
writer killed mid-write leaves one behind. Such files are never data."""


TEMPORARY_NAME = re.compile(r"^.+\.[0-9a-f]{32}\.partial$")
"""The name zarr's local store gives a file while writing it (``zarr.json`` is written as
``zarr.<32 hex digits>.partial``, then linked into place)."""
STALE_SECONDS = 5.0
"""A temporary file not written to for this long belongs to a write that was cut off: zarr
writes each file (a few kilobytes of metadata, a chunk) in one go."""


def leftover_temporaries(
    location: str | os.PathLike[str], *, shard: str | None = None
) -> list[Path]:
    """zarr's temporary files that writes cut off left in the local emote-memory store at
    ``location``: at its root and in ``shards/`` those written to more than
    :data:`STALE_SECONDS` ago (another process may be creating a shard), under the other shards
    too unless ``shard`` is given, and every one under ``shards/<shard>`` (whose lease the caller
    holds: nobody else writes there). None for a folder without emote's root metadata, or a URL.
    """
    folder = Path(os.fspath(location))
    if is_url(os.fspath(location)) or not _emote_root(folder):
        return []
    now = time.time()
    found = []
    for top in (folder, folder / SHARDS):
        found += [e for e in _entries(top) if _temporary(e) and _stale(e, now)]
    for top in _entries(folder / SHARDS):
        if not top.is_dir() or top.is_symlink() or (shard is not None and top.name != shard):
            continue
        for directory, _, names in os.walk(top):
            inside = [Path(directory) / name for name in names]
            found += [e for e in inside if _temporary(e) and (shard or _stale(e, now))]
    return found


def remove_leftover_temporaries(location: str | os.PathLike[str], *, shard: str) -> None:
    """Removes :func:`leftover_temporaries` (logged): a writer does before it appends."""
    removed = []
    for path in leftover_temporaries(location, shard=shard):
        try:
            path.unlink()
            removed.append(str(path))
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("could not remove '%s', left by a write cut off (%s)", path, error)
    if removed:
        log.info("removed temporary files that writes cut off left: %s", ", ".join(removed))


def creation_leftovers(location: str | os.PathLike[str]) -> list[Path] | None:
    """Where a local folder holds nothing but what creating an emote-memory store there left
    when it was cut off (zarr's temporary root metadata: empty, or naming emote's format, and
    written to more than :data:`STALE_SECONDS` ago): those files. ``None`` otherwise."""
    folder = Path(os.fspath(location))
    if is_url(os.fspath(location)) or not folder.is_dir() or folder.is_symlink():
        return None
    entries = _entries(folder)
    now = time.time()
    for entry in entries:
        if not (_temporary(entry) and entry.name.startswith("zarr.") and _stale(entry, now)):
            return None
        try:
            with open(entry, "rb") as file:
                head = file.read(1 << 16)
        except OSError:
            return None
        if head and FORMAT_NAME.encode() not in head:
            return None
    return entries or None


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _temporary(path: Path) -> bool:
    return bool(TEMPORARY_NAME.match(path.name)) and path.is_file() and not path.is_symlink()


def _stale(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime > STALE_SECONDS
    except OSError:
        return False


def _emote_root(folder: Path) -> bool:
    """Whether ``folder`` holds root metadata naming emote's format."""
    try:
        document = json.loads((folder / "zarr.json").read_bytes())
    except (OSError, ValueError):
        return False
    return (
        isinstance(document, dict)
        and (document.get("attributes") or {}).get("format") == FORMAT_NAME
    )


def keys_under(root: Any, prefix: str) -> bool:
    """Whether the store holds any key below ``prefix`` (metadata or not; temporaries aside)."""
    from zarr.core.sync import sync  # zarr's stores are async; this runs one call to the end

    async def first() -> bool:
        async for key in root.store.list_prefix(prefix):
            if not key.endswith(PARTIAL_SUFFIX):
                return True
        return False

    return bool(sync(first()))


def child_names(root: Any, prefix: str) -> list[str]:
    """The names directly below ``prefix`` in the store, whether or not they have metadata."""
    from zarr.core.sync import sync

    async def names() -> list[str]:
        return [name async for name in root.store.list_dir(prefix)]

    return sorted(
        name for name in sync(names()) if name != "zarr.json" and not name.endswith(PARTIAL_SUFFIX)
    )


__all__ = [
    "PARTIAL_SUFFIX",
    "STALE_SECONDS",
    "TEMPORARY_NAME",
    "child_names",
    "creation_leftovers",
    "is_store",
    "keys_under",
    "leftover_temporaries",
    "open_group",
    "remove_leftover_temporaries",
    "require_group",
]
