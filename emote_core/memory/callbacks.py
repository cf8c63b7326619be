"""The callback that waits for enough data in the memory before training starts (`MemoryWarmup`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from emote_core.callback import Callback, Order
from emote_core.errors import ConfigurationError
from emote_core.trainer import TrainingShutdownException

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


@runtime_checkable
class ReadinessSource(Protocol):
    """Anything that says whether there is enough data to train on (a memory loader)."""

    def is_ready(self) -> bool:
        """Whether training can start."""
        ...


@runtime_checkable
class PendingExportProcessor(Protocol):
    """Something that serves export requests while training waits (an ONNX exporter)."""

    def process_pending_exports(self) -> None:
        """Serves the export requests made since the last call."""
        ...


class MemoryWarmup(Callback):
    """Holds training back until the loader has enough data (``begin_training``).

    Collectors fill the table from other threads meanwhile. The wait polls ``loader.is_ready()``
    every ``poll_interval`` seconds and ends early, stopping training cleanly, when the trainer's
    shutdown signal (the state's ``shutdown_signal``) or the one given here is set.

    Args:
        loader: Anything with ``is_ready()``, such as a ``MemoryLoader``.
        exporter: Served with ``process_pending_exports()`` while waiting, so collectors that
            wait for a policy export are not starved.
        shutdown_signal: An extra stop signal: an event or a function returning whether to stop.
        poll_interval: Seconds between readiness checks.
        name: The callback's name.

    Raises:
        ConfigurationError: If ``poll_interval`` is not positive.
    """

    order = Order.DATA

    def __init__(
        self,
        *,
        loader: ReadinessSource,
        exporter: PendingExportProcessor | None = None,
        shutdown_signal: threading.Event | Callable[[], bool] | None = None,
        poll_interval: float = 0.05,
        name: str = "memory_warmup",
    ) -> None:
        if not poll_interval > 0:
            raise ConfigurationError(
                f"poll_interval must be a positive number of seconds; got {poll_interval!r}"
            )
        super().__init__(name=name)
        self.loader = loader
        self.exporter = exporter
        self.shutdown_signal = shutdown_signal
        self.poll_interval = float(poll_interval)

    def _stop_requested(self, trainer_signal: threading.Event | None) -> bool:
        if trainer_signal is not None and trainer_signal.is_set():
            return True
        own = self.shutdown_signal
        if own is None:
            return False
        return own.is_set() if isinstance(own, threading.Event) else bool(own())

    def begin_training(self, shutdown_signal: threading.Event | None = None) -> None:
        """Waits until ``loader.is_ready()``.

        Raises:
            TrainingShutdownException: If a shutdown signal is set while waiting.
        """
        started = time.monotonic()
        logged = False
        while not self.loader.is_ready():
            if self.exporter is not None:
                self.exporter.process_pending_exports()
            if self._stop_requested(shutdown_signal):
                raise TrainingShutdownException(
                    f"shutdown requested while '{self.name}' waited for memory"
                )
            if not logged:
                log.info("'%s' is waiting for the memory to fill", self.name)
                logged = True
            if shutdown_signal is not None:
                shutdown_signal.wait(self.poll_interval)  # wakes at once on shutdown
            else:
                time.sleep(self.poll_interval)
        if logged:
            log.info("memory ready after %.1f s of warm-up", time.monotonic() - started)


__all__ = [
    "MemoryWarmup",
    "PendingExportProcessor",
    "ReadinessSource",
]
