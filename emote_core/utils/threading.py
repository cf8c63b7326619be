"""Small lock-protected containers for sharing values between threads, and quicker GIL hand-offs
for threads that take turns with it (:func:`quick_switches`).

These are used where a training loop and background workers (exporters, loggers, data collectors)
exchange a value: the lock is held only for the short read, write or swap, never while user code
runs, except inside :class:`LockedResource`'s ``with`` block, which exists exactly to hold it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar

T = TypeVar("T")

__all__ = [
    "QUICK_SWITCH_SECONDS",
    "AtomicContainer",
    "AtomicInt",
    "LockedResource",
    "TracedLock",
    "WeakReference",
    "quick_switches",
]

log = logging.getLogger(__name__)


class LockedResource(Generic[T]):
    """A value that may only be touched while holding its lock.

    ``with resource as value:`` acquires the lock and yields the wrapped value; the lock is released
    when the block exits, also on error. Mutate the value in place inside the block, or replace it
    with :meth:`swap`.

    The lock is not re-entrant: entering the same resource twice from one thread deadlocks, as
    does calling :meth:`swap` inside its own ``with`` block.

    Args:
        value: The value to protect.
    """

    def __init__(self, value: T) -> None:
        self._value = value
        self._lock = threading.Lock()

    def __enter__(self) -> T:
        self._lock.acquire()
        return self._value

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()

    def swap(self, value: T) -> T:
        """Replace the wrapped value.

        Args:
            value: The new value.

        Returns:
            The value held before the call.
        """
        with self._lock:
            old, self._value = self._value, value
            return old


class AtomicContainer(Generic[T]):
    """A value whose reads, writes, swaps and takes are each atomic.

    Args:
        value: The initial value.
    """

    def __init__(self, value: T) -> None:
        self._value: T | None = value
        self._lock = threading.Lock()

    def take(self) -> T | None:
        """Empty the container and return what it held, in one atomic step.

        Of several threads taking at once, exactly one gets the value; the others get ``None``,
        which is also what the container holds afterwards (until the next :meth:`set`).

        Returns:
            The value held before the call, or ``None`` if the container was empty.
        """
        with self._lock:
            value, self._value = self._value, None
            return value

    def read(self) -> T | None:
        """Returns the current value (``None`` after :meth:`take`)."""
        with self._lock:
            return self._value

    def set(self, value: T) -> None:
        """Replace the current value.

        Args:
            value: The new value.
        """
        with self._lock:
            self._value = value

    def swap(self, value: T) -> T | None:
        """Replace the current value and return the previous one in one atomic step.

        Args:
            value: The new value.

        Returns:
            The value held before the call.
        """
        with self._lock:
            old, self._value = self._value, value
            return old


class AtomicInt:
    """An integer counter safe to update from many threads.

    ``counter += n`` and ``counter -= n`` are atomic: they update this object in place and return
    it, so the name keeps referring to the same shared counter.

    Args:
        value: The initial value.
    """

    def __init__(self, value: int = 0) -> None:
        self._value = int(value)
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        """The current value."""
        with self._lock:
            return self._value

    def increment(self, n: int = 1) -> int:
        """Add ``n`` to the counter.

        Args:
            n: The amount to add.

        Returns:
            The value after the addition.
        """
        with self._lock:
            self._value += n
            return self._value

    def decrement(self, n: int = 1) -> int:
        """Subtract ``n`` from the counter.

        Args:
            n: The amount to subtract.

        Returns:
            The value after the subtraction.
        """
        with self._lock:
            self._value -= n
            return self._value

    def swap(self, value: int) -> int:
        """Replace the counter's value.

        Args:
            value: The new value.

        Returns:
            The value held before the call.
        """
        with self._lock:
            old, self._value = self._value, int(value)
            return old

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __iadd__(self, n: int) -> Self:
        self.increment(n)
        return self

    def __isub__(self, n: int) -> Self:
        self.decrement(n)
        return self

    def __repr__(self) -> str:
        return f"AtomicInt({self.value})"


class WeakReference(weakref.ReferenceType, Generic[T]):  # type: ignore[type-arg]
    """A weak reference that names the type it points at, as upstream emote's ``WeakReference``.

    Calling it returns the object while something else keeps it alive, and ``None`` once it has
    been collected; it never keeps the object alive itself. ``WeakReference[Policy](policy)``
    reads as what it holds where a plain ``weakref.ref`` would not.

    Args:
        obj: The object to refer to; it must support weak references.
        callback: Called with this reference when the object is about to be collected.
    """

    def __call__(self) -> T | None:
        return super().__call__()


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


class TracedLock:
    """A lock that records who holds it and how long threads wait for it and keep it.

    Meant for finding deadlocks and contention: :attr:`holder` names the thread inside the lock
    right now, and each acquisition after a wait is logged at DEBUG level with the thread that
    waited, the wait and the name of the lock. Use it as a context manager, like the lock it wraps.

    Args:
        lock_class: Makes the underlying lock; ``threading.RLock`` gives a re-entrant one, whose
            nested entries count as one hold.
        name: Names the lock in the log.
    """

    def __init__(
        self, lock_class: Callable[[], _Lock] = threading.Lock, *, name: str = "traced_lock"
    ) -> None:
        self._lock = lock_class()
        self.name = name
        self._holder: str | None = None
        self._depth = 0
        self._hold_start = 0.0
        self._accumulated_block_time = 0.0
        self._accumulated_exec_time = 0.0
        self._acquisitions = 0

    @property
    def holder(self) -> str | None:
        """The name of the thread holding the lock, or ``None`` when it is free."""
        return self._holder

    @property
    def accumulated_block_time(self) -> float:
        """Seconds that all threads together spent waiting to acquire the lock."""
        return self._accumulated_block_time

    @property
    def accumulated_exec_time(self) -> float:
        """Seconds the lock was held, over all completed holds."""
        return self._accumulated_exec_time

    @property
    def acquisitions(self) -> int:
        """How many times the lock was taken (nested re-entries not counted)."""
        return self._acquisitions

    def __enter__(self) -> Self:
        waiting_since = time.perf_counter()
        self._lock.acquire()
        acquired_at = time.perf_counter()
        # From here on this thread holds the lock, so the bookkeeping below cannot race.
        self._depth += 1
        if self._depth == 1:
            waited = acquired_at - waiting_since
            self._accumulated_block_time += waited
            self._acquisitions += 1
            self._holder = threading.current_thread().name
            self._hold_start = acquired_at
            if waited > 0.001:
                log.debug(
                    "%s: %s acquired it after waiting %.3f s", self.name, self._holder, waited
                )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._accumulated_exec_time += time.perf_counter() - self._hold_start
            self._holder = None
        self._lock.release()

    def __repr__(self) -> str:
        return f"TracedLock(name={self.name!r}, holder={self._holder!r})"


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
