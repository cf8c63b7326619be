"""Pixel environments: a tiny pixel Pendulum, frame-stacked.

A single frame shows where things are but not how fast they move, so the environment stacks the
last ``frame_stack`` frames along the channel axis with :class:`~emote_core.env.frames.FrameStack`
(oldest first; after a reset the stack is the first frame repeated). Observations stay ``uint8``:
a table stores one byte per pixel and the network scales them.

``emote/PixelPendulum-v0`` is gymnasium's Pendulum (dynamics, reward, 200-step limit) seen as a
small grayscale image of the rod, drawn with numpy: small enough for a pixel SAC agent to learn on
a CPU. Importing this module registers the id.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from emote_core.env.frames import FrameStack
from emote_core.errors import ConfigurationError

PIXEL_PENDULUM_ID = "emote/PixelPendulum-v0"
"""The id under which the frame-stacked :class:`PixelPendulum` is registered with gymnasium."""

PENDULUM_EPISODE_STEPS = 200
"""Steps before a pixel Pendulum episode is truncated, as in gymnasium's ``Pendulum-v1``."""

MIN_PENDULUM_SIZE = 16
"""The smallest pixel Pendulum image: below it the rod spans too few pixels to show its angle."""

_ROD_LENGTH = 0.4
"""The rod's length as a fraction of the image size (the rod and its rim stay inside)."""


def _int_at_least(owner: str, name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigurationError(
            f"{owner}'s {name} must be an integer of at least {minimum}; got {value!r}"
        )
    return int(value)


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
    size = _int_at_least("render_pendulum", "size", size, minimum=MIN_PENDULUM_SIZE)
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
        self.size = _int_at_least("PixelPendulum", "size", size, minimum=MIN_PENDULUM_SIZE)
        if isinstance(g, bool) or not isinstance(g, int | float) or not math.isfinite(g):
            raise ConfigurationError(f"PixelPendulum's g must be a finite number; got {g!r}")
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
    frame_stack = _int_at_least("PixelPendulum", "frame_stack", frame_stack)
    return FrameStack(PixelPendulum(size=size, g=g, render_mode=render_mode), frame_stack)


def register() -> None:
    """Registers :data:`PIXEL_PENDULUM_ID`, once.

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


register()

__all__ = [
    "MIN_PENDULUM_SIZE",
    "PENDULUM_EPISODE_STEPS",
    "PIXEL_PENDULUM_ID",
    "PixelPendulum",
    "make_pixel_pendulum",
    "register",
    "render_pendulum",
]
