"""One writer per shard: the lease a :class:`~.writer.ShardWriter` holds while it appends.

Local paths: an exclusive ``flock`` on ``<store>/leases/<shard>.lock``, which the kernel drops
when the writer's process ends however it ends. fsspec URLs: numbered files
``<store>/leases/<shard>/<generation>.json`` made by exclusive create; the newest generation
holds the shard, a writer takes over when its holder's heartbeat is older than ``timeout``, and
a holder that was taken over commits nothing more. Either holds only where the file system's
``flock`` / exclusive create is atomic; otherwise give parallel writers their own shards.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from emote_core.errors import StorageError
from emote_core.stores.locations import describe_error, filesystem, storage_errors

log = logging.getLogger(__name__)

LEASES = "leases"
"""The folder of leases inside a store (not part of the Zarr hierarchy)."""
DEFAULT_TIMEOUT = 600.0
"""Seconds without a heartbeat after which a remote lease is taken over."""


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path (not an fsspec URL other than ``file://``)."""
    return "://" not in url or url.startswith("file://")


def holder_record(token: str) -> dict[str, Any]:
    """Who holds a lease: host, pid, when it began and a token unique to this holder."""
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "heartbeat": now,
        "token": token,
    }


def process_running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe(holder: dict[str, Any]) -> str:
    """``pid 1234 on host 'h' since 2026-11-24T10:00:00+00:00`` (what a refusal names)."""
    return (
        f"pid {holder.get('pid', '?')} on host '{holder.get('host', '?')}' "
        f"since {holder.get('since', '?')}"
    )


class ShardLease:
    """The exclusive right to append to one shard; acquired on creation.

    Args:
        url: The store.
        shard: The shard.
        timeout: Seconds after which a remote lease without a heartbeat is taken over.

    Raises:
        StorageError: If another live writer holds the shard (naming it), or the lease cannot
            be written.
    """

    def __init__(self, url: str, shard: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.local = is_local(url)
        self.url = url.removeprefix("file://") if self.local else url
        self.shard = shard
        self.timeout = float(timeout)
        self.token = uuid.uuid4().hex
        self.held = False
        self.previous: dict[str, Any] | None = None
        """The record of the holder this lease took over from (a dead or stalled writer)."""
        self._file: Any = None
        self.generation = 0
        """The number of this holder's lease file (remote leases)."""
        if self.local:
            self._acquire_local()
        else:
            self._acquire_remote()
        self.held = True

    # Local: flock.

    def _acquire_local(self) -> None:
        import fcntl

        folder = os.path.join(self.url, LEASES)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{self.shard}.lock")
        handle = open(path, "a+b")  # noqa: SIM115 - held open for the lease's lifetime
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_json(handle)
            handle.close()
            raise StorageError(
                f"shard '{self.shard}' of store '{self.url}' is being written by "
                f"{describe(holder)}; one writer per shard — wait for it, or write to another "
                "shard (`shard`)"
            ) from None
        self.previous = _read_json(handle) or None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder_record(self.token)).encode())
        handle.flush()
        self._file = handle

    # Remote: numbered lease files, each made with an exclusive create.

    def _folder(self) -> tuple[Any, str]:
        fs, root = filesystem(self.url)
        return fs, f"{root.rstrip('/')}/{LEASES}/{self.shard}"

    def _generations(self) -> list[int]:
        """The generations of this shard's lease files, oldest first, listed afresh (a cached
        listing would hide a writer that took over since)."""
        fs, folder = self._folder()
        fs.invalidate_cache(folder)
        try:
            names = fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            stem = str(name).rstrip("/").rsplit("/", 1)[-1].removesuffix(".json")
            if stem.isdigit():
                found.append(int(stem))
        return sorted(found)

    def _path(self, generation: int) -> str:
        return f"{self._folder()[1]}/{generation:012d}.json"

    def _acquire_remote(self) -> None:
        fs, _ = self._folder()
        with storage_errors(self.url):
            generations = self._generations()
            if generations:
                holder = self._read_remote(generations[-1])
                age = time.time() - float(holder.get("heartbeat", 0.0))
                if holder and age < self.timeout:
                    raise StorageError(
                        f"shard '{self.shard}' of store '{self.url}' is being written by "
                        f"{describe(holder)} (heartbeat {age:.0f} s ago; taken over after "
                        f"{self.timeout:.0f} s); one writer per shard — wait for it, or write "
                        "to another shard (`shard`)"
                    )
                self.previous = holder or None
            self.generation = (generations[-1] if generations else 0) + 1
            try:
                with fs.open(self._path(self.generation), "xb") as file:
                    file.write(json.dumps(holder_record(self.token)).encode())
            except FileExistsError:
                raise self._raced() from None
            newest = self._generations()
            if not newest or newest[-1] != self.generation:  # a later one was made meanwhile
                with contextlib.suppress(FileNotFoundError):
                    fs.rm_file(self._path(self.generation))
                raise self._raced()
            for older in generations:  # the stale holders' files: best effort
                with contextlib.suppress(FileNotFoundError):
                    fs.rm_file(self._path(older))

    def _raced(self) -> StorageError:
        return StorageError(
            f"another writer took the lease of shard '{self.shard}' of store '{self.url}' at "
            "the same moment; write to another shard"
        )

    def _read_remote(self, generation: int) -> dict[str, Any]:
        fs, _ = self._folder()
        try:
            return json.loads(fs.cat_file(self._path(generation)))
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError):
            return {"heartbeat": 0.0}  # an unreadable lease is as good as stale

    def _newest_holder(self) -> dict[str, Any]:
        generations = self._generations()
        return self._read_remote(generations[-1]) if generations else {}

    def check(self, *, refresh: bool = True) -> None:
        """The lease is still ours; a remote lease also gets a fresh heartbeat (``refresh``).

        Raises:
            StorageError: If it was released, or another writer took it over.
        """
        if not self.held:
            raise StorageError(
                f"the writer of shard '{self.shard}' of store '{self.url}' was closed"
            )
        if self.local:
            return  # the kernel holds a local lease for us until we let go
        with storage_errors(self.url):
            holder = self._newest_holder()
            if holder.get("token") != self.token:
                raise StorageError(
                    f"lost the lease of shard '{self.shard}' of store '{self.url}' to "
                    f"{describe(holder)} (no heartbeat for over {self.timeout:.0f} s); nothing "
                    "more is committed by this writer"
                )
            if not refresh:
                return
            fs, _ = self._folder()
            holder["heartbeat"] = time.time()
            with fs.open(self._path(self.generation), "wb") as file:
                file.write(json.dumps(holder).encode())

    def release(self) -> None:
        """Lets go of the lease (idempotent)."""
        if not self.held:
            return
        self.held = False
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()  # a lease let go of names no holder
            self._file.close()  # closing drops the flock
            self._file = None
        else:
            try:
                if self._read_remote(self.generation).get("token") == self.token:
                    fs, _ = self._folder()
                    fs.rm_file(self._path(self.generation))
            except Exception as error:  # unreachable now: the lease goes stale on its own
                log.warning(
                    "could not let go of the lease of shard '%s' of store '%s' (%s); another "
                    "writer takes it over %.0f s after its last heartbeat",
                    self.shard, self.url, describe_error(self.url, error) or error, self.timeout,
                )  # fmt: skip


def _read_json(handle: Any) -> dict[str, Any]:
    handle.seek(0)
    try:
        return json.loads(handle.read() or b"{}")
    except ValueError:
        return {}


__all__ = ["DEFAULT_TIMEOUT", "LEASES", "ShardLease", "describe", "is_local", "process_running"]
