"""HitTheMiddle: registered, well-formed, and separating random play from control at -5."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from emote_core.env import HIT_THE_MIDDLE_ID, DictGymWrapper, HitTheMiddle, make_vector_env
from emote_core.env.hit_the_middle import middle_controller, register
from emote_core.errors import ConfigurationError
from emote_core.typing import DictResponse, EpisodeState


def mean_return(policy, episodes: int = 300) -> float:
    env = gym.make(HIT_THE_MIDDLE_ID)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def test_random_play_scores_clearly_below_minus_five_and_the_controller_above() -> None:
    rng = np.random.default_rng(0)
    random_return = mean_return(lambda obs: rng.uniform(-1, 1, size=1).astype(np.float32))
    idle_return = mean_return(lambda obs: np.zeros(1, np.float32))
    controlled_return = mean_return(middle_controller)
    assert random_return < -15
    assert idle_return < -12
    assert controlled_return > -2


def test_episodes_are_thirty_steps_truncated_and_interrupted() -> None:
    wrapper = DictGymWrapper(make_vector_env(HIT_THE_MIDDLE_ID, num_envs=2))
    observations = wrapper.reset(seed=0)
    for step in range(1, 31):
        responses = {
            agent: DictResponse(list_data={"actions": np.array([0.5], np.float32)})
            for agent in observations
        }
        observations = wrapper.step(responses)
        finals = [o for o in observations.values() if o.episode_state.is_final]
        assert len(finals) == (2 if step == 30 else 0)
    assert {o.episode_state for o in finals} == {EpisodeState.INTERRUPTED}
    assert [length for _, length in wrapper.drain_completed_episodes()] == [30, 30]


def test_passes_gymnasiums_env_checker_and_stays_in_its_space() -> None:
    env = HitTheMiddle()
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    for _ in range(30):
        obs, reward, terminated, truncated, _ = env.step(np.array([1.0], np.float32))
        assert env.observation_space.contains(obs)
        assert reward == pytest.approx(-abs(float(obs[0])))
        assert not terminated
    assert truncated
    assert obs[0] == 1.0 and obs[1] == 0.0  # pushed into the wall, which stops it


def test_registration_is_idempotent_and_kwargs_reach_the_env() -> None:
    register()
    register()
    env = gym.make(HIT_THE_MIDDLE_ID, episode_length=5)
    env.reset(seed=0)
    steps = 0
    truncated = False
    while not truncated:
        *_, truncated, _ = env.step(np.zeros(1, np.float32))
        steps += 1
    assert steps == 5


def test_bad_parameters_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="episode_length"):
        HitTheMiddle(episode_length=0)
    with pytest.raises(ConfigurationError, match="dt"):
        HitTheMiddle(dt=-0.1)
