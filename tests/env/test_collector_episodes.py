"""GymCollector handing whole episodes to the memory stores what it stores step by step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from emote_core.env import DictGymWrapper, GymCollector, ThreadedGymCollector, make_vector_env
from emote_core.errors import ConfigurationError, EpisodeCollationError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.logging_wrapper import LoggingProxyWrapper
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.memory.wrappers import MemoryProxyWrapper, MemoryTableProxyWrapper
from emote_core.proxies import FeatureAgentProxy, RandomAgentProxy
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState
from tests.env.test_batch_collector import StepByStep, assert_same_episodes


class StepsOnly(MemoryProxyWrapper):
    """A wrapper whose add does work of its own (it counts steps): it must see every step."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.steps = 0

    def add(self, observations: Any, responses: Any) -> None:
        self.steps += len(responses)
        super().add(observations, responses)


class PerAgentOnly:
    """An agent proxy without act_batch that records what it was asked."""

    def __init__(self, inner: RandomAgentProxy) -> None:
        self.inner = inner
        self.seen: list[tuple[AgentId, EpisodeState, Any]] = []

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        for agent, observation in observations.items():
            reward = observation.rewards.get("reward")
            self.seen.append((agent, EpisodeState(observation.episode_state), reward))
        return self.inner(observations)


class Tanh(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(obs[:, :1] - obs[:, 1:2])


def run(
    env_id: str,
    num_envs: int,
    calls: tuple[int, ...],
    *,
    whole: bool,
    policy: bool = False,
    use_terminal: bool = False,
    threshold: int | None = None,
) -> tuple[list[tuple], GymCollector]:
    env = DictGymWrapper(make_vector_env(env_id, num_envs=num_envs))
    table = DictObsMemoryTable(spaces=env.spaces, maxlen=100_000, use_terminal=use_terminal)
    proxy = MemoryTableProxy(table, minimum_length_threshold=threshold, use_terminal=use_terminal)
    episodes: list[tuple] = []
    proxy.episode_listeners.append(lambda *episode: episodes.append(episode))
    agent: Any = RandomAgentProxy(action_space=env.single_action_space, seed=5)
    if policy:
        agent = FeatureAgentProxy(policy=Tanh(), device="cpu", spaces=env.spaces)
    warmup = RandomAgentProxy(action_space=env.single_action_space, seed=9)
    memory = proxy if whole else StepByStep(proxy)
    collector = GymCollector(env=env, agent=agent, memory=memory, seed=3, warmup_agent=warmup)
    assert collector.records_episodes is whole
    for index, count in enumerate(calls):
        collector.collect(count, agent=warmup if index == 0 else None)
    env.close()
    return episodes, collector


@pytest.mark.parametrize(
    ("env_id", "num_envs", "calls", "options"),
    [
        ("CartPole-v1", 4, (30, 1, 1, 57), {}),
        ("CartPole-v1", 1, (100, 80), {"use_terminal": True, "threshold": 12}),
        ("emote/HitTheMiddle-v0", 3, (7, 1, 90), {"policy": True}),
        ("Pendulum-v1", 2, (150, 1, 1, 300), {"use_terminal": True}),
    ],
)
def test_whole_episodes_equal_steps_one_by_one(
    env_id: str, num_envs: int, calls: tuple[int, ...], options: dict[str, Any]
) -> None:
    expected, by_step = run(env_id, num_envs, calls, whole=False, **options)
    got, whole = run(env_id, num_envs, calls, whole=True, **options)
    assert_same_episodes(got, expected)
    # Every episode finished by a call is in the memory when the call returns, as step by step.
    assert whole.memory.completed_episodes == by_step.memory.completed_episodes
    assert whole.memory.dropped_episodes == by_step.memory.dropped_episodes
    assert whole.completed_episodes == by_step.completed_episodes
    assert whole.env_steps == by_step.env_steps == sum(calls) * num_envs
    for key in ("episode/reward", "episode/length"):
        assert list(whole.windowed_scalar[key]) == list(by_step.windowed_scalar[key]), key
    assert whole.scalar_logs == by_step.scalar_logs


def test_an_agent_without_act_batch_is_asked_per_agent_as_a_wrapper_would_ask_it() -> None:
    def play(whole: bool) -> tuple[list[tuple], PerAgentOnly, GymCollector]:
        env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=3))
        proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=10_000))
        episodes: list[tuple] = []
        proxy.episode_listeners.append(lambda *episode: episodes.append(episode))
        batched = RandomAgentProxy(action_space=env.single_action_space, seed=1)
        agent = PerAgentOnly(RandomAgentProxy(action_space=env.single_action_space, seed=2))
        memory = proxy if whole else StepByStep(proxy)
        collector = GymCollector(env=env, agent=batched, memory=memory, seed=4)
        collector.collect(20)  # batched, then the per-agent agent takes over mid-episode
        collector.collect(60, agent=agent)
        env.close()
        return episodes, agent, collector

    expected, asked_by_step, _ = play(whole=False)
    got, asked_whole, collector = play(whole=True)
    assert collector.records_episodes
    assert_same_episodes(got, expected)
    # The same states and rewards; a new episode is a new agent id in both.
    assert [s for _, s, _ in asked_whole.seen] == [s for _, s, _ in asked_by_step.seen]
    assert [r for _, _, r in asked_whole.seen] == [r for _, _, r in asked_by_step.seen]
    initial = [a for a, s, _ in asked_whole.seen if s == EpisodeState.INITIAL]
    assert len(initial) == len(set(initial)) >= 3


def test_an_agent_without_act_batch_from_the_start_hands_over_whole_episodes() -> None:
    def play(whole: bool) -> tuple[list[tuple], PerAgentOnly, GymCollector]:
        env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=3))
        proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=10_000))
        episodes: list[tuple] = []
        proxy.episode_listeners.append(lambda *episode: episodes.append(episode))
        agent = PerAgentOnly(RandomAgentProxy(action_space=env.single_action_space, seed=2))
        memory = proxy if whole else StepByStep(proxy)
        collector = GymCollector(env=env, agent=agent, memory=memory, seed=4)
        collector.collect(70)
        env.close()
        return episodes, agent, collector

    expected, asked_by_step, by_step = play(whole=False)
    got, asked_whole, collector = play(whole=True)
    assert collector.records_episodes and not by_step.records_episodes
    assert_same_episodes(got, expected)
    assert asked_whole.seen == asked_by_step.seen  # the same ids, states and rewards
    assert collector.scalar_logs == by_step.scalar_logs


class WithLogProbs(RandomAgentProxy):
    """An agent whose responses hold more than the actions."""

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("actions", "log_probs")


def test_episodes_are_handed_over_only_where_every_part_takes_them() -> None:
    env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=1_000))
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)

    def records(memory: Any, acting: Any = agent, warmup: Any = None) -> bool:
        collector = GymCollector(env=env, agent=acting, memory=memory, warmup_agent=warmup)
        return collector.records_episodes

    assert records(proxy)
    assert records(MemoryTableProxyWrapper(MemoryTableProxyWrapper(proxy)))
    assert not records(StepsOnly(proxy))
    assert not records(MemoryTableProxyWrapper(StepsOnly(proxy)))
    assert not records(LoggingProxyWrapper(proxy, writer=None))
    assert records(proxy, acting=PerAgentOnly(agent))  # asked per agent, episodes whole
    assert records(proxy, warmup=PerAgentOnly(agent))
    assert not records(proxy, acting=WithLogProbs(action_space=env.single_action_space))
    with pytest.raises(TypeError, match="takes steps only"):
        StepsOnly(proxy).add_episode({"rewards": np.zeros(1, np.float32)}, EpisodeState.TERMINAL)
    env.close()


def test_an_agent_answering_more_than_actions_is_refused_mid_run_with_whole_episodes() -> None:
    env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=1_000))
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)
    collector = GymCollector(env=env, agent=agent, memory=proxy, seed=0)
    collector.collect(3)
    with pytest.raises(ConfigurationError, match=r"answering \('actions', 'log_probs'\)"):
        collector.collect(1, agent=WithLogProbs(action_space=env.single_action_space))
    assert collector.env_steps == 6
    collector.collect(1)  # the collector goes on with its own agent
    assert collector.env_steps == 8
    env.close()


def test_add_episode_refuses_what_is_not_a_finished_episode() -> None:
    env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=1))
    proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=1_000))
    sequence = {
        "obs": np.zeros((3, 4), np.float32),
        "actions": np.zeros((2, 1), np.int64),
        "rewards": np.ones(2, np.float32),
    }
    for bad, state in [
        ({**sequence, "rewards": np.ones(0, np.float32)}, EpisodeState.TERMINAL),
        ({k: v for k, v in sequence.items() if k != "rewards"}, EpisodeState.TERMINAL),
        (sequence, EpisodeState.RUNNING),
    ]:
        with pytest.raises(EpisodeCollationError, match="whole episode needs"):
            proxy.add_episode(bad, state)
    proxy.add_episode(sequence, EpisodeState.INTERRUPTED)
    assert proxy.completed_episodes == 1 and proxy.size() == 2
    env.close()


def test_threaded_collector_hands_over_whole_episodes() -> None:
    env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=10_000))
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)
    collector = ThreadedGymCollector(env=env, agent=agent, memory=proxy, warmup_steps=400, seed=0)
    assert collector.records_episodes
    collector.begin_training()
    collector.end_training()
    assert collector.env_steps >= 400
    assert proxy.completed_episodes >= 10
    collector._log_finished()
    lengths = list(collector.windowed_scalar["episode/length"])
    stored = sorted(len(data["rewards"]) for _, data, _ in proxy.table.episodes())
    assert sorted(lengths) == stored
    env.close()
