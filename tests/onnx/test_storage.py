from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError, StorageError
from emote_core.onnx.storage import CRUDStorage, StorageItem, StorageItemHandle


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def files_in(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_create_read_update_delete(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path / "exports", prefix="policy_", extension="onnx")
    assert (tmp_path / "exports").is_dir()
    assert storage.latest() is None

    first = storage.create_with_data(b"one")
    second = storage.create_with_data(b"two")
    assert [first.handle.value, second.handle.value] == [0, 1]
    assert first.filepath == str(tmp_path / "exports" / "policy_0.onnx")
    assert first.timestamp.tzinfo is UTC
    assert read_bytes(second.filepath) == b"two"
    assert storage.latest() == second
    assert storage.get(first.handle) == first
    assert storage.items() == [first, second]

    updated = storage.update(first.handle, b"uno")
    assert updated.timestamp >= first.timestamp
    assert storage.process_data(first.handle, read_bytes) == b"uno"

    assert storage.delete(first.handle) is True
    assert storage.delete(first.handle) is False
    assert storage.get(first.handle) is None
    assert not os.path.exists(first.filepath)
    assert files_in(tmp_path / "exports") == ["policy_1.onnx"]
    assert len(storage) == 1


def test_handles_are_never_reused_after_delete(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path)
    items = [storage.create_with_data(bytes([i])) for i in range(3)]
    storage.delete(items[2].handle)
    assert storage.create_with_data(b"x").handle.value == 3


def test_unknown_handle_in_update_and_process_data(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path)
    missing = StorageItemHandle(7)
    with pytest.raises(StorageError, match="no item with handle 7"):
        storage.update(missing, b"x")
    with pytest.raises(StorageError, match="no item with handle 7"):
        storage.process_data(missing, read_bytes)
    assert files_in(tmp_path) == []  # the failed update left no temporary file


def test_create_from_filepath_copies_or_moves(tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    source.write_bytes(b"weights")
    storage = CRUDStorage(tmp_path / "store", extension=".pt")

    copied = storage.create_from_filepath(source)
    assert source.exists()
    assert copied.filepath.endswith("0.pt")
    assert read_bytes(copied.filepath) == b"weights"

    moved = storage.create_from_filepath(str(source), move=True)
    assert not source.exists()
    assert read_bytes(moved.filepath) == b"weights"

    with pytest.raises(StorageError, match="must be bytes, bytearray or memoryview, got int"):
        storage.create_with_data(5)  # type: ignore[arg-type]
    assert storage.create_with_data(bytearray(b"ab")).handle.value == 2
    storage.delete(StorageItemHandle(2))

    with pytest.raises(StorageError, match="not an existing file"):
        storage.create_from_filepath(tmp_path / "missing.pt")
    assert len(storage) == 2


def test_saver_writes_to_a_temporary_path_then_renames(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path, extension="txt")
    seen: list[str] = []

    def saver(path: str) -> None:
        seen.append(path)
        # While the saver runs, nothing visible to readers exists yet.
        assert storage.items() == []
        with open(path, "w") as file:
            file.write("done")

    item = storage.create_with_saver(saver)
    assert seen[0] != item.filepath
    assert os.path.dirname(seen[0]) == str(tmp_path)  # same filesystem: the rename is atomic
    assert seen[0].endswith(".txt")
    assert files_in(tmp_path) == ["0.txt"]


def test_failing_saver_leaves_no_file_and_no_item(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path)

    def half_write_then_fail(path: str) -> None:
        with open(path, "wb") as file:
            file.write(b"partial")
        raise RuntimeError("export crashed")

    with pytest.raises(RuntimeError, match="export crashed"):
        storage.create_with_saver(half_write_then_fail)
    assert files_in(tmp_path) == []
    assert storage.items() == []
    assert storage.latest() is None

    with pytest.raises(StorageError, match="without writing a file"):
        storage.create_with_saver(lambda path: None)
    assert storage.items() == []
    assert storage.create_with_data(b"ok").handle.value == 0


def test_max_items_deletes_the_oldest(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path, prefix="ckpt", max_items=3)
    for i in range(6):
        storage.create_with_data(bytes([i]))
    assert [item.handle.value for item in storage.items()] == [3, 4, 5]
    assert files_in(tmp_path) == ["ckpt3.bin", "ckpt4.bin", "ckpt5.bin"]
    assert storage.process_data(StorageItemHandle(3), read_bytes) == bytes([3])


def test_reopen_picks_up_items_and_continues_numbering(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path, prefix="export_", extension="onnx")
    for i in range(4):
        storage.create_with_data(bytes([i]))
    storage.delete(StorageItemHandle(1))
    # Files that are not ours are ignored.
    for name in ("notes.txt", "export_.onnx", "export_x1.onnx", "export_01.onnx", "2.onnx"):
        (tmp_path / name).write_bytes(b"")

    reopened = CRUDStorage(tmp_path, prefix="export_", extension="onnx")
    assert [item.handle.value for item in reopened.items()] == [0, 2, 3]
    assert reopened.process_data(StorageItemHandle(2), read_bytes) == bytes([2])
    assert isinstance(reopened.get(StorageItemHandle(0)), StorageItem)
    assert reopened.get(StorageItemHandle(0)).timestamp <= datetime.now(UTC)  # type: ignore[union-attr]
    assert reopened.create_with_data(b"new").handle.value == 4


def test_concurrent_crud_loses_nothing(tmp_path: Path) -> None:
    storage = CRUDStorage(tmp_path)
    threads_count, per_thread = 8, 40
    barrier = threading.Barrier(threads_count)
    created: dict[int, list[StorageItem]] = {}
    deleted: dict[int, list[StorageItemHandle]] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            barrier.wait()
            mine: list[StorageItem] = []
            gone: list[StorageItemHandle] = []
            for i in range(per_thread):
                payload = f"{worker}:{i}".encode()
                item = storage.create_with_data(payload)
                mine.append(item)
                # Read back our own item; another thread may not touch it.
                assert storage.process_data(item.handle, read_bytes) == payload
                storage.items()
                storage.latest()
                if i % 3 == 0:
                    assert storage.delete(item.handle)
                    gone.append(item.handle)
            created[worker] = mine
            deleted[worker] = gone
        except BaseException as error:  # surfaced in the main thread below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    all_created = [item for items in created.values() for item in items]
    handles = [item.handle for item in all_created]
    assert len(handles) == threads_count * per_thread
    assert len(set(handles)) == len(handles)  # unique
    assert sorted(h.value for h in handles) == list(range(len(handles)))  # no gaps either

    all_deleted = {h for hs in deleted.values() for h in hs}
    remaining = storage.items()
    assert {item.handle for item in remaining} == set(handles) - all_deleted
    for worker, items in created.items():
        for i, item in enumerate(items):
            if item.handle not in all_deleted:
                assert read_bytes(item.filepath) == f"{worker}:{i}".encode()
    assert len(files_in(tmp_path)) == len(remaining)  # no stray temporary files


@given(st.integers(min_value=0, max_value=10**30))
def test_handle_string_round_trip(value: int) -> None:
    handle = StorageItemHandle(value)
    assert StorageItemHandle.from_string(str(handle)) == handle


@pytest.mark.parametrize("text", ["", "abc", "-1", "1.5", "0x10", "1 2", "١٢"])
def test_handle_from_bad_string(text: str) -> None:
    with pytest.raises(StorageError, match=r"non-negative decimal integer such as '12', got"):
        StorageItemHandle.from_string(text)


def test_handle_rejects_bad_values() -> None:
    with pytest.raises(StorageError, match="integer >= 0, got -3"):
        StorageItemHandle(-3)
    assert StorageItemHandle.from_string(" 42\n").value == 42
    assert sorted([StorageItemHandle(10), StorageItemHandle(2)])[0].value == 2


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"prefix": "a/b"}, "prefix must not contain a path separator"),
        ({"extension": "x/y"}, "extension must not contain a path separator"),
        ({"max_items": 0}, "max_items must be None or an integer >= 1, got 0"),
    ],
)
def test_bad_configuration(tmp_path: Path, kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=pattern):
        CRUDStorage(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_directory_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    with pytest.raises(StorageError, match=r"cannot use .* as a storage directory"):
        CRUDStorage(path)
