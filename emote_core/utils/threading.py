"""Small lock-protected containers for sharing values between threads.

These are used where a training loop and background workers (exporters, loggers, data collectors)
exchange a value: the lock is held only for the short read, write or swap, never while user code
runs, except inside :class:`LockedResource`'s ``with`` block, which exists exactly to hold it.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Generic, Self, TypeVar

T = TypeVar("T")

__all__ = ["AtomicContainer", "AtomicInt", "LockedResource"]


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
    """A value whose reads, writes and swaps are each atomic.

    Args:
        value: The initial value.
    """

    def __init__(self, value: T) -> None:
        self._value = value
        self._lock = threading.Lock()

    def read(self) -> T:
        """Returns the current value."""
        with self._lock:
            return self._value

    def set(self, value: T) -> None:
        """Replace the current value.

        Args:
            value: The new value.
        """
        with self._lock:
            self._value = value

    def swap(self, value: T) -> T:
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
