"""Descriptions of what agents observe and do: boxes, discrete choices, named dicts of them.

Spaces describe shapes, dtypes and bounds without holding data. They convert from gymnasium's
spaces and round-trip through JSON, which is how stores and exported policies record them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from emote_core.errors import ConfigurationError

SPACES_JSON_VERSION = 1
"""Version of the JSON layout written by :meth:`MDPSpace.to_json`."""
ACTION_MASK_KEY = "action_mask"
"""The observation key of a discrete action mask (PettingZoo's and gymnasium's convention): one
0/1 entry per action of a ``Discrete(n)`` space, 1 where the action is allowed."""

Bound = npt.NDArray[np.float64] | None


def _bound_to_json(bound: Bound) -> Any:
    """Writes a bound as a scalar when uniform, else a nested list; unbounded entries are null."""
    if bound is None:
        return None
    values = np.asarray(bound, dtype=np.float64)
    if values.size > 0 and np.all(values == values.flat[0]):
        first = float(values.flat[0])
        return first if math.isfinite(first) else None
    return [v if math.isfinite(v) else None for v in values.ravel().tolist()]


def _bound_from_json(raw: Any, shape: tuple[int, ...], sign: float) -> Bound:
    if raw is None:
        return None
    if isinstance(raw, list):
        flat = [sign * math.inf if v is None else float(v) for v in raw]
        return np.asarray(flat, dtype=np.float64).reshape(shape)
    return np.full(shape, float(raw), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class BoxSpace:
    """A fixed-shape array of one dtype, optionally bounded.

    Attributes:
        dtype: The numpy dtype of the values.
        shape: The shape of one value (no batch dimension).
        low: Lower bounds broadcastable to ``shape``, or ``None`` when unbounded.
        high: Upper bounds broadcastable to ``shape``, or ``None`` when unbounded.
        frames: How many frames each value stacks along its last axis, oldest first (emote's
            ``FrameStack``): 1 for a plain value. Memory tables store a stacked entry's newest
            frame once per step and rebuild the stack when sampling.
    """

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    low: Bound = None
    high: Bound = None
    frames: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise ConfigurationError(f"a space's shape must be non-negative; got {self.shape}")
        frames = self.frames
        if isinstance(frames, bool) or not isinstance(frames, int | np.integer) or frames < 1:
            raise ConfigurationError(
                f"a space's frames (frames stacked per value) must be an integer >= 1; got "
                f"{frames!r}"
            )
        object.__setattr__(self, "frames", int(frames))
        if self.frames > 1 and (not self.shape or self.shape[-1] % self.frames):
            raise ConfigurationError(
                f"a space of {self.frames} stacked frames needs a last axis that holds them "
                f"equally; its shape is {self.shape}"
            )
        for name in ("low", "high"):
            bound = getattr(self, name)
            if bound is not None:
                try:
                    values = np.broadcast_to(np.asarray(bound, dtype=np.float64), self.shape)
                except ValueError as error:
                    raise ConfigurationError(
                        f"space bound '{name}' of shape {np.shape(bound)} does not broadcast to "
                        f"the space's shape {self.shape}"
                    ) from error
                object.__setattr__(self, name, values.copy())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BoxSpace) or type(other) is not type(self):
            return NotImplemented
        return (
            self.dtype == other.dtype
            and self.shape == other.shape
            and self.frames == other.frames
            and _bounds_equal(self.low, other.low)
            and _bounds_equal(self.high, other.high)
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.dtype.str, self.shape))

    def contains(self, value: npt.ArrayLike) -> bool:
        """Whether ``value`` has this space's shape and lies inside its bounds."""
        array = np.asarray(value)
        if array.shape != self.shape:
            return False
        if self.low is not None and np.any(array < self.low):
            return False
        return not (self.high is not None and np.any(array > self.high))

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """The shape of one frame of a value: the shape itself unless frames are stacked."""
        if self.frames == 1:
            return self.shape
        return (*self.shape[:-1], self.shape[-1] // self.frames)

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-compatible description of this space (``frames`` only when > 1, so
        descriptions written before stacks existed read the same)."""
        document = {
            "type": "box",
            "dtype": self.dtype.str,
            "shape": list(self.shape),
            "low": _bound_to_json(self.low),
            "high": _bound_to_json(self.high),
        }
        if self.frames > 1:
            document["frames"] = self.frames
        return document


@dataclass(frozen=True, eq=False)
class DiscreteSpace(BoxSpace):
    """A choice among ``n`` options, stored as one integer per step (shape ``(1,)``).

    Attributes:
        n: The number of options.
    """

    dtype: np.dtype[Any] = field(default_factory=lambda: np.dtype(np.int64))
    shape: tuple[int, ...] = (1,)
    n: int = 2

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigurationError(f"a discrete space needs at least one option; got n={self.n}")
        object.__setattr__(self, "low", np.zeros(self.shape))
        object.__setattr__(self, "high", np.full(self.shape, float(self.n - 1)))
        super().__post_init__()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DiscreteSpace):
            return NotImplemented
        return self.n == other.n and self.dtype == other.dtype and self.shape == other.shape

    def __hash__(self) -> int:
        return hash(("discrete", self.n, self.dtype.str))

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-compatible description of this space."""
        return {"type": "discrete", "n": self.n, "dtype": self.dtype.str, "shape": list(self.shape)}


def _bounds_equal(a: Bound, b: Bound) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))


@dataclass(frozen=True)
class DictSpace:
    """Named sub-spaces, as for dict observations.

    Attributes:
        spaces: The sub-spaces by key.
    """

    spaces: dict[str, BoxSpace]

    def __getitem__(self, key: str) -> BoxSpace:
        return self.spaces[key]

    def keys(self) -> list[str]:
        """The keys of the sub-spaces, in order."""
        return list(self.spaces)

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-compatible description of this space."""
        return {"type": "dict", "spaces": {k: v.to_json() for k, v in self.spaces.items()}}


@dataclass(frozen=True)
class MDPSpace:
    """The spaces of a decision process: rewards, actions and the (dict) observation.

    Attributes:
        rewards: The reward space, normally float32 of shape ``(1,)``.
        actions: The action space (a box, or a discrete choice).
        state: The observation space as named sub-spaces.
    """

    rewards: BoxSpace
    actions: BoxSpace
    state: DictSpace

    @property
    def action_mask_key(self) -> str | None:
        """:data:`ACTION_MASK_KEY` when the observation holds a discrete action mask, else
        ``None``."""
        return ACTION_MASK_KEY if ACTION_MASK_KEY in self.state.spaces else None

    @property
    def feature_keys(self) -> list[str]:
        """The observation keys a network reads: every key but the action mask."""
        return [key for key in self.state.spaces if key != ACTION_MASK_KEY]

    @classmethod
    def from_gymnasium(
        cls, observation_space: Any, action_space: Any, *, observation_key: str = "obs"
    ) -> MDPSpace:
        """Builds an MDP space from gymnasium spaces.

        A ``Box`` observation becomes one entry named ``observation_key``; a ``Dict`` observation
        keeps its keys. Actions may be ``Box`` or ``Discrete``. A ``Dict`` entry named
        :data:`ACTION_MASK_KEY` (a ``MultiBinary(n)``, or a ``Box`` of 0/1 integers of shape
        ``(n,)``) masks ``Discrete(n)`` actions and becomes a box of bounds 0 and 1.

        Args:
            observation_space: A gymnasium ``Box`` or ``Dict`` of ``Box`` spaces.
            action_space: A gymnasium ``Box`` or ``Discrete`` space.
            observation_key: The key given to a single ``Box`` observation.

        Returns:
            The corresponding MDP space, with float32 rewards of shape ``(1,)``.

        Raises:
            ConfigurationError: If a space type is not supported, or an action mask does not fit
                the actions (continuous actions, or not one entry per discrete action).
        """
        from gymnasium import spaces as gym_spaces

        if isinstance(observation_space, gym_spaces.Dict):
            state = DictSpace(
                {
                    k: _mask_from_gym(v, action_space)
                    if k == ACTION_MASK_KEY
                    else _box_from_gym(v, k)
                    for k, v in observation_space.spaces.items()
                }
            )
        else:
            state = DictSpace({observation_key: _box_from_gym(observation_space, observation_key)})
        if isinstance(action_space, gym_spaces.Discrete):
            if int(action_space.start) != 0:
                raise ConfigurationError(
                    f"discrete action spaces must start at 0; got start={action_space.start}"
                )
            actions: BoxSpace = DiscreteSpace(n=int(action_space.n))
        else:
            actions = _box_from_gym(action_space, "actions")
        return cls(rewards=BoxSpace(np.float32, (1,)), actions=actions, state=state)

    def to_json(self) -> dict[str, Any]:
        """Returns a JSON-compatible description, with a layout version."""
        return {
            "version": SPACES_JSON_VERSION,
            "rewards": self.rewards.to_json(),
            "actions": self.actions.to_json(),
            "state": self.state.to_json(),
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> MDPSpace:
        """Rebuilds a space written by :meth:`to_json`.

        Raises:
            ConfigurationError: If the document is not a space description this emote reads.
        """
        try:
            version = int(document.get("version", 0))
            if version > SPACES_JSON_VERSION:
                raise ConfigurationError(
                    f"space description has version {version}; this emote reads up to "
                    f"{SPACES_JSON_VERSION} — upgrade emote"
                )
            state = space_from_json(document["state"])
            if not isinstance(state, DictSpace):
                raise ConfigurationError("an MDP space's 'state' must be a dict space")
            rewards = space_from_json(document["rewards"])
            actions = space_from_json(document["actions"])
        except (KeyError, TypeError, ValueError) as error:
            if isinstance(error, ConfigurationError):
                raise
            raise ConfigurationError(f"malformed space description: {error!r}") from error
        if not isinstance(rewards, BoxSpace) or not isinstance(actions, BoxSpace):
            raise ConfigurationError("an MDP space's 'rewards' and 'actions' must be box spaces")
        return cls(rewards=rewards, actions=actions, state=state)


def space_from_json(document: dict[str, Any]) -> BoxSpace | DictSpace:
    """Rebuilds one space from its JSON description.

    Raises:
        ConfigurationError: If the space type is unknown.
    """
    kind = document.get("type")
    if kind == "dict":
        return DictSpace({k: _as_box(space_from_json(v)) for k, v in document["spaces"].items()})
    if kind == "discrete":
        return DiscreteSpace(n=int(document["n"]), dtype=np.dtype(document["dtype"]))
    if kind == "box":
        shape = tuple(int(s) for s in document["shape"])
        return BoxSpace(
            dtype=np.dtype(document["dtype"]),
            shape=shape,
            low=_bound_from_json(document.get("low"), shape, -1.0),
            high=_bound_from_json(document.get("high"), shape, 1.0),
            frames=document.get("frames", 1),
        )
    raise ConfigurationError(f"unknown space type {kind!r}; expected 'box', 'discrete' or 'dict'")


def _as_box(space: BoxSpace | DictSpace) -> BoxSpace:
    if not isinstance(space, BoxSpace):
        raise ConfigurationError("nested dict spaces are not supported; flatten the observation")
    return space


def _box_from_gym(space: Any, key: str) -> BoxSpace:
    from gymnasium import spaces as gym_spaces

    if not isinstance(space, gym_spaces.Box):
        raise ConfigurationError(
            f"space '{key}' is a {type(space).__name__}; emote supports Box observations, "
            "Dict of Box observations, and Box or Discrete actions"
        )
    low = np.asarray(space.low, dtype=np.float64)
    high = np.asarray(space.high, dtype=np.float64)
    return BoxSpace(
        dtype=space.dtype,
        shape=space.shape,
        low=None if np.all(np.isneginf(low)) else low,
        high=None if np.all(np.isposinf(high)) else high,
        # emote's FrameStack says how many frames its observations stack (a FrameStackBox).
        frames=getattr(space, "frames", 1),
    )


def _mask_from_gym(space: Any, action_space: Any) -> BoxSpace:
    """An action mask as a 0/1 box (of the env's integer dtype) of one entry per action."""
    from gymnasium import spaces as gym_spaces

    if not isinstance(action_space, gym_spaces.Discrete):
        raise ConfigurationError(
            f"observation '{ACTION_MASK_KEY}' masks discrete actions, but the actions are "
            f"{action_space}; drop the mask, or rename the key if it is an ordinary observation"
        )
    n = int(action_space.n)
    binary = isinstance(space, gym_spaces.MultiBinary) or (
        isinstance(space, gym_spaces.Box)
        and np.dtype(space.dtype).kind in "biu"
        and np.all(space.low >= 0)
        and np.all(space.high <= 1)
    )
    if not binary:
        raise ConfigurationError(
            f"observation '{ACTION_MASK_KEY}' is {space}; an action mask is a MultiBinary({n}) or "
            f"a Box(0, 1, ({n},), int8) with 1 for each allowed action"
        )
    if tuple(space.shape) != (n,):
        raise ConfigurationError(
            f"observation '{ACTION_MASK_KEY}' has shape {tuple(space.shape)}; a mask of "
            f"Discrete({n}) actions has one entry per action, shape ({n},) — fix the env's "
            "observation space"
        )
    return BoxSpace(dtype=space.dtype, shape=(n,), low=np.zeros(n), high=np.ones(n))


_CHANNELS = (1, 2, 3, 4)
"""Channel counts of an image: a 3-d value with one of these first or last is read as one."""


def describe_shape(shape: Sequence[int]) -> str:
    """A value's shape in words for messages and reports: "1 number", "3 numbers",
    "4x5 grid of numbers", "84x84 image with 3 channels", "2x3x5x7 array of numbers"."""
    dims = tuple(int(s) for s in shape)
    if len(dims) <= 1:
        count = dims[0] if dims else 1
        return "1 number" if count == 1 else f"{count} numbers"
    if len(dims) == 2:
        return f"{dims[0]}x{dims[1]} grid of numbers"
    if len(dims) == 3:
        for channels, (height, width) in ((dims[2], dims[:2]), (dims[0], dims[1:])):
            if channels in _CHANNELS and min(height, width) > max(_CHANNELS):
                plural = "channel" if channels == 1 else "channels"
                return f"{height}x{width} image with {channels} {plural}"
    return "x".join(str(d) for d in dims) + " array of numbers"


def describe_space(space: BoxSpace) -> str:
    """A space's values in words: "one of 2 choices" for discrete ones, else its shape's words
    ("84x84 image with 9 channels, 3 stacked frames" where frames are stacked)."""
    if isinstance(space, DiscreteSpace):
        return f"one of {space.n} choices"
    if space.frames > 1:
        return f"{describe_shape(space.shape)}, {space.frames} stacked frames"
    return describe_shape(space.shape)


_LISTED_ENTRIES = 6
"""Bounds that differ between entries are listed one by one up to this many entries."""


def describe_bounds(space: BoxSpace) -> str:
    """A space's bounds in words: "-1 to 1", "0 to 255", "unbounded". Bounds that differ between
    entries are listed ("-4.8 to 4.8, -inf to inf") or, for many entries, given as the lowest
    and highest marked "(per entry)"."""
    if isinstance(space, DiscreteSpace):
        return f"0 to {space.n - 1}"
    if space.low is None and space.high is None:
        return "unbounded"
    low = np.full(space.shape, -math.inf) if space.low is None else space.low
    high = np.full(space.shape, math.inf) if space.high is None else space.high
    if low.size == 0:
        return "no entries"
    if np.all(low == low.flat[0]) and np.all(high == high.flat[0]):
        return f"{low.flat[0]:g} to {high.flat[0]:g}"
    if low.size <= _LISTED_ENTRIES:
        return ", ".join(f"{a:g} to {b:g}" for a, b in zip(low.flat, high.flat, strict=True))
    return f"{np.min(low):g} to {np.max(high):g} (per entry)"


__all__ = [
    "ACTION_MASK_KEY",
    "SPACES_JSON_VERSION",
    "BoxSpace",
    "DictSpace",
    "DiscreteSpace",
    "MDPSpace",
    "describe_bounds",
    "describe_shape",
    "describe_space",
    "space_from_json",
]
