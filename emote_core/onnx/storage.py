"""A thread-safe store of numbered files in one directory.

Training keeps periodic artefacts (ONNX exports, checkpoints) in a :class:`CRUDStorage`. Each item
is one file named ``{prefix}{handle}.{extension}``, where the handle is a number that grows with
every item created. Files are always written to a temporary name first and renamed into place
with :func:`os.replace`, so nobody ever sees a half-written item.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TypeVar

from emote_core.errors import ConfigurationError, StorageError

__all__ = ["CRUDStorage", "StorageItem", "StorageItemHandle"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_DECIMAL = re.compile(r"[0-9]+")


def _as_bytes(data: bytes) -> bytes:
    # bytes(5) would silently make five zero bytes; accept only real binary data.
    if not isinstance(data, bytes | bytearray | memoryview):
        raise StorageError(
            f"stored data must be bytes, bytearray or memoryview, got {type(data).__name__}; "
            "encode text first or use create_with_saver"
        )
    return bytes(data)


@dataclass(frozen=True, order=True)
class StorageItemHandle:
    """The number that identifies an item in a :class:`CRUDStorage`.

    ``str(handle)`` gives the number; :meth:`from_string` reads it back.

    Attributes:
        value: The item's number, >= 0.

    Raises:
        StorageError: If ``value`` is not an integer >= 0.
    """

    value: int

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise StorageError(f"a storage handle must be an integer >= 0, got {self.value!r}")

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def from_string(cls, text: str) -> StorageItemHandle:
        """Parse a handle written by ``str(handle)``.

        Args:
            text: Decimal digits, such as ``"12"``; surrounding whitespace is ignored.

        Returns:
            The handle.

        Raises:
            StorageError: If ``text`` is not a string of decimal digits.
        """
        stripped = text.strip() if isinstance(text, str) else None
        if stripped is None or not _DECIMAL.fullmatch(stripped):
            raise StorageError(
                f"a storage handle is a non-negative decimal integer such as '12', got {text!r}"
            )
        return cls(int(stripped))


@dataclass(frozen=True)
class StorageItem:
    """One stored file.

    Attributes:
        handle: The item's handle.
        timestamp: When the item's file was last written (UTC).
        filepath: The path of the item's file.
    """

    handle: StorageItemHandle
    timestamp: datetime
    filepath: str


class CRUDStorage:
    """Creates, reads, updates and deletes numbered files in a directory, from any thread.

    Handles grow by one with every item created and are never reused by the same storage object,
    even after a delete. Opening a directory that already holds items picks them up and numbers
    new ones after the highest handle found. All methods are thread-safe; a saver given to
    :meth:`create_with_saver` runs without holding the lock, so slow exports do not block readers.

    Args:
        directory: Where the files live; created if missing.
        prefix: Text before the handle in each file name.
        extension: File name extension without the dot (a leading dot is dropped); empty for none.
        max_items: If set, creating an item beyond this many deletes the oldest items (lowest
            handles) until ``max_items`` remain.

    Raises:
        ConfigurationError: If ``prefix`` or ``extension`` contains a path separator, or
            ``max_items`` is not an integer >= 1.
        StorageError: If ``directory`` exists but is not a directory or cannot be created.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefix: str = "",
        extension: str = "bin",
        max_items: int | None = None,
    ) -> None:
        extension = extension.removeprefix(".")
        for name, text in (("prefix", prefix), ("extension", extension)):
            if "/" in text or os.sep in text or (os.altsep and os.altsep in text):
                raise ConfigurationError(
                    f"CRUDStorage: {name} must not contain a path separator, got {text!r}; "
                    "put folders in directory instead"
                )
        if max_items is not None and (
            isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1
        ):
            raise ConfigurationError(
                f"CRUDStorage: max_items must be None or an integer >= 1, got {max_items!r}"
            )
        self._directory = os.fspath(directory)
        self._prefix = prefix
        self._suffix = f".{extension}" if extension else ""
        self._max_items = max_items
        self._pattern = re.compile(re.escape(prefix) + r"(0|[1-9][0-9]*)" + re.escape(self._suffix))
        self._lock = threading.RLock()
        self._items: dict[StorageItemHandle, StorageItem] = {}
        try:
            os.makedirs(self._directory, exist_ok=True)
        except OSError as error:
            raise StorageError(
                f"cannot use {self._directory!r} as a storage directory: {error}"
            ) from error
        self._scan_existing()
        self._next_handle = max((h.value for h in self._items), default=-1) + 1

    @property
    def directory(self) -> str:
        """The directory holding the files."""
        return self._directory

    def _scan_existing(self) -> None:
        for entry in os.scandir(self._directory):
            match = self._pattern.fullmatch(entry.name)
            if match is None or not entry.is_file():
                continue
            handle = StorageItemHandle(int(match.group(1)))
            timestamp = datetime.fromtimestamp(entry.stat().st_mtime, tz=UTC)
            self._items[handle] = StorageItem(
                handle=handle, timestamp=timestamp, filepath=entry.path
            )
        if self._items:
            logger.debug("found %d existing items in %s", len(self._items), self._directory)

    def _filepath(self, handle: StorageItemHandle) -> str:
        return os.path.join(self._directory, f"{self._prefix}{handle}{self._suffix}")

    def _temporary_path(self) -> str:
        # Hidden, and ".tmp" before the suffix means it never matches an item's file name.
        return os.path.join(self._directory, f".{uuid.uuid4().hex}.tmp{self._suffix}")

    def _unknown(self, handle: StorageItemHandle) -> StorageError:
        return StorageError(
            f"storage {self._directory!r} has no item with handle {handle}; "
            "it was deleted or never created — list the handles with items()"
        )

    def create_with_saver(self, saver: Callable[[str], None]) -> StorageItem:
        """Create an item by letting ``saver`` write its file.

        ``saver`` writes to a temporary path in the storage directory; only when it returns is
        the file renamed into place and the item created. If ``saver`` raises, the temporary file
        is removed, no item is created and the error propagates.

        Args:
            saver: Called with the temporary path to write to.

        Returns:
            The new item.

        Raises:
            StorageError: If ``saver`` returns without writing a file at the path.
        """
        temporary = self._temporary_path()
        try:
            saver(temporary)
            if not os.path.isfile(temporary):
                raise StorageError(
                    f"the saver returned without writing a file at {temporary!r}; "
                    "it must write to exactly the path it is given"
                )
            return self._commit(temporary)
        finally:
            if os.path.lexists(temporary):
                os.remove(temporary)

    def _commit(self, temporary: str) -> StorageItem:
        """Rename a fully written temporary file into place as a new item."""
        with self._lock:
            handle = StorageItemHandle(self._next_handle)
            filepath = self._filepath(handle)
            os.replace(temporary, filepath)
            # Handles are taken only on success, so they follow the order items appear in.
            self._next_handle += 1
            item = StorageItem(handle=handle, timestamp=datetime.now(UTC), filepath=filepath)
            self._items[handle] = item
            logger.debug("created item %s at %s", handle, filepath)
            self._eject_beyond_max_items()
            return item

    def create_with_data(self, data: bytes) -> StorageItem:
        """Create an item whose file holds ``data``.

        Args:
            data: The file's content.

        Returns:
            The new item.

        Raises:
            StorageError: If ``data`` is not bytes-like.
        """
        payload = _as_bytes(data)

        def write(path: str) -> None:
            with open(path, "wb") as file:
                file.write(payload)

        return self.create_with_saver(write)

    def create_from_filepath(
        self, path: str | os.PathLike[str], *, move: bool = False
    ) -> StorageItem:
        """Create an item from an existing file.

        Args:
            path: The file to take in.
            move: Move the file instead of copying it.

        Returns:
            The new item.

        Raises:
            StorageError: If ``path`` is not an existing file.
        """
        source = os.fspath(path)
        if not os.path.isfile(source):
            raise StorageError(f"cannot store {source!r}: it is not an existing file")
        if not move:

            def copy(target: str) -> None:
                shutil.copyfile(source, target)

            return self.create_with_saver(copy)
        temporary = self._temporary_path()
        shutil.move(source, temporary)
        try:
            return self._commit(temporary)
        except BaseException:
            shutil.move(temporary, source)  # give the caller their file back
            raise

    def update(self, handle: StorageItemHandle, data: bytes) -> StorageItem:
        """Replace the content of an item's file.

        Args:
            handle: The item to update.
            data: The new content.

        Returns:
            The item with its new timestamp.

        Raises:
            StorageError: If there is no item with ``handle`` or ``data`` is not bytes-like.
        """
        payload = _as_bytes(data)
        temporary = self._temporary_path()
        try:
            with open(temporary, "wb") as file:
                file.write(payload)
            with self._lock:
                item = self._items.get(handle)
                if item is None:
                    raise self._unknown(handle)
                os.replace(temporary, item.filepath)
                item = replace(item, timestamp=datetime.now(UTC))
                self._items[handle] = item
                return item
        finally:
            if os.path.lexists(temporary):
                os.remove(temporary)

    def process_data(self, handle: StorageItemHandle, fn: Callable[[str], T]) -> T:
        """Call ``fn`` with an item's file path while holding the lock.

        No other thread can update or delete the item while ``fn`` runs. ``fn`` may call this
        storage's other methods from the same thread.

        Args:
            handle: The item to read.
            fn: Reads the file at the path it is given.

        Returns:
            What ``fn`` returns.

        Raises:
            StorageError: If there is no item with ``handle``.
        """
        with self._lock:
            item = self._items.get(handle)
            if item is None:
                raise self._unknown(handle)
            return fn(item.filepath)

    def get(self, handle: StorageItemHandle) -> StorageItem | None:
        """Returns the item with ``handle``, or ``None`` if there is none."""
        with self._lock:
            return self._items.get(handle)

    def latest(self) -> StorageItem | None:
        """Returns the item with the highest handle, or ``None`` if the storage is empty."""
        with self._lock:
            if not self._items:
                return None
            return self._items[max(self._items)]

    def items(self) -> list[StorageItem]:
        """Returns all items, ordered by handle."""
        with self._lock:
            return [self._items[handle] for handle in sorted(self._items)]

    def delete(self, handle: StorageItemHandle) -> bool:
        """Delete an item and its file.

        Args:
            handle: The item to delete.

        Returns:
            Whether there was such an item.
        """
        with self._lock:
            item = self._items.pop(handle, None)
            if item is None:
                return False
            try:
                os.remove(item.filepath)
            except FileNotFoundError:
                logger.warning("file of item %s was already gone: %s", handle, item.filepath)
            logger.debug("deleted item %s", handle)
            return True

    def _eject_beyond_max_items(self) -> None:
        if self._max_items is None:
            return
        while len(self._items) > self._max_items:
            self.delete(min(self._items))

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __repr__(self) -> str:
        return f"CRUDStorage({self._directory!r}, items={len(self)})"
