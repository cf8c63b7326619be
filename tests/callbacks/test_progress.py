"""ProgressReporter and ThroughputMeter, run in a real Trainer with a clock the test controls."""

from __future__ import annotations

import pytest

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.callbacks.progress import (
    ProgressReporter,
    ProgressSnapshot,
    ThroughputMeter,
    TrainingPhase,
)
from emote_core.errors import ConfigurationError
from emote_core.trainer import Trainer

STEPS = 10
WARMUP_SECONDS = 30.0
SECONDS_PER_BATCH = 0.25
ENV_STEPS_PER_BATCH = 4


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeCollector(LoggingMixin, Callback):
    """Logs what a collector and a loss log: env steps, episode returns, losses, other scalars.

    Its warm-up in ``begin_training`` takes WARMUP_SECONDS, and each batch SECONDS_PER_BATCH.
    """

    order = Order.DATA

    def __init__(self, clock: Clock, seen: list[ProgressSnapshot]) -> None:
        super().__init__(name="collector")
        self.clock = clock
        self.seen = seen
        self.snapshots_before_warmup: int | None = None
        self.env_steps = 0

    def begin_training(self) -> None:
        self.snapshots_before_warmup = len(self.seen)
        self.clock.now += WARMUP_SECONDS
        self.env_steps = 200
        self.log_scalar("training/env_steps", self.env_steps)

    def begin_batch(self) -> None:
        self.clock.now += SECONDS_PER_BATCH
        self.env_steps += ENV_STEPS_PER_BATCH
        self.log_scalar("training/env_steps", self.env_steps)

    def backward(self, bp_step: int) -> None:
        self.log_windowed_scalar("episode/reward", float(bp_step))
        self.log_scalar("loss/q1", 1.0 / bp_step)
        self.log_scalar("loss/policy", -2.0 * bp_step)
        self.log_scalar("training/alpha", 0.5)


def _train(
    interval: float, steps: int = STEPS, return_window: int = 3
) -> tuple[list[ProgressSnapshot], FakeCollector]:
    clock = Clock()
    seen: list[ProgressSnapshot] = []
    collector = FakeCollector(clock, seen)
    reporter = ProgressReporter(
        sink=seen.append,
        total=steps,
        callbacks=[collector],
        interval=interval,
        return_window=return_window,
        clock=clock,
    )
    batches = [{"batch_size": 8} for _ in range(steps)]
    Trainer([collector, reporter], batches).train()
    return seen, collector


def test_the_first_snapshot_comes_before_warm_up_and_the_last_at_the_end() -> None:
    seen, collector = _train(interval=0.5)
    assert collector.snapshots_before_warmup == 1  # life before the collector's warm-up
    first, last = seen[0], seen[-1]
    assert first.phase is TrainingPhase.STARTING
    assert (first.bp_step, first.total, first.env_steps) == (0, STEPS, None)
    assert first.updates_per_second is None and first.eta_seconds is None
    assert last.phase is TrainingPhase.FINISHED
    assert last.bp_step == STEPS and last.eta_seconds == 0.0
    assert last.elapsed_seconds == pytest.approx(WARMUP_SECONDS + STEPS * SECONDS_PER_BATCH)


def test_the_first_update_is_shown_at_once_then_at_most_every_interval() -> None:
    seen, _ = _train(interval=0.5)
    training = [s.bp_step for s in seen if s.phase is TrainingPhase.TRAINING]
    # A batch takes 0.25 s: update 1 at once (warm-up is over), then every second update.
    assert training == [1, 3, 5, 7, 9]


def test_rates_eta_return_and_losses_are_read_from_what_callbacks_log() -> None:
    seen, _ = _train(interval=0.0, return_window=3)
    snapshot = next(s for s in seen if s.bp_step == 6 and s.phase is TrainingPhase.TRAINING)
    # Rates count from the first update, not from the start of the 30 s warm-up.
    assert snapshot.updates_per_second == pytest.approx(1 / SECONDS_PER_BATCH)
    assert snapshot.env_steps == 200 + 6 * ENV_STEPS_PER_BATCH
    assert snapshot.env_steps_per_second == pytest.approx(ENV_STEPS_PER_BATCH / SECONDS_PER_BATCH)
    assert snapshot.eta_seconds == pytest.approx((STEPS - 6) * SECONDS_PER_BATCH)
    assert snapshot.episode_return == pytest.approx((4 + 5 + 6) / 3)  # the 3 most recent
    assert snapshot.losses == {"loss/q1": pytest.approx(1 / 6), "loss/policy": -12.0}


def test_without_a_collector_there_are_no_env_figures() -> None:
    clock = Clock()
    seen: list[ProgressSnapshot] = []
    reporter = ProgressReporter(sink=seen.append, total=3, clock=clock, interval=0.0)
    Trainer([reporter], [{"batch_size": 1}] * 3).train()
    assert [s.bp_step for s in seen] == [0, 1, 2, 3, 3]
    assert all(s.env_steps is None and s.env_steps_per_second is None for s in seen)
    assert all(s.episode_return is None and s.losses == {} for s in seen)


def test_a_run_that_fails_still_sends_its_final_snapshot() -> None:
    class Boom(Callback):
        def end_batch(self, bp_step: int) -> None:
            if bp_step == 2:
                raise RuntimeError("boom")

    seen: list[ProgressSnapshot] = []
    reporter = ProgressReporter(sink=seen.append, total=5, interval=0.0)
    with pytest.raises(RuntimeError, match="boom"):
        Trainer([reporter, Boom()], [{"batch_size": 1}] * 5).train()
    assert seen[-1].phase is TrainingPhase.FINISHED and seen[-1].bp_step == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"interval": -1.0}, "interval must be >= 0"), ({"return_window": 0}, "return_window")],
)
def test_bad_settings_are_refused(arguments: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ProgressReporter(sink=print, total=1, **arguments)  # type: ignore[arg-type]


def test_throughput_meter_rate_follows_the_window_and_gives_an_eta() -> None:
    clock = Clock()
    meter = ThroughputMeter(window_seconds=10.0, clock=clock)
    assert meter.rate is None and meter.eta(100) is None
    count = 0
    assert meter.add(count) is None  # one measurement is no rate
    for _ in range(20):  # 5 per second for 20 s
        clock.now += 1.0
        count += 5
        meter.add(count)
    assert meter.rate == pytest.approx(5.0)
    for _ in range(10):  # then 50 per second: after a full window only the new rate counts
        clock.now += 1.0
        count += 50
        meter.add(count)
    assert meter.rate == pytest.approx(50.0)
    assert meter.eta(count + 100) == pytest.approx(2.0)  # 100 to go at 50/s
    assert meter.eta(10) == 0.0 and meter.eta(None) is None
    meter.reset()
    assert meter.rate is None


def test_throughput_meter_needs_a_positive_window() -> None:
    with pytest.raises(ConfigurationError, match="window_seconds must be positive"):
        ThroughputMeter(window_seconds=0)
