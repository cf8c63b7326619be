"""Termination functions: when a model-simulated transition ends its episode, by name.

A model-based recipe names its environment's known termination rule as a string (``"hopper"``),
never as code, so recipes stay plain data; :func:`termination_function` turns the name into the
function. Each function is called as ``termination_fn(actions, next_observation)`` with ``(B, A)``
actions and the ``(B, O)`` observations a dynamics model predicted for them, and returns a
``(B, 1)`` bool tensor: true where the episode ends there (TERMINAL: do not bootstrap).

The built-in rules restate each environment's own termination test in terms of its observation
vector, with the environment's default arguments (``exclude_current_positions_from_observation``
left on, default health ranges). Each checks the observation width it expects, so a rule named
for the wrong environment fails loudly instead of reading the wrong entries. Add rules of your
own with :func:`register_termination_function`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from emote_core.errors import ConfigurationError

TerminationFnType = Callable[[Tensor, Tensor], Tensor]
"""``termination_fn(actions (B, A), next_observation (B, O)) -> (B, 1) bool``."""


def _require_width(name: str, next_observation: Tensor, widths: tuple[int, ...], envs: str) -> None:
    width = next_observation.shape[-1]
    if width not in widths:
        expected = " or ".join(str(w) for w in widths)
        raise ConfigurationError(
            f"termination function '{name}' reads {envs} observations of {expected} values "
            f"(the environment's default layout); got rows of {width} — name the termination "
            "function of the environment the model was trained on, or register one for this "
            "layout with register_termination_function"
        )


def _outside(values: Tensor, low: float, high: float) -> Tensor:
    """True where ``low < value < high`` fails (NaN fails, as the environments' tests do)."""
    return ~((values > low) & (values < high))


def no_termination(actions: Tensor, next_observation: Tensor) -> Tensor:
    """Never terminates: for tasks that only end at their time limit.

    For ``Pendulum-v1``, ``HalfCheetah-v4``/``-v5``, ``Swimmer-v4``/``-v5`` and
    ``Reacher-v4``/``-v5``.
    """
    return torch.zeros(
        (*next_observation.shape[:-1], 1), dtype=torch.bool, device=next_observation.device
    )


INVERTED_PENDULUM_MAX_ANGLE = 0.2
"""InvertedPendulum terminates once the pole's angle exceeds this (radians) in magnitude."""


def inverted_pendulum_termination(actions: Tensor, next_observation: Tensor) -> Tensor:
    """``InvertedPendulum-v4``/``-v5``: any observation value not finite, or the pole's angle
    (observation index 1; the layout is ``[cart x, pole angle, cart velocity, pole angular
    velocity]``) beyond ±0.2 radians.

    Raises:
        ConfigurationError: If rows are not 4 values wide.
    """
    _require_width("inverted_pendulum", next_observation, (4,), "InvertedPendulum-v4/v5")
    not_finite = ~torch.isfinite(next_observation).all(dim=-1, keepdim=True)
    angle = next_observation[..., 1:2]
    return not_finite | (angle.abs() > INVERTED_PENDULUM_MAX_ANGLE)


DOUBLE_PENDULUM_POLE_LENGTH = 0.6
"""The length of each of InvertedDoublePendulum's two poles (metres; the hinge is at height 0)."""
DOUBLE_PENDULUM_MIN_TIP_HEIGHT = 1.0
"""InvertedDoublePendulum terminates once its tip is at or below this height (of 1.2 upright)."""


def inverted_double_pendulum_termination(actions: Tensor, next_observation: Tensor) -> Tensor:
    """``InvertedDoublePendulum-v4`` (11 values) and ``-v5`` (9 values): the second pole's tip at
    or below height 1.

    The observation holds the poles' angles as ``[x, sin θ1, sin θ2, cos θ1, cos θ2, ...]``, where
    θ2 is the second pole's angle relative to the first. Both poles are 0.6 long and hinge about
    the same axis, so the tip's height above the cart is ``0.6 cos θ1 + 0.6 cos(θ1 + θ2)``, with
    ``cos(θ1 + θ2) = cos θ1 cos θ2 - sin θ1 sin θ2``.

    The environment reads the tip's position from MuJoCo's kinematics, which are computed inside
    the last physics substep, while the observation holds the state after it; right at the
    boundary the two can disagree for one step.

    Raises:
        ConfigurationError: If rows are not 9 or 11 values wide.
    """
    _require_width(
        "inverted_double_pendulum", next_observation, (9, 11), "InvertedDoublePendulum-v4/v5"
    )
    sin_1, sin_2 = next_observation[..., 1:2], next_observation[..., 2:3]
    cos_1, cos_2 = next_observation[..., 3:4], next_observation[..., 4:5]
    height = DOUBLE_PENDULUM_POLE_LENGTH * (cos_1 + cos_1 * cos_2 - sin_1 * sin_2)
    return height <= DOUBLE_PENDULUM_MIN_TIP_HEIGHT


HOPPER_HEALTHY_Z_RANGE = (0.7, math.inf)
"""Hopper's default ``healthy_z_range``: the torso's height must stay strictly inside it."""
HOPPER_HEALTHY_ANGLE_RANGE = (-0.2, 0.2)
"""Hopper's default ``healthy_angle_range`` for the torso's angle (radians)."""
HOPPER_HEALTHY_STATE_RANGE = (-100.0, 100.0)
"""Hopper's default ``healthy_state_range`` for every observation value after the height."""


def hopper_termination(actions: Tensor, next_observation: Tensor) -> Tensor:
    """``Hopper-v4``/``-v5`` with default arguments: terminates when it is no longer healthy.

    The observation (11 values, x position excluded) is ``[z, torso angle, three joint angles,
    six velocities clipped to ±10]``. Healthy means, all strictly: ``0.7 < z``; ``-0.2 < angle <
    0.2``; and every value from index 1 on inside ``(-100, 100)``. The environment checks that
    last range on the unclipped velocities, which the observation cannot show; with velocities
    clipped to ±10 only the angles can break it here.

    Raises:
        ConfigurationError: If rows are not 11 values wide.
    """
    _require_width("hopper", next_observation, (11,), "Hopper-v4/v5")
    z, angle = next_observation[..., 0:1], next_observation[..., 1:2]
    bad_state = _outside(next_observation[..., 1:], *HOPPER_HEALTHY_STATE_RANGE)
    return (
        _outside(z, *HOPPER_HEALTHY_Z_RANGE)
        | _outside(angle, *HOPPER_HEALTHY_ANGLE_RANGE)
        | bad_state.any(dim=-1, keepdim=True)
    )


WALKER2D_HEALTHY_Z_RANGE = (0.8, 2.0)
"""Walker2d's default ``healthy_z_range``: the torso's height must stay strictly inside it."""
WALKER2D_HEALTHY_ANGLE_RANGE = (-1.0, 1.0)
"""Walker2d's default ``healthy_angle_range`` for the torso's angle (radians)."""


def walker2d_termination(actions: Tensor, next_observation: Tensor) -> Tensor:
    """``Walker2d-v4``/``-v5`` with default arguments: terminates when it is no longer healthy.

    The observation (17 values, x position excluded) starts ``[z, torso angle, ...]``. Healthy
    means, strictly: ``0.8 < z < 2.0`` and ``-1 < angle < 1``.

    Raises:
        ConfigurationError: If rows are not 17 values wide.
    """
    _require_width("walker2d", next_observation, (17,), "Walker2d-v4/v5")
    z, angle = next_observation[..., 0:1], next_observation[..., 1:2]
    return _outside(z, *WALKER2D_HEALTHY_Z_RANGE) | _outside(angle, *WALKER2D_HEALTHY_ANGLE_RANGE)


CARTPOLE_MAX_X = 2.4
"""CartPole terminates once the cart is further than this from the centre."""
CARTPOLE_MAX_ANGLE = 12 * 2 * math.pi / 360
"""CartPole terminates once the pole leans further than 12 degrees (in radians)."""


def cartpole_termination(actions: Tensor, next_observation: Tensor) -> Tensor:
    """``CartPole-v0``/``-v1``, and continuous-action variants that keep its state and limits:
    the cart beyond ±2.4 or the pole beyond ±12 degrees.

    The observation is ``[x, x velocity, pole angle, pole angular velocity]``.

    Raises:
        ConfigurationError: If rows are not 4 values wide.
    """
    _require_width("cartpole", next_observation, (4,), "CartPole")
    x, angle = next_observation[..., 0:1], next_observation[..., 2:3]
    return (x.abs() > CARTPOLE_MAX_X) | (angle.abs() > CARTPOLE_MAX_ANGLE)


_REGISTRY: dict[str, TerminationFnType] = {
    "none": no_termination,
    "pendulum": no_termination,
    "inverted_pendulum": inverted_pendulum_termination,
    "inverted_double_pendulum": inverted_double_pendulum_termination,
    "hopper": hopper_termination,
    "walker2d": walker2d_termination,
    "cartpole": cartpole_termination,
    "cartpole_continuous": cartpole_termination,
}

TERMINATION_FUNCTIONS: Mapping[str, TerminationFnType] = MappingProxyType(_REGISTRY)
"""Every termination function by name (read-only; it shows later registrations too)."""


def termination_function(name: str) -> TerminationFnType:
    """The termination function registered under ``name``.

    Raises:
        ConfigurationError: If no function has that name; the message suggests the closest one.
    """
    function = _REGISTRY.get(name) if isinstance(name, str) else None
    if function is not None:
        return function
    known = ", ".join(sorted(_REGISTRY))
    close = difflib.get_close_matches(name, _REGISTRY, n=1) if isinstance(name, str) else []
    hint = f"; did you mean '{close[0]}'?" if close else ";"
    raise ConfigurationError(f"no termination function named {name!r}{hint} (known: {known})")


def register_termination_function(
    name: str, fn: TerminationFnType, *, replace: bool = False
) -> None:
    """Makes ``fn`` available to :func:`termination_function` (and recipes) as ``name``.

    Args:
        name: The name recipes use.
        fn: ``fn(actions (B, A), next_observation (B, O)) -> (B, 1) bool``.
        replace: Allow replacing a function already registered under ``name``.

    Raises:
        ConfigurationError: If ``name`` is not a non-empty string, ``fn`` is not callable, or the
            name is taken and ``replace`` is false.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"a termination function's name must be a non-empty string; got {name!r}"
        )
    if not callable(fn):
        raise ConfigurationError(
            f"termination function '{name}' must be callable as fn(actions, next_observation); "
            f"got {fn!r}"
        )
    if name in _REGISTRY and not replace:
        held = getattr(_REGISTRY[name], "__name__", repr(_REGISTRY[name]))
        raise ConfigurationError(
            f"a termination function named '{name}' is already registered ({held}); pass "
            "replace=True to replace it, or choose another name"
        )
    _REGISTRY[name] = fn


__all__ = [
    "TERMINATION_FUNCTIONS",
    "TerminationFnType",
    "cartpole_termination",
    "hopper_termination",
    "inverted_double_pendulum_termination",
    "inverted_pendulum_termination",
    "no_termination",
    "register_termination_function",
    "termination_function",
    "walker2d_termination",
]
