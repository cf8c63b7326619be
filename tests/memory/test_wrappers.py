"""Proxy wrappers: forwarding, collection statistics for loggers, and periodic table exports."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as ea
from torch.utils.tensorboard import SummaryWriter

from emote_core.callbacks.logging import TensorboardLogger
from emote_core.callbacks.testing import FinalRewardTestCheck
from emote_core.errors import ConfigurationError, TestCheckFailed
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.logging_wrapper import LoggingProxyWrapper
from emote_core.memory.mappers import NextElementMapper
from emote_core.memory.proxy import MemoryProxy, MemoryTableProxy
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.memory.wrappers import MemoryTableProxyWrapper
from emote_core.stores.memory_export import MemoryExporterProxyWrapper
from emote_core.trainer import Trainer, TrainingShutdownException
from emote_core.typing import DictObservation, DictResponse, EpisodeState, MetaData

INITIAL, RUNNING = EpisodeState.INITIAL, EpisodeState.RUNNING
TERMINAL, INTERRUPTED = EpisodeState.TERMINAL, EpisodeState.INTERRUPTED


def make_table(maxlen: int = 10_000) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (2,), np.float32),
            VirtualColumn("next_obs", (2,), np.float32, "obs", NextElementMapper()),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
        ],
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
    )


def obs(state, reward=None, metadata=None) -> DictObservation:
    rewards = {} if reward is None else {"reward": reward}
    return DictObservation(
        episode_state=state,
        array_data={"obs": np.zeros(2, np.float32)},
        rewards=rewards,
        metadata=metadata,
    )


def act() -> DictResponse:
    return DictResponse({"actions": np.zeros(1, np.float32)})


def feed_episode(proxy, agent, rewards, end=TERMINAL, metadata=None):
    """One episode of ``len(rewards)`` transitions for ``agent``."""
    proxy.add({agent: obs(INITIAL, metadata=metadata)}, {agent: act()})
    for reward in rewards[:-1]:
        proxy.add({agent: obs(RUNNING, reward, metadata)}, {agent: act()})
    proxy.add({agent: obs(end, rewards[-1], metadata)}, {})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stacked_wrappers_behave_like_the_proxy(tmp_path):
    table = make_table()
    proxy = MemoryTableProxy(table, minimum_length_threshold=2, name="collector")
    exporter = MemoryExporterProxyWrapper(
        proxy,
        target_memory_name="mem",
        inf_steps_per_memory_export=10**9,
        experiment_root_path=tmp_path,
    )
    wrapper = LoggingProxyWrapper(exporter)
    assert isinstance(wrapper, MemoryProxy)
    assert wrapper.unwrapped is proxy and wrapper.inner is exporter
    assert wrapper.table is table and wrapper.timers is proxy.timers
    feed_episode(wrapper, 0, [1.0, 1.0])
    feed_episode(wrapper, 1, [1.0])  # below the threshold: dropped
    wrapper.add({2: obs(INITIAL)}, {2: act()})
    assert wrapper.size() == 2 == table.size()
    # Methods and properties of the proxy at the bottom, through two wrappers; plain attributes
    # are not forwarded (as upstream), they are read from the proxy that has them.
    assert wrapper.open_episodes == 1 and not wrapper.is_initial(2) and wrapper.is_initial(0)
    assert wrapper.dropped_episodes == 1
    assert wrapper.target_memory_name == "mem"  # from the exporter in the middle
    proxy.note = "set by a user"
    assert wrapper.unwrapped.note == "set by a user"
    with pytest.raises(AttributeError, match="'note' is a plain attribute"):
        _ = wrapper.note
    wrapper.resize(1)
    assert table.maxlen == 1 and table.size() == 0
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = wrapper.no_such_thing


def test_table_proxy_wrapper_forwards_the_table_api():
    table = make_table()
    wrapper = MemoryTableProxyWrapper(MemoryTableProxy(table))
    wrapper.resize(5)
    assert table.maxlen == 5
    feed_episode(wrapper, 0, [1.0, 2.0])
    assert wrapper.size() == 2 and table.episode_count == 1


def test_logging_wrapper_counts_steps_and_episodes_and_logs_returns():
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table()))
    feed_episode(wrapper, 0, [1.0, 2.0, 3.0])  # 3 agent steps, return 6
    feed_episode(wrapper, 0, [10.0], end=INTERRUPTED)  # 1 agent step, return 10
    wrapper.add({9: obs(TERMINAL, 5.0)}, {})  # unknown agent: skipped by the proxy and the logs
    assert wrapper.inf_step == 4 and wrapper.completed_episodes == 2
    assert list(wrapper.windowed_scalar["episode/reward"]) == [6.0, 10.0]
    assert list(wrapper.windowed_scalar["episode/length"]) == [3.0, 1.0]
    assert wrapper.scalar_logs["training/scaled_reward"] == 8.0
    assert wrapper.scalar_logs["training/inf_step"] == 4.0
    assert wrapper.scalar_logs["training/completed_episodes"] == 2.0


def test_final_reward_check_reads_the_logging_wrapper():
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table()))
    feed_episode(wrapper, 0, [5.0, 5.0])
    passing = FinalRewardTestCheck(callback=wrapper, cutoff=9.5, test_length=1)
    with pytest.raises(TrainingShutdownException):
        passing.end_cycle(bp_step=1)
    failing = FinalRewardTestCheck(callback=wrapper, cutoff=10.5, test_length=1)
    with pytest.raises(TestCheckFailed, match="training/scaled_reward"):
        failing.end_cycle(bp_step=1)


def test_metadata_info_and_info_lists_reach_the_logs_and_the_report():
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table()), cycle_in_steps=10**6)
    metadata = MetaData(info={"goal/distance": 2.5}, info_lists={"contact/forces": [1.0, 2.0]})
    feed_episode(wrapper, 0, [1.0, 1.0], metadata=metadata)  # 3 observations with metadata
    assert list(wrapper.windowed_scalar["goal/distance"]) == [2.5, 2.5, 2.5]
    assert wrapper.hist_logs["contact/forces"].tolist() == [1.0, 2.0] * 3  # there once read
    values, lists = wrapper.get_report(
        ["goal/distance", "episode/reward", "contact/forces", "nope"]
    )
    assert values["goal/distance"] == 2.5 and values["goal/distance/cumulative"] == 7.5
    assert values["episode/reward"] == 2.0
    assert lists["contact/forces"] == [1.0, 2.0] * 3
    assert lists["goal/distance"] == [2.5, 2.5, 2.5]  # a window, as upstream reports it
    assert "nope" not in values and "nope" not in lists


def test_rate_and_timers_are_refreshed_every_cycle():
    clock = Clock()
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table()), cycle_in_steps=4, clock=clock)
    wrapper.add({0: obs(INITIAL)}, {0: act()})
    clock.now += 2.0
    for _ in range(3):
        wrapper.add({0: obs(RUNNING, 1.0)}, {0: act()})
    assert wrapper.scalar_logs["performance/inf_steps_per_sec"] == 2.0  # 4 steps in 2 s
    assert wrapper.scalar_logs["timing/add"] > 0


def test_counters_survive_a_checkpoint_round_trip(tmp_path):
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table()), name="proxy_logs")
    feed_episode(wrapper, 0, [1.0, 2.0])
    path = tmp_path / "state.pt"
    torch.save(wrapper.state_dict(), path)

    resumed = LoggingProxyWrapper(MemoryTableProxy(make_table()), name="proxy_logs")
    resumed.load_state_dict(torch.load(path, weights_only=True))
    assert resumed.inf_step == 2 and resumed.completed_episodes == 1
    feed_episode(resumed, 0, [4.0])
    assert resumed.inf_step == 3 and resumed.completed_episodes == 2
    assert list(resumed.windowed_scalar["episode/reward"]) == [3.0, 4.0]


def test_tensorboard_logger_writes_the_wrapper_logs(tmp_path):
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table()), cycle_in_steps=1)
    metadata = MetaData(info_lists={"contact/forces": [0.5, 1.5]})
    feed_episode(wrapper, 0, [1.0, 2.0], metadata=metadata)
    writer = SummaryWriter(log_dir=str(tmp_path))
    logger = TensorboardLogger(callbacks=[wrapper], writer=writer, log_interval=1)
    Trainer([logger], [{"batch_size": 8}]).train()

    events = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    events.Reload()
    scalars = {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]}
    assert scalars["episode_bp_step/reward"] == 3.0
    assert scalars["episode_bp_step/length"] == 2.0
    assert scalars["training_bp_step/inf_step"] == 2.0
    assert scalars["training_bp_step/scaled_reward"] == 3.0
    assert "contact_bp_step/forces" in events.Tags()["histograms"]


def test_logging_wrapper_rejects_a_bad_cycle():
    with pytest.raises(ConfigurationError, match="cycle_in_steps"):
        LoggingProxyWrapper(MemoryTableProxy(make_table()), cycle_in_steps=0)


def test_a_logger_in_the_training_thread_reads_while_a_collector_thread_adds(tmp_path):
    """Logs are read as snapshots: no 'changed size during iteration' and exact counters."""
    wrapper = LoggingProxyWrapper(MemoryTableProxy(make_table(maxlen=1000)), cycle_in_steps=7)
    writer = SummaryWriter(log_dir=str(tmp_path))
    logger = TensorboardLogger(callbacks=[wrapper], writer=writer, log_interval=1)
    stop = threading.Event()
    fed = {"steps": 0, "episodes": 0, "return": 0.0}
    errors: list[BaseException] = []

    def collect() -> None:
        try:
            while not stop.is_set():
                number = fed["episodes"]
                metadata = MetaData(
                    info={f"info/key{number % 40}": 1.0},  # new keys keep appearing
                    info_lists={f"lists/key{number % 4}": [1.0, 2.0]},
                )
                feed_episode(wrapper, 0, [1.0, 2.0, 3.0], metadata=metadata)
                fed["steps"] += 3
                fed["episodes"] += 1
                fed["return"] += 6.0
        except BaseException as error:  # reported to the test below
            errors.append(error)

    collector = threading.Thread(target=collect)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so unsafe reads would collide
    collector.start()
    try:
        Trainer([logger], [{"batch_size": 1}] * 40).train()
    finally:
        stop.set()
        collector.join()
        sys.setswitchinterval(interval)
    assert errors == []
    assert fed["episodes"] > 50
    assert wrapper.inf_step == fed["steps"] and wrapper.completed_episodes == fed["episodes"]
    assert wrapper.windowed_scalar_cumulative["episode/reward"] == fed["return"]
