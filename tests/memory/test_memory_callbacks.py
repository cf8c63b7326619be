"""MemoryWarmup in a real Trainer, with collector threads."""

from __future__ import annotations

import itertools
import threading

import numpy as np

from emote_core.callback import Callback
from emote_core.memory.callbacks import MemoryWarmup
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.loaders import MemoryLoader
from emote_core.memory.mappers import NextElementMapper, SyntheticMasks
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.trainer import Trainer
from emote_core.typing import DictObservation, DictResponse, EpisodeState

INITIAL, RUNNING, TERMINAL = EpisodeState.INITIAL, EpisodeState.RUNNING, EpisodeState.TERMINAL


def make_table() -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (2,), np.float32),
            VirtualColumn("next_obs", (2,), np.float32, "obs", NextElementMapper()),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=10_000,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=1,
    )


def feed_episode(proxy, agent: int, length: int, end=TERMINAL, base: float = 0.0) -> None:
    def observation(state, t):
        reward = {} if state == INITIAL else {"reward": base + t}
        return DictObservation(
            episode_state=state,
            array_data={"obs": np.full(2, base + t, np.float32)},
            rewards=reward,
        )

    response = {agent: DictResponse({"actions": np.ones(1, np.float32)})}
    proxy.add({agent: observation(INITIAL, 0)}, response)
    for t in range(1, length):
        proxy.add({agent: observation(RUNNING, t)}, response)
    proxy.add({agent: observation(end, length)}, {})


class SizeAtBatches(Callback):
    """Records the table's size at each batch and whether end_training ran."""

    def __init__(self, table: ArrayMemoryTable) -> None:
        super().__init__(name="size_at_batches")
        self.table = table
        self.sizes: list[int] = []
        self.ended = False

    def begin_batch(self) -> None:
        self.sizes.append(self.table.size())

    def end_training(self) -> None:
        self.ended = True


class Watched:
    """A loader whose readiness checks record the table's size: what the warm-up saw."""

    def __init__(self, loader: MemoryLoader, table: ArrayMemoryTable) -> None:
        self.loader, self.table = loader, table
        self.seen: list[int] = []
        self.changed = threading.Condition()

    def is_ready(self) -> bool:
        with self.changed:
            self.seen.append(self.table.size())
            self.changed.notify_all()
        return self.loader.is_ready()

    def wait_for_a_look_at(self, size: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: size in self.seen, timeout=60), self.seen


def test_warmup_holds_training_until_a_collector_thread_fills_the_table():
    table = make_table()
    proxy = MemoryTableProxy(table)
    loader = MemoryLoader(table=table, rollout_count=4, rollout_length=2)  # needs 8 transitions
    watched = Watched(loader, table)

    def collect() -> None:
        for episode in range(3):  # 3 episodes of 3 transitions: ready after the third
            watched.wait_for_a_look_at(3 * episode)  # the warm-up saw the table not ready
            feed_episode(proxy, agent=0, length=3, base=10.0 * episode)

    sizes = SizeAtBatches(table)
    trainer = Trainer(
        [MemoryWarmup(loader=watched, poll_interval=0.01), sizes], itertools.islice(loader, 3)
    )
    collector = threading.Thread(target=collect)
    collector.start()
    state = trainer.train()
    collector.join()
    # Without the warm-up the first batch would sample an empty table and fail.
    assert state["bp_step"] == 3 and sizes.sizes == [9, 9, 9]
    assert {0, 3, 6} <= set(watched.seen) <= {0, 3, 6, 9}  # it waited through each episode


class RecordedEvent(threading.Event):
    """An event that records the timeout of every wait on it and says when one begins."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        self.waiting.set()
        return super().wait(timeout)


def test_warmup_stops_training_when_the_shutdown_signal_is_set(no_hang: None):
    table = make_table()
    loader = MemoryLoader(table=table, rollout_count=4, rollout_length=2)  # never ready
    sizes = SizeAtBatches(table)
    # A poll interval no test outlasts: only a wait that wakes on the signal can end this one.
    trainer = Trainer([MemoryWarmup(loader=loader, poll_interval=3_600.0), sizes], loader)
    trainer.shutdown_signal = stop = RecordedEvent()
    stopper = threading.Thread(target=lambda: stop.waiting.wait(timeout=60) and stop.set())
    stopper.start()
    state = trainer.train()
    stopper.join()
    assert stop.timeouts == [3_600.0]  # one wait on the signal itself, ended by it
    assert state["bp_step"] == 0 and sizes.sizes == [] and sizes.ended


def test_warmup_honours_its_own_shutdown_function_and_serves_pending_exports():
    class ReadyOnThirdCall:
        def __init__(self) -> None:
            self.calls = 0

        def is_ready(self) -> bool:
            self.calls += 1
            return self.calls >= 3

    class Exporter:
        def __init__(self) -> None:
            self.served = 0

        def process_pending_exports(self) -> None:
            self.served += 1

    exporter = Exporter()
    warmup = MemoryWarmup(loader=ReadyOnThirdCall(), exporter=exporter, poll_interval=0.001)
    state = Trainer([warmup], [{"batch_size": 1}]).train()
    assert state["bp_step"] == 1 and exporter.served == 2

    stopped = MemoryWarmup(loader=ReadyOnThirdCall(), shutdown_signal=lambda: True)
    state = Trainer([stopped], [{"batch_size": 1}]).train()
    assert state["bp_step"] == 0
