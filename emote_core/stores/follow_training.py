"""The :class:`FollowStores` callback: a training run that takes in what collectors commit.

Before the first update it waits (with a message, waking at once on Ctrl-C) until the table
holds enough to train on; then, every ``interval`` updates and at most every ``min_seconds``, it
asks its :class:`~emote_core.stores.follow.StoreFollower` for the newly committed episodes, and
logs how old they were when they arrived (data age) and how fast they arrive (ingest rate).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar

import numpy as np

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.stores.follow import WAIT_LOG_SECONDS, IngestReport, StoreFollower
from emote_core.trainer import TrainingShutdownException

log = logging.getLogger(__name__)

PREFIX = "follow/"
"""TensorBoard tags of the follower start with this."""


class FollowStores(LoggingMixin, Callback):
    """Appends newly committed store episodes to the replay table while training.

    Args:
        follower: Reads the stores and appends to the table.
        loader: Says whether a batch can be sampled (``is_ready()``).
        interval: Updates between looks at the stores.
        min_seconds: Seconds at least between two looks (keeps a fast learner from reading
            commit records of remote stores more often than collectors commit).
        warmup_transitions: Transitions the table holds before training starts.
        wait: Wait before the first update until the table is ready (a learner without
            collection of its own); else the run's collector warms the table up.
        poll_seconds: Seconds between looks while waiting.
        log_seconds: Seconds at least between two lines on stderr about what was taken in.
        name: The callback's name.

    Raises:
        ConfigurationError: If an interval is not positive.
    """

    order: ClassVar[int] = Order.DATA

    def __init__(
        self,
        *,
        follower: StoreFollower,
        loader: Any,
        interval: int,
        min_seconds: float = 0.0,
        warmup_transitions: int = 0,
        wait: bool = True,
        poll_seconds: float = 0.5,
        log_seconds: float = 30.0,
        name: str = "store_follower",
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigurationError(f"FollowStores: interval must be >= 1 update; got {interval}")
        if not poll_seconds > 0 or min_seconds < 0:
            raise ConfigurationError(
                f"FollowStores: poll_seconds must be > 0 and min_seconds >= 0; got "
                f"{poll_seconds}, {min_seconds}"
            )
        super().__init__(name=name)
        self.follower = follower
        self.loader = loader
        self.interval = interval
        self.min_seconds = float(min_seconds)
        self.warmup_transitions = int(warmup_transitions)
        self.wait = wait
        self.poll_seconds = float(poll_seconds)
        self.log_seconds = float(log_seconds)
        self._last_poll = -np.inf
        self._window_start = time.monotonic()
        self._window = [0, 0]  # episodes, transitions taken in since the last line
        self._window_ages: list[np.ndarray] = []
        self._read_seconds = 0.0

    def ready(self) -> bool:
        """Whether training can start: a batch can be sampled and the warm-up is reached."""
        return bool(self.loader.is_ready()) and self.follower.table.size() >= (
            self.warmup_transitions
        )

    def look(self) -> IngestReport:
        """One look at the stores now; what it took in is logged."""
        self._last_poll = time.monotonic()
        report = self.follower.poll()
        self.record(report)
        return report

    def record(self, report: IngestReport) -> None:
        """Logs a look's (or the first fill's) intake: TensorBoard scalars, a line now and then."""
        follower = self.follower
        table = follower.table
        self._read_seconds += report.seconds
        if report.episodes:
            self.log_windowed_scalar(f"{PREFIX}data_age_s", report.ages)
            self.log_scalar(f"{PREFIX}data_age_max_s", float(report.ages.max()))
            self._window_ages.append(report.ages)
        self._window[0] += report.episodes
        self._window[1] += report.transitions
        elapsed = time.monotonic() - self._window_start
        self.log_windowed_scalar(f"{PREFIX}poll_seconds", report.seconds)
        self.log_scalar(f"{PREFIX}ingested_episodes", follower.ingested_episodes)
        self.log_scalar(f"{PREFIX}ingested_transitions", follower.ingested_transitions)
        self.log_scalar(f"{PREFIX}skipped_episodes", follower.skipped_episodes)
        self.log_scalar(f"{PREFIX}table_transitions", table.size())
        if elapsed > 0:
            self.log_scalar(f"{PREFIX}ingest_transitions_per_s", self._window[1] / elapsed)
        if elapsed >= self.log_seconds and self._window[0]:
            self._say(elapsed)

    def _say(self, elapsed: float) -> None:
        ages = np.concatenate(self._window_ages)
        episodes, transitions = self._window
        log.info(
            "follow: +%d episodes (%d transitions) in %.0f s: %.0f transitions/s (read at %.0f/s); "
            "data age median %.2f s, max %.2f s; table %d transitions in %d episodes",
            episodes, transitions, elapsed, transitions / elapsed,
            transitions / max(self._read_seconds, 1e-9), float(np.median(ages)),
            float(ages.max()), self.follower.table.size(), self.follower.table.episode_count,
        )  # fmt: skip
        self._window_start = time.monotonic()
        self._window = [0, 0]
        self._window_ages = []
        self._read_seconds = 0.0

    # Hooks.

    def begin_training(self, shutdown_signal: threading.Event | None = None) -> None:
        """Takes in what is new; without collection of its own, waits until the table is ready.

        Raises:
            TrainingShutdownException: If shutdown is asked for while waiting.
        """
        self.look()
        if not self.wait:
            return
        started = time.monotonic()
        said = -WAIT_LOG_SECONDS
        while not self.ready():
            waited = time.monotonic() - started
            if waited - said >= WAIT_LOG_SECONDS:
                table = self.follower.table
                log.warning(
                    "waiting for episodes: the table holds %d transitions in %d episodes; "
                    "training starts at %d transitions and a batch of %d windows "
                    "(%.0f s so far, following %s; Ctrl-C stops)",
                    table.size(), table.episode_count, self.warmup_transitions,
                    getattr(self.loader, "rollout_count", 1), waited,
                    ", ".join(self.follower.urls),
                )  # fmt: skip
                said = waited
            if shutdown_signal is not None:
                if shutdown_signal.wait(self.poll_seconds):  # wakes at once on Ctrl-C
                    raise TrainingShutdownException("shutdown requested while waiting for episodes")
            else:
                time.sleep(self.poll_seconds)
            self.look()
        if said >= 0:
            log.warning(
                "the table holds %d transitions: training starts after %.1f s of waiting",
                self.follower.table.size(), time.monotonic() - started,
            )  # fmt: skip

    def begin_batch(self, bp_step: int) -> None:
        """Every ``interval`` updates (and ``min_seconds``), takes in what was committed since."""
        if bp_step % self.interval == 0 and (
            time.monotonic() - self._last_poll >= self.min_seconds
        ):
            self.look()

    def end_training(self) -> None:
        """Says what the last stretch took in."""
        if self._window[0]:
            self._say(max(time.monotonic() - self._window_start, 1e-9))


__all__ = ["PREFIX", "FollowStores"]
