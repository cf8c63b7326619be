"""MemoryWarmup in a real Trainer, with collector threads."""

from __future__ import annotations

import itertools
import threading
import time

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


def test_warmup_holds_training_until_a_collector_thread_fills_the_table():
    table = make_table()
    proxy = MemoryTableProxy(table)
    loader = MemoryLoader(table=table, rollout_count=4, rollout_length=2)  # needs 8 transitions

    def collect() -> None:
        for episode in range(3):  # 3 episodes of 3 transitions: ready after the third
            time.sleep(0.05)
            feed_episode(proxy, agent=0, length=3, base=10.0 * episode)

    sizes = SizeAtBatches(table)
    trainer = Trainer(
        [MemoryWarmup(loader=loader, poll_interval=0.01), sizes], itertools.islice(loader, 3)
    )
    collector = threading.Thread(target=collect)
    started = time.monotonic()
    collector.start()
    state = trainer.train()
    collector.join()
    # Without the warm-up the first batch would sample an empty table and fail.
    assert state["bp_step"] == 3 and sizes.sizes == [9, 9, 9]
    assert time.monotonic() - started >= 0.15


def test_warmup_stops_training_when_the_shutdown_signal_is_set():
    table = make_table()
    loader = MemoryLoader(table=table, rollout_count=4, rollout_length=2)  # never ready
    sizes = SizeAtBatches(table)
    trainer = Trainer([MemoryWarmup(loader=loader, poll_interval=10.0), sizes], loader)
    stopper = threading.Timer(0.2, trainer.shutdown_signal.set)
    started = time.monotonic()
    stopper.start()
    state = trainer.train()
    elapsed = time.monotonic() - started
    stopper.join()
    # The wait wakes on the signal itself, well before the 10 s poll interval.
    assert 0.15 <= elapsed < 5.0
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
