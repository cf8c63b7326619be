"""Pixel environments: Pendulum drawn as a small image, CarRacing in 84x84 RGB frames, stacked."""

from __future__ import annotations

import math
import tomllib

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from emote_core.assembly.builders import make_env
from emote_core.env import (
    PIXEL_CAR_RACING_ID,
    PIXEL_PENDULUM_ID,
    PixelPendulum,
    make_vision_box2d_env,
    render_pendulum,
)
from emote_core.errors import ConfigurationError
from emote_core.recipes.loading import recipe_from_dict
from emote_core.typing import DictResponse, EpisodeState


def rod_direction(image: np.ndarray) -> float:
    """The angle (Pendulum's convention: 0 up, counter-clockwise) of the image's bright mass."""
    size = image.shape[0]
    weights = image[..., 0].astype(np.float64)
    centres = np.arange(size) + 0.5 - size / 2
    x = float((weights * centres[None, :]).sum() / weights.sum())
    y_up = float((weights * -centres[:, None]).sum() / weights.sum())
    return math.atan2(-x, y_up)


def angle_gap(a: float, b: float) -> float:
    return abs((a - b + math.pi) % (2 * math.pi) - math.pi)


def test_registered_pixel_pendulum_gives_stacked_uint8_images() -> None:
    env = gym.make(PIXEL_PENDULUM_ID)
    space = env.observation_space
    assert space.shape == (48, 48, 3) and space.dtype == np.uint8
    assert np.all(space.low == 0) and np.all(space.high == 255)
    assert env.spec is not None and env.spec.max_episode_steps == 200
    observation = np.asarray(env.reset(seed=0)[0])
    assert observation.shape == (48, 48, 3) and observation.dtype == np.uint8
    assert space.contains(observation)
    assert observation.max() == 255 and observation.min() == 0  # a white rod on black
    observation = np.asarray(env.step(np.array([1.0], np.float32))[0])
    assert observation.dtype == np.uint8 and space.contains(observation)

    small = gym.make(PIXEL_PENDULUM_ID, size=32, frame_stack=4)
    assert small.observation_space.shape == (32, 32, 4)
    assert np.asarray(small.reset(seed=0)[0]).shape == (32, 32, 4)


@pytest.mark.filterwarnings("ignore:.*symmetric and normalized space")  # Pendulum's torque
def test_one_pixel_pendulum_frame_passes_gymnasiums_checker() -> None:
    check_env(PixelPendulum(size=24), skip_render_check=True)


@pytest.mark.parametrize("size", [16, 32, 48])
def test_the_rod_points_where_the_pendulum_does(size: int) -> None:
    half = size // 2
    up, left = render_pendulum(0.0, size=size), render_pendulum(math.pi / 2, size=size)
    down, right = render_pendulum(math.pi, size=size), render_pendulum(-math.pi / 2, size=size)
    for image in (up, left, down, right):
        assert image.shape == (size, size, 1) and image.dtype == np.uint8
    near, far = half - 2, half + 2  # the rod's round end at the pivot may reach 2 pixels over
    assert up[:half].sum() > 5 * up[half:].sum() and up[far:].sum() == 0
    assert down[half:].sum() > 5 * down[:half].sum() and down[:near].sum() == 0
    assert left[:, :half].sum() > 5 * left[:, half:].sum() and left[:, far:].sum() == 0
    assert right[:, half:].sum() > 5 * right[:, :half].sum() and right[:, :near].sum() == 0
    for angle in np.linspace(-math.pi, math.pi, 37):
        assert angle_gap(rod_direction(render_pendulum(angle, size=size)), angle) < 0.03


def test_the_image_depends_on_the_angle_only_and_always_the_same_way() -> None:
    first = render_pendulum(0.3, size=48)
    again = render_pendulum(0.3, size=48)
    assert np.array_equal(first, again) and first is not again
    assert not np.array_equal(first, render_pendulum(0.32, size=48))  # anti-aliasing shows 1 degree
    assert not np.array_equal(first, render_pendulum(-0.3, size=48))
    # A rod 0.4 * 48 long and 3 pixels wide with round ends covers about 64.7 pixels, however
    # it is turned.
    for angle in (0.0, 0.3, 1.0, 2.5):
        covered = render_pendulum(angle, size=48).sum() / 255
        assert abs(covered - (0.4 * 48 * 3 + math.pi * 1.5**2)) < 3


def test_pixel_pendulum_shows_its_state() -> None:
    env = PixelPendulum(size=32)
    image, _ = env.reset(seed=5)
    assert np.array_equal(image, render_pendulum(env.state[0], size=32))
    for _ in range(5):
        image, *_ = env.step(np.array([2.0], np.float32))
    assert np.array_equal(image, render_pendulum(env.state[0], size=32))


def test_reward_termination_and_time_limit_are_pendulums() -> None:
    pixels, pendulum = gym.make(PIXEL_PENDULUM_ID), gym.make("Pendulum-v1")
    pixels.reset(seed=11)
    vector, _ = pendulum.reset(seed=11)
    assert np.allclose(pixels.unwrapped.state[:2], pendulum.unwrapped.state)
    actions = np.random.default_rng(0).uniform(-3.0, 3.0, size=(200, 1)).astype(np.float32)
    for step, action in enumerate(actions, start=1):
        _, reward, terminated, truncated, _ = pixels.step(action)
        vector, expected, expected_terminated, expected_truncated, _ = pendulum.step(action)
        assert reward == expected
        assert (terminated, truncated) == (expected_terminated, expected_truncated)
        assert truncated == (step == 200)
    angle = math.atan2(float(vector[1]), float(vector[0]))
    assert angle_gap(pixels.unwrapped.state[0], angle) < 1e-5


def test_the_stack_starts_as_the_first_frame_and_shifts_one_frame_per_step() -> None:
    env = gym.make(PIXEL_PENDULUM_ID, size=32, frame_stack=3)
    stack = np.asarray(env.reset(seed=2)[0])
    first = render_pendulum(env.unwrapped.state[0], size=32)
    for channel in range(3):
        assert np.array_equal(stack[..., channel : channel + 1], first)
    for _ in range(4):
        previous = stack
        stack = np.asarray(env.step(np.array([2.0], np.float32))[0])
        assert np.array_equal(stack[..., :2], previous[..., 1:])
        assert np.array_equal(stack[..., 2:], render_pendulum(env.unwrapped.state[0], size=32))
        assert not np.array_equal(stack[..., 2], stack[..., 1])  # the rod moved


def play(seed: int, steps: int = 20) -> list[np.ndarray]:
    env = gym.make(PIXEL_PENDULUM_ID, size=32)
    observations = [np.asarray(env.reset(seed=seed)[0])]
    for _ in range(steps):
        observations.append(np.asarray(env.step(np.array([0.5], np.float32))[0]))
    return observations


def test_seeded_episodes_repeat_exactly() -> None:
    first, again, other = play(3), play(3), play(4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"size": 8}, "size must be an integer of at least 16; got 8"),
        ({"size": 48.0}, "size must be an integer of at least 16; got 48.0"),
        ({"size": True}, "size must be an integer of at least 16; got True"),
        ({"frame_stack": 0}, "frame_stack must be an integer of at least 1; got 0"),
        ({"frame_stack": "3"}, "frame_stack must be an integer of at least 1; got '3'"),
        ({"g": float("nan")}, "g must be a finite number; got nan"),
        ({"render_mode": "human"}, "got render_mode='human'"),
    ],
)
def test_bad_pixel_pendulum_arguments_are_one_line_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigurationError, match="PixelPendulum") as caught:
        gym.make(PIXEL_PENDULUM_ID, **kwargs)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_rgb_array_rendering_shows_the_current_frame() -> None:
    env = gym.make(PIXEL_PENDULUM_ID, size=24, render_mode="rgb_array")
    stack = np.asarray(env.reset(seed=0)[0])
    frame = env.render()
    assert frame.shape == (24, 24, 3) and frame.dtype == np.uint8
    assert all(np.array_equal(frame[..., c], stack[..., -1]) for c in range(3))
    plain = gym.make(PIXEL_PENDULUM_ID)
    plain.reset(seed=0)
    assert plain.render() is None


def test_a_recipe_runs_pixel_pendulum_in_a_vector_env_with_whole_final_stacks() -> None:
    recipe = recipe_from_dict(
        tomllib.loads(
            """
            [env]
            id = "emote/PixelPendulum-v0"
            num_envs = 2
            kwargs = { frame_stack = 3, size = 32 }
            max_episode_steps = 4
            """
        )
    )
    env = make_env(recipe)
    try:
        state = env.spaces.state["obs"]
        assert state.shape == (32, 32, 3) and state.dtype == np.uint8
        latest = {agent: o.array_data["obs"] for agent, o in env.reset(seed=0).items()}
        finals = 0
        for _ in range(9):
            responses = {
                agent: DictResponse(list_data={"actions": np.array([1.0], np.float32)})
                for agent in env.agents
            }
            for agent, observation in env.step(responses).items():
                stack = observation.array_data["obs"]
                assert stack.dtype == np.uint8 and stack.shape == (32, 32, 3)
                if observation.episode_state is EpisodeState.INITIAL:
                    assert all(np.array_equal(stack[..., c], stack[..., 0]) for c in (1, 2))
                else:
                    # Running or final, each stack is the one before it moved on by one frame.
                    assert np.array_equal(stack[..., :2], latest[agent][..., 1:])
                    assert not np.array_equal(stack[..., 2], stack[..., 1])
                    finals += observation.episode_state is EpisodeState.INTERRUPTED
                latest[agent] = stack
        assert finals == 4  # two slots, episodes of four steps, nine steps
        assert env.drain_completed_episodes()[0][1] == 4
    finally:
        env.close()


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (("NoSuchCar-v0", 0), "registered gymnasium id such as 'CarRacing-v3'; got 'NoSuchCar-v0'"),
        (("CarRacing-v3", -1), "rank must be an integer of at least 0; got -1"),
        (("CarRacing-v3", 0, -2), "seed must be an integer of at least 0; got -2"),
        (("CarRacing-v3", 0, 0, 0), "frame_stack must be an integer of at least 1; got 0"),
        (("CarRacing-v3", 0, 0, 3, "yes"), "use_float_scaling must be True or False; got 'yes'"),
    ],
)
def test_bad_vision_env_arguments_are_one_line_errors(arguments: tuple, words: str) -> None:
    with pytest.raises(ConfigurationError, match="make_vision_box2d_env") as caught:
        make_vision_box2d_env(*arguments)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_vision_env_refuses_environments_without_images_when_made() -> None:
    make = make_vision_box2d_env("Pendulum-v1", 0)
    with pytest.raises(ConfigurationError, match="needs image observations"):
        make()


@pytest.fixture
def box2d() -> None:
    pytest.importorskip("Box2D", reason="gymnasium[box2d] is not installed: no CarRacing")


@pytest.mark.usefixtures("box2d")
def test_car_racing_in_stacked_84x84_rgb_frames() -> None:
    env = make_vision_box2d_env("CarRacing-v3", 1, seed=0, frame_stack=2)()
    space = env.observation_space
    assert space.shape == (84, 84, 6) and space.dtype == np.uint8
    stack = np.asarray(env.reset()[0])
    assert stack.shape == (84, 84, 6) and stack.dtype == np.uint8
    assert np.array_equal(stack[..., :3], stack[..., 3:])
    for _ in range(3):
        stack, reward, terminated, truncated, _ = env.step(np.array([0.0, 1.0, 0.0], np.float32))
        stack = np.asarray(stack)
        assert stack.shape == (84, 84, 6) and space.contains(stack)
        assert math.isfinite(reward) and not terminated and not truncated
    green = stack[..., 1].astype(int) - stack[..., 0].astype(int)
    assert green.max() > 50  # grass: frames keep their colour
    env.close()


@pytest.mark.usefixtures("box2d")
def test_car_racing_is_seeded_by_seed_plus_rank_and_can_be_scaled() -> None:
    def first_stack(rank: int, seed: int) -> np.ndarray:
        env = make_vision_box2d_env("CarRacing-v3", rank, seed, 1, use_float_scaling=True)()
        try:
            env.reset()  # unseeded: the track after the one the factory's seeded reset drew
            return np.asarray(env.step(np.zeros(3, np.float32))[0])
        finally:
            env.close()

    stack = first_stack(1, 5)
    assert stack.shape == (84, 84, 3) and stack.dtype == np.float32
    assert stack.min() >= -1.0 and stack.max() <= 1.0
    assert np.array_equal(stack, first_stack(2, 4))  # the same seed + rank
    assert not np.array_equal(stack, first_stack(0, 5))


@pytest.mark.usefixtures("box2d")
def test_pixel_car_racing_is_registered_for_recipes() -> None:
    env = gym.make(PIXEL_CAR_RACING_ID, frame_stack=2, continuous=False)
    assert env.spec is not None and env.spec.max_episode_steps == 1000
    assert env.observation_space.shape == (84, 84, 6) and env.observation_space.dtype == np.uint8
    assert isinstance(env.action_space, gym.spaces.Discrete)
    assert np.asarray(env.reset(seed=0)[0]).shape == (84, 84, 6)
    stack = np.asarray(env.step(3)[0])
    assert stack.shape == (84, 84, 6) and stack.dtype == np.uint8
    env.close()
