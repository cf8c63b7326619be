from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from emote_core.utils import (
    AtomicContainer,
    AtomicInt,
    LockedResource,
    TracedLock,
    WeakReference,
)
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


def test_atomic_int_increments_from_many_threads_reach_exact_total() -> None:
    counter = AtomicInt()

    def work() -> None:
        for _ in range(ITERATIONS):
            counter.increment()

    _run_in_threads(work)
    assert counter.value == THREADS * ITERATIONS


def test_atomic_int_inplace_operators_are_atomic_and_keep_the_object() -> None:
    counter = AtomicInt(10)
    original = counter

    def work() -> None:
        nonlocal counter
        for _ in range(ITERATIONS):
            counter += 3
            counter -= 1

    _run_in_threads(work)
    assert counter is original
    assert int(counter) == 10 + THREADS * ITERATIONS * 2


def test_atomic_int_returns_new_values_and_swaps() -> None:
    counter = AtomicInt(5)
    assert counter.increment(4) == 9
    assert counter.decrement() == 8
    assert counter.swap(-2) == 8
    assert counter.value == -2
    assert [10, 20, 30][AtomicInt(1)] == 20  # usable as an index


def test_atomic_int_increment_results_are_unique_under_contention() -> None:
    counter = AtomicInt()
    seen: list[int] = []
    seen_lock = threading.Lock()

    def work() -> None:
        local = [counter.increment() for _ in range(1_000)]
        with seen_lock:
            seen.extend(local)

    _run_in_threads(work)
    assert sorted(seen) == list(range(1, THREADS * 1_000 + 1))


def test_locked_resource_serialises_read_modify_write() -> None:
    resource = LockedResource({"total": 0})

    def work() -> None:
        for _ in range(ITERATIONS // 5):
            with resource as state:
                current = state["total"]
                time.sleep(0)  # hand the GIL to another thread mid-update; the lock must hold
                state["total"] = current + 1

    _run_in_threads(work)
    with resource as state:
        assert state["total"] == THREADS * ITERATIONS // 5


def test_locked_resource_releases_lock_on_error_and_swaps() -> None:
    resource = LockedResource([1])
    try:
        with resource as value:
            value.append(2)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert resource.swap([9]) == [1, 2]  # would deadlock if the lock were still held
    with resource as value:
        assert value == [9]


def test_atomic_container_swap_returns_every_value_exactly_once() -> None:
    container: AtomicContainer[int] = AtomicContainer(-1)
    returned: list[int] = []
    returned_lock = threading.Lock()
    next_id = AtomicInt()

    def work() -> None:
        mine = []
        for _ in range(1_000):
            mine.append(container.swap(next_id.increment()))
        with returned_lock:
            returned.extend(mine)

    _run_in_threads(work)
    returned.append(container.read())
    # Each value put in (plus the initial one) comes out once: none lost, none duplicated.
    assert sorted(returned) == [-1, *range(1, THREADS * 1_000 + 1)]


def test_atomic_container_read_and_set() -> None:
    container = AtomicContainer("a")
    assert container.read() == "a"
    container.set("b")
    assert container.swap("c") == "b"
    assert container.read() == "c"


def test_atomic_container_take_empties_it_and_only_one_thread_gets_the_value() -> None:
    container = AtomicContainer("weights")
    assert container.take() == "weights"
    assert container.read() is None
    assert container.take() is None
    taken: list[str | None] = []
    taken_lock = threading.Lock()

    def work() -> None:
        value = container.take()
        with taken_lock:
            taken.append(value)

    for round_ in range(50):
        container.set(f"weights-{round_}")
        taken.clear()
        _run_in_threads(work)
        assert sorted(taken, key=str) == [None] * (THREADS - 1) + [f"weights-{round_}"]


def test_weak_reference_returns_the_object_until_it_is_collected() -> None:
    class Policy:
        pass

    policy = Policy()
    collected: list[object] = []
    reference = WeakReference[Policy](policy, collected.append)
    assert reference() is policy
    assert isinstance(reference, WeakReference)
    del policy
    gc.collect()
    assert reference() is None
    assert collected == [reference]


def test_traced_lock_names_its_holder_and_measures_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lock = TracedLock(name="exporter")
    assert lock.holder is None
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock:
            inside.set()
            release.wait(5)

    holder = threading.Thread(target=hold, name="exporter-thread")
    holder.start()
    assert inside.wait(5)
    assert lock.holder == "exporter-thread"
    threading.Timer(0.05, release.set).start()
    with caplog.at_level(logging.DEBUG, logger="emote_core.utils.threading"), lock:
        assert lock.holder == threading.current_thread().name
    holder.join()
    assert lock.holder is None
    assert lock.acquisitions == 2
    assert lock.accumulated_block_time >= 0.04  # the main thread waited for the release
    assert lock.accumulated_exec_time >= lock.accumulated_block_time
    assert "exporter: MainThread acquired it after waiting" in caplog.text


def test_traced_lock_serialises_threads_and_counts_reentry_once() -> None:
    lock = TracedLock()
    counter = [0]

    def work() -> None:
        for _ in range(200):
            with lock:
                counter[0] += 1

    _run_in_threads(work)
    assert counter[0] == THREADS * 200
    assert lock.acquisitions == THREADS * 200
    reentrant = TracedLock(threading.RLock)
    with reentrant, reentrant:
        assert reentrant.holder == threading.current_thread().name
    assert reentrant.holder is None
    assert reentrant.acquisitions == 1


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
