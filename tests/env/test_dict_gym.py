"""DictGymWrapper against plain single-environment rollouts with the same seeds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import TransformObservation

from emote_core.env import DictGymWrapper, make_vector_env
from emote_core.errors import ConfigurationError
from emote_core.spaces import BoxSpace, DiscreteSpace
from emote_core.typing import DictResponse, EpisodeState


@dataclass
class Episode:
    observations: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    end: EpisodeState | None = None


def cartpole_action(obs: np.ndarray) -> np.ndarray:
    """A weak but deterministic controller: episodes of varying length, most TERMINAL."""
    return np.array([int(obs[2] > 0)], dtype=np.int64)


def pendulum_action(obs: np.ndarray) -> np.ndarray:
    """Deterministic actions in [-1, 1] (the wrapper's rescaled range)."""
    return np.array([np.clip(-0.7 * obs[2] + 0.3 * obs[0], -1.0, 1.0)], dtype=np.float32)


def run_wrapper(
    wrapper: DictGymWrapper,
    policy: Callable[[np.ndarray], np.ndarray],
    *,
    seed: int,
    vector_steps: int,
    key: str = "obs",
) -> tuple[dict[int, list[Episode]], list[dict]]:
    """Episodes per slot (finished ones only) and every step's raw observation dict."""
    observations = wrapper.reset(seed=seed)
    slot_of = {agent: slot for slot, agent in enumerate(wrapper.agents)}
    open_episodes: dict[int, Episode] = {}
    finished: dict[int, list[Episode]] = defaultdict(list)
    steps = [observations]
    for _ in range(vector_steps):
        responses = {}
        for agent, observation in observations.items():
            state = observation.episode_state
            episode = open_episodes.get(agent)
            if state == EpisodeState.INITIAL:
                assert episode is None
                episode = open_episodes[agent] = Episode()
            else:
                episode.rewards.append(observation.rewards["reward"])
            episode.observations.append(observation.array_data[key])
            if state.is_final:
                episode.end = state
                finished[slot_of[agent]].append(open_episodes.pop(agent))
                continue
            action = policy(observation.array_data[key])
            episode.actions.append(action)
            responses[agent] = DictResponse(list_data={"actions": action})
        observations = wrapper.step(responses)
        for slot, agent in enumerate(wrapper.agents):
            slot_of.setdefault(agent, slot)
        steps.append(observations)
    return finished, steps


def run_single(
    env: gym.Env, policy: Callable[[np.ndarray], np.ndarray], *, seed: int, episodes: int, scale
) -> list[Episode]:
    result = []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        episode = Episode(observations=[obs])
        while True:
            action = policy(obs)
            episode.actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(scale(action))
            episode.rewards.append(float(reward))
            episode.observations.append(obs)
            if terminated or truncated:
                episode.end = EpisodeState.from_gymnasium(
                    terminated=terminated, truncated=truncated
                )
                break
        result.append(episode)
        obs, _ = env.reset()
    return result


def assert_same_episodes(wrapped: list[Episode], single: list[Episode]) -> None:
    assert len(wrapped) == len(single)
    for got, want in zip(wrapped, single, strict=True):
        assert got.end == want.end
        assert len(got.rewards) == len(want.rewards)
        assert sum(got.rewards) == pytest.approx(sum(want.rewards), rel=1e-9)
        np.testing.assert_array_equal(np.stack(got.observations), np.stack(want.observations))
        np.testing.assert_array_equal(got.observations[-1], want.observations[-1])
        np.testing.assert_array_equal(np.stack(got.actions), np.stack(want.actions))


def test_cartpole_matches_single_env_rollouts_with_the_same_seeds() -> None:
    wrapper = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=4))
    finished, _ = run_wrapper(wrapper, cartpole_action, seed=11, vector_steps=300)
    single_env = gym.make("CartPole-v1")
    total = 0
    for slot in range(4):
        assert len(finished[slot]) >= 3, "each slot should finish several episodes"
        single = run_single(
            single_env,
            cartpole_action,
            seed=11 + slot,
            episodes=len(finished[slot]),
            scale=lambda a: int(a[0]),
        )
        assert_same_episodes(finished[slot], single)
        total += len(single)
    assert {e.end for slot in finished.values() for e in slot} == {EpisodeState.TERMINAL}
    completed = wrapper.drain_completed_episodes()
    assert len(completed) == total
    assert wrapper.drain_completed_episodes() == []
    lengths = sorted(length for _, length in completed)
    assert lengths == sorted(len(e.rewards) for s in finished.values() for e in s)
    assert all(ret == length for ret, length in completed)  # CartPole pays 1 per step


def test_pendulum_time_limit_is_interrupted_with_the_true_final_observation() -> None:
    wrapper = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=3))
    finished, steps = run_wrapper(wrapper, pendulum_action, seed=3, vector_steps=401)
    single_env = gym.make("Pendulum-v1")
    for slot in range(3):
        assert len(finished[slot]) == 2
        assert all(
            e.end == EpisodeState.INTERRUPTED and len(e.rewards) == 200 for e in finished[slot]
        )
        single = run_single(
            single_env, pendulum_action, seed=3 + slot, episodes=2, scale=lambda a: 2.0 * a
        )
        assert_same_episodes(finished[slot], single)
    # At step 200 each slot reports its final observation and the next INITIAL together.
    boundary = steps[200]
    states = sorted(o.episode_state for o in boundary.values())
    assert states == [EpisodeState.INTERRUPTED] * 3 + [EpisodeState.INITIAL] * 3
    finals = [o for o in boundary.values() if o.episode_state.is_final]
    initials = [o for o in boundary.values() if o.episode_state == EpisodeState.INITIAL]
    assert all(o.rewards == {} for o in initials)
    for final, initial in zip(finals, initials, strict=True):
        assert not np.array_equal(final.array_data["obs"], initial.array_data["obs"])


def test_agent_ids_are_fresh_per_episode_and_monotonic() -> None:
    wrapper = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    observations = wrapper.reset(seed=0)
    assert list(observations) == [0, 1]
    seen = set(observations)
    for _ in range(100):
        responses = {
            agent: DictResponse(list_data={"actions": np.array([1])})
            for agent, o in observations.items()
            if not o.episode_state.is_final
        }
        observations = wrapper.step(responses)
        for agent, observation in observations.items():
            if observation.episode_state == EpisodeState.INITIAL:
                assert agent not in seen and agent > max(seen)
            else:
                assert agent in seen
            seen.add(agent)
    assert len(seen) > 2  # always pushing right ends episodes quickly
    again = wrapper.reset(seed=0)
    assert min(again) > max(seen)


def test_async_vector_env_gives_the_same_episodes_as_sync() -> None:
    sync = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    asynchronous = DictGymWrapper(
        make_vector_env("CartPole-v1", num_envs=2, vectorization_mode="async")
    )
    try:
        want, _ = run_wrapper(sync, cartpole_action, seed=5, vector_steps=120)
        got, _ = run_wrapper(asynchronous, cartpole_action, seed=5, vector_steps=120)
    finally:
        asynchronous.close()
    for slot in range(2):
        assert_same_episodes(got[slot], want[slot])


def test_spaces_describe_one_agent_with_rescaled_box_actions() -> None:
    cartpole = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2), observation_key="state")
    assert cartpole.num_envs == 2
    assert cartpole.spaces.actions == DiscreteSpace(n=2)
    assert cartpole.spaces.state.keys() == ["state"]
    assert cartpole.spaces.state["state"].shape == (4,)
    pendulum = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=2))
    assert pendulum.spaces.actions == BoxSpace(np.float32, (1,), low=-1.0, high=1.0)
    assert pendulum.single_action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    raw = DictGymWrapper(make_vector_env("Pendulum-v1", num_envs=2), rescale_actions=False)
    assert raw.spaces.actions == BoxSpace(np.float32, (1,), low=-2.0, high=2.0)


def test_rescaled_actions_reach_the_env_bounds_and_are_clipped() -> None:
    seen = []

    class Record(gym.ActionWrapper):
        def action(self, action):
            seen.append(np.array(action))
            return action

    env = make_vector_env("Pendulum-v1", num_envs=2, wrappers=[Record])
    wrapper = DictGymWrapper(env)
    observations = wrapper.reset(seed=0)
    a, b = list(observations)
    wrapper.step(
        {
            a: DictResponse(list_data={"actions": np.array([1.0], np.float32)}),
            b: DictResponse(list_data={"actions": np.array([-3.0], np.float32)}),
        }
    )
    np.testing.assert_allclose(np.concatenate(seen), [2.0, -2.0])


def test_dict_observations_keep_their_keys_including_the_final_one() -> None:
    def make() -> gym.Env:
        env = gym.make("CartPole-v1")
        space = gym.spaces.Dict(
            {
                "pose": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "speed": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            }
        )
        return TransformObservation(env, lambda o: {"pose": o[[0, 2]], "speed": o[[1, 3]]}, space)

    vector = gym.vector.SyncVectorEnv(
        [make, make], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    wrapper = DictGymWrapper(vector)
    assert sorted(wrapper.spaces.state.keys()) == ["pose", "speed"]
    observations = wrapper.reset(seed=1)
    finals = []
    for _ in range(60):
        responses = {
            agent: DictResponse(list_data={"actions": np.array([0])})
            for agent, o in observations.items()
            if not o.episode_state.is_final
        }
        observations = wrapper.step(responses)
        finals += [o for o in observations.values() if o.episode_state.is_final]
    assert finals
    for final in finals:
        assert sorted(final.array_data) == ["pose", "speed"]
        assert final.episode_state == EpisodeState.TERMINAL
        assert abs(final.array_data["pose"][1]) > 0.2  # the pole fell past CartPole's limit


def test_next_step_autoreset_is_rejected_with_the_fix() -> None:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(ConfigurationError, match=r"SAME_STEP.*make_vector_env"):
        DictGymWrapper(env)


def test_missing_or_malformed_responses_are_errors() -> None:
    wrapper = DictGymWrapper(make_vector_env("CartPole-v1", num_envs=2))
    with pytest.raises(ConfigurationError, match="before reset"):
        wrapper.step({})
    a, b = list(wrapper.reset(seed=0))
    with pytest.raises(ConfigurationError, match=f"no response for agent {b}"):
        wrapper.step({a: DictResponse(list_data={"actions": np.array([0])})})
    with pytest.raises(ConfigurationError, match="no 'actions'"):
        wrapper.step(
            {
                a: DictResponse(list_data={"actions": np.array([0])}),
                b: DictResponse(list_data={"action": np.array([0])}),
            }
        )


def test_unbounded_box_actions_cannot_be_rescaled() -> None:
    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {}

        def step(self, action):
            return np.zeros(1, np.float32), 0.0, False, False, {}

    vector = gym.vector.SyncVectorEnv(
        [Unbounded], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    with pytest.raises(ConfigurationError, match="rescale_actions=False"):
        DictGymWrapper(vector)
    assert DictGymWrapper(vector, rescale_actions=False).spaces.actions.low is None
