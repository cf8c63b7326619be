"""Converting memories: hash a source, read it, write a target safely.

:func:`convert` reads a source and writes a target under a temporary name in the destination's
directory, renamed into place only when complete: a failure leaves no partial destination and
no temporary files, and an existing destination is replaced only with ``force``. A store at a
URL (object storage has no rename) is written locally and uploaded with its root metadata last
(:mod:`emote_core.stores.zarr_store.remote`); a URL that holds anything is never replaced.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from emote_core.errors import FormatError, StorageError
from emote_core.integrations.formats import lookup_format, read_source
from emote_core.stores.locations import is_url
from emote_core.stores.provenance import Provenance
from emote_core.stores.sources import Progress, WriteOptions, check_finite, length_key
from emote_core.stores.stored import StoredTable
from emote_core.stores.zarr_store.lease import process_running
from emote_core.stores.zarr_store.writer import is_store

log = logging.getLogger(__name__)
# Hashing sources.


def source_sha256(location: str) -> tuple[str | None, str]:
    """The sha256 of a source, and what was hashed.

    A file's hash is that of its bytes. A directory's is the sha256 over its files in sorted
    order of their relative POSIX paths, each contributing its path (UTF-8), a NUL byte, its size
    as 8 little-endian bytes and its content; the same tree hashes the same wherever it lies.

    Returns:
        ``(hex digest, "file" | "directory")``, or ``(None, reason)`` where nothing local can be
        hashed (a URL, a dataset id).
    """
    path = Path(location)
    if "://" in location or not path.exists():
        return None, "not hashed: the source is not a local file or directory"
    digest = hashlib.sha256()
    if path.is_file():
        _hash_file(digest, path)
        return digest.hexdigest(), "file"
    files = sorted((f.relative_to(path).as_posix(), f) for f in path.rglob("*") if f.is_file())
    for relative, file in files:
        digest.update(relative.encode() + b"\0" + file.stat().st_size.to_bytes(8, "little"))
        _hash_file(digest, file)
    return digest.hexdigest(), "directory"


def _local_path(location: str, name: str) -> str:
    """Where a source lies on this machine: a Minari dataset id resolves under Minari's root, a
    tmrl dataset folder to its ``data.pkl`` (so the folder and the file hash the same)."""
    if name == "minari" and not Path(location).exists():
        from emote_core.integrations.minari.datasets import datasets_root

        return str(datasets_root() / location)
    if name == "tmrl-dataset" and Path(location).is_dir():
        from emote_core.integrations.tmrl.dataset import dataset_file

        return str(dataset_file(location))
    return location


def _hash_file(digest: Any, path: Path) -> None:
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)


# Converting.


def convert(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    source_format: str | None = None,
    target_format: str = "zarr",
    trust_pickle: bool = False,
    force: bool = False,
    progress: Progress | None = None,
    skip_damaged: bool = False,
    allow_nonfinite: bool = False,
    command: Sequence[str] = (),
) -> dict[str, Any]:
    """Reads ``source`` and writes it to ``destination`` in ``target_format``, atomically.

    The target appears under its name only when complete, and records its source's
    ``{"format", "sha256", "path"}`` (an emote-memory store also the ``command`` and emote's
    version).

    Args:
        source: Any source :func:`read_source` reads.
        destination: The file or store to write (a dataset id for dataset targets).
        source_format: Read the source as this format instead of detecting it.
        target_format: A name from :func:`target_formats`.
        trust_pickle: Unpickle without restrictions (runs the file's code).
        force: Replace an existing destination.
        progress: Called with (episodes written, episodes in all) while writing.
        skip_damaged: Convert the intact episodes of a damaged store (by default it is refused).
        allow_nonfinite: Keep NaN and infinite values in float columns (by default a source
            holding any is refused, see :func:`check_finite`).
        command: The command line that asked for the conversion (``sys.argv``).

    Returns:
        The summary: ``source``, ``source_format``, ``source_sha256``, ``destination``,
        ``target_format``, ``episodes``, ``transitions`` and ``seconds``.

    Raises:
        FormatError: If a format is unknown, the source cannot be read or holds non-finite
            values (without ``allow_nonfinite``), or the destination exists without ``force``.
        StorageError: If the destination cannot be written.
    """
    started = time.perf_counter()
    source_text, target_text = os.fspath(source), os.fspath(destination)
    target = lookup_format(target_format, "target")
    if target.target != "dataset":
        _check_destination(source_text, target_text, force, target.name)
    name, stored = read_source(
        source_text, source_format=source_format, trust_pickle=trust_pickle,
        skip_damaged=skip_damaged,
    )  # fmt: skip
    if not allow_nonfinite:
        check_finite(stored)
    log.info("read %d episodes from '%s' (%s)", len(stored.episodes), source_text, name)
    sha256, hashed = source_sha256(_local_path(source_text, name))
    origin: dict[str, Any] = {"format": name, "sha256": sha256, "sha256_of": hashed}
    origin["path"] = source_text if "://" in source_text else os.path.abspath(source_text)
    record = Provenance(command=tuple(command), source=origin)
    write_target(
        stored, target_text, target.name, source=origin, force=force, progress=progress,
        provenance=record,
    )  # fmt: skip
    key = length_key(stored)
    return {
        "source": source_text,
        "source_format": name,
        "source_sha256": sha256,
        "destination": target_text,
        "target_format": target.name,
        "episodes": len(stored.episodes),
        "transitions": int(sum(len(data[key]) for _, data, _ in stored.episodes)),
        "seconds": time.perf_counter() - started,
    }


def write_target(
    stored: StoredTable,
    destination: str | os.PathLike[str],
    target_format: str = "zarr",
    *,
    source: dict[str, Any] | None = None,
    force: bool = False,
    progress: Progress | None = None,
    provenance: Provenance | None = None,
) -> None:
    """Writes ``stored`` to ``destination`` in ``target_format``, all or nothing.

    Files and stores are written under a temporary name in the destination's directory and
    renamed into place when complete; on any failure neither a partial destination nor
    temporary files remain, and an existing destination is left as it was.

    Args:
        stored: What to write (any reader's output).
        destination: The file or store (a dataset id for dataset targets).
        target_format: A name from :func:`target_formats`.
        source: Where ``stored`` came from, recorded in the target where the format has room.
        force: Replace an existing destination.
        progress: Called with (episodes written, episodes in all) while writing.
        provenance: Who writes, recorded where the format has room (emote-memory stores).

    Raises:
        FormatError: If the format is unknown, the destination exists without ``force``, or an
            episode does not fit the target.
        StorageError: If the destination cannot be written.
    """
    target = lookup_format(target_format, "target")
    text = os.fspath(destination)
    write = target.write
    if write is None:  # pragma: no cover - _lookup returns only formats with a writer
        raise FormatError(f"'{target.name}' cannot be written")
    if target.name != "zarr":  # only emote-memory stores rebuild stacks from single frames
        from emote_core.stores.frame_stacks import with_whole_stacks

        stored = with_whole_stacks(stored)
    origin = dict(source or {"format": stored.format, "sha256": None, "path": stored.source})
    options = WriteOptions(origin, force, progress, provenance)
    if progress is not None:
        progress(0, len(stored.episodes))
    if target.target == "dataset":
        write(stored, text, options)
    elif is_url(text):  # no rename on object stores: written here, uploaded root metadata last
        from emote_core.stores.zarr_store.remote import staging_folder, upload_store

        _check_destination(None, text, force, target.name)
        with staging_folder() as folder:
            local = folder / "store"
            write(stored, str(local), options)
            upload_store(local, text)
    else:
        _check_destination(None, text, force, target.name)
        clean_leftovers(Path(text).parent)
        with _temporary_sibling(Path(text), target.target) as temporary:
            write(stored, str(temporary), options)
            _move_into_place(temporary, Path(text), force)
    if progress is not None:
        progress(len(stored.episodes), len(stored.episodes))


def _check_destination(
    source: str | None, destination: str, force: bool, target_format: str
) -> None:
    """Refuses destinations that would lose data: the source itself, a place inside the source
    or holding it, and (even with ``force``) anything but a store or file of the target format.
    """
    if is_url(destination):
        from emote_core.stores.zarr_store.remote import check_url_destination

        check_url_destination(source, destination, target_format)
        return
    target = Path(destination)
    if source is not None and "://" not in source:
        origin, written = Path(source).resolve(), target.resolve()
        if written == origin:
            raise FormatError(f"source and destination are the same ('{destination}')")
        if origin in written.parents:
            raise FormatError(
                f"destination '{destination}' is inside the source '{source}'; write it elsewhere"
            )
        if written in origin.parents:
            raise FormatError(
                f"destination '{destination}' holds the source '{source}'; replacing it would "
                "delete the source — write it elsewhere"
            )
    if target.exists() or target.is_symlink():
        if not force:
            raise FormatError(
                f"destination '{destination}' exists; pass `force=True` to replace it"
            )
        _check_replaceable(target, target_format)
    if not target.parent.is_dir():
        raise StorageError(
            f"cannot write '{destination}': directory '{target.parent}' does not exist"
        )


def _check_replaceable(target: Path, target_format: str) -> None:
    """``--force`` replaces what emote would have written there, nothing else.

    Raises:
        FormatError: If ``target`` is a link, or not a store or file of ``target_format``.
    """
    if target.is_symlink():
        raise FormatError(f"'{target}' is a symbolic link; `force=True` replaces no links")
    if target_format == "zarr":
        if target.is_dir() and is_store(target):
            return
        raise FormatError(
            f"'{target}' is not an emote memory store; `force=True` replaces only a store "
            "(it would delete what is there) — choose another destination"
        )
    if not target.is_file():
        raise FormatError(
            f"'{target}' is a directory; `force=True` replaces only a {target_format} file — "
            "choose another destination"
        )
    if not _is_format(target, target_format):
        raise FormatError(
            f"'{target}' is not a {target_format} file; `force=True` replaces only a file of the "
            "format it writes — choose another destination"
        )


def _is_format(path: Path, target_format: str) -> bool:
    """Whether a file holds ``target_format`` (by content, as emote writes it)."""
    try:
        if target_format in ("emote-v1", "npz", "pt"):
            if not zipfile.is_zipfile(path):
                return False
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
            if target_format == "emote-v1":
                return "version" in names and "configuration.json" in names
            if target_format == "npz":
                return bool(names) and all(name.endswith(".npy") for name in names)
            return any(name.endswith("data.pkl") for name in names)  # torch.save's zip
        if target_format == "csv":
            with open(path, encoding="utf-8") as file:
                header = file.readline()
            return path.suffix.lower() == ".csv" and "," in header
    except (OSError, UnicodeDecodeError, zipfile.BadZipFile):
        return False
    return False


_LEFTOVER = re.compile(r"^\.emote-(tmp|old)-(\d+)-(.+)$")


def clean_leftovers(directory: Path) -> None:
    """Tidies what conversions killed midway left in ``directory``: only emote's own temporary
    names, and only those of processes no longer running on this machine.

    ``.emote-tmp-<pid>-*`` is an unfinished target: removed. ``.emote-old-<pid>-<name>`` is a
    replaced destination set aside: removed when ``<name>`` (its replacement) is in place, put
    back as ``<name>`` when the process died before the replacement arrived.
    """
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for path in entries:
        match = _LEFTOVER.match(path.name)
        if match is None or process_running(int(match.group(2))):
            continue
        kind, name = match.group(1), match.group(3)
        if kind == "old" and not (directory / name).exists():
            os.rename(path, directory / name)
            log.warning("restored '%s' from '%s', set aside by a conversion cut off", name, path)
            continue
        _remove(path)
        log.info("removed '%s', left by a conversion that was cut off", path)


@contextmanager
def _temporary_sibling(destination: Path, kind: str) -> Iterator[Path]:
    """A fresh temporary name next to ``destination``, removed on exit if still there."""
    prefix = f".emote-tmp-{os.getpid()}-"
    try:
        if kind == "directory":
            path = Path(tempfile.mkdtemp(dir=destination.parent, prefix=prefix))
        else:
            # The destination's name ends the temporary one, so writers that add a suffix
            # (numpy's savez adds ".npz") see the one they expect.
            handle, name = tempfile.mkstemp(
                dir=destination.parent, prefix=prefix, suffix=f"-{destination.name}"
            )
            os.close(handle)
            path = Path(name)
    except OSError as error:
        raise StorageError(f"cannot write '{destination}' ({error})") from error
    try:
        yield path
    finally:
        _remove(path)


def _default_permissions(path: Path) -> None:
    """Gives a finished temporary file or directory the mode a plain create would have had."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _move_into_place(temporary: Path, destination: Path, force: bool) -> None:
    """Renames the finished ``temporary`` to ``destination``; an old one is removed only after."""
    try:
        _default_permissions(temporary)
        if not (destination.exists() or destination.is_symlink()):
            os.rename(temporary, destination)
            return
        if not force:
            raise FormatError(
                f"destination '{destination}' exists; pass `force=True` to replace it"
            )
        if temporary.is_file() and destination.is_file():
            os.replace(temporary, destination)
            return
        old = destination.with_name(f".emote-old-{os.getpid()}-{destination.name}")
        os.rename(destination, old)
        try:
            os.rename(temporary, destination)
        except BaseException:
            os.rename(old, destination)
            raise
        _remove(old)
    except OSError as error:
        raise StorageError(f"cannot move the result into '{destination}' ({error})") from error


__all__ = ["convert", "source_sha256", "write_target"]
