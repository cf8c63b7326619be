"""The parts of observation normalisation that any family gets: statistics from what the memory
takes in (step by step or whole episodes, the same), the acting proxy, the batch callback."""

from __future__ import annotations

import numpy as np
import torch

from emote_core.algorithms.normalization import (
    InputNormalization,
    NormalizationStatistics,
    NormalizingAgentProxy,
)
from emote_core.env import DictGymWrapper, make_vector_env
from emote_core.memory import DictObsMemoryTable
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.nn.normalization import ObservationNormalizer, ReturnNormalizer
from emote_core.proxies import RandomAgentProxy
from emote_core.typing import DictObservation, EpisodeState


def play(memory, steps: int) -> list[list[DictObservation]]:
    """Random steps of two Pendulum envs given to ``memory`` one step at a time; returns each
    finished episode's observations."""
    env = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=2, max_episode_steps=7))
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=0)
    observations = env.reset(seed=3)
    episodes: dict[int, list[DictObservation]] = {}
    finished = []
    for _ in range(steps):
        responses = agent(observations)
        memory.add(observations, responses)
        for identity, observation in observations.items():
            episodes.setdefault(identity, []).append(observation)
        observations = env.step(responses)
        finals = {a: o for a, o in observations.items() if o.episode_state.is_final}
        if finals:
            memory.add(finals, {})
            for identity, observation in finals.items():
                finished.append([*episodes.pop(identity), observation])
                del observations[identity]
    env.close()
    return finished


def test_steps_and_whole_episodes_give_the_statistics_of_every_observation_once() -> None:
    spaces = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=1)).spaces
    by_step = ObservationNormalizer(spaces)
    returns_by_step = ReturnNormalizer(0.9)
    table = DictObsMemoryTable(spaces=spaces, maxlen=10_000, seed=0)
    memory = NormalizationStatistics(
        MemoryTableProxy(table), observations=by_step, returns=returns_by_step
    )
    finished = play(memory, 30)
    rows = np.stack([o.array_data["obs"] for e in finished for o in e]).astype(np.float64)
    # Open episodes' observations count too when they come step by step: compare what the
    # table holds with the whole-episode path.
    by_episode = ObservationNormalizer(spaces)
    returns_by_episode = ReturnNormalizer(0.9)
    recorder = NormalizationStatistics(None, observations=by_episode, returns=returns_by_episode)
    for _, sequence, _ in table.episodes():
        recorder.record_episode(sequence)
    stored = np.concatenate([s["obs"] for _, s, _ in table.episodes()]).astype(np.float64)
    assert len(stored) == len(rows) and table.episode_count == len(finished)
    assert float(by_episode.statistics[0].count) == len(rows)
    np.testing.assert_allclose(by_episode.statistics[0].mean, rows.mean(0), rtol=1e-5)
    np.testing.assert_allclose(by_episode.statistics[0].var, rows.var(0), rtol=1e-4)
    # The step path also took in the open episodes' observations (2 envs, 30 steps).
    assert float(by_step.statistics[0].count) == 60 + len(finished)
    rewards = [np.array([o.rewards["reward"] for o in e[1:]]) for e in finished]
    expected = np.concatenate([returns_by_episode.discounted_returns(r) for r in rewards])
    assert float(returns_by_episode.statistics.count) == len(expected)
    np.testing.assert_allclose(returns_by_episode.statistics.var, [expected.var()], rtol=1e-4)
    # Every reward of open episodes too, but the last step's: it comes with the observations
    # the loop never hands over.
    assert float(returns_by_step.statistics.count) == 60 - 2


def test_the_acting_proxy_normalises_without_updating_and_keeps_the_inner_proxys_api() -> None:
    spaces = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=1)).spaces
    normalizer = ObservationNormalizer(spaces, clip=1.0)
    normalizer.update({"obs": np.array([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])})

    class Recording:
        input_names = ("obs",)
        output_names = ("actions",)
        policy = "the policy"

        def __init__(self) -> None:
            self.seen: list[np.ndarray] = []

        def act_batch(self, observations):
            self.seen.append(observations["obs"])
            return np.zeros((len(observations["obs"]), 1), np.float32)

        def __call__(self, observations):
            self.seen.append(np.stack([o.array_data["obs"] for o in observations.values()]))
            return {}

    inner = Recording()
    proxy = NormalizingAgentProxy(inner, normalizer)
    before = {k: v.clone() for k, v in normalizer.state_dict().items()}
    proxy.act_batch({"obs": np.array([[1.0, 3.0, -5.0]], np.float32)})
    row = np.array([2.0, 1.0, 0.0], np.float32)
    proxy({7: DictObservation(episode_state=EpisodeState.INITIAL, array_data={"obs": row})})
    np.testing.assert_allclose(inner.seen[0], [[0.0, 1.0, -1.0]], atol=1e-6)
    np.testing.assert_allclose(inner.seen[1], [[1.0, 0.0, -1.0]], atol=1e-6)
    assert all(torch.equal(before[k], v) for k, v in normalizer.state_dict().items())
    assert proxy.input_names == ("obs",) and proxy.policy == "the policy"
    proxy.policy = "swapped"  # the threaded collector swaps the inner proxy's policy
    assert inner.policy == "swapped"


def test_the_batch_callback_normalises_observations_and_scales_rewards() -> None:
    spaces = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=1)).spaces
    observations = ObservationNormalizer(spaces)
    observations.update({"obs": np.array([[1.0, 1.0, 100.0], [3.0, 3.0, 300.0]])})
    returns = ReturnNormalizer(0.0)
    returns.update(np.array([-2.0, 2.0]))
    callback = InputNormalization(observations=observations, returns=returns)
    result = callback.begin_batch(
        observation={"obs": torch.tensor([[3.0, 1.0, 200.0]])},
        next_observation={"obs": torch.tensor([[1.0, 3.0, 300.0]])},
        rewards=torch.tensor([[4.0]]),
    )["default"]
    np.testing.assert_allclose(result["observation"]["obs"], [[1.0, -1.0, 0.0]], atol=1e-5)
    np.testing.assert_allclose(result["next_observation"]["obs"], [[-1.0, 1.0, 1.0]], atol=1e-5)
    np.testing.assert_allclose(result["rewards"], [[2.0]], rtol=1e-5)
    restored = InputNormalization(
        observations=ObservationNormalizer(spaces), returns=ReturnNormalizer(0.0)
    )
    restored.load_state_dict(callback.state_dict())
    assert torch.equal(restored.returns.scale(torch.tensor([4.0])), torch.tensor([2.0]))
