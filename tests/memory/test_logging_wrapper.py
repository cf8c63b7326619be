"""LoggingProxyWrapper called as upstream emote calls it: (inner, writer, log_interval), writing
its own TensorBoard events, with upstream's report() and "histogram:" keys."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from torch.utils.tensorboard import SummaryWriter

from emote_core.errors import ConfigurationError
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.logging_wrapper import LoggingProxyWrapper
from emote_core.memory.mappers import NextElementMapper
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import DictObservation, DictResponse, EpisodeState, MetaData


def table_proxy() -> MemoryTableProxy:
    table = ArrayMemoryTable(
        columns=[
            Column("obs", (2,), np.float32),
            VirtualColumn("next_obs", (2,), np.float32, "obs", NextElementMapper()),
            Column("actions", (1,), np.float32),
            Column("rewards", (1,), np.float32),
        ],
        maxlen=1000, sampler=UniformSampleStrategy(), ejector=FifoEjectionStrategy(),
        length_key="rewards",
    )  # fmt: skip
    return MemoryTableProxy(table)


def step(proxy, state, reward=None, metadata=None) -> None:
    rewards = {} if reward is None else {"reward": reward}
    observation = DictObservation(
        episode_state=state,
        array_data={"obs": np.zeros(2, np.float32)},
        rewards=rewards,
        metadata=metadata,
    )
    responses = {} if state in (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED) else {
        0: DictResponse({"actions": np.zeros(1, np.float32)})
    }  # fmt: skip
    proxy.add({0: observation}, responses)


def read_events(directory):
    events = ea.EventAccumulator(str(directory), size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    events.Reload()
    return events


def test_upstreams_call_writes_tensorboard_events_every_log_interval_adds(tmp_path) -> None:
    writer = SummaryWriter(log_dir=str(tmp_path))
    wrapper = LoggingProxyWrapper(table_proxy(), writer, 4)  # upstream's positional call
    forces = MetaData(info={"histogram:speed": 3.0}, info_lists={"histogram:forces": [1.0, 5.0]})
    for rewards in ([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]):  # two episodes: 4 adds each
        step(wrapper, EpisodeState.INITIAL, metadata=forces)
        for reward in rewards[:-1]:
            step(wrapper, EpisodeState.RUNNING, reward)
        step(wrapper, EpisodeState.TERMINAL, rewards[-1])
    writer.close()

    events = read_events(tmp_path)
    inf_steps = [e.value for e in events.Scalars("training/inf_step")]
    assert inf_steps == [3.0, 6.0]  # written at adds 4 and 8, each at its agent step
    assert [e.step for e in events.Scalars("episode/reward")] == [3, 6]
    assert events.Scalars("episode/reward")[-1].value == 9.0  # mean of returns 6 and 12
    assert events.Scalars("episode/reward/cumulative")[-1].value == 18.0
    assert [e.value for e in events.Scalars("episode/completed")] == [1.0, 2.0]
    by_episodes = events.Scalars("env_vs_episode/reward")
    assert [(e.step, e.value) for e in by_episodes] == [(1, 6.0), (2, 9.0)]
    histograms = events.Tags()["histograms"]
    for tag in (
        "forces",
        "speed",
        "episode/reward_distribution",
        "env_vs_episode/reward_distribution",
    ):
        assert tag in histograms
    forces_written = events.Histograms("forces")[-1].histogram_value
    assert forces_written.num == 4 and forces_written.max == 5.0  # two observations' lists


def test_report_routes_metrics_as_upstream_and_get_report_answers_in_its_spelling() -> None:
    wrapper = LoggingProxyWrapper(table_proxy(), cycle_in_steps=10**6)
    wrapper.report({"goal/distance": 2.0, "histogram:speed": 4.0}, {"histogram:forces": [1.0, 3.0]})
    wrapper.report({"goal/distance": 4.0}, {"hits": [1.0, 0.0]})
    values, lists = wrapper.get_report(["goal/distance", "histogram:forces", "hits", "speed"])
    assert values["goal/distance"] == 3.0 and values["goal/distance/cumulative"] == 6.0
    assert lists["goal/distance"] == [2.0, 4.0]
    assert values["histogram:forces"] == 2.0  # the mean of the histogram's values
    assert values["hits"] == 0.5  # an un-prefixed list is averaged too, as upstream does
    assert lists["speed"] == [4.0] and "speed" not in wrapper.windowed_scalar


def test_reported_histograms_are_in_hist_logs_at_once_and_none_rewards_give_nan_returns() -> None:
    wrapper = LoggingProxyWrapper(table_proxy(), cycle_in_steps=10**6)
    wrapper.report({"histogram:speed": 4.0}, {"histogram:forces": [1.0, 3.0]})
    wrapper.report({"histogram:speed": 5.0}, {})
    histograms = wrapper.hist_logs  # no refresh has run: the values are there when read
    assert histograms["speed"].tolist() == [4.0, 5.0] and histograms["forces"].tolist() == [1, 3]
    histograms.clear()  # a logger that wrote them consumes them
    assert wrapper.hist_logs == {}
    step(wrapper, EpisodeState.INITIAL)
    final = DictObservation(
        episode_state=EpisodeState.TERMINAL, array_data={"obs": np.zeros(2, np.float32)},
        rewards={"reward": None},
    )  # fmt: skip
    with pytest.warns(UserWarning, match="NaN reward"):
        wrapper.add({0: final}, {})
    assert wrapper.completed_episodes == 1
    assert np.isnan(wrapper.windowed_scalar["episode/reward"][-1])


def test_writer_and_log_interval_come_together(tmp_path) -> None:
    writer = SummaryWriter(log_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match="pass both or neither"):
        LoggingProxyWrapper(table_proxy(), writer)
    with pytest.raises(ConfigurationError, match="log_interval must be a positive integer"):
        LoggingProxyWrapper(table_proxy(), writer, 0)
    with pytest.raises(ConfigurationError, match="needs a writer"):
        LoggingProxyWrapper(table_proxy()).write_logs()
    writer.close()
