"""Placing a finished store on object storage, where nothing can be renamed into place.

A store is written locally, then uploaded with its root ``zarr.json`` last: until that one
object lands there is no store at the URL (readers find none), so a reader never sees a store
half uploaded. An upload that fails removes what it put there; one killed outright leaves
objects without a root ``zarr.json``, which no reader takes for a store and which a later
conversion to the same URL refuses to write over (naming them).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from emote_core.errors import FormatError, StorageError
from emote_core.stores.locations import S3_SCHEMES, filesystem, is_url, scheme, storage_errors
from emote_core.stores.zarr_store.groups import PARTIAL_SUFFIX
from emote_core.stores.zarr_store.lease import LEASES

log = logging.getLogger(__name__)

ROOT_METADATA = "zarr.json"


def holds_objects(url: str) -> bool:
    """Whether anything is stored at or below ``url`` (listed afresh)."""
    fs, path = filesystem(url)
    with storage_errors(url):
        fs.invalidate_cache(path)
        return bool(fs.exists(path))


def check_url_destination(source: str | None, destination: str, target_format: str) -> None:
    """What a conversion may write at a URL: only a new store (object stores cannot swap a
    replacement into place).

    Raises:
        FormatError: If the target is not a store, the URL is or holds the source, or anything
            is stored there (``--force`` or not).
        StorageError: If the URL's backend is missing or its object store unreachable.
    """
    if target_format != "zarr":
        raise FormatError(
            f"convert writes {target_format} files to local paths; '{destination}' is a URL — "
            "convert to a local file, then copy it (or convert to a store: --to zarr)"
        )
    if source is not None and is_url(source):
        inner, outer = destination.rstrip("/") + "/", source.rstrip("/") + "/"
        if inner.startswith(outer) or outer.startswith(inner):
            raise FormatError(
                f"destination '{destination}' is, holds or lies inside the source '{source}'; "
                "write it elsewhere"
            )
    fs, path = filesystem(destination)
    bucket = path.strip("/").split("/", 1)[0]
    with storage_errors(destination):
        if scheme(destination) in S3_SCHEMES and not fs.exists(bucket):
            raise StorageError(
                f"the bucket of '{destination}' ('{bucket}') does not exist; create it first, "
                "or name another"
            )
    if holds_objects(destination):
        raise FormatError(
            f"destination '{destination}' exists; convert does not replace what is on object "
            "storage, even with --force (there is no rename to swap a replacement in safely) — "
            "remove it first, or choose another destination"
        )


def upload_store(local: str | os.PathLike[str], url: str) -> int:
    """Uploads the store at ``local`` to ``url``, its root ``zarr.json`` last; the leases of its
    local writers and temporary files stay behind.

    Returns:
        The number of objects written.

    Raises:
        StorageError: If the object store refuses or cannot be reached; what was uploaded is
            removed first.
    """
    root = Path(local)
    files = sorted(
        path
        for path in root.rglob("*")
        if path.is_file()
        and path.relative_to(root).parts[0] != LEASES
        and not path.name.endswith(PARTIAL_SUFFIX)
    )
    fs, base = filesystem(url)
    base = base.rstrip("/")
    last = root / ROOT_METADATA
    first = [path for path in files if path != last]
    try:
        with storage_errors(url):
            if first:
                fs.put(
                    [str(path) for path in first],
                    [f"{base}/{path.relative_to(root).as_posix()}" for path in first],
                )
            fs.put_file(str(last), f"{base}/{ROOT_METADATA}")
    except BaseException:
        _remove_partial(fs, base, url)
        raise
    log.info("uploaded %d objects to '%s'", len(files), url)
    return len(files)


def _remove_partial(fs: Any, base: str, url: str) -> None:
    """Removes what a failed upload put at ``base`` (it was empty before: checked by the caller)."""
    try:
        fs.invalidate_cache(base)
        if fs.exists(base):
            fs.rm(base, recursive=True)
    except Exception as error:  # the store is gone or unreachable: say what may be left
        log.warning(
            "could not remove the partial upload at '%s' (%s); remove it by hand", url, error
        )


__all__ = ["ROOT_METADATA", "check_url_destination", "holds_objects", "upload_store"]
