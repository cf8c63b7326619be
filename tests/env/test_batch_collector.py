"""BatchGymCollector stores exactly what GymCollector + MemoryTableProxy store, faster."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from emote_core.env import BatchGymCollector, DictGymWrapper, GymCollector, make_vector_env
from emote_core.env.batch_collector import CHUNK_BYTES, CHUNK_ROWS
from emote_core.errors import ConfigurationError
from emote_core.memory import DictObsMemoryTable, MemoryTableProxy
from emote_core.memory.wrappers import MemoryProxyWrapper
from emote_core.proxies import RandomAgentProxy
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.typing import EpisodeState


class StepByStep(MemoryProxyWrapper):
    """Passes every step on unchanged; with an ``add`` of its own it takes steps only, so a
    collector gives it every agent's step: the reference the whole-episode path must match."""

    def add(self, observations: Any, responses: Any) -> None:
        super().add(observations, responses)


def per_agent_episodes(env_id: str, num_envs: int, steps: int) -> list[tuple]:
    env = DictGymWrapper(make_vector_env(env_id, num_envs=num_envs))
    proxy = MemoryTableProxy(DictObsMemoryTable(spaces=env.spaces, maxlen=100_000))
    episodes: list[tuple] = []
    proxy.episode_listeners.append(lambda *episode: episodes.append(episode))
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=3)
    collector = GymCollector(env=env, agent=agent, memory=StepByStep(proxy), seed=11)
    assert not collector.records_episodes  # the reference: one agent's step at a time
    collector.collect(steps)
    env.close()
    return episodes


def batch_episodes(env_id: str, num_envs: int, steps: int, agent_kind: str) -> list[tuple]:
    env = DictGymWrapper(make_vector_env(env_id, num_envs=num_envs))
    episodes: list[tuple] = []
    random_agent = RandomAgentProxy(action_space=env.single_action_space, seed=3)
    agent: Any = random_agent
    if agent_kind == "per-agent":  # an agent proxy without act_batch

        class PerAgentOnly:
            def __call__(self, observations):
                return random_agent(observations)

        agent = PerAgentOnly()
    batches: list[EpisodeBatch] = []
    collector = BatchGymCollector(
        env=env, agent=agent, seed=11, chunk_steps=7, on_batch=batches.append,
        on_episode=lambda *episode: episodes.append(episode),
    )  # fmt: skip
    # Uneven calls: episodes and chunks straddle the calls' boundaries.
    for count in (1, 5, steps - 6):
        collector.collect(count)
    collector.cut()
    assert collector.completed_episodes == len(episodes)
    assert collector.env_steps == steps * num_envs
    env.close()
    # The batches hold the same episodes, each cut's in the order they were handed out.
    assert len(batches) >= 2 and all(len(batch) for batch in batches)
    assert_same_episodes([e for batch in batches for e in batch.episodes()], episodes)
    return episodes


def assert_same_episodes(got: list[tuple], expected: list[tuple]) -> None:
    """The same identities, end states and arrays (dtypes included), in the same order."""
    assert len(expected) >= 2
    assert [(i, s) for i, _, s in got] == [(i, s) for i, _, s in expected]
    for (_, sequence, _), (_, reference, _) in zip(got, expected, strict=True):
        assert sorted(sequence) == sorted(reference)
        for key, values in reference.items():
            assert sequence[key].dtype == values.dtype, key
            np.testing.assert_array_equal(sequence[key], values, err_msg=key)


@pytest.mark.parametrize(
    ("env_id", "num_envs", "steps"),
    [
        ("CartPole-v1", 1, 300),  # discrete actions, TERMINAL endings
        ("CartPole-v1", 4, 200),
        ("emote/HitTheMiddle-v0", 3, 100),  # box actions rescaled, INTERRUPTED endings
        ("Pendulum-v1", 2, 450),  # 200-step time limit, episodes span many chunks
        pytest.param("LunarLander-v3", 8, 4_000, marks=pytest.mark.slow, id="lunar-slow"),
    ],
)
@pytest.mark.parametrize("agent_kind", ["act_batch", "per-agent"])
def test_episodes_equal_the_per_agent_path(
    env_id: str, num_envs: int, steps: int, agent_kind: str
) -> None:
    expected = per_agent_episodes(env_id, num_envs, steps)
    got = batch_episodes(env_id, num_envs, steps, agent_kind)
    assert_same_episodes(got, expected)
    states = {state for _, _, state in got}
    assert states <= {EpisodeState.TERMINAL, EpisodeState.INTERRUPTED}


def test_collect_episodes_and_settings() -> None:
    env = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    seen: list[int] = []
    collector = BatchGymCollector(
        env=env, agent=RandomAgentProxy(action_space=env.single_action_space, seed=0), seed=0,
        on_episode=lambda identity, sequence, state: seen.append(len(sequence["rewards"])),
    )  # fmt: skip
    collector.collect_episodes(5)
    assert 5 <= collector.completed_episodes <= 6
    collector.cut()
    assert len(seen) == collector.completed_episodes and all(n >= 1 for n in seen)
    with pytest.raises(ConfigurationError, match="chunk_steps must be a positive integer"):
        BatchGymCollector(env=env, agent=None, on_episode=print, chunk_steps=0)
    with pytest.raises(ConfigurationError, match="needs on_episode or on_batch"):
        BatchGymCollector(env=env, agent=None)
    # By default a chunk holds CHUNK_ROWS rows, whatever the number of environments...
    assert collector.chunk_steps == CHUNK_ROWS // 2
    env.close()
    # ...or CHUNK_BYTES of observations, fewer where they are images.
    frames = DictGymWrapper(make_vector_env("emote/PixelPendulum-v0", num_envs=2))
    pixels = BatchGymCollector(env=frames, agent=None, on_episode=print)
    row = int(np.prod(frames.env.single_observation_space.shape))  # uint8
    assert pixels.chunk_steps == min(CHUNK_ROWS, CHUNK_BYTES // row) // 2 < CHUNK_ROWS // 2
    frames.close()


class _InterruptedConcatenate:
    """numpy, except that its ``calls``-th ``concatenate`` raises KeyboardInterrupt (Ctrl-C)."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def concatenate(self, *args: Any, **kwargs: Any) -> np.ndarray:
        self.calls -= 1
        if self.calls == 0:
            raise KeyboardInterrupt
        return np.concatenate(*args, **kwargs)


def recorder(env_id: str, num_envs: int, chunk_steps: int) -> tuple[Any, BatchGymCollector, list]:
    """A collector with per_agent_episodes' seeds, and the list its episodes go to."""
    env = DictGymWrapper(make_vector_env(env_id, num_envs=num_envs))
    episodes: list[tuple] = []
    collector = BatchGymCollector(
        env=env, agent=RandomAgentProxy(action_space=env.single_action_space, seed=3), seed=11,
        chunk_steps=chunk_steps, on_episode=lambda *episode: episodes.append(episode),
    )  # fmt: skip
    return env, collector, episodes


@pytest.mark.parametrize("interrupted_at", [1, 2, 3])
def test_an_interrupted_cut_leaves_every_episode_to_the_next(
    monkeypatch: pytest.MonkeyPatch, interrupted_at: int
) -> None:
    expected = per_agent_episodes("Pendulum-v1", 2, 450)
    env, collector, episodes = recorder("Pendulum-v1", 2, chunk_steps=130)
    collector.collect(300)  # two cuts: episodes carried over, one finished at step 200
    flaky = _InterruptedConcatenate(interrupted_at)
    with monkeypatch.context() as patched:
        patched.setattr("emote_core.env.batch_collector.np", flaky)
        with pytest.raises(KeyboardInterrupt):
            collector.cut()  # in the middle of building the chunk's columns
    collector.collect(150)
    collector.cut()
    env.close()
    assert_same_episodes(episodes, expected)


def test_a_step_torn_by_an_interrupt_is_left_out() -> None:
    expected = per_agent_episodes("CartPole-v1", 3, 120)
    env, collector, episodes = recorder("CartPole-v1", 3, chunk_steps=500)
    collector.collect(120)
    # Ctrl-C between a step's records: its observations kept, its actions and rewards not,
    # an episode ending in it noted
    seen, _, _ = collector._pending
    seen.append(seen[-1])
    collector._finals.append((120, 0, {"obs": seen[-1][0]}, EpisodeState.TERMINAL))
    collector.cut()
    env.close()
    assert_same_episodes(episodes, expected)
