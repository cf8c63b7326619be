"""Schedules for hyperparameters that change as training goes on (learning rates, noise, ...).

A schedule starts at step 0 and advances by one step on each :meth:`BPStepScheduler.step`
call, typically once per backpropagation step. Its :attr:`~BPStepScheduler.value` is a pure
function of the number of steps taken, so saving :meth:`~BPStepScheduler.state_dict` in a
checkpoint and loading it into a freshly built schedule resumes the exact same sequence.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping

from emote_core.errors import CheckpointError, ConfigurationError

__all__ = [
    "BPStepScheduler",
    "ConstantSchedule",
    "CosineAnnealing",
    "CosineAnnealingWarmRestarts",
    "CyclicMode",
    "CyclicSchedule",
    "LinearSchedule",
    "TruncatedLinearSchedule",
]


def _finite(owner: str, name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{owner}: {name} must be a finite number, got {value!r}")
    return float(value)


def _positive_int(owner: str, name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{owner}: {name} must be an integer >= 1, got {value!r}")
    return value


class BPStepScheduler(ABC):
    """Base class of schedules that advance one step per backpropagation step.

    Subclasses implement :attr:`value` from :attr:`steps_taken`. If a subclass keeps more state
    than the step count, it extends :meth:`state_dict` and :meth:`load_state_dict`, keeping the
    state to ints and floats.

    Called with arguments, ``BPStepScheduler(bp_step_begin, bp_step_end, value_min, value_max)``
    builds upstream emote's class of that name, a :class:`TruncatedLinearSchedule`, so ported
    code (``scheduler.evaluate_at(bp_step)``) keeps its meaning.
    """

    def __new__(cls, *args: object, **kwargs: object) -> BPStepScheduler:
        if cls is BPStepScheduler and (args or kwargs):
            return super().__new__(TruncatedLinearSchedule)
        return super().__new__(cls)

    def __init__(self) -> None:
        self._steps_taken = 0

    @property
    @abstractmethod
    def value(self) -> float:
        """The scheduled value at the current step."""

    @property
    def steps_taken(self) -> int:
        """How many times :meth:`step` was called (or the count restored from a checkpoint)."""
        return self._steps_taken

    def step(self) -> None:
        """Advance the schedule by one step."""
        self._steps_taken += 1

    def evaluate_at(self, bp_step: int) -> float:
        """The value the schedule has after ``bp_step`` steps, leaving its own position alone.

        Upstream emote's name for asking a schedule about any step, for example to plot it or to
        check a recipe before training.

        Args:
            bp_step: The step to evaluate, an integer >= 0.

        Returns:
            What :attr:`value` is once :attr:`steps_taken` equals ``bp_step``.

        Raises:
            ConfigurationError: If ``bp_step`` is not an integer >= 0.
        """
        if isinstance(bp_step, bool) or not isinstance(bp_step, int) or bp_step < 0:
            raise ConfigurationError(
                f"{type(self).__name__}.evaluate_at: bp_step must be an integer >= 0, "
                f"got {bp_step!r}"
            )
        # The value is a function of the step count alone (see the class docstring), so reading
        # it at another count and putting the count back changes nothing observable.
        current = self._steps_taken
        self._steps_taken = bp_step
        try:
            return self.value
        finally:
            self._steps_taken = current

    def state_dict(self) -> dict[str, int | float]:
        """Returns the schedule's position, to be saved in a checkpoint."""
        return {"steps_taken": self._steps_taken}

    def load_state_dict(self, state: Mapping[str, int | float]) -> None:
        """Restore the position saved by :meth:`state_dict`.

        The schedule's own settings (initial value, steps, ...) come from its constructor, not
        from the state, so a resumed run may change them on purpose.

        Args:
            state: A mapping produced by :meth:`state_dict`.

        Raises:
            CheckpointError: If ``steps_taken`` is missing or not a non-negative integer.
        """
        if "steps_taken" not in state:
            raise CheckpointError(
                f"{type(self).__name__} state has no 'steps_taken' key (keys: {sorted(state)}); "
                "pass the mapping returned by state_dict()"
            )
        steps_taken = state["steps_taken"]
        if isinstance(steps_taken, bool) or not isinstance(steps_taken, int) or steps_taken < 0:
            raise CheckpointError(
                f"{type(self).__name__} state has steps_taken={steps_taken!r}; "
                "it must be an integer >= 0"
            )
        self._steps_taken = steps_taken

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps_taken={self._steps_taken}, value={self.value!r})"


class ConstantSchedule(BPStepScheduler):
    """A schedule whose value never changes.

    Args:
        value: The value at every step.

    Raises:
        ConfigurationError: If ``value`` is not a finite number.
    """

    def __init__(self, value: float) -> None:
        super().__init__()
        self._constant = _finite("ConstantSchedule", "value", value)

    @property
    def value(self) -> float:
        """The constant value."""
        return self._constant


class LinearSchedule(BPStepScheduler):
    """Moves linearly from ``initial`` to ``final`` over ``steps`` steps, then holds ``final``.

    With ``use_staircase``, the value moves in ``staircase_steps`` equal plateaus instead: the
    first plateau is ``initial``, each next one is ``(final - initial) / staircase_steps`` further,
    and ``final`` is reached at step ``steps`` as in the linear case. For example 1 -> 0 over 10
    steps with 5 stairs gives 1.0, 1.0, 0.8, 0.8, 0.6, 0.6, 0.4, 0.4, 0.2, 0.2, then 0.0.

    Args:
        initial: The value at step 0.
        final: The value from step ``steps`` on.
        steps: How many steps the change takes; at least 1.
        use_staircase: Whether to change in discrete plateaus.
        staircase_steps: How many plateaus; at least 1. Used only with ``use_staircase``.

    Raises:
        ConfigurationError: If a number is not finite or a step count is not an integer >= 1.
    """

    def __init__(
        self,
        initial: float,
        final: float,
        steps: int,
        *,
        use_staircase: bool = False,
        staircase_steps: int = 5,
    ) -> None:
        super().__init__()
        self._initial = _finite("LinearSchedule", "initial", initial)
        self._final = _finite("LinearSchedule", "final", final)
        self._steps = _positive_int("LinearSchedule", "steps", steps)
        self._use_staircase = bool(use_staircase)
        self._staircase_steps = _positive_int("LinearSchedule", "staircase_steps", staircase_steps)

    @property
    def value(self) -> float:
        """The value at the current step."""
        if self._steps_taken >= self._steps:
            return self._final
        fraction = self._steps_taken / self._steps
        if self._use_staircase:
            fraction = math.floor(fraction * self._staircase_steps) / self._staircase_steps
        return self._initial + (self._final - self._initial) * fraction


class TruncatedLinearSchedule(BPStepScheduler):
    """``value_min`` up to step ``bp_step_begin``, then linear to ``value_max`` at ``bp_step_end``,
    constant after.

    Upstream emote's ``BPStepScheduler(bp_step_begin, bp_step_end, value_min, value_max)`` (a
    truncated linear ramp read with ``evaluate_at``); its positional order is kept, so a ported
    call means the same. As upstream, an empty ramp (``bp_step_end - bp_step_begin < 1e-10``) is
    the constant ``value_max``.

    Args:
        bp_step_begin: The last step at ``value_min``.
        bp_step_end: The first step at ``value_max``.
        value_min: The value before the ramp.
        value_max: The value after it (it may be below ``value_min``: a falling ramp).
    """

    def __init__(
        self, bp_step_begin: float, bp_step_end: float, value_min: float, value_max: float
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.bp_step_begin = _finite(owner, "bp_step_begin", bp_step_begin)
        self.bp_step_end = _finite(owner, "bp_step_end", bp_step_end)
        self.value_min = _finite(owner, "value_min", value_min)
        self.value_max = _finite(owner, "value_max", value_max)

    @property
    def value(self) -> float:
        begin, end, step = self.bp_step_begin, self.bp_step_end, self.steps_taken
        if end - begin < 1e-10:
            return self.value_max
        if step <= begin:
            return self.value_min
        fraction = min((step - begin) / (end - begin), 1.0)
        return self.value_min + fraction * (self.value_max - self.value_min)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bp_step_begin={self.bp_step_begin}, bp_step_end="
            f"{self.bp_step_end}, value_min={self.value_min}, value_max={self.value_max})"
        )


class CyclicMode(enum.Enum):
    """How the amplitude of a :class:`CyclicSchedule` evolves from cycle to cycle."""

    TRIANGULAR = "triangular"
    """Every cycle goes all the way from ``initial`` to ``final`` and back."""

    TRIANGULAR2 = "triangular2"
    """Each cycle's distance from ``initial`` is half that of the previous cycle."""


class CyclicSchedule(BPStepScheduler):
    """Goes from ``initial`` to ``final`` and back, over and over (as ``torch``'s ``CyclicLR``).

    A cycle lasts ``2 * half_period_steps`` steps: the value is ``initial`` at the start of each
    cycle and reaches its peak after ``half_period_steps`` steps. In ``TRIANGULAR`` mode the peak is
    always ``final``; in ``TRIANGULAR2`` mode the peak of cycle ``k`` (counting from 0) is
    ``initial + (final - initial) / 2**k``.

    Args:
        initial: The value at the start of each cycle.
        final: The value at the peak of the first cycle.
        half_period_steps: Steps from a cycle's start to its peak; at least 1.
        mode: How the amplitude evolves across cycles.

    Raises:
        ConfigurationError: If a number is not finite, ``half_period_steps`` is not an integer
            >= 1 or ``mode`` is not a :class:`CyclicMode`.
    """

    def __init__(
        self,
        initial: float,
        final: float,
        half_period_steps: int,
        *,
        mode: CyclicMode = CyclicMode.TRIANGULAR,
    ) -> None:
        super().__init__()
        self._initial = _finite("CyclicSchedule", "initial", initial)
        self._final = _finite("CyclicSchedule", "final", final)
        self._half_period = _positive_int("CyclicSchedule", "half_period_steps", half_period_steps)
        if not isinstance(mode, CyclicMode):
            options = ", ".join(f"CyclicMode.{m.name}" for m in CyclicMode)
            raise ConfigurationError(f"CyclicSchedule: mode must be one of {options}, got {mode!r}")
        self._mode = mode

    @property
    def mode(self) -> CyclicMode:
        """The amplitude mode."""
        return self._mode

    @property
    def value(self) -> float:
        """The value at the current step."""
        period = 2 * self._half_period
        cycle, position = divmod(self._steps_taken, period)
        distance = min(position, period - position)  # steps away from the cycle's start or end
        fraction = distance / self._half_period
        if self._mode is CyclicMode.TRIANGULAR2:
            fraction *= 0.5**cycle
        return self._initial + (self._final - self._initial) * fraction


def _cosine(initial: float, final: float, fraction: float) -> float:
    return final + (initial - final) * (1.0 + math.cos(math.pi * fraction)) / 2.0


class CosineAnnealing(BPStepScheduler):
    """Follows half a cosine from ``initial`` to ``final`` over ``steps`` steps, then holds.

    Halfway through, the value is the mean of ``initial`` and ``final``.

    Args:
        initial: The value at step 0.
        final: The value from step ``steps`` on.
        steps: How many steps the decay takes; at least 1.

    Raises:
        ConfigurationError: If a number is not finite or ``steps`` is not an integer >= 1.
    """

    def __init__(self, initial: float, final: float, steps: int) -> None:
        super().__init__()
        self._initial = _finite("CosineAnnealing", "initial", initial)
        self._final = _finite("CosineAnnealing", "final", final)
        self._steps = _positive_int("CosineAnnealing", "steps", steps)

    @property
    def value(self) -> float:
        """The value at the current step."""
        if self._steps_taken >= self._steps:
            return self._final
        return _cosine(self._initial, self._final, self._steps_taken / self._steps)


class CosineAnnealingWarmRestarts(BPStepScheduler):
    """Cosine decay from ``initial`` towards ``final`` that restarts every ``steps`` steps.

    The value is ``initial`` at steps 0, ``steps``, ``2 * steps``, ... and approaches ``final``
    just before each restart (as ``torch``'s ``CosineAnnealingWarmRestarts`` with ``T_mult=1``).

    Args:
        initial: The value at the start of each period.
        final: The value the decay approaches at the end of each period.
        steps: The length of a period in steps; at least 1.

    Raises:
        ConfigurationError: If a number is not finite or ``steps`` is not an integer >= 1.
    """

    def __init__(self, initial: float, final: float, steps: int) -> None:
        super().__init__()
        self._initial = _finite("CosineAnnealingWarmRestarts", "initial", initial)
        self._final = _finite("CosineAnnealingWarmRestarts", "final", final)
        self._steps = _positive_int("CosineAnnealingWarmRestarts", "steps", steps)

    @property
    def value(self) -> float:
        """The value at the current step."""
        position = self._steps_taken % self._steps
        return _cosine(self._initial, self._final, position / self._steps)
