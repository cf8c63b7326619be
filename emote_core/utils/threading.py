"""Quicker GIL hand-offs for threads that take turns with it (:func:`quick_switches`)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["QUICK_SWITCH_SECONDS", "quick_switches"]

QUICK_SWITCH_SECONDS = 0.0002
"""The interval :func:`quick_switches` sets (CPython's default is 5 ms)."""

_switches = threading.Lock()
_switch_users = 0
_switch_found: float | None = None  # the interval the first block found
_switch_set: float | None = None  # the interval it set, as the interpreter reads it back


@contextmanager
def quick_switches(interval: float = QUICK_SWITCH_SECONDS) -> Iterator[None]:
    """Has the interpreter hand the GIL to a waiting thread after ``interval`` seconds instead
    of its usual 5 ms, for the ``with`` block.

    Threads that each make many short calls which let go of the GIL (``preadv``, ``crc32``) can
    starve one another at the usual interval: a thread that returns from its call finds the
    GIL taken again by the other before it woke, and waits out the interval. Two threads
    loading a store were measured taking 16 and 2 parts of the work that way in one run (the
    load 57-85 ms), and 8 and 8 with 0.2 ms (34-55 ms).

    Blocks may nest and overlap across threads: the first sets the interval (never raising
    it), the last puts back the one the first found, unless something else changed it since.
    """
    global _switch_users, _switch_found, _switch_set
    with _switches:
        if _switch_users == 0:
            _switch_found = sys.getswitchinterval()
            if interval < _switch_found:  # (each set rounds it down to whole microseconds)
                sys.setswitchinterval(interval)
            _switch_set = sys.getswitchinterval()
        _switch_users += 1
    try:
        yield
    finally:
        with _switches:
            _switch_users -= 1
            if _switch_users == 0 and _switch_found is not None:
                current = sys.getswitchinterval()
                if current == _switch_set and current != _switch_found:  # ours, still
                    sys.setswitchinterval(_switch_found)
                _switch_found = _switch_set = None
