from __future__ import annotations

import math
import threading
import types

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError
from emote_core.utils import BlockTimers, MovingWindowStatistics, TimedBlock, WelfordStatistics
from emote_core.utils import timers as timers_module

STAT_KEYS = {
    "mean",
    "std",
    "min",
    "max",
    "count",
    "last",
    "overall_mean",
    "overall_std",
    "overall_min",
    "overall_max",
}


def test_welford_matches_numpy_on_random_data() -> None:
    rng = np.random.default_rng(1234)
    data = rng.normal(loc=1e6, scale=3.0, size=10_000)  # large offset: naive sums lose precision
    stats = WelfordStatistics()
    for x in data:
        stats.add(x)
    assert stats.count == data.size
    assert stats.mean == pytest.approx(np.mean(data), rel=1e-12)
    assert stats.std == pytest.approx(np.std(data), rel=1e-9)
    assert stats.variance == pytest.approx(np.var(data), rel=1e-9)
    assert stats.sample_variance == pytest.approx(np.var(data, ddof=1), rel=1e-9)
    assert stats.min == data.min()
    assert stats.max == data.max()


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=200))
def test_welford_matches_numpy_for_any_values(values: list[float]) -> None:
    stats = WelfordStatistics()
    for x in values:
        stats.add(x)
    assert stats.mean == pytest.approx(np.mean(values), rel=1e-9, abs=1e-6)
    assert stats.std == pytest.approx(np.std(values), rel=1e-6, abs=1e-4)
    assert stats.min == min(values)
    assert stats.max == max(values)


def test_welford_empty_is_nan() -> None:
    stats = WelfordStatistics()
    assert stats.count == 0
    assert all(math.isnan(v) for v in (stats.mean, stats.std, stats.min, stats.max))


@pytest.mark.parametrize("window", [1, 7, 50])
def test_moving_window_matches_numpy_over_last_values(window: int) -> None:
    rng = np.random.default_rng(window)
    data = rng.uniform(-5.0, 5.0, size=123)
    stats = MovingWindowStatistics(window)
    for i, x in enumerate(data, start=1):
        stats.add(x)
        recent = data[max(0, i - window) : i]
        assert stats.count == len(recent)
        assert stats.mean == pytest.approx(np.mean(recent), rel=1e-12, abs=1e-12)
        assert stats.std == pytest.approx(np.std(recent), rel=1e-9, abs=1e-12)
        assert stats.min == recent.min()
        assert stats.max == recent.max()
    assert stats.values == pytest.approx(list(data[-window:]))


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_bad_window_is_rejected_with_its_value(window: object) -> None:
    with pytest.raises(
        ConfigurationError, match=r"MovingWindowStatistics: window must be a positive integer; got"
    ):
        MovingWindowStatistics(window)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=repr(window).replace(".", r"\.")):
        BlockTimers(window)  # type: ignore[arg-type]


class Clock:
    """A ``perf_counter`` that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The timers' clock, moved by the test instead of by sleeping."""
    fake = Clock()
    monkeypatch.setattr(
        timers_module, "time", types.SimpleNamespace(perf_counter=fake.perf_counter)
    )
    return fake


def test_timed_block_measures_the_time_its_block_takes(clock: Clock) -> None:
    block = TimedBlock()
    for seconds in (0.05, 0.07, 0.06):
        with block:
            clock.advance(seconds)
    assert block.count == 3
    assert (block.min(), block.max()) == pytest.approx((0.05, 0.07))
    assert block.mean() == pytest.approx(0.06)
    assert block.last == pytest.approx(0.06)
    assert block.std() == pytest.approx(np.std([0.05, 0.07, 0.06]))


def test_timed_block_window_forgets_old_timings_but_overall_does_not() -> None:
    block = TimedBlock(window=2)
    for duration in (10.0, 1.0, 3.0):
        block.record(duration)
    assert block.mean() == pytest.approx(2.0)
    assert block.max() == 3.0
    assert block.last == 3.0
    stats = block.stats()
    assert set(stats) == STAT_KEYS
    assert stats["count"] == 3.0
    assert stats["overall_max"] == 10.0
    assert stats["overall_mean"] == pytest.approx(14.0 / 3.0)


def test_timed_block_records_even_when_the_block_raises() -> None:
    block = TimedBlock()
    with pytest.raises(ValueError), block:
        raise ValueError("fail")
    assert block.count == 1


def test_timed_block_nested_and_concurrent_use(clock: Clock) -> None:
    block = TimedBlock()
    with block:
        clock.advance(0.02)
        with block:
            clock.advance(0.01)
    assert block.count == 2
    assert block.min() == pytest.approx(0.01)
    assert block.max() == pytest.approx(0.03)  # the outer timing includes the inner one

    def work() -> None:
        for _ in range(20):
            with block:
                pass

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert block.count == 2 + 8 * 20


def test_block_timers_stats_per_scope(clock: Clock) -> None:
    timers = BlockTimers(window=10)
    for _ in range(3):
        with timers.scope("sample"):
            pass
    with timers.scope("train") as block:
        clock.advance(0.01)
    assert block is timers.timer("train")
    stats = timers.stats()
    assert set(stats) == {"sample", "train"}
    assert timers.names() == ["sample", "train"]
    for per_scope in stats.values():
        assert set(per_scope) == STAT_KEYS
        assert all(isinstance(v, float) for v in per_scope.values())
    assert stats["sample"]["count"] == 3.0
    assert stats["train"]["count"] == 1.0
    assert stats["train"]["mean"] == pytest.approx(0.01)


def test_block_timers_create_one_timer_per_name_across_threads() -> None:
    timers = BlockTimers()
    barrier = threading.Barrier(8)
    blocks: list[TimedBlock] = []
    blocks_lock = threading.Lock()

    def work() -> None:
        barrier.wait()
        for _ in range(50):
            with timers.scope("shared") as block:
                pass
        with blocks_lock:
            blocks.append(block)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(b) for b in blocks}) == 1
    assert timers.stats()["shared"]["count"] == 8 * 50
