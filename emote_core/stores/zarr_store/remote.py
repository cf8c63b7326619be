"""Placing a finished store on object storage, where nothing can be renamed into place.

A store is written locally, in a staging folder of the system's temporary directory, then
uploaded with its root ``zarr.json`` last: until that one object lands there is no store at the
URL (readers find none), so a reader never sees a store half uploaded. The upload puts an
``emote-upload.json`` marker first (host and pid of the uploader) and removes it last. An upload
that fails removes what it put there; one killed outright leaves objects without a root
``zarr.json`` next to the marker, which a later conversion to the same URL replaces once the
marker proves the uploader was emote on this machine and is gone (anything else it refuses,
saying how to clear it). Staging folders are named with the pid and carry the same marker: one
a killed conversion left behind is removed when the next one starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from emote_core.errors import FormatError, StorageError
from emote_core.stores.locations import S3_SCHEMES, filesystem, is_url, scheme, storage_errors
from emote_core.stores.zarr_store.groups import PARTIAL_SUFFIX
from emote_core.stores.zarr_store.lease import LEASES, describe, holder_record, process_running

log = logging.getLogger(__name__)

ROOT_METADATA = "zarr.json"
UPLOAD_MARKER = "emote-upload.json"
"""The object an upload puts first and removes last, and the file in a staging folder: who is
uploading (``tool``, ``host``, ``pid``, ``since``, ``token``)."""
STAGING_PREFIX = "emote-upload-"
"""Staging folders are ``<temporary directory>/emote-upload-<pid>-<random>``."""


def _marker() -> bytes:
    return json.dumps({"tool": "emote", **holder_record(uuid.uuid4().hex)}).encode()


def _gone_uploader(marker: Any) -> bool | None:
    """Whether a marker's uploader is provably gone: emote's marker, written on this host by a
    process no longer running (``True``); running (``False``); unprovable (``None``)."""
    if not isinstance(marker, dict) or marker.get("tool") != "emote":
        return None
    pid = marker.get("pid")
    if marker.get("host") != socket.gethostname() or type(pid) is not int or pid <= 0:
        return None
    return not process_running(pid)


def _read_marker(fs: Any, path: str) -> Any:
    """The marker at ``path`` parsed, or ``None`` where none (or no JSON) is there."""
    try:
        return json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None


def unfinished_upload(url: str) -> bool:
    """Whether what is stored at ``url`` is provably an upload of emote's that was cut off:
    no root ``zarr.json``, and a marker written by an emote process on this machine that is no
    longer running. Such objects are emote's own and may be replaced.

    Raises:
        FormatError: If it is a store, an upload still running, or objects emote cannot prove
            it wrote (the message says how to clear them).
    """
    fs, path = filesystem(url)
    base = path.rstrip("/")
    with storage_errors(url):
        fs.invalidate_cache(base)
        if fs.exists(f"{base}/{ROOT_METADATA}"):
            raise FormatError(
                f"destination '{url}' exists; convert does not replace what is on object "
                "storage, even with `force=True` (there is no rename to swap a replacement in "
                "safely) — remove it first, or choose another destination"
            )
        marker = _read_marker(fs, f"{base}/{UPLOAD_MARKER}")
    gone = _gone_uploader(marker)
    if gone:
        return True
    if gone is False:
        raise FormatError(
            f"destination '{url}' is being uploaded right now by {describe(marker)}; wait for "
            "it to finish or stop it, or choose another destination"
        )
    clear = (
        f"if nothing is writing there, remove them (for S3: `aws s3 rm --recursive {url}`) and "
        "convert again, or choose another destination"
    )
    if isinstance(marker, dict) and marker.get("tool") == "emote":
        raise FormatError(
            f"destination '{url}' holds an unfinished upload (no {ROOT_METADATA}) by emote's "
            f"{describe(marker)}, which this machine cannot tell cut off — {clear}"
        )
    raise FormatError(
        f"destination '{url}' holds objects but no store (no {ROOT_METADATA}) and no upload "
        f"marker of emote's, so emote cannot prove it wrote them — {clear}"
    )


@contextmanager
def staging_folder() -> Iterator[Path]:
    """A fresh folder in the system's temporary directory to write a store in before its
    upload, removed on exit. Staging folders that processes no longer running on this machine
    left behind (killed outright) are removed first: only those named as emote names them that
    hold its marker.

    Raises:
        StorageError: If the folder cannot be made.
    """
    parent = Path(tempfile.gettempdir())
    try:
        entries = [p for p in parent.iterdir() if p.name.startswith(STAGING_PREFIX)]
    except OSError:
        entries = []
    for entry in entries:
        try:
            marker = json.loads((entry / UPLOAD_MARKER).read_text())
        except (OSError, ValueError):
            continue  # not emote's, or not readable: left alone
        if entry.name.startswith(f"{STAGING_PREFIX}{marker.get('pid')}-") and _gone_uploader(
            marker
        ):
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed '%s', left by a conversion that was cut off", entry)
    try:
        folder = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
        (folder / UPLOAD_MARKER).write_bytes(_marker())
    except OSError as error:
        raise StorageError(f"cannot make a staging folder in '{parent}' ({error})") from error
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
            "convert to a local file, then copy it (or convert to a store: `target_format='zarr'`)"
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
        unfinished_upload(destination)  # refuses all but an upload of emote's cut off


def upload_store(local: str | os.PathLike[str], url: str) -> int:
    """Uploads the store at ``local`` to ``url``: the marker first, its root ``zarr.json``
    last, then the marker removed; the leases of its local writers and temporary files stay
    behind. What an upload of emote's cut off left at ``url`` is removed first.

    Returns:
        The number of objects written.

    Raises:
        FormatError: If objects other than a cut-off upload's are at ``url``
            (:func:`unfinished_upload`).
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
    first = [path for path in files if path != last and path.name != UPLOAD_MARKER]
    if holds_objects(url) and unfinished_upload(url):
        with storage_errors(url):
            fs.rm(base, recursive=True)
        log.warning("removed the upload to '%s' that a conversion cut off left there", url)
    try:
        with storage_errors(url):
            fs.pipe_file(f"{base}/{UPLOAD_MARKER}", _marker())
            log.debug("uploading %d objects to '%s', its %s last", len(first) + 1, url, last.name)
            if first:
                fs.put(
                    [str(path) for path in first],
                    [f"{base}/{path.relative_to(root).as_posix()}" for path in first],
                )
            fs.put_file(str(last), f"{base}/{ROOT_METADATA}")
    except BaseException:
        _remove_partial(fs, base, url)
        raise
    try:  # the store is complete: a marker left over only names who uploaded it
        with storage_errors(url):
            fs.rm_file(f"{base}/{UPLOAD_MARKER}")
    except Exception as error:
        log.warning("could not remove '%s/%s' (%s)", url, UPLOAD_MARKER, error)
    log.info("uploaded %d objects to '%s'", len(first) + 1, url)
    return len(first) + 1


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


__all__ = [
    "ROOT_METADATA",
    "STAGING_PREFIX",
    "UPLOAD_MARKER",
    "check_url_destination",
    "holds_objects",
    "staging_folder",
    "unfinished_upload",
    "upload_store",
]
