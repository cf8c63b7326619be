"""Pixel environments: a tiny pixel Pendulum and CarRacing in 84x84 frames, both frame-stacked.

Both stack the last ``frame_stack`` ``uint8`` frames along the channel axis
(:class:`~emote_core.env.frames.FrameStack`). ``emote/PixelPendulum-v0`` is gymnasium's
Pendulum drawn as a small grayscale image; ``emote/PixelCarRacing-v0`` is CarRacing (needs
``gymnasium[box2d]``) in 84x84 RGB; :func:`make_vision_box2d_env` builds the same chain for any
registered id. Importing this module registers both ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from emote_core.env.frames import FrameStack, ScaledFloatFrame, WarpFrame
from emote_core.errors import ConfigurationError
from emote_core.utils.checks import finite_number, int_at_least

PIXEL_PENDULUM_ID = "emote/PixelPendulum-v0"
"""The id under which the frame-stacked :class:`PixelPendulum` is registered with gymnasium."""

PIXEL_CAR_RACING_ID = "emote/PixelCarRacing-v0"
"""The id under which CarRacing in stacked 84x84 RGB frames is registered with gymnasium."""

PENDULUM_EPISODE_STEPS = 200
"""Steps before a pixel Pendulum episode is truncated, as in gymnasium's ``Pendulum-v1``."""

CAR_RACING_EPISODE_STEPS = 1000
"""Steps before a pixel CarRacing episode is truncated, as in gymnasium's ``CarRacing-v3``."""

FRAME_SIZE = 84
"""Height and width of :func:`make_vision_box2d_env`'s and ``emote/PixelCarRacing-v0``'s frames."""

MIN_PENDULUM_SIZE = 16
"""The smallest pixel Pendulum image: below it the rod spans too few pixels to show its angle."""

_ROD_LENGTH = 0.4
"""The rod's length as a fraction of the image size (the rod and its rim stay inside)."""


class _RodCanvas:
    """Pixel-centre coordinates of a square image, kept to draw rods from its centre quickly."""

    def __init__(self, size: int) -> None:
        centres = np.arange(size, dtype=np.float32) + np.float32(0.5) - np.float32(size / 2)
        self.size = size
        self.x = np.broadcast_to(centres[None, :], (size, size))
        self.y = np.broadcast_to(-centres[:, None], (size, size))  # rows grow downwards
        self.radius_squared = self.x * self.x + self.y * self.y
        self.length = np.float32(_ROD_LENGTH * size)
        # Half the rod's width; at least a pixel so that the rod is two pixels wide.
        self.half_width = np.float32(max(1.0, size / 32))

    def draw(self, angle: float) -> np.ndarray:
        # The distance of each pixel centre to the segment from the centre to the rod's tip,
        # turned into coverage with a one-pixel ramp at the rim (anti-aliasing).
        along_x = np.float32(-math.sin(angle))
        along_y = np.float32(math.cos(angle))
        projection = self.x * along_x + self.y * along_y
        nearest = np.clip(projection, np.float32(0.0), self.length)
        distance_squared = self.radius_squared - nearest * (projection + projection - nearest)
        distance = np.sqrt(np.maximum(distance_squared, np.float32(0.0)))
        coverage = np.clip(self.half_width + np.float32(0.5) - distance, 0.0, 1.0)
        image = (coverage * np.float32(255.0) + np.float32(0.5)).astype(np.uint8)
        return image[..., None]


_CANVASES: dict[int, _RodCanvas] = {}


def render_pendulum(angle: float, *, size: int) -> np.ndarray:
    """Draws the pendulum at ``angle`` as a white rod on black, from the image's centre.

    The angle is gymnasium Pendulum's: 0 points straight up and it grows counter-clockwise, so at
    ``pi / 2`` the rod points left and at ``pi`` straight down. The rod is ``0.4 * size`` long and
    anti-aliased, so small turns change the image.

    Args:
        angle: The pendulum's angle in radians.
        size: Height and width of the image, at least :data:`MIN_PENDULUM_SIZE`.

    Returns:
        A ``uint8`` image of shape ``(size, size, 1)``, new for every call.

    Raises:
        ConfigurationError: If ``size`` is too small.
    """
    size = int_at_least("render_pendulum", "size", size, MIN_PENDULUM_SIZE)
    canvas = _CANVASES.get(size)
    if canvas is None:
        canvas = _CANVASES.setdefault(size, _RodCanvas(size))
    return canvas.draw(float(angle))


class PixelPendulum(gymnasium.Env[np.ndarray, np.ndarray]):
    """Gymnasium's Pendulum seen as a grayscale image of its rod.

    Dynamics, reward, action space (a torque in ``[-2, 2]``) and reset distribution are those of
    gymnasium's ``PendulumEnv``, which this environment steps; only the observation differs: a
    ``(size, size, 1)`` ``uint8`` image from :func:`render_pendulum`. One image holds the angle but
    not the angular velocity, so the environment is meant to be used with a frame stack, as
    ``emote/PixelPendulum-v0`` is. Grayscale is enough for one white rod and keeps a stack of
    ``k`` frames at ``k`` channels. This class has no time limit of its own; the registered id
    truncates episodes at :data:`PENDULUM_EPISODE_STEPS`.

    Args:
        size: Height and width of the image, at least :data:`MIN_PENDULUM_SIZE`.
        g: Gravity, as gymnasium's Pendulum takes it.
        render_mode: ``None`` or ``"rgb_array"`` (the current image in three channels).

    Raises:
        ConfigurationError: If ``size`` is too small, ``g`` is not a finite number or the render
            mode is unknown.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, *, size: int = 48, g: float = 10.0, render_mode: str | None = None) -> None:
        self.size = int_at_least("PixelPendulum", "size", size, MIN_PENDULUM_SIZE)
        g = finite_number("PixelPendulum", "g", g)
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ConfigurationError(
                f"PixelPendulum renders {self.metadata['render_modes']} or nothing (None); got "
                f"render_mode={render_mode!r}"
            )
        self.render_mode = render_mode
        self.pendulum = PendulumEnv(g=float(g))
        """The gymnasium Pendulum that is stepped (its ``state`` is ``(angle, velocity)``)."""
        self.observation_space = spaces.Box(0, 255, shape=(self.size, self.size, 1), dtype=np.uint8)
        self.action_space = self.pendulum.action_space
        self._image: np.ndarray | None = None

    @property
    def state(self) -> np.ndarray:
        """A copy of ``(angle, angular velocity)``; angle 0 is upright."""
        return np.array(self.pendulum.state, dtype=np.float64)

    def _observe(self) -> np.ndarray:
        self._image = render_pendulum(float(self.pendulum.state[0]), size=self.size)
        return self._image

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode as gymnasium's Pendulum does (``options`` as it takes them)."""
        super().reset(seed=seed)
        self.pendulum.reset(seed=seed, options=options)
        return self._observe(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Applies the torque; returns the new image and Pendulum's reward (it never terminates)."""
        _, reward, terminated, truncated, info = self.pendulum.step(action)
        return self._observe(), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> np.ndarray | None:
        """The current image as ``(size, size, 3)`` ``uint8`` in ``rgb_array`` mode, else None."""
        if self.render_mode != "rgb_array" or self._image is None:
            return None
        return np.repeat(self._image, 3, axis=-1)


def make_pixel_pendulum(
    *, size: int = 48, frame_stack: int = 3, g: float = 10.0, render_mode: str | None = None
) -> gymnasium.Env:
    """``emote/PixelPendulum-v0``'s entry point: a :class:`PixelPendulum` under a frame stack.

    Args:
        size: Height and width of each frame.
        frame_stack: Frames per observation; observations are ``(size, size, frame_stack)``
            ``uint8``.
        g: Gravity.
        render_mode: ``None`` or ``"rgb_array"``.

    Returns:
        The stacked environment (gymnasium adds the 200-step limit when made from the id).

    Raises:
        ConfigurationError: If an argument is out of range.
    """
    frame_stack = int_at_least("PixelPendulum", "frame_stack", frame_stack, 1)
    return FrameStack(PixelPendulum(size=size, g=g, render_mode=render_mode), frame_stack)


def pixel_frames(env: gymnasium.Env, *, frame_stack: int, use_float_scaling: bool) -> gymnasium.Env:
    """Frames warped to 84x84 RGB, stacked, and scaled to float32 if asked.

    RGB rather than grayscale: CarRacing tells road from grass and shows its dashboard in colour,
    and 84x84x3 ``uint8`` frames are what the memory figures of emote's pixel work are sized for.

    Args:
        env: An environment with ``(H, W, 3)`` image observations.
        frame_stack: Frames per observation.
        use_float_scaling: Map the stacks to float32 in ``[-1, 1]``
            (:class:`~emote_core.env.frames.ScaledFloatFrame`); ``False`` keeps ``uint8``.

    Returns:
        The wrapped environment, observations ``(84, 84, 3 * frame_stack)``.

    Raises:
        ConfigurationError: If the observations are not images or ``frame_stack`` is not positive.
    """
    frame_stack = int_at_least("pixel_frames", "frame_stack", frame_stack, 1)
    wrapped: gymnasium.Env = FrameStack(
        WarpFrame(env, width=FRAME_SIZE, height=FRAME_SIZE, grayscale=False), frame_stack
    )
    if use_float_scaling:
        wrapped = ScaledFloatFrame(wrapped)
    return wrapped


def make_pixel_car_racing(
    *, frame_stack: int = 3, render_mode: str | None = None, **car_racing_kwargs: Any
) -> gymnasium.Env:
    """``emote/PixelCarRacing-v0``'s entry point: CarRacing in stacked 84x84 RGB ``uint8`` frames.

    Args:
        frame_stack: Frames per observation; observations are ``(84, 84, 3 * frame_stack)``.
        render_mode: Passed to CarRacing.
        **car_racing_kwargs: Passed to CarRacing (``continuous``, ``domain_randomize``,
            ``lap_complete_percent``).

    Returns:
        The wrapped environment (gymnasium adds the 1000-step limit when made from the id).

    Raises:
        ConfigurationError: If ``frame_stack`` is not positive or Box2D is not installed.
    """
    frame_stack = int_at_least("PixelCarRacing", "frame_stack", frame_stack, 1)
    try:
        from gymnasium.envs.box2d.car_racing import CarRacing
    except (ImportError, gymnasium.error.DependencyNotInstalled) as error:
        raise ConfigurationError(
            f"{PIXEL_CAR_RACING_ID} needs Box2D, which did not import ({error}); install "
            "gymnasium[box2d]"
        ) from error
    car_racing = CarRacing(render_mode=render_mode, **car_racing_kwargs)
    return pixel_frames(car_racing, frame_stack=frame_stack, use_float_scaling=False)


def make_vision_box2d_env(
    env_id: str,
    rank: int,
    seed: int = 0,
    frame_stack: int = 3,
    use_float_scaling: bool = False,
) -> Callable[[], gymnasium.Env]:
    """A factory of one pixel Box2D environment (CarRacing), for a vector env's ``rank``-th slot.

    The environment is ``gymnasium.make(env_id)`` with its frames warped to 84x84 RGB (see
    :func:`pixel_frames` for why RGB), stacked ``frame_stack`` deep and, with
    ``use_float_scaling``, scaled to float32 in ``[-1, 1]``. It is seeded with ``seed + rank``
    (its first reset and its action space), so every slot plays its own, reproducible tracks.
    Checking the arguments happens here; making the environment waits for the call.

    Args:
        env_id: A registered gymnasium id with RGB image observations, such as
            ``"CarRacing-v3"``.
        rank: The slot's index in its vector environment.
        seed: The base seed; the slot uses ``seed + rank``.
        frame_stack: Frames per observation.
        use_float_scaling: Float32 observations in ``[-1, 1]``; ``False`` keeps ``uint8`` (a
            quarter of the memory, scaled by the network).

    Returns:
        A function of no arguments that builds the environment, observations
        ``(84, 84, 3 * frame_stack)``.

    Raises:
        ConfigurationError: If ``env_id`` is not registered or another argument is out of range.
    """
    if not isinstance(env_id, str) or env_id not in gymnasium.registry:
        raise ConfigurationError(
            f"make_vision_box2d_env's env_id must be a registered gymnasium id such as "
            f"'CarRacing-v3'; got {env_id!r}"
        )
    rank = int_at_least("make_vision_box2d_env", "rank", rank, 0)
    seed = int_at_least("make_vision_box2d_env", "seed", seed, 0)
    frame_stack = int_at_least("make_vision_box2d_env", "frame_stack", frame_stack, 1)
    if not isinstance(use_float_scaling, bool):
        raise ConfigurationError(
            f"make_vision_box2d_env's use_float_scaling must be True or False; got "
            f"{use_float_scaling!r}"
        )

    def make() -> gymnasium.Env:
        env = pixel_frames(
            gymnasium.make(env_id), frame_stack=frame_stack, use_float_scaling=use_float_scaling
        )
        env.reset(seed=seed + rank)
        env.action_space.seed(seed + rank)
        return env

    return make


def register() -> None:
    """Registers :data:`PIXEL_PENDULUM_ID` and :data:`PIXEL_CAR_RACING_ID`, once.

    Importing this module does it. gymnasium's passive checker is left off: it expects arrays
    and would warn about every frame stack, which arrives as
    :class:`~emote_core.env.frames.LazyFrames` (the tests check spaces and observations instead).
    """
    if PIXEL_PENDULUM_ID not in gymnasium.registry:
        gymnasium.register(
            id=PIXEL_PENDULUM_ID,
            entry_point=f"{__name__}:make_pixel_pendulum",
            max_episode_steps=PENDULUM_EPISODE_STEPS,
            disable_env_checker=True,
        )
    if PIXEL_CAR_RACING_ID not in gymnasium.registry:
        gymnasium.register(
            id=PIXEL_CAR_RACING_ID,
            entry_point=f"{__name__}:make_pixel_car_racing",
            max_episode_steps=CAR_RACING_EPISODE_STEPS,
            disable_env_checker=True,
        )


register()

__all__ = [
    "CAR_RACING_EPISODE_STEPS",
    "FRAME_SIZE",
    "MIN_PENDULUM_SIZE",
    "PENDULUM_EPISODE_STEPS",
    "PIXEL_CAR_RACING_ID",
    "PIXEL_PENDULUM_ID",
    "PixelPendulum",
    "make_pixel_car_racing",
    "make_pixel_pendulum",
    "make_vision_box2d_env",
    "pixel_frames",
    "register",
    "render_pendulum",
]
