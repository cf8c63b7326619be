"""Observation wrappers for image environments: warp, stack and scale frames.

The usual chain for pixel observations is ``ScaledFloatFrame(FrameStack(WarpFrame(env), k))``
or, to keep ``uint8`` frames in memory, ``FrameStack(WarpFrame(env), k)`` with the scaling done
by the agent proxy. Resizing uses ``torch.nn.functional.interpolate`` (area averaging), so no
image library is needed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from emote_core.errors import ConfigurationError

_LUMINANCE = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _image_box(env: gymnasium.Env, wrapper: str) -> spaces.Box:
    space = env.observation_space
    if not isinstance(space, spaces.Box) or len(space.shape) not in (2, 3):
        raise ConfigurationError(
            f"{wrapper} needs image observations, a Box of shape (H, W) or (H, W, C); got {space}"
        )
    return space


class WarpFrame(gymnasium.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Resizes frames to ``height x width``, in grayscale by default, as ``uint8`` ``(H, W, C)``.

    Args:
        env: An environment with ``(H, W)`` or ``(H, W, C)`` image observations (``C`` of 1, 3
            or 4; RGB(A) is turned to grayscale with the ITU-R 601 luma weights).
        width: Output width.
        height: Output height.
        grayscale: Output one channel; ``False`` keeps the input's channels.

    Raises:
        ConfigurationError: If the observations are not images or a size is not positive.
    """

    def __init__(
        self, env: gymnasium.Env, *, width: int = 84, height: int = 84, grayscale: bool = True
    ) -> None:
        super().__init__(env)
        source = _image_box(env, "WarpFrame")
        if width < 1 or height < 1:
            raise ConfigurationError(f"WarpFrame's size must be positive; got {width}x{height}")
        channels = 1 if len(source.shape) == 2 else source.shape[2]
        if grayscale and channels not in (1, 3, 4):
            raise ConfigurationError(
                f"WarpFrame turns 1, 3 or 4 channels to grayscale; frames have {channels}"
            )
        self.width = width
        self.height = height
        self.grayscale = grayscale
        out_channels = 1 if grayscale else channels
        self.observation_space = spaces.Box(
            low=0, high=255, shape=(height, width, out_channels), dtype=np.uint8
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The frame resized (and grayscaled), ``uint8`` ``(height, width, channels)``."""
        frame = np.asarray(observation, dtype=np.float32)
        if frame.ndim == 2:
            frame = frame[..., None]
        if self.grayscale and frame.shape[-1] >= 3:
            frame = frame[..., :3] @ _LUMINANCE
            frame = frame[..., None]
        tensor = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None]
        resized = torch.nn.functional.interpolate(
            tensor, size=(self.height, self.width), mode="area"
        )
        result = resized[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)
        return result.numpy()


class LazyFrames:
    """The last ``k`` frames, concatenated along the channel axis only when read.

    Consecutive stacks share their frames (each frame is stored once, however many stacks hold
    it), which saves memory where observations are kept one by one.
    ``np.asarray(lazy_frames)`` materialises the ``(H, W, k * C)`` array (cached).

    Args:
        frames: The frames, oldest first, each ``(H, W, C)``.
    """

    __slots__ = ("_frames", "_materialised")

    def __init__(self, frames: list[np.ndarray]) -> None:
        self._frames = frames
        self._materialised: np.ndarray | None = None

    @property
    def frames(self) -> tuple[np.ndarray, ...]:
        """The frames, oldest first (shared, not copied)."""
        return tuple(self._frames)

    def _force(self) -> np.ndarray:
        if self._materialised is None:
            self._materialised = np.concatenate(self._frames, axis=-1)
        return self._materialised

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._force()
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the materialised array."""
        first = self._frames[0]
        return (*first.shape[:-1], first.shape[-1] * len(self._frames))

    @property
    def dtype(self) -> np.dtype[Any]:
        """The frames' dtype."""
        return self._frames[0].dtype

    def __len__(self) -> int:
        return len(self._frames)

    def __getitem__(self, index: Any) -> Any:
        return self._force()[index]

    def frame(self, index: int) -> np.ndarray:
        """One stored frame (``-1`` is the newest), without materialising the stack."""
        return self._frames[index]


class FrameStackBox(spaces.Box):
    """The observation space of :class:`FrameStack`: a ``Box`` that also says how many frames
    each value stacks along its last axis (``frames``), so that memory tables store each frame
    once and rebuild the stacks when sampling (``BoxSpace.frames``).

    Args:
        low: Lower bounds of a stacked value.
        high: Upper bounds of a stacked value.
        dtype: The frames' dtype.
        frames: Frames per value.
    """

    def __init__(self, low: Any, high: Any, *, dtype: Any, frames: int) -> None:
        super().__init__(low=low, high=high, dtype=dtype)
        self.frames = int(frames)

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and getattr(other, "frames", 1) == self.frames

    __hash__ = spaces.Box.__hash__

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, frames={self.frames})"


class FrameStack(gymnasium.ObservationWrapper[LazyFrames, Any, np.ndarray]):
    """Stacks the last ``k`` frames along the channel axis, as :class:`LazyFrames`.

    After a reset the stack holds ``k`` copies of the first frame.

    Args:
        env: An environment with ``(H, W, C)`` (or ``(H, W)``) image observations.
        k: Frames per stack.

    Raises:
        ConfigurationError: If ``k`` is not a positive integer or observations are not images.
    """

    def __init__(self, env: gymnasium.Env, k: int) -> None:
        super().__init__(env)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"FrameStack's k must be a positive integer; got {k!r}")
        source = _image_box(env, "FrameStack")
        self.k = k
        self._expand = len(source.shape) == 2
        low = np.asarray(source.low)[..., None] if self._expand else np.asarray(source.low)
        high = np.asarray(source.high)[..., None] if self._expand else np.asarray(source.high)
        self.observation_space = FrameStackBox(
            low=np.concatenate([low] * k, axis=-1),
            high=np.concatenate([high] * k, axis=-1),
            dtype=source.dtype,
            frames=k,
        )
        self._frames: deque[np.ndarray] = deque(maxlen=k)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[LazyFrames, dict[str, Any]]:
        """Resets and fills the stack with the first frame."""
        observation, info = self.env.reset(seed=seed, options=options)
        frame = self._frame(observation)
        self._frames.clear()
        self._frames.extend([frame] * self.k)
        return LazyFrames(list(self._frames)), info

    def observation(self, observation: np.ndarray) -> LazyFrames:
        """Pushes the newest frame and returns the stack."""
        self._frames.append(self._frame(observation))
        return LazyFrames(list(self._frames))

    def _frame(self, observation: np.ndarray) -> np.ndarray:
        frame = np.asarray(observation)
        return frame[..., None] if self._expand else frame


class ScaledFloatFrame(gymnasium.ObservationWrapper[np.ndarray, Any, Any]):
    """Maps ``uint8`` frames (or :class:`LazyFrames`) to float32 in ``[-1, 1]`` or ``[0, 1]``.

    ``centered=True`` (the default) gives ``(frame / 255 - 0.5) * 2`` in ``[-1, 1]``, what upstream
    emote's wrapper of the same name returns, so ported pixel pipelines see the same inputs (its
    observation space says so, where upstream's claimed ``[0, 1]``). ``centered=False`` gives
    ``frame / 255`` in ``[0, 1]``, the Atari baselines' scaling.

    Args:
        env: An environment with ``uint8`` image observations.
        centered: Whether to centre the range on zero.

    Raises:
        ConfigurationError: If the observations are not a ``uint8`` box.
    """

    def __init__(self, env: gymnasium.Env, *, centered: bool = True) -> None:
        super().__init__(env)
        source = env.observation_space
        if not isinstance(source, spaces.Box) or source.dtype != np.uint8:
            raise ConfigurationError(f"ScaledFloatFrame needs uint8 observations; got {source}")
        self.centered = bool(centered)
        low = -1.0 if self.centered else 0.0
        self.observation_space = spaces.Box(low=low, high=1.0, shape=source.shape, dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        """The frame as float32 in the wrapper's range."""
        scaled = np.asarray(observation, dtype=np.float32) / np.float32(255.0)
        if self.centered:
            scaled = (scaled - np.float32(0.5)) * np.float32(2.0)
        return scaled


__all__ = ["FrameStack", "FrameStackBox", "LazyFrames", "ScaledFloatFrame", "WarpFrame"]
