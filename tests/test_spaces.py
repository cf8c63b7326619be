"""Spaces from gymnasium, and their JSON round trip."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces as gym_spaces
from hypothesis import given
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError
from emote_core.spaces import (
    BoxSpace,
    DictSpace,
    DiscreteSpace,
    MDPSpace,
    describe_bounds,
    describe_shape,
    describe_space,
    space_from_json,
)
from emote_core.typing import EpisodeState


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1", "MountainCarContinuous-v0"])
def test_real_environments_convert_and_round_trip_through_json(env_id: str) -> None:
    env = gym.make(env_id)
    space = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    assert space.state["obs"].shape == env.observation_space.shape
    assert space.state["obs"].dtype == env.observation_space.dtype
    restored = MDPSpace.from_json(json.loads(json.dumps(space.to_json())))
    assert restored == space
    observation, _ = env.reset(seed=0)
    assert restored.state["obs"].contains(observation)


def test_cartpole_keeps_partial_infinite_bounds() -> None:
    env = gym.make("CartPole-v1")
    space = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    document = json.dumps(space.to_json(), allow_nan=False)  # strict JSON: no Infinity
    restored = MDPSpace.from_json(json.loads(document))
    np.testing.assert_array_equal(restored.state["obs"].high, env.observation_space.high)
    assert restored.actions == DiscreteSpace(n=2)


def test_dict_observations_keep_their_keys() -> None:
    observation = gym_spaces.Dict(
        {
            "position": gym_spaces.Box(-1, 1, (3,), np.float32),
            "image": gym_spaces.Box(0, 255, (8, 8, 3), np.uint8),
        }
    )
    space = MDPSpace.from_gymnasium(observation, gym_spaces.Box(-1, 1, (2,), np.float32))
    assert sorted(space.state.keys()) == ["image", "position"]
    assert space.state["image"].dtype == np.uint8
    assert MDPSpace.from_json(space.to_json()) == space


def test_unsupported_spaces_are_named() -> None:
    with pytest.raises(ConfigurationError, match="'obs' is a MultiBinary"):
        MDPSpace.from_gymnasium(gym_spaces.MultiBinary(4), gym_spaces.Discrete(2))
    with pytest.raises(ConfigurationError, match="must start at 0"):
        MDPSpace.from_gymnasium(gym_spaces.Box(-1, 1, (2,)), gym_spaces.Discrete(3, start=1))


def test_newer_or_malformed_descriptions_are_refused() -> None:
    space = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (2,)),
        state=DictSpace({"obs": BoxSpace(np.float32, (4,))}),
    )
    document = space.to_json()
    document["version"] = 7
    with pytest.raises(ConfigurationError, match="version 7; this emote reads up to 1"):
        MDPSpace.from_json(document)
    with pytest.raises(ConfigurationError, match="malformed space description"):
        MDPSpace.from_json({"version": 1, "state": {"type": "dict"}})
    with pytest.raises(ConfigurationError, match="unknown space type 'tuple'"):
        space_from_json({"type": "tuple"})


def test_bounds_must_broadcast_to_the_shape() -> None:
    with pytest.raises(ConfigurationError, match="does not broadcast"):
        BoxSpace(np.float32, (3,), low=np.zeros(4))


@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    low=st.floats(-1e6, 0, allow_nan=False),
    span=st.floats(0, 1e6, allow_nan=False),
    dtype=st.sampled_from([np.float32, np.float64, np.int32, np.uint8]),
)
def test_box_json_round_trip_is_exact(shape, low, span, dtype) -> None:
    box = BoxSpace(dtype, tuple(shape), low=np.full(shape, low), high=np.full(shape, low + span))
    assert space_from_json(json.loads(json.dumps(box.to_json()))) == box


def test_gymnasium_flags_map_to_episode_states() -> None:
    assert EpisodeState.from_gymnasium(terminated=True, truncated=False) is EpisodeState.TERMINAL
    assert EpisodeState.from_gymnasium(terminated=False, truncated=True) is EpisodeState.INTERRUPTED
    assert EpisodeState.from_gymnasium(terminated=True, truncated=True) is EpisodeState.TERMINAL
    assert EpisodeState.from_gymnasium(terminated=False, truncated=False) is EpisodeState.RUNNING
    assert EpisodeState.TERMINAL.is_final and EpisodeState.INTERRUPTED.is_final
    assert not EpisodeState.INITIAL.is_final and not EpisodeState.RUNNING.is_final


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ((), "1 number"),
        ((1,), "1 number"),
        ((3,), "3 numbers"),
        ((4, 5), "4x5 grid of numbers"),
        ((84, 84, 3), "84x84 image with 3 channels"),
        ((1, 64, 48), "64x48 image with 1 channel"),
        ((2, 3, 4), "2x3x4 array of numbers"),
    ],
)
def test_shapes_read_as_words_in_messages(shape, words) -> None:
    assert describe_shape(shape) == words


def test_real_spaces_read_as_words_with_their_bounds() -> None:
    cartpole = gym.make("CartPole-v1")
    space = MDPSpace.from_gymnasium(cartpole.observation_space, cartpole.action_space)
    assert describe_space(space.actions) == "one of 2 choices"
    assert describe_bounds(space.actions) == "0 to 1"
    assert describe_space(space.state["obs"]) == "4 numbers"
    high = space.state["obs"].high
    assert describe_bounds(space.state["obs"]) == (
        f"{-high[0]:g} to {high[0]:g}, -inf to inf, {-high[2]:g} to {high[2]:g}, -inf to inf"
    )
    pendulum = gym.make("Pendulum-v1")
    actions = MDPSpace.from_gymnasium(pendulum.observation_space, pendulum.action_space).actions
    assert (describe_space(actions), describe_bounds(actions)) == ("1 number", "-2 to 2")
    assert describe_bounds(BoxSpace(np.float32, (2,))) == "unbounded"
    wide = BoxSpace(np.float32, (8,), low=-np.arange(8.0), high=np.arange(8.0))
    assert describe_bounds(wide) == "-7 to 7 (per entry)"


def test_a_pixel_env_s_frame_stack_reads_as_words() -> None:
    import emote_core.env  # noqa: F401 - registers emote's pixel environments

    env = gym.make("emote/PixelPendulum-v0", size=32, frame_stack=4)
    state = MDPSpace.from_gymnasium(env.observation_space, env.action_space).state
    assert describe_space(state["obs"]) == "32x32 image with 4 channels, 4 stacked frames"
    assert describe_bounds(state["obs"]) == "0 to 255"
