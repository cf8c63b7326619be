"""Progress of a training run as small snapshots for a display: done / total, rates, ETA, metrics.

:class:`ProgressReporter` hands a :class:`ProgressSnapshot` to a sink (any callable) when training
begins, at most every ``interval`` seconds while it runs, and once when it ends. It reads what the
other callbacks already log (the collector's ``training/env_steps`` and ``episode/reward``, the
losses' ``loss/...`` scalars) and invents no counters of its own. How a snapshot is shown (a live
bar, plain lines) is the sink's business; emote's command line renders it in
``emote_cli/progress.py``. TensorBoard keeps every metric; a snapshot carries only the few that
matter at a glance.

:class:`ThroughputMeter` is the rate and ETA arithmetic, also used by commands that count
something other than training steps (env steps, episodes).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from emote_core.callback import Callback, Order
from emote_core.errors import ConfigurationError

if TYPE_CHECKING:
    from emote_core.callbacks.logging_mixin import LoggingMixin

ENV_STEPS_KEY = "training/env_steps"
"""The scalar a collector logs its environment steps under (``emote_core.env.collectors``)."""
EPISODE_RETURN_KEY = "episode/reward"
"""The windowed scalar a collector logs each finished episode's return under."""
LOSS_PREFIX = "loss/"
"""Scalars whose key starts with this are losses."""


class TrainingPhase(StrEnum):
    """Where a run is when a snapshot is taken."""

    STARTING = "starting"
    """Before the first update: warm-up, loading memory."""
    TRAINING = "training"
    """Updates are running."""
    FINISHED = "finished"
    """Training ended (the last update ran, or it was stopped)."""


@dataclass(frozen=True)
class ProgressSnapshot:
    """What a progress display shows of a training run at one moment.

    Rates and the ETA are ``None`` until two moments have been measured; the environment
    figures are ``None`` when nothing collects (training from stores alone).
    """

    phase: TrainingPhase
    bp_step: int
    """The number of the last completed update."""
    total: int | None
    """The update the run ends at."""
    elapsed_seconds: float
    """Seconds since the reporter saw training begin."""
    updates_per_second: float | None = None
    env_steps: int | None = None
    env_steps_per_second: float | None = None
    eta_seconds: float | None = None
    """Seconds to ``total`` at the recent update rate."""
    episode_return: float | None = None
    """The mean return of the most recent finished episodes."""
    losses: dict[str, float] = field(default_factory=dict)
    """The latest value of each loss, keyed as logged (``loss/q1``), in the order logged."""


ProgressSink = Callable[[ProgressSnapshot], None]
"""Receives each snapshot; called on the training thread, so it should return quickly."""


class ThroughputMeter:
    """The rate of a growing count over the last ``window_seconds``, and the time to a total.

    Args:
        window_seconds: How far back the rate looks; a shorter window follows changes sooner.
        clock: Seconds as a float (``time.monotonic`` unless a test passes its own).

    Raises:
        ConfigurationError: If ``window_seconds`` is not positive.
    """

    def __init__(
        self, window_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not window_seconds > 0:
            raise ConfigurationError(
                f"window_seconds must be positive; got {window_seconds!r} — pass how many seconds "
                "of history the rate averages over"
            )
        self.window_seconds = float(window_seconds)
        self.clock = clock
        self._samples: deque[tuple[float, float]] = deque()

    def reset(self) -> None:
        """Forgets every measurement (after a pause the rate would otherwise include it)."""
        self._samples.clear()

    def add(self, count: float) -> float | None:
        """Records that the count is ``count`` now.

        Returns:
            The rate in counts per second (:attr:`rate`).
        """
        now = self.clock()
        samples = self._samples
        samples.append((now, float(count)))
        # Keep one sample older than the window, so the rate always spans the whole window.
        while len(samples) > 2 and now - samples[1][0] >= self.window_seconds:
            samples.popleft()
        return self.rate

    @property
    def rate(self) -> float | None:
        """Counts per second over the window; ``None`` before two measurements apart in time."""
        if len(self._samples) < 2:
            return None
        (start, first), (end, last) = self._samples[0], self._samples[-1]
        if end <= start:
            return None
        return max(last - first, 0.0) / (end - start)

    def eta(self, total: float | None) -> float | None:
        """Seconds until the count reaches ``total`` at the current rate.

        Returns:
            ``0.0`` once it is reached; ``None`` when there is no total or no positive rate yet.
        """
        if total is None or not self._samples:
            return None
        remaining = total - self._samples[-1][1]
        if remaining <= 0:
            return 0.0
        rate = self.rate
        if not rate:
            return None
        return remaining / rate


class ProgressReporter(Callback):
    """Hands :class:`ProgressSnapshot` objects to ``sink`` while training runs.

    One snapshot when training begins (before the collector's warm-up, so a display shows life
    at once), then after an update whenever ``interval`` seconds have passed since the last, and
    a final one when training ends, however it ends.

    Args:
        sink: Receives the snapshots.
        total: The update the run ends at (``None`` when unknown).
        callbacks: The logging callbacks to read environment steps, returns and losses from.
        interval: The least number of seconds between two snapshots while training runs.
        return_window: How many of the most recent episode returns the shown return averages.
        clock: Seconds as a float (``time.monotonic`` unless a test passes its own).
        name: The callback's name.

    Raises:
        ConfigurationError: If ``interval`` is negative or ``return_window`` is not positive.
    """

    # Just ahead of the data callbacks: the first snapshot must be out before warm-up starts.
    order: ClassVar[int] = Order.DATA - 1

    def __init__(
        self,
        *,
        sink: ProgressSink,
        total: int | None,
        callbacks: Sequence[LoggingMixin] = (),
        interval: float = 0.5,
        return_window: int = 20,
        clock: Callable[[], float] = time.monotonic,
        name: str = "progress",
    ) -> None:
        if not interval >= 0:
            raise ConfigurationError(f"progress interval must be >= 0 seconds; got {interval!r}")
        if (
            isinstance(return_window, bool)
            or not isinstance(return_window, int)
            or return_window < 1
        ):
            raise ConfigurationError(
                f"return_window must be a positive number of episodes; got {return_window!r}"
            )
        super().__init__(name=name)
        self.sink = sink
        self.total = total
        self.callbacks = list(callbacks)
        self.interval = float(interval)
        self.return_window = return_window
        self.clock = clock
        self._updates = ThroughputMeter(clock=clock)
        self._env_steps = ThroughputMeter(clock=clock)
        self._started = 0.0
        self._last_sent: float | None = None

    def begin_training(self, bp_step: int) -> None:
        """Sends the first snapshot: the run is starting at ``bp_step``."""
        self._started = self.clock()
        self._updates.reset()
        self._env_steps.reset()
        self._last_sent = None
        self._send(TrainingPhase.STARTING, bp_step)
        self._last_sent = None  # the first update is shown at once, and starts the rates

    def end_batch(self, bp_step: int) -> None:
        """Sends a snapshot if ``interval`` seconds have passed since the last one."""
        if self._last_sent is None or self.clock() - self._last_sent >= self.interval:
            self._send(TrainingPhase.TRAINING, bp_step)

    def end_training(self, bp_step: int) -> None:
        """Sends the final snapshot."""
        self._send(TrainingPhase.FINISHED, bp_step)

    def _send(self, phase: TrainingPhase, bp_step: int) -> None:
        env_steps = self._logged_env_steps()
        if phase is not TrainingPhase.STARTING:
            # Rates count from the first update, so warm-up does not drag them down.
            self._updates.add(bp_step)
            if env_steps is not None:
                self._env_steps.add(env_steps)
        now = self.clock()
        self._last_sent = now
        self.sink(
            ProgressSnapshot(
                phase=phase,
                bp_step=int(bp_step),
                total=self.total,
                elapsed_seconds=now - self._started,
                updates_per_second=self._updates.rate,
                env_steps=env_steps,
                env_steps_per_second=self._env_steps.rate if env_steps is not None else None,
                eta_seconds=self._updates.eta(self.total),
                episode_return=self._recent_return(),
                losses=self._losses(),
            )
        )

    def _logged_env_steps(self) -> int | None:
        for callback in self.callbacks:
            value = callback.scalar_logs.get(ENV_STEPS_KEY)
            if value is not None:
                return int(value)
        return None

    def _recent_return(self) -> float | None:
        for callback in self.callbacks:
            window = callback.windowed_scalar.get(EPISODE_RETURN_KEY)
            if window:
                recent = list(window)[-self.return_window :]
                value = math.fsum(recent) / len(recent)
                return value if math.isfinite(value) else None
        return None

    def _losses(self) -> dict[str, float]:
        losses: dict[str, float] = {}
        for callback in self.callbacks:
            for key, value in callback.scalar_logs.items():
                if key.startswith(LOSS_PREFIX):
                    losses[key] = float(value)
        return losses


__all__ = [
    "ENV_STEPS_KEY",
    "EPISODE_RETURN_KEY",
    "LOSS_PREFIX",
    "ProgressReporter",
    "ProgressSink",
    "ProgressSnapshot",
    "ThroughputMeter",
    "TrainingPhase",
]
