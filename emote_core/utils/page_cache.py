"""Reading files into the kernel's page cache ahead of their reads, in large pages where Linux can.

Plain read-ahead caches a small file read from disk in 4 KB pages, and later copies out of the
cache take about twice as long as out of large ones. A file mapped with ``MADV_HUGEPAGE`` is
read in large pages when a fault first touches it, so :func:`read_ahead` maps the file, advises
huge pages, and populates one page per 2 MB of it (``MADV_POPULATE_READ``). That blocks until
the file is read, so callers run it on several threads. Where it is not available it falls back
to ``posix_fadvise(WILLNEED)``, and where that fails too it does nothing: only ever a hint.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from typing import Any

_PROT_READ, _MAP_SHARED = 1, 1
_MADV_HUGEPAGE, _MADV_POPULATE_READ = 14, 22
_HUGE_PAGE = 2 << 20
"""The span each populated page reads ahead (a PMD huge page on x86-64 and arm64)."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _libc() -> Any:
    """libc's ``mmap``, ``madvise`` and ``munmap`` through ctypes (which lets go of the GIL while
    they run), or ``None`` off Linux."""
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's among them
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]  # fmt: skip
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        return None
    return libc


_FAILED = ctypes.c_void_p(-1).value
_libc_calls: Any = None
_large_pages: bool | None = None
"""Whether :func:`read_ahead` tries huge-page mappings: ``None`` until its first call, ``False``
off Linux or once the kernel has refused one."""


class _CachestatRange(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("cache", "dirty", "writeback", "evicted",
                                                      "recently_evicted")]  # fmt: skip


_CACHESTAT = 451
"""``cachestat``'s number (Linux 6.5; the same on x86-64 and arm64)."""
_cachestat_works = True


def _cached(libc: Any, descriptor: int, offset: int, size: int) -> bool:
    """Whether the kernel already holds bytes ``offset:offset + size`` of the file
    (``cachestat``: no mapping, which the loader's own page faults would otherwise wait
    behind); ``False`` where it cannot say."""
    global _cachestat_works
    if libc is None or not _cachestat_works:
        return False
    found = _Cachestat()
    span = _CachestatRange(offset, size)
    if libc.syscall(_CACHESTAT, descriptor, ctypes.byref(span), ctypes.byref(found), 0) != 0:
        _cachestat_works = ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM)
        return False
    pages = -(-(offset + size) // _PAGE) - offset // _PAGE
    return found.cache >= pages


def _calls() -> Any:
    """libc's calls once looked up (``None`` where huge-page read-ahead is off)."""
    global _large_pages, _libc_calls
    if _large_pages is None:
        _libc_calls = _libc()
        _large_pages = _libc_calls is not None
    return _libc_calls if _large_pages else None


def needs_reading(descriptor: int, offset: int, size: int) -> bool:
    """Whether bytes ``offset:offset + size`` of the file may be missing from the page cache:
    ``False`` only where the kernel says it holds them all (a call of about a microsecond, so
    callers can skip :func:`read_ahead`, and the threads it needs, for files already cached)."""
    return size > 0 and not _cached(_calls(), descriptor, offset, size)


def read_ahead(descriptor: int, offset: int, size: int) -> None:
    """Has the kernel read bytes ``offset:offset + size`` of an open file into its page cache, in
    large pages where it can (see the module's notes); blocks until they are read where it does.
    Only that span is mapped and populated (the kernel may read up to 4 MB past it, as far as
    the file goes), so a file far larger than what is read costs no more.

    Never raises: a file that cannot be read ahead is read when it is read.
    """
    global _large_pages
    if size <= 0 or offset < 0:
        return
    libc = _calls()
    if libc is not None:
        if _cached(libc, descriptor, offset, size):
            return
        start = offset - offset % _PAGE  # mappings start on a page
        length = offset + size - start
        address = libc.mmap(None, length, _PROT_READ, _MAP_SHARED, descriptor, start)
        if address is not None and address != _FAILED:
            try:
                if libc.madvise(address, length, _MADV_HUGEPAGE) == 0:
                    for at in range(0, length, _HUGE_PAGE):
                        if libc.madvise(address + at, _PAGE, _MADV_POPULATE_READ) != 0:
                            break  # EINVAL: a kernel before 5.14; EFAULT: the file shrank
                    else:
                        return
                if ctypes.get_errno() == errno.EINVAL:  # this kernel cannot: plain hints only
                    _large_pages = False
            finally:
                libc.munmap(address, length)
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):  # closed meanwhile, or a file that takes no hints
            os.posix_fadvise(descriptor, offset, size, os.POSIX_FADV_WILLNEED)


__all__ = ["needs_reading", "read_ahead"]
