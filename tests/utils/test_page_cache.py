"""Reading files into the page cache ahead of their reads: what is asked of the kernel, what it
leaves cached, and that a hint never fails a read."""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import pytest

from emote_core.utils import page_cache

MB = 1 << 20


@pytest.fixture
def fresh(monkeypatch):
    """page_cache's module state as before its first call."""
    monkeypatch.setattr(page_cache, "_large_pages", None)
    monkeypatch.setattr(page_cache, "_libc_calls", None)
    monkeypatch.setattr(page_cache, "_cachestat_works", True)


def a_file(tmp_path, size: int) -> int:
    path = tmp_path / "chunk"
    path.write_bytes(os.urandom(size))
    return os.open(path, os.O_RDONLY)


class Recording:
    """libc's calls through, each recorded; ``refuse`` makes madvise fail with EINVAL."""

    def __init__(self, libc, refuse: bool = False, cached: bool = False) -> None:
        self.libc, self.refuse, self.cached, self.calls = libc, refuse, cached, []

    def syscall(self, number, descriptor, span, found, flags):
        result = self.libc.syscall(number, descriptor, span, found, flags)
        if not self.cached:
            found._obj.cache = 0
        return result

    def mmap(self, *args):
        self.calls.append(("mmap", args[1]))
        self.base = self.libc.mmap(*args)
        return self.base

    def madvise(self, address, length, advice):
        self.calls.append(("madvise", address - self.base, length, advice))
        if self.refuse:
            ctypes.set_errno(errno.EINVAL)
            return -1
        return self.libc.madvise(address, length, advice)

    def munmap(self, address, length):
        self.calls.append(("munmap", length))
        return self.libc.munmap(address, length)


linux = pytest.mark.skipif(sys.platform != "linux", reason="huge-page read-ahead is Linux's")


@linux
def test_a_file_is_mapped_for_huge_pages_and_one_page_per_2_mb_populated(tmp_path, fresh):
    descriptor = a_file(tmp_path, 5 * MB)
    recording = Recording(page_cache._libc())
    page_cache._large_pages, page_cache._libc_calls = True, recording
    page_cache.read_ahead(descriptor, 0, 5 * MB)
    page = page_cache._PAGE
    assert recording.calls == [
        ("mmap", 5 * MB),
        ("madvise", 0, 5 * MB, page_cache._MADV_HUGEPAGE),
        ("madvise", 0, page, page_cache._MADV_POPULATE_READ),
        ("madvise", 2 * MB, page, page_cache._MADV_POPULATE_READ),
        ("madvise", 4 * MB, page, page_cache._MADV_POPULATE_READ),
        ("munmap", 5 * MB),
    ]
    os.close(descriptor)


@linux
def test_a_file_the_kernel_holds_already_is_not_mapped(tmp_path, fresh):
    descriptor = a_file(tmp_path, MB)
    probe = page_cache._libc()
    page_cache.read_ahead(descriptor, 0, MB)
    if not page_cache._cachestat_works or not page_cache._cached(probe, descriptor, 0, MB):
        pytest.skip("this kernel cannot say what it holds (cachestat, Linux 6.5)")
    recording = Recording(probe, cached=True)
    page_cache._libc_calls = recording
    page_cache.read_ahead(descriptor, 0, MB)
    assert recording.calls == []  # no mapping: the loader's page faults would wait behind it
    os.close(descriptor)


@linux
def test_a_file_dropped_from_the_cache_is_cached_again(tmp_path, fresh):
    descriptor = a_file(tmp_path, 3 * MB)
    os.fsync(descriptor)
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    probe = page_cache._libc()
    page_cache._large_pages, page_cache._libc_calls = True, probe
    if page_cache._cached(probe, descriptor, 0, 3 * MB) or not page_cache._cachestat_works:
        pytest.skip("this file system keeps the file cached, or the kernel cannot say")
    page_cache.read_ahead(descriptor, 0, 3 * MB)
    assert page_cache._cached(probe, descriptor, 0, 3 * MB)
    os.close(descriptor)


@linux
def test_a_kernel_that_refuses_huge_pages_gets_plain_hints_from_then_on(
    tmp_path, fresh, monkeypatch
):
    descriptor = a_file(tmp_path, MB)
    hints = []
    monkeypatch.setattr(page_cache.os, "posix_fadvise", lambda *args: hints.append(args))
    recording = Recording(page_cache._libc(), refuse=True)
    page_cache._large_pages, page_cache._libc_calls = True, recording
    page_cache.read_ahead(descriptor, 0, MB)
    assert [call[0] for call in recording.calls] == ["mmap", "madvise", "munmap"]
    assert page_cache._large_pages is False
    page_cache.read_ahead(descriptor, 0, MB)
    assert len(recording.calls) == 3  # not mapped again
    assert hints == [(descriptor, 0, MB, os.POSIX_FADV_WILLNEED)] * 2
    os.close(descriptor)


def test_without_huge_pages_the_hint_is_posix_fadvise(tmp_path, fresh, monkeypatch):
    descriptor = a_file(tmp_path, 4096)
    hints = []
    monkeypatch.setattr(page_cache, "_libc", lambda: None)  # as off Linux
    monkeypatch.setattr(
        page_cache.os, "posix_fadvise", lambda *args: hints.append(args), raising=False
    )
    monkeypatch.setattr(page_cache.os, "POSIX_FADV_WILLNEED", 3, raising=False)
    page_cache.read_ahead(descriptor, 0, 4096)
    assert page_cache._large_pages is False
    assert hints == [(descriptor, 0, 4096, 3)]
    os.close(descriptor)


def test_a_hint_never_fails(tmp_path, fresh):
    descriptor = a_file(tmp_path, 10_000)
    page_cache.read_ahead(descriptor, 0, 0)
    page_cache.read_ahead(descriptor, 0, 5 * MB)  # past the end: populating it would fault
    reader, writer = os.pipe()
    page_cache.read_ahead(reader, 0, MB)  # a pipe maps nothing and takes no hints
    directory = os.open(tmp_path, os.O_RDONLY)
    page_cache.read_ahead(directory, 0, MB)
    for opened in (reader, writer, directory, descriptor):
        os.close(opened)
    page_cache.read_ahead(descriptor, 0, MB)  # closed meanwhile


def test_only_a_file_the_kernel_says_it_holds_needs_no_reading(tmp_path, fresh, monkeypatch):
    descriptor = a_file(tmp_path, MB)
    assert not page_cache.needs_reading(descriptor, 0, 0)
    page_cache.read_ahead(descriptor, 0, MB)
    if sys.platform == "linux" and page_cache._cachestat_works:
        assert not page_cache.needs_reading(descriptor, 0, MB)  # just read: held
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        held = page_cache._cached(page_cache._calls(), descriptor, 0, MB)
        assert page_cache.needs_reading(descriptor, 0, MB) == (not held)
    monkeypatch.setattr(page_cache, "_large_pages", None)
    monkeypatch.setattr(page_cache, "_libc", lambda: None)  # a kernel that cannot say
    assert page_cache.needs_reading(descriptor, 0, MB)
    os.close(descriptor)


@linux
def test_a_span_inside_a_file_is_mapped_from_its_page_and_no_further(tmp_path, fresh):
    descriptor = a_file(tmp_path, 9 * MB)
    recording = Recording(page_cache._libc())
    page_cache._large_pages, page_cache._libc_calls = True, recording
    page_cache.read_ahead(descriptor, 5 * MB + 100, 3 * MB)  # bytes 5 MB + 100 to 8 MB + 100
    page = page_cache._PAGE
    length = 3 * MB + 100
    assert recording.calls == [
        ("mmap", length),
        ("madvise", 0, length, page_cache._MADV_HUGEPAGE),
        ("madvise", 0, page, page_cache._MADV_POPULATE_READ),
        ("madvise", 2 * MB, page, page_cache._MADV_POPULATE_READ),
        ("munmap", length),
    ]
    os.close(descriptor)
