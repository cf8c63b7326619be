"""Frame wrappers: warp to 84x84 grayscale, stack lazily, scale to floats."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from emote_core.env.frames import FrameStack, LazyFrames, ScaledFloatFrame, WarpFrame
from emote_core.errors import ConfigurationError


class Pictures(gym.Env):
    """An RGB 'game': each step shows a frame filled with the step's colour."""

    def __init__(self, shape=(210, 160, 3)) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _frame(self) -> np.ndarray:
        frame = np.zeros(self.observation_space.shape, np.uint8)
        frame[...] = (self.t * 10) % 256
        frame[: frame.shape[0] // 2] = 0  # top half black, for checking the layout
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        return self._frame(), 0.0, False, self.t >= 10, {}


def test_warp_frame_makes_84x84_grayscale_uint8() -> None:
    env = WarpFrame(Pictures())
    assert env.observation_space.shape == (84, 84, 1)
    assert env.observation_space.dtype == np.uint8
    env.reset(seed=0)
    obs, *_ = env.step(0)
    obs, *_ = env.step(0)
    assert obs.shape == (84, 84, 1) and obs.dtype == np.uint8
    assert env.observation_space.contains(obs)
    assert np.all(obs[:40] == 0)  # the black top half stays black, and on top
    np.testing.assert_array_equal(obs[44:], 20)  # grey (20, 20, 20) has luma 20


def test_warp_frame_turns_colour_into_luma_and_can_keep_channels() -> None:
    env = Pictures()
    red = np.zeros((20, 20, 3), np.uint8)
    red[..., 0] = 200
    assert np.all(WarpFrame(env, width=10, height=10).observation(red) == round(0.299 * 200))
    kept = WarpFrame(env, width=8, height=6, grayscale=False)
    assert kept.observation_space.shape == (6, 8, 3)
    np.testing.assert_array_equal(kept.observation(red)[..., 0], 200)


def test_frame_stack_shares_frames_and_materialises_on_asarray() -> None:
    env = FrameStack(WarpFrame(Pictures()), 4)
    assert env.observation_space.shape == (84, 84, 4)
    first, _ = env.reset(seed=0)
    assert isinstance(first, LazyFrames)
    assert first.shape == (84, 84, 4) and len(first) == 4
    second, *_ = env.step(0)
    third, *_ = env.step(0)
    # The newest frame of one stack is the same memory in the next stack, not a copy.
    assert second.frame(-1) is third.frame(-2)
    assert np.shares_memory(second.frame(-1), third.frame(-2))
    array = np.asarray(third)
    assert array.shape == (84, 84, 4) and array.dtype == np.uint8
    assert env.observation_space.contains(array)
    np.testing.assert_array_equal(array[60, 0], [0, 0, 10, 20])  # oldest first
    assert np.asarray(third, dtype=np.float32).dtype == np.float32
    assert np.asarray(third) is array  # materialised once


def test_frame_stack_adds_a_channel_to_2d_frames() -> None:
    env = FrameStack(Pictures(shape=(12, 10)), 3)
    assert env.observation_space.shape == (12, 10, 3)
    obs, _ = env.reset(seed=0)
    assert np.asarray(obs).shape == (12, 10, 3)


def test_scaled_float_frame_maps_uint8_to_unit_floats_also_after_stacking() -> None:
    env = ScaledFloatFrame(FrameStack(WarpFrame(Pictures()), 2), centered=False)
    assert env.observation_space.dtype == np.float32
    assert env.observation_space.shape == (84, 84, 2)
    env.reset(seed=0)
    obs, *_ = env.step(0)
    assert obs.dtype == np.float32 and obs.shape == (84, 84, 2)
    np.testing.assert_allclose(obs[60, 0], [0.0, 10 / 255])
    assert env.observation_space.contains(obs)


def test_scaled_float_frame_defaults_to_upstreams_centred_range() -> None:
    env = ScaledFloatFrame(FrameStack(WarpFrame(Pictures()), 2))
    assert (env.observation_space.low == -1.0).all() and (env.observation_space.high == 1.0).all()
    env.reset(seed=0)
    obs, *_ = env.step(0)
    np.testing.assert_allclose(obs[60, 0], [-1.0, (10 / 255 - 0.5) * 2], rtol=1e-6)
    assert env.observation_space.contains(obs)


def test_wrappers_reject_what_they_cannot_handle() -> None:
    cartpole = gym.make("CartPole-v1")
    with pytest.raises(ConfigurationError, match="image observations"):
        WarpFrame(cartpole)
    with pytest.raises(ConfigurationError, match="uint8"):
        ScaledFloatFrame(cartpole)
    with pytest.raises(ConfigurationError, match="k must be"):
        FrameStack(Pictures(), 0)
