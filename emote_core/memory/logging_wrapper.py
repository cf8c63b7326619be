"""LoggingProxyWrapper: collection statistics (steps, episodes, returns, metadata) for loggers."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARD_KEY, MemoryProxy
from emote_core.memory.wrappers import MemoryTableProxyWrapper
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState, MetaData
from emote_core.utils import BlockTimers
from emote_core.utils.checks import positive_int

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger(__name__)

_RUNNING = EpisodeState.RUNNING
_INITIAL = EpisodeState.INITIAL
_FINAL = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)
INF_STEP_KEY = "training/inf_step"
"""Scalar: agent steps (inferences) seen by a :class:`LoggingProxyWrapper`."""
EPISODES_KEY = "training/completed_episodes"
"""Scalar: episodes finished (TERMINAL or INTERRUPTED) seen by a :class:`LoggingProxyWrapper`."""
EPISODE_REWARD_KEY = "episode/reward"
"""Windowed scalar: the return (sum of rewards) of each finished episode."""
EPISODE_LENGTH_KEY = "episode/length"
"""Windowed scalar: the transitions of each finished episode."""
SCALED_REWARD_KEY = "training/scaled_reward"
"""Scalar: the mean return of the recent finished episodes (read by ``FinalRewardTestCheck``)."""
INF_STEPS_PER_SECOND_KEY = "performance/inf_steps_per_sec"
"""Scalar: agent steps per second since the previous refresh."""
HISTOGRAM_PREFIX = "histogram:"
"""A metadata key starting with this (upstream emote's convention) is logged as a histogram of
the key without it."""


def _reward_value(observation: DictObservation) -> float:
    """The observation's reward as a float; ``None`` (no reward sent) is NaN, as the proxy
    stores it."""
    reward = observation.rewards[REWARD_KEY]
    return float("nan") if reward is None else float(reward)


def _copy_windows(windows: dict[str, deque[float]]) -> dict[str, deque[float]]:
    return {key: deque(window, maxlen=window.maxlen) for key, window in windows.items()}


def _shared_log(name: str, copy: Callable[[Any], Any]) -> property:
    """A LoggingMixin store of the wrapper: read as a snapshot, written under the wrapper's lock."""

    def get(self: LoggingProxyWrapper) -> Any:
        with self._lock:
            return copy(getattr(self._logs, name))

    def set_(self: LoggingProxyWrapper, value: Any) -> None:
        with self._lock:
            setattr(self._logs, name, value)

    return property(get, set_, doc=f"A snapshot of the logged ``{name}``.")


class _HistogramSnapshot(dict[str, np.ndarray]):
    """The histograms a logger reads; its ``clear()`` removes what was read from the wrapper."""

    def __init__(self, values: dict[str, np.ndarray], owner: LoggingProxyWrapper) -> None:
        super().__init__(values)
        self._owner = owner

    def clear(self) -> None:
        self._owner._consume_histograms(self)
        super().clear()


class LoggingProxyWrapper(LoggingMixin, MemoryTableProxyWrapper):
    """Logs what passes through a proxy: counters, episode returns, metadata and timers.

    It is a :class:`~emote_core.callbacks.logging_mixin.LoggingMixin`: pass it to a
    ``TensorboardLogger`` among its callbacks. Logged keys:

    * ``training/inf_step`` and ``training/completed_episodes``: counters (scalars);
    * ``episode/reward`` and ``episode/length``: return and length of each finished episode
      (windowed scalars);
    * ``training/scaled_reward``: mean of the ``episode/reward`` window (a scalar, the default key
      of ``FinalRewardTestCheck``);
    * every key of ``metadata.info`` as a windowed scalar, and of ``metadata.info_lists`` as a
      windowed scalar and a histogram (a ``histogram:`` key prefix: the histogram only, see
      :meth:`report`);
    * every ``cycle_in_steps`` agent steps: ``performance/inf_steps_per_sec`` and each timer's
      mean duration (seconds) as ``timing/<name>``.

    An agent step is an observation that got an action; returns sum ``rewards["reward"]``.
    :meth:`add` may run on a collector thread while a logger reads: the logs are read as
    snapshots under a lock, and written only through this class's methods.

    Args:
        inner: The wrapped proxy.
        writer: A ``torch.utils.tensorboard.SummaryWriter`` written to every ``log_interval``
            calls of :meth:`add` (upstream's call); ``None`` leaves writing to a logger callback.
        log_interval: Calls of :meth:`add` between writes to ``writer`` (needed with it).
        name: The name checkpoints store this wrapper's counters under.
        cycle_in_steps: How many agent steps between refreshes of rates, timers and histograms
            (histograms are also brought up to date whenever they are read).
        histogram_length: The most ``info_lists`` values kept per key between writes.
        default_window_length: How many values each windowed scalar keeps.
        clock: The time source for the rate, in seconds (for tests).

    Raises:
        ConfigurationError: If ``cycle_in_steps``, ``histogram_length`` or ``log_interval`` is
            not positive, or ``writer`` and ``log_interval`` are not given together.
    """

    windowed_scalar = _shared_log("windowed_scalar", _copy_windows)
    windowed_scalar_cumulative = _shared_log("windowed_scalar_cumulative", dict)

    def __init__(
        self,
        inner: MemoryProxy,
        writer: SummaryWriter | None = None,
        log_interval: int | None = None,
        *,
        name: str = "memory_proxy_logger",
        cycle_in_steps: int = 1000,
        histogram_length: int = 10_000,
        default_window_length: int = 250,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (writer is None) != (log_interval is None):
            raise ConfigurationError(
                "LoggingProxyWrapper writes to a writer every log_interval calls of add(); pass "
                f"both or neither (got writer={writer!r}, log_interval={log_interval!r})"
            )
        for label, value in (
            ("cycle_in_steps", cycle_in_steps),
            ("histogram_length", histogram_length),
            ("log_interval", 1 if log_interval is None else log_interval),
        ):
            positive_int("LoggingProxyWrapper", label, value)
        self.writer = writer
        self.log_interval = log_interval
        self._adds = 0
        self._lock = threading.RLock()
        self._logs = LoggingMixin(default_window_length=default_window_length)
        self.inf_step = 0
        self.completed_episodes = 0
        super().__init__(inner=inner, default_window_length=default_window_length)
        self.name = name
        self.cycle_in_steps = cycle_in_steps
        self.histogram_length = histogram_length
        self._clock = clock
        self._returns: dict[AgentId, list[float]] = {}  # agent -> [return, length]
        self._pending_lists: dict[str, deque[float]] = {}
        self._last_refresh_step = 0
        self._last_refresh_time = clock()

    @property
    def scalar_logs(self) -> dict[str, float]:
        """A snapshot of the scalars, with the counters as they are now."""
        with self._lock:
            snapshot = dict(self._logs.scalar_logs)
            snapshot[INF_STEP_KEY] = float(self.inf_step)
            snapshot[EPISODES_KEY] = float(self.completed_episodes)
            return snapshot

    @scalar_logs.setter
    def scalar_logs(self, value: dict[str, float]) -> None:
        with self._lock:
            self._logs.scalar_logs = dict(value)

    @property
    def hist_logs(self) -> dict[str, np.ndarray]:
        """A snapshot of the histograms, with every value recorded so far; clearing it drops the
        values read from the wrapper."""
        with self._lock:
            self._flush_histograms()
            return _HistogramSnapshot(self._logs.hist_logs, self)

    @hist_logs.setter
    def hist_logs(self, value: dict[str, np.ndarray]) -> None:
        with self._lock:
            self._logs.hist_logs = dict(value)

    def _consume_histograms(self, read: Mapping[str, np.ndarray]) -> None:
        with self._lock:
            held = self._logs.hist_logs
            for key, values in read.items():
                if held.get(key) is values:  # not refreshed since it was read
                    del held[key]

    def log_scalar(self, key: str, value: Any) -> None:
        """Records the latest value of ``key``."""
        with self._lock:
            self._logs.log_scalar(key, value)

    def log_windowed_scalar(self, key: str, value: Any) -> None:
        """Adds values to ``key``'s window (see :meth:`LoggingMixin.log_windowed_scalar`)."""
        with self._lock:
            self._logs.log_windowed_scalar(key, value)

    def log_histogram(self, key: str, value: Any) -> None:
        """Records the values whose distribution to show for ``key``."""
        with self._lock:
            self._logs.log_histogram(key, value)

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Passes the step on to the wrapped proxy, then records its statistics."""
        self._inner.add(observations, responses)
        returns = self._returns
        steps = 0
        finished: list[tuple[float, int]] = []
        metadata: list[MetaData] = []
        for agent, observation in observations.items():
            state = observation.episode_state
            if state == _RUNNING:
                steps += 1
                running = returns.get(agent)
                if running is None:
                    returns[agent] = [0.0, 0]  # started mid-stream: its reward is not ours
                else:
                    running[0] += _reward_value(observation)
                    running[1] += 1
            elif state == _INITIAL:
                steps += 1
                returns[agent] = [0.0, 0]
            elif state in _FINAL:
                running = returns.pop(agent, None)
                if running is not None:
                    reward = _reward_value(observation)
                    finished.append((running[0] + reward, int(running[1]) + 1))
            if observation.metadata is not None:
                metadata.append(observation.metadata)
        with self._lock:
            self.inf_step += steps
            if finished:
                self._episodes_finished(finished)
            for item in metadata:
                self._record_metadata(item.info, item.info_lists)
            if self.inf_step - self._last_refresh_step >= self.cycle_in_steps:
                self.refresh()
            self._adds += 1
            due = self.log_interval is not None and self._adds % self.log_interval == 0
        if due:
            self.write_logs()

    def _episodes_finished(self, finished: list[tuple[float, int]]) -> None:
        logs = self._logs
        self.completed_episodes += len(finished)
        logs.log_windowed_scalar(EPISODE_REWARD_KEY, [total for total, _ in finished])
        logs.log_windowed_scalar(EPISODE_LENGTH_KEY, [length for _, length in finished])
        logs.log_scalar(SCALED_REWARD_KEY, float(np.mean(logs.windowed_scalar[EPISODE_REWARD_KEY])))

    def report(
        self, metrics: Mapping[str, float], metrics_lists: Mapping[str, Iterable[float]]
    ) -> None:
        """Logs metrics as an observation's metadata would be (upstream emote's method).

        Args:
            metrics: Values by key: windowed scalars, or histogram values for keys starting with
                ``histogram:`` (logged under the rest of the key).
            metrics_lists: Lists of values by key: windowed scalars and histograms, or histogram
                values only for keys starting with ``histogram:``.
        """
        with self._lock:
            self._record_metadata(metrics, metrics_lists)

    def _record_metadata(
        self, info: Mapping[str, Any], info_lists: Mapping[str, Iterable[float]]
    ) -> None:
        for key, value in info.items():
            if key.startswith(HISTOGRAM_PREFIX):
                self._gather(key[len(HISTOGRAM_PREFIX) :], value)
            else:
                self._logs.log_windowed_scalar(key, value)
        for key, values in info_lists.items():
            if key.startswith(HISTOGRAM_PREFIX):
                self._gather(key[len(HISTOGRAM_PREFIX) :], values)
                continue
            values = np.asarray(values, dtype=np.float64).ravel().tolist()
            if values:
                self._logs.log_windowed_scalar(key, values)
            self._gather(key, values)

    def _gather(self, key: str, values: Any) -> None:
        """Holds histogram values until the next :meth:`refresh`."""
        pending = self._pending_lists.get(key)
        if pending is None:
            pending = self._pending_lists[key] = deque(maxlen=self.histogram_length)
        pending.extend(np.asarray(values, dtype=np.float64).ravel().tolist())

    def write_logs(self, writer: SummaryWriter | None = None) -> None:
        """Writes the logs to ``writer`` (the wrapper's own when left out) at step ``inf_step``.

        Written: the scalars, the windowed scalars' means and sums (``<key>/cumulative``), the
        histograms, and upstream emote's ``episode/completed``, ``env_vs_episode/reward`` (mean
        return, at the finished-episode count) and the recent returns' distributions
        ``episode/reward_distribution`` and ``env_vs_episode/reward_distribution``.

        Raises:
            ConfigurationError: If there is no writer to write to.
        """
        writer = writer if writer is not None else self.writer
        if writer is None:
            raise ConfigurationError("LoggingProxyWrapper.write_logs needs a writer; pass one")
        with self._lock:
            self.refresh()
            step, episodes = self.inf_step, self.completed_episodes
            scalars = self.scalar_logs | {"episode/completed": float(episodes)}
            for key, window in self._logs.windowed_scalar.items():
                scalars[key] = float(np.mean(window)) if window else None
            for key, total in self._logs.windowed_scalar_cumulative.items():
                scalars[f"{key}/cumulative"] = total
            histograms = {key: np.array(v) for key, v in self._logs.hist_logs.items()}
            returns = np.array(self._logs.windowed_scalar.get(EPISODE_REWARD_KEY, ()))
        for key, value in scalars.items():
            if value is not None:
                writer.add_scalar(key, value, step)
        for key, values in histograms.items():
            if values.size:
                writer.add_histogram(key, values, step)
        if returns.size:
            writer.add_scalar("env_vs_episode/reward", float(returns.mean()), episodes)
            writer.add_histogram("episode/reward_distribution", returns, step)
            writer.add_histogram("env_vs_episode/reward_distribution", returns, episodes)
        writer.flush()

    def refresh(self) -> None:
        """Updates the rate, the timers and the histograms in the logs now.

        Called every ``cycle_in_steps`` agent steps and by :meth:`get_report`.
        """
        with self._lock:
            logs = self._logs
            now = self._clock()
            elapsed = now - self._last_refresh_time
            if elapsed > 0 and self.inf_step > self._last_refresh_step:
                rate = (self.inf_step - self._last_refresh_step) / elapsed
                logs.scalar_logs[INF_STEPS_PER_SECOND_KEY] = rate
            self._last_refresh_step = self.inf_step
            self._last_refresh_time = now
            timers = getattr(self._inner, "timers", None)
            if isinstance(timers, BlockTimers):
                for timer_name, stats in timers.stats().items():
                    if stats["count"] > 0:
                        logs.scalar_logs[f"timing/{timer_name}"] = stats["mean"]
            self._flush_histograms()

    def _flush_histograms(self) -> None:
        """Moves the values gathered since the last flush into the histograms (under the lock)."""
        logs = self._logs
        for key, pending in self._pending_lists.items():
            if not pending:
                continue
            earlier = logs.hist_logs.get(key)
            fresh = np.fromiter(pending, dtype=np.float64, count=len(pending))
            values = fresh if earlier is None else np.concatenate([earlier, fresh])
            logs.hist_logs[key] = values[-self.histogram_length :]
            pending.clear()

    def get_report(self, keys: Iterable[str]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Current values of ``keys``, for callers that report them elsewhere.

        Args:
            keys: Logged keys. A windowed scalar gives its mean under ``key`` and its sum under
                ``key + "/cumulative"``, and its window in the second dict; a scalar gives its
                latest value; a histogram gives its values in the second dict (in place of a
                window of the same key), and, asked for as ``histogram:<key>`` (upstream's
                spelling), their mean under that name. Unknown keys are left out.

        Returns:
            ``(means and scalars, lists of histogram values)``.
        """
        values: dict[str, float] = {}
        lists: dict[str, list[float]] = {}
        with self._lock:
            self.refresh()
            logs = self._logs
            for key in keys:
                if key.startswith(HISTOGRAM_PREFIX):
                    held = logs.hist_logs.get(key[len(HISTOGRAM_PREFIX) :])
                    if held is not None and len(held):
                        values[key] = float(np.mean(held))
                    continue
                window = logs.windowed_scalar.get(key)
                if window:
                    values[key] = float(np.mean(window))
                    values[f"{key}/cumulative"] = logs.windowed_scalar_cumulative.get(key, 0.0)
                    lists[key] = list(window)
                elif key in (scalars := self.scalar_logs):
                    values[key] = scalars[key]
                if key in logs.hist_logs:
                    lists[key] = logs.hist_logs[key].tolist()
        return values, lists

    def state_dict(self) -> dict[str, Any]:
        """The counters (and the logs), so a resumed run continues counting."""
        with self._lock:
            self.refresh()
            state = super().state_dict()
            state["inf_step"] = self.inf_step
            state["completed_episodes"] = self.completed_episodes
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores the counters and logs saved by :meth:`state_dict`."""
        with self._lock:
            super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
            self.inf_step = int(state_dict.get("inf_step", 0))
            self.completed_episodes = int(state_dict.get("completed_episodes", 0))
            self._last_refresh_step = self.inf_step
            self._last_refresh_time = self._clock()


__all__ = [
    "EPISODES_KEY",
    "EPISODE_LENGTH_KEY",
    "EPISODE_REWARD_KEY",
    "INF_STEPS_PER_SECOND_KEY",
    "INF_STEP_KEY",
    "SCALED_REWARD_KEY",
    "LoggingProxyWrapper",
]
