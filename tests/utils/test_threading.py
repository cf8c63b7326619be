from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from emote_core.utils.threading import QUICK_SWITCH_SECONDS, quick_switches

THREADS = 8
ITERATIONS = 5_000


@pytest.fixture(autouse=True)
def _frequent_thread_switches() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, so races show up reliably."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def _run_in_threads(target: Callable[[], None], count: int = THREADS) -> None:
    barrier = threading.Barrier(count)

    def worker() -> None:
        barrier.wait()  # start together to maximise contention
        target()

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.fixture
def usual_interval() -> Iterator[float]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield sys.getswitchinterval()
    sys.setswitchinterval(before)


def test_quick_switches_lower_the_interval_for_the_block_and_put_it_back(usual_interval):
    with quick_switches():
        assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_SECONDS)
    assert sys.getswitchinterval() == usual_interval
    with pytest.raises(KeyError), quick_switches(0.001):  # also when the block fails
        assert sys.getswitchinterval() == pytest.approx(0.001)
        raise KeyError("x")
    assert sys.getswitchinterval() == usual_interval


def test_quick_switches_never_raise_an_interval_already_lower(usual_interval):
    sys.setswitchinterval(0.00005)
    lower = sys.getswitchinterval()
    with quick_switches():
        assert sys.getswitchinterval() == lower
    assert sys.getswitchinterval() == lower


def test_overlapping_blocks_on_threads_share_one_change_and_the_last_restores(usual_interval):
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with quick_switches():
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=other)
    with quick_switches():
        worker.start()
        assert inside.wait(10)
    # This thread's block ended first: the other's still runs at the quick interval.
    assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_SECONDS)
    release.set()
    worker.join(10)
    assert sys.getswitchinterval() == usual_interval


def test_an_interval_changed_inside_a_block_is_left_as_it_was_set(usual_interval):
    with quick_switches():
        sys.setswitchinterval(0.002)  # someone else's choice, made meanwhile
    assert sys.getswitchinterval() == pytest.approx(0.002)
