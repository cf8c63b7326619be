"""Running statistics and wall-clock timers for code blocks.

:class:`BlockTimers` is what a training loop uses: ``with timers.scope("sample"): ...`` times each
pass through a block, and :meth:`BlockTimers.stats` returns plain floats ready to log. Every timer
keeps two views of its durations: statistics over the last ``window`` timings (how the block
behaves now) and statistics over every timing since the timer was created.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Self

from emote_core.utils.checks import positive_int

__all__ = ["BlockTimers", "MovingWindowStatistics", "TimedBlock", "WelfordStatistics"]


class WelfordStatistics:
    """Mean, variance, minimum and maximum of a stream, in constant memory.

    Uses Welford's online algorithm, which stays accurate when values are large compared with
    their spread (unlike keeping a sum of squares). Variance and standard deviation are the
    population ones (divide by ``count``), matching ``numpy.var``/``numpy.std`` defaults. Before the
    first value, ``mean``, ``variance``, ``std``, ``min`` and ``max`` are ``nan``.

    Not thread-safe by itself; :class:`TimedBlock` serialises access.
    """

    def __init__(self) -> None:
        self._count = 0
        self._mean = 0.0
        self._m2 = 0.0  # sum of squared differences from the current mean
        self._min = math.inf
        self._max = -math.inf

    def add(self, x: float) -> None:
        """Add one value to the statistics.

        Args:
            x: The value.
        """
        x = float(x)
        self._count += 1
        delta = x - self._mean
        self._mean += delta / self._count
        self._m2 += delta * (x - self._mean)
        self._min = min(self._min, x)
        self._max = max(self._max, x)

    @property
    def count(self) -> int:
        """How many values were added."""
        return self._count

    @property
    def mean(self) -> float:
        """The mean of all values added."""
        return self._mean if self._count else math.nan

    @property
    def variance(self) -> float:
        """The population variance of all values added."""
        return self._m2 / self._count if self._count else math.nan

    @property
    def sample_variance(self) -> float:
        """The unbiased (``count - 1``) variance; ``nan`` with fewer than two values."""
        return self._m2 / (self._count - 1) if self._count > 1 else math.nan

    @property
    def std(self) -> float:
        """The population standard deviation of all values added."""
        return math.sqrt(self.variance) if self._count else math.nan

    @property
    def min(self) -> float:
        """The smallest value added."""
        return self._min if self._count else math.nan

    @property
    def max(self) -> float:
        """The largest value added."""
        return self._max if self._count else math.nan


class MovingWindowStatistics:
    """Mean, standard deviation, minimum and maximum of the last ``window`` values.

    Adding a value is O(1); the oldest value falls out once ``window`` values are held. Queries
    look at the held values (at most ``window``). The standard deviation is the population one,
    like ``numpy.std``. With no values held, the statistics are ``nan``.

    Not thread-safe by itself; :class:`TimedBlock` serialises access.

    Args:
        window: How many of the most recent values to keep; at least 1.

    Raises:
        ConfigurationError: If ``window`` is not an integer >= 1.
    """

    def __init__(self, window: int) -> None:
        positive_int("MovingWindowStatistics", "window", window)
        self._window = window
        self._values: deque[float] = deque(maxlen=window)

    def add(self, x: float) -> None:
        """Add one value, dropping the oldest one if the window is full.

        Args:
            x: The value.
        """
        self._values.append(float(x))

    @property
    def window(self) -> int:
        """The most values held at once."""
        return self._window

    @property
    def count(self) -> int:
        """How many values are held now (at most ``window``)."""
        return len(self._values)

    @property
    def values(self) -> list[float]:
        """The held values, oldest first."""
        return list(self._values)

    @property
    def mean(self) -> float:
        """The mean of the held values."""
        if not self._values:
            return math.nan
        return math.fsum(self._values) / len(self._values)

    @property
    def std(self) -> float:
        """The population standard deviation of the held values."""
        if not self._values:
            return math.nan
        mean = self.mean
        return math.sqrt(math.fsum((x - mean) ** 2 for x in self._values) / len(self._values))

    @property
    def min(self) -> float:
        """The smallest held value."""
        return min(self._values) if self._values else math.nan

    @property
    def max(self) -> float:
        """The largest held value."""
        return max(self._values) if self._values else math.nan


class TimedBlock:
    """A context manager that measures how long each pass through a block takes.

    Durations are in seconds, measured with :func:`time.perf_counter`. :meth:`mean`, :meth:`std`,
    :meth:`min` and :meth:`max` describe the last ``window`` timings; :attr:`overall` holds the
    statistics of every timing. The same block may be entered from several threads at once and
    may be nested in itself: each thread keeps its own stack of start times.

    Args:
        window: How many recent timings :meth:`mean` and friends look at; at least 1.

    Raises:
        ConfigurationError: If ``window`` is not an integer >= 1.
    """

    def __init__(self, window: int = 100) -> None:
        self._window_stats = MovingWindowStatistics(window)
        self._overall = WelfordStatistics()
        self._last = math.nan
        self._lock = threading.Lock()
        self._local = threading.local()

    def __enter__(self) -> Self:
        starts: list[float] | None = getattr(self._local, "starts", None)
        if starts is None:
            starts = []
            self._local.starts = starts
        starts.append(time.perf_counter())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        end = time.perf_counter()
        start = self._local.starts.pop()
        self.record(end - start)

    def record(self, duration: float) -> None:
        """Record a duration measured elsewhere.

        Args:
            duration: The duration in seconds.
        """
        with self._lock:
            self._last = float(duration)
            self._window_stats.add(duration)
            self._overall.add(duration)

    def mean(self) -> float:
        """Returns the mean duration over the window, in seconds (``nan`` before any timing)."""
        with self._lock:
            return self._window_stats.mean

    def std(self) -> float:
        """Returns the standard deviation of durations over the window, in seconds."""
        with self._lock:
            return self._window_stats.std

    def min(self) -> float:
        """Returns the shortest duration in the window, in seconds."""
        with self._lock:
            return self._window_stats.min

    def max(self) -> float:
        """Returns the longest duration in the window, in seconds."""
        with self._lock:
            return self._window_stats.max

    @property
    def count(self) -> int:
        """How many timings were recorded in total."""
        with self._lock:
            return self._overall.count

    @property
    def last(self) -> float:
        """The most recent duration in seconds (``nan`` before any timing)."""
        with self._lock:
            return self._last

    @property
    def overall(self) -> WelfordStatistics:
        """Statistics of every timing recorded; read it only while no thread is timing."""
        return self._overall

    def stats(self) -> dict[str, float]:
        """Summarise the timings as plain floats, consistent with each other.

        Returns:
            ``mean``, ``std``, ``min``, ``max`` over the window; ``count`` (all timings);
            ``last``; and ``overall_mean``, ``overall_std``, ``overall_min``, ``overall_max``
            over all timings. Durations are in seconds.
        """
        with self._lock:
            return {
                "mean": self._window_stats.mean,
                "std": self._window_stats.std,
                "min": self._window_stats.min,
                "max": self._window_stats.max,
                "count": float(self._overall.count),
                "last": self._last,
                "overall_mean": self._overall.mean,
                "overall_std": self._overall.std,
                "overall_min": self._overall.min,
                "overall_max": self._overall.max,
            }


class BlockTimers:
    """A named set of :class:`TimedBlock` timers.

    ``with timers.scope("sample"):`` times the block under the name ``"sample"``, creating its timer
    on first use. Creating timers is thread-safe: threads that open the same new name at once share
    one timer.

    Args:
        window: The window given to each timer created; at least 1.

    Raises:
        ConfigurationError: If ``window`` is not an integer >= 1.
    """

    def __init__(self, window: int = 100) -> None:
        positive_int("BlockTimers", "window", window)
        self._window = window
        self._timers: dict[str, TimedBlock] = {}
        self._lock = threading.Lock()

    def timer(self, name: str) -> TimedBlock:
        """Returns the timer called ``name``, creating it if needed.

        Args:
            name: The timer's name.
        """
        with self._lock:
            block = self._timers.get(name)
            if block is None:
                block = TimedBlock(self._window)
                self._timers[name] = block
            return block

    @contextmanager
    def scope(self, name: str) -> Iterator[TimedBlock]:
        """Time the ``with`` block under ``name``.

        Args:
            name: The timer's name.

        Yields:
            The timer, so the block may read earlier timings.
        """
        block = self.timer(name)
        with block:
            yield block

    def names(self) -> list[str]:
        """Returns the timer names, in order of creation."""
        with self._lock:
            return list(self._timers)

    def stats(self) -> dict[str, dict[str, float]]:
        """Returns each timer's :meth:`TimedBlock.stats`, keyed by name."""
        with self._lock:
            timers = list(self._timers.items())
        return {name: block.stats() for name, block in timers}
