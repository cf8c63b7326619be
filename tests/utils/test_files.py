"""Files read from a user's folders: regular files only, never past a size cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emote_core.errors import FormatError
from emote_core.utils.files import open_regular_file, read_regular_file


def test_a_regular_file_is_read_whole_up_to_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"0123456789")
    assert read_regular_file(path, limit=10, rule="fix") == b"0123456789"
    with pytest.raises(FormatError, match=r"holds 10 bytes, more than the 9 .*; keep it small$"):
        read_regular_file(path, limit=9, rule="keep it small")
    descriptor, info = open_regular_file(path, rule="fix")
    os.close(descriptor)
    assert info.st_size == 10


def test_a_named_pipe_a_device_and_a_folder_are_refused_without_waiting(tmp_path: Path) -> None:
    pipe, zero, folder = tmp_path / "pipe", tmp_path / "zero", tmp_path / "folder"
    os.mkfifo(pipe)  # opening it for reading would wait for a writer forever
    zero.symlink_to("/dev/zero")  # reading it would never end
    folder.mkdir()
    for path, mode in ((pipe, "p"), (zero, "c"), (folder, "d")):
        with pytest.raises(FormatError, match=rf"'{path}' is not a file \(mode {mode}.*; the rule"):
            read_regular_file(path, limit=1 << 20, rule="the rule")
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "absent", limit=1, rule="x")
