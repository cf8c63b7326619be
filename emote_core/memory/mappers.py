"""Mappers: how virtual columns derive their values when a table is sampled.

A sample is a set of windows, each ``sequence_length`` consecutive transitions of one episode.
:class:`SampleContext` describes them once; every mapper reads what it needs from it. Per-step
mappers return ``count * sequence_length`` rows; per-window mappers (``per_window``) return
``count`` rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch

from emote_core.errors import ConfigurationError
from emote_core.memory.storage import RingArray, host_to_device

_Value = TypeVar("_Value")


class _computed_once(Generic[_Value]):
    """A property computed on first access and then kept in the instance's ``__dict__``.

    ``functools.cached_property`` does the same but, before Python 3.12, takes a lock on every
    first access, which costs more than most of these arrays do to compute; a sample context is
    used by one thread.
    """

    def __init__(self, function: Callable[[Any], _Value]) -> None:
        self.function = function
        self.name = function.__name__
        self.__doc__ = function.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.function(instance)
        return value


@dataclass
class SampleContext:
    """The windows of one sample.

    Attributes:
        slots: Episode slot per window, shape ``(count,)``.
        offsets: First transition of each window within its episode, shape ``(count,)``.
        sequence_length: Transitions per window.
        starts: First row of each window's episode, shape ``(count,)``.
        lengths: Transitions of each window's episode, shape ``(count,)``.
        terminal: Whether each window's episode ended TERMINAL, shape ``(count,)``.
        device: The table's device.
    """

    slots: np.ndarray
    offsets: np.ndarray
    sequence_length: int
    starts: np.ndarray
    lengths: np.ndarray
    terminal: np.ndarray
    device: torch.device

    @property
    def count(self) -> int:
        return len(self.slots)

    @_computed_once
    def positions(self) -> np.ndarray:
        """The transition index within its episode of every sampled step, ``(count * L,)``."""
        if self.sequence_length == 1:
            return self.offsets
        steps = np.arange(self.sequence_length, dtype=np.int64)
        return (self.offsets[:, None] + steps[None, :]).reshape(-1)

    @_computed_once
    def rows(self) -> np.ndarray:
        """The storage row of every sampled step, ``(count * L,)``."""
        if self.sequence_length == 1:
            return self.starts + self.offsets
        return self.positions + np.repeat(self.starts, self.sequence_length)

    @_computed_once
    def device_rows(self) -> torch.Tensor | None:
        """``rows`` on the device, made once per sample for CUDA tables (``None`` on the CPU)."""
        if self.device.type == "cpu":
            return None
        return host_to_device(self.rows, self.device)

    @_computed_once
    def step_lengths(self) -> np.ndarray:
        """The episode length of every sampled step, ``(count * L,)``."""
        if self.sequence_length == 1:
            return self.lengths
        return np.repeat(self.lengths, self.sequence_length)

    @_computed_once
    def dones(self) -> np.ndarray:
        """Whether each sampled step is its episode's last transition, ``(count * L,)``."""
        return self.positions == self.step_lengths - 1

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return host_to_device(array, self.device)


class Mapper(ABC):
    """Derives a virtual column's values for a sample.

    Class attributes:
        per_window: Whether the result has one row per window instead of one per step.
        needs_target: Whether the mapper reads a stored target column.
        target_extra_rows: Rows the target must hold beyond the episode's transitions (1 for
            mappers that read the observation after a transition).
    """

    per_window: ClassVar[bool] = False
    needs_target: ClassVar[bool] = True
    target_extra_rows: ClassVar[int] = 0
    hides_target: ClassVar[bool] = False
    """Whether the target column is read only through this mapper and left out of batches (the
    single frames a frame stack is built from)."""

    @abstractmethod
    def map(
        self, context: SampleContext, target: RingArray | None, shape: tuple[int, ...], dtype: Any
    ) -> torch.Tensor:
        """Returns the derived values for the sample described by ``context``."""

    def describe(self) -> dict[str, Any]:
        """A JSON-compatible description, for stores and ``emote memory inspect``."""
        return {"type": type(self).__name__}


class NextElementMapper(Mapper):
    """The target's value ``n`` steps after each sampled step (the next observation for ``n=1``).

    Steps closer than ``n`` to the episode's end read its final observation instead.

    Args:
        n: How many steps ahead to read.
    """

    target_extra_rows: ClassVar[int] = 1

    def __init__(self, n: int = 1) -> None:
        if n < 1:
            raise ConfigurationError(f"a next-element mapper looks ahead n >= 1 steps; got n={n}")
        self.n = n

    @classmethod
    def with_n(cls, n: int) -> NextElementMapper:
        """A mapper that reads ``n`` steps ahead (n-step returns)."""
        return cls(n)

    def map(
        self, context: SampleContext, target: RingArray | None, shape: tuple[int, ...], dtype: Any
    ) -> torch.Tensor:
        assert target is not None
        if self.n == 1:
            rows = context.rows + 1
            device_rows = None if context.device_rows is None else context.device_rows + 1
            return target.gather(rows, device_rows)
        ahead = np.minimum(context.positions + self.n, context.step_lengths)
        return target.gather(ahead + np.repeat(context.starts, context.sequence_length))

    def describe(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "n": self.n}


class OnlyLastMapper(Mapper):
    """The target's value right after each window: the bootstrap observation of n-step tables."""

    per_window: ClassVar[bool] = True
    target_extra_rows: ClassVar[int] = 1

    def map(
        self, context: SampleContext, target: RingArray | None, shape: tuple[int, ...], dtype: Any
    ) -> torch.Tensor:
        assert target is not None
        return target.gather(context.starts + context.offsets + context.sequence_length)


class SyntheticDones(Mapper):
    """1 at the last transition of an episode, 0 elsewhere."""

    needs_target: ClassVar[bool] = False

    def map(
        self, context: SampleContext, target: RingArray | None, shape: tuple[int, ...], dtype: Any
    ) -> torch.Tensor:
        values = context.dones.astype(dtype).reshape(-1, *shape)
        return context.to_device(values)

    @classmethod
    def as_mask(cls) -> SyntheticMasks:
        """The matching mask mapper: 0 only at the last transition of a TERMINAL episode."""
        return SyntheticMasks()


class SyntheticMasks(Mapper):
    """0 at the last transition of a TERMINAL episode (do not bootstrap), 1 everywhere else.

    An INTERRUPTED episode (a time limit) keeps 1 at its end: its final observation is
    bootstrapped from.
    """

    needs_target: ClassVar[bool] = False

    def map(
        self, context: SampleContext, target: RingArray | None, shape: tuple[int, ...], dtype: Any
    ) -> torch.Tensor:
        terminal = context.terminal
        if context.sequence_length > 1:
            terminal = np.repeat(terminal, context.sequence_length)
        values = (~(context.dones & terminal)).astype(dtype).reshape(-1, *shape)
        return context.to_device(values)


class FrameStackMapper(Mapper):
    """Stacks of the last ``frames`` frames, rebuilt from a column that holds each frame once.

    The stack at step ``p`` joins the frames of steps ``p - frames + 1 .. p`` along the last
    axis, oldest first, as emote's ``FrameStack`` wrapper does; steps before the episode's start
    repeat its first frame, as the wrapper's stack after a reset does. ``ahead`` reads the stack
    ``ahead`` steps later (1: the next observation's; more: n-step bootstraps, which stop at
    the episode's final observation as :class:`NextElementMapper` does).

    The column holds each frame channels first (``(C, ...)`` for a frame of shape ``(..., C)``),
    so the gathered frames of a stack lie one after another as the stack's channels: the stack
    comes out as a view of them, shape ``(..., frames * C)``, without moving a pixel (a copy
    into channels-last order costs many times the gather). Convolutional encoders turn it back
    into channels first for free; ``reshape`` copies where a caller needs a flat row.

    Args:
        frames: Frames per stack.
        ahead: Steps ahead of each sampled step.

    Raises:
        ConfigurationError: If ``frames`` < 1 or ``ahead`` < 0.
    """

    target_extra_rows: ClassVar[int] = 1
    hides_target: ClassVar[bool] = True

    def __init__(self, frames: int, ahead: int = 0) -> None:
        if frames < 1 or ahead < 0:
            raise ConfigurationError(
                f"a frame stack takes frames >= 1 and ahead >= 0; got frames={frames}, "
                f"ahead={ahead}"
            )
        self.frames = int(frames)
        self.ahead = int(ahead)

    def _newest(self, context: SampleContext) -> tuple[np.ndarray, np.ndarray]:
        """The episode position of each stack's newest frame, and each one's episode start."""
        starts = np.repeat(context.starts, context.sequence_length)
        if self.ahead == 0:
            return context.positions, starts
        return np.minimum(context.positions + self.ahead, context.step_lengths), starts

    def map(
        self, context: SampleContext, target: RingArray | None, shape: tuple[int, ...], dtype: Any
    ) -> torch.Tensor:
        assert target is not None
        newest, starts = self._newest(context)
        back = np.arange(1 - self.frames, 1, dtype=np.int64)
        rows = (np.maximum(newest[:, None] + back[None, :], 0) + starts[:, None]).reshape(-1)
        frames = target.gather(rows)  # (count * frames, C, ...), each frame channels first
        channels = frames.reshape(len(newest), self.frames * frames.shape[1], *frames.shape[2:])
        return channels.movedim(1, -1)  # (count, ..., frames * C): a view, no copy

    def describe(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "frames": self.frames, "ahead": self.ahead}


class LastFrameStackMapper(FrameStackMapper):
    """The frame stack right after each window: the bootstrap observation of n-step tables
    (:class:`OnlyLastMapper` for stacked frames)."""

    per_window: ClassVar[bool] = True

    def __init__(self, frames: int) -> None:
        super().__init__(frames, ahead=0)

    def _newest(self, context: SampleContext) -> tuple[np.ndarray, np.ndarray]:
        return context.offsets + context.sequence_length, context.starts

    def describe(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "frames": self.frames}


MAPPERS: dict[str, type[Mapper]] = {
    cls.__name__: cls
    for cls in (
        NextElementMapper, OnlyLastMapper, SyntheticDones, SyntheticMasks, FrameStackMapper,
        LastFrameStackMapper,
    )
}  # fmt: skip
"""Mapper classes by name, for restoring described tables."""


def mapper_from_description(description: dict[str, Any]) -> Mapper:
    """Rebuilds a mapper from :meth:`Mapper.describe` output.

    Raises:
        ConfigurationError: If the mapper type is unknown.
    """
    kind = description.get("type")
    if kind not in MAPPERS:
        raise ConfigurationError(f"unknown mapper {kind!r}; known mappers: {sorted(MAPPERS)}")
    if kind == "NextElementMapper":
        return NextElementMapper(int(description.get("n", 1)))
    if kind in ("FrameStackMapper", "LastFrameStackMapper"):
        frames, ahead = description.get("frames"), description.get("ahead", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (frames, ahead)):
            raise ConfigurationError(
                f"mapper {kind} needs integer 'frames' (and 'ahead'); got {description!r}"
            )
        if kind == "LastFrameStackMapper":
            return LastFrameStackMapper(frames)
        return FrameStackMapper(frames, ahead)
    return MAPPERS[kind]()


__all__ = [
    "MAPPERS",
    "FrameStackMapper",
    "LastFrameStackMapper",
    "Mapper",
    "NextElementMapper",
    "OnlyLastMapper",
    "SampleContext",
    "SyntheticDones",
    "SyntheticMasks",
    "mapper_from_description",
]
