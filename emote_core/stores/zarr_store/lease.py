"""One writer per shard: the lease a :class:`~.writer.ShardWriter` holds while it appends.

**Local paths.** ``<store>/leases/<shard>.lock`` is a file the writer holds an exclusive
``flock`` on for as long as it writes, and in which it records who it is (host, pid, since).
The kernel drops the lock when the process ends, however it ends (SIGKILL included), so the
lease of a dead writer is free at once and the next writer takes it over (and repairs the torn
tail the dead one may have left). Guaranteed: two processes on one machine never hold the lease
of one shard at once; on a network file system this holds only where it implements ``flock``.

**fsspec URLs** (``s3://``, ``gs://``, ``memory://``). ``<store>/leases/<shard>.json`` is created
with the file system's exclusive create (``open(..., "xb")``: a conditional PUT on S3) and names
its holder and a random token; the holder refreshes its ``heartbeat`` at every commit and checks,
before each commit, that the lease still holds its token. A lease whose heartbeat is older than
``timeout`` seconds is taken over. Guaranteed where the backend's exclusive create is atomic
(S3 conditional writes, GCS generation preconditions, local and memory file systems): one
holder at a time, and a holder that lost its lease (it stalled past ``timeout``) commits
nothing more. Where it is not atomic, two writers that start within the same moment can both
believe they hold it; give parallel writers their own shards there.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from emote_core.errors import StorageError

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
                "shard (--shard NAME)"
            ) from None
        self.previous = _read_json(handle) or None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder_record(self.token)).encode())
        handle.flush()
        self._file = handle

    # Remote: exclusive create, heartbeat, token check.

    def _remote(self) -> tuple[Any, str]:
        import fsspec

        fs, root = fsspec.core.url_to_fs(self.url)
        return fs, f"{root.rstrip('/')}/{LEASES}/{self.shard}.json"

    def _acquire_remote(self) -> None:
        fs, path = self._remote()
        record = json.dumps(holder_record(self.token)).encode()
        try:
            with fs.open(path, "xb") as file:
                file.write(record)
            return
        except FileExistsError:
            pass
        holder = self._read_remote()
        age = time.time() - float(holder.get("heartbeat", 0.0))
        if age < self.timeout:
            raise StorageError(
                f"shard '{self.shard}' of store '{self.url}' is being written by "
                f"{describe(holder)} (heartbeat {age:.0f} s ago; taken over after "
                f"{self.timeout:.0f} s); one writer per shard — wait for it, or write to "
                "another shard (--shard NAME)"
            )
        self.previous = holder
        with fs.open(path, "wb") as file:
            file.write(record)
        if self._read_remote().get("token") != self.token:
            raise StorageError(
                f"another writer took over the stale lease of shard '{self.shard}' of store "
                f"'{self.url}' at the same moment; write to another shard"
            )

    def _read_remote(self) -> dict[str, Any]:
        fs, path = self._remote()
        try:
            return json.loads(fs.cat_file(path))
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError):
            return {"heartbeat": 0.0}  # an unreadable lease is as good as stale

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
        holder = self._read_remote()
        if holder.get("token") != self.token:
            raise StorageError(
                f"lost the lease of shard '{self.shard}' of store '{self.url}' to "
                f"{describe(holder)} (no heartbeat for over {self.timeout:.0f} s); nothing more "
                "is committed by this writer"
            )
        if not refresh:
            return
        fs, path = self._remote()
        holder["heartbeat"] = time.time()
        with fs.open(path, "wb") as file:
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
        elif self._read_remote().get("token") == self.token:
            fs, path = self._remote()
            fs.rm_file(path)


def _read_json(handle: Any) -> dict[str, Any]:
    handle.seek(0)
    try:
        return json.loads(handle.read() or b"{}")
    except ValueError:
        return {}


__all__ = ["DEFAULT_TIMEOUT", "LEASES", "ShardLease", "describe", "is_local"]
