"""SystemLogger: the training process's memory and CPU use, to spot leaks in long runs."""

from __future__ import annotations

import psutil

from emote_core.callback import Callback
from emote_core.callbacks.logging_mixin import LoggingMixin

BYTES_PER_MB = 1024 * 1024
"""Megabytes here are mebibytes, as in ``top`` and ``free -m``."""


class SystemLogger(LoggingMixin, Callback):
    """Logs the training process's resident memory, its growth and its CPU use every cycle.

    At ``end_cycle`` it logs the scalars ``system/ram_usage_mb`` (resident set size of this
    process), ``system/ram_usage_growth_mb_per_step`` (the change since the previous cycle divided
    by the training steps in between; 0 at the first cycle) and ``system/cpu_percent`` (this
    process's CPU use since the previous cycle, or since ``begin_training``; above 100 when it
    uses several cores). A growth that stays positive over many cycles points to a leak. Pass it
    to a logger such as ``TensorboardLogger`` to write the values out.

    Args:
        cycle: Measure every this many training steps.
        name: The callback's name.
    """

    def __init__(self, *, cycle: int = 1000, name: str = "system") -> None:
        super().__init__(name=name, cycle=cycle)
        self._process: psutil.Process | None = None
        self._last_rss_mb: float | None = None
        self._last_bp_step = 0

    def begin_training(self) -> None:
        """Finds this process and starts its CPU measurement."""
        # Looked up here rather than in __init__ so a callback built in one process and trained
        # in another (a spawned worker) measures the process that trains.
        self._process = psutil.Process()
        self._process.cpu_percent()  # the first call only starts psutil's measurement
        self._last_rss_mb = None

    def end_cycle(self, bp_step: int) -> None:
        """Measures and logs memory, memory growth and CPU use."""
        if self._process is None:
            self._process = psutil.Process()
        rss_mb = self._process.memory_info().rss / BYTES_PER_MB
        if self._last_rss_mb is None or bp_step <= self._last_bp_step:
            growth = 0.0
        else:
            growth = (rss_mb - self._last_rss_mb) / (bp_step - self._last_bp_step)
        self.log_scalar("system/ram_usage_mb", rss_mb)
        self.log_scalar("system/ram_usage_growth_mb_per_step", growth)
        self.log_scalar("system/cpu_percent", self._process.cpu_percent())
        self._last_rss_mb = rss_mb
        self._last_bp_step = bp_step


__all__ = ["SystemLogger"]
